"""Newton–Schulz orthogonalisation, shared by Muon and NorMuon."""

from collections.abc import Sequence
from typing import Any, Literal, no_type_check

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._hyper import ScalarLike
from .._sharding import gathered
from ._dimension_numbers import matrix_view
from ._gram_newton_schulz import gram_newton_schulz
from ._polar_express import _polar_express_rows

# Jordan (2024): the quintic whose slope at zero is largest while its iterates
# stay within [0.7, 1.2] on [0, 1].
_DEFAULT_NS_COEFFS = (3.4445, -4.7750, 2.0315)
# Ahn et al. (2025), Dion: one quintic per iteration.
_DION_NS_COEFFS = (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
)
_PRESETS = {
    "standard": _DEFAULT_NS_COEFFS,
    "muon": _DEFAULT_NS_COEFFS,
    "dion": _DION_NS_COEFFS,
    "polar_express": _polar_express_rows(5),
}
_PRECONDITIONINGS = ("frobenius", "spectral", "aol", "schatten")
# `orthogonalization=`: the standard iteration, or on the short side's Gram matrix.
_ORTHOGONALIZATIONS = ("newton_schulz", "gram")

Preconditioning = Literal["frobenius", "spectral", "aol", "schatten"]
Orthogonalization = Literal["newton_schulz", "gram"]
Coefficients = str | Sequence[ScalarLike] | Sequence[Sequence[ScalarLike]] | ArrayLike


def _as_coefficients(value: Coefficients) -> Float[Array | np.ndarray, "..."]:
    if isinstance(value, str):
        if value not in _PRESETS:
            raise ValueError(
                f"Unknown Newton-Schulz preset {value!r}; the presets are "
                f"{sorted(_PRESETS)}."
            )
        value = _PRESETS[value]
    return jnp.asarray(value, jnp.float32)


@no_type_check
def _newton_schulz(
    x, coefficients, steps, preconditioning, eps, method="newton_schulz"
):
    """Orthogonalises one matrix: $X \\mapsto U V^H$ approximately, for $X = U S V^H$."""
    if method == "gram" and x.shape[0] != x.shape[1]:
        rows = coefficients.astype(x.dtype)
        rows = [rows] * steps if rows.ndim == 1 else list(rows)
        return gram_newton_schulz(x, rows, preconditioning, eps)
    transposed = x.shape[0] > x.shape[1]
    if transposed:  # iterate on the smaller Gram matrix
        x = x.T
    if preconditioning == "frobenius":
        x = x / (jnp.linalg.norm(x) + eps)
    elif preconditioning == "spectral":
        # The largest singular value, by an SVD in at least single precision.
        wide = x.astype(jnp.promote_types(x.dtype, jnp.float32))
        norm = jnp.linalg.norm(wide, ord=2).astype(jnp.finfo(x.dtype).dtype)
        x = x / (norm + eps)
    coefficients = coefficients.astype(x.dtype)
    rows = [coefficients] * steps if coefficients.ndim == 1 else list(coefficients)
    for index, row in enumerate(rows):
        gram = x @ x.T.conj()
        if index == 0 and preconditioning == "aol":
            # Boissin et al. (2025): rescale row i by (sum_j |A_ij|)^(-1/2), which
            # bounds the spectral norm by 1 and equilibrates the rows.
            scaling = jax.lax.rsqrt(jnp.clip(jnp.abs(gram).sum(axis=-1), min=eps))
            x = x * scaling[:, None]
            gram = gram * scaling[:, None] * scaling[None, :]
        elif index == 0 and preconditioning == "schatten":
            # Grishina et al. (2025): divide by the Schatten-4 norm ||X X^H||_F^(1/2).
            scaling = jax.lax.rsqrt(jnp.clip(jnp.linalg.norm(gram), min=eps))
            x = x * scaling
            gram = gram * scaling**2
        polynomial = row[1] * gram + row[2] * gram @ gram
        x = row[0] * x + polynomial @ x
    if transposed:
        x = x.T
    return x


@no_type_check
def orthogonalize(
    x,
    dimension_numbers,
    coefficients,
    steps,
    preconditioning,
    eps,
    method="newton_schulz",
):
    """Newton–Schulz orthogonalisation of each matrix of `x` under its dimension numbers
    (`method="gram"`: on the Gram matrix of each non-square matrix's short side)."""
    # Under explicit sharding the iteration runs on the gathered matrix (its
    # matmuls contract every dimension) and the result is sharded like `x`.
    x, shard_like_x = gathered(x)
    to_matrix, from_matrix = matrix_view(x.shape, dimension_numbers)
    matrices = to_matrix(x)
    out = jax.vmap(
        lambda m: _newton_schulz(m, coefficients, steps, preconditioning, eps, method)
    )(matrices)
    return shard_like_x(from_matrix(out).astype(x.dtype))


def check_orthogonalizer(
    owner: str, orthogonalization: str, preconditioning: str, ns_steps: Any
) -> None:
    """Checks the static options of an orthogonalising transform, with one wording."""
    if orthogonalization not in _ORTHOGONALIZATIONS:
        raise ValueError(
            f"{owner}: `orthogonalization` must be one of "
            f"{_ORTHOGONALIZATIONS}, got {orthogonalization!r}."
        )
    if preconditioning not in _PRECONDITIONINGS:
        raise ValueError(
            f"{owner}: `preconditioning` must be one of "
            f"{_PRECONDITIONINGS}, got {preconditioning!r}."
        )
    if not isinstance(ns_steps, int) or ns_steps < 1:
        raise ValueError(
            f"{owner}: `ns_steps` must be a positive int, got {ns_steps!r}."
        )
