"""Muon: momentum orthogonalised by Newton–Schulz iterations."""

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._alias import adamw
from .._base import (
    AbstractGradientTransformation,
    EmptyState,
    Params,
    Updates,
    leafwise,
)
from .._combine import Chain, Partition
from .._filters import FilterSpec
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_optional_scalar,
    as_scalar,
    check_decays,
    check_hyperparameter,
)
from .._numerics import debias, safe_int32_increment
from .._quantize import MomentDType, cast_moment, moment_like
from .._sharding import gathered
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from ._dimension_numbers import (
    _AbstractDimensionNumbers,
    fans,
    matrix_view,
    resolve_dimension_numbers,
    selection_spec,
)
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

Preconditioning = Literal["frobenius", "spectral", "aol", "schatten"]
Coefficients = str | Sequence[ScalarLike] | Sequence[Sequence[ScalarLike]] | ArrayLike


@dataclasses.dataclass(frozen=True)
class MuonDimensionNumbers(_AbstractDimensionNumbers):
    r"""Which axes of a parameter Muon treats as the rows and columns of a matrix.

    A weight used as $x W = y$ has its *reduction* axes (contracted with the
    input) as rows and its *output* axes as columns; the default is a plain
    matrix, rows on axis 0 and columns on axis 1. Every other axis is a batch
    axis: each slice along the batch axes is orthogonalised on its own. For a
    convolution kernel of shape `(out, in, kh, kw)`, for example,
    `MuonDimensionNumbers(reduction_axis=(1, 2, 3), output_axis=0)`.

    Unlike Optax's NamedTuple, this is a frozen dataclass: a single pytree
    leaf, so it can sit in a filter spec next to bools and predicates.

    **Arguments:**

    - `reduction_axis`: an axis or a sequence of axes (negative counts from the end).
    - `output_axis`: an axis or a sequence of axes.
    """


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
def _newton_schulz(x, coefficients, steps, preconditioning, eps):
    """Orthogonalises one matrix: $X \\mapsto U V^H$ approximately, for $X = U S V^H$."""
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
def orthogonalize(x, dimension_numbers, coefficients, steps, preconditioning, eps):
    """Newton–Schulz orthogonalisation of each matrix of `x` under its dimension numbers."""
    # Under explicit sharding the iteration runs on the gathered matrix (its
    # matmuls contract every dimension) and the result is sharded like `x`.
    x, shard_like_x = gathered(x)
    to_matrix, from_matrix = matrix_view(x.shape, dimension_numbers)
    matrices = to_matrix(x)
    out = jax.vmap(
        lambda m: _newton_schulz(m, coefficients, steps, preconditioning, eps)
    )(matrices)
    return shard_like_x(from_matrix(out).astype(x.dtype))


class MuonState(eqx.Module):
    """The state of [`eqopt.contrib.ScaleByMuon`][]: the step count and the momentum.

    The momentum is `None` at leaves that Muon does not orthogonalise. (Optax's
    state also holds the Newton–Schulz coefficients; here they are a
    hyperparameter of the transform.)
    """

    count: Int[Array, ""]
    mu: Updates


class ScaleByMuon(AbstractGradientTransformation):
    r"""Orthogonalises the Nesterov momentum of each matrix (Muon).

    For each selected matrix $G_t$ (see `weight_dimension_numbers`):

    $$
    \begin{aligned}
    M_t &= \beta M_{t-1} + (1 - \beta) G_t \\
    \hat M_t &= \beta\, \frac{M_t}{1 - \beta^{t+1}} + (1 - \beta)\, \frac{G_t}{1 - \beta^t}
      \quad\text{(Nesterov; else } \hat M_t = M_t / (1 - \beta^t)\text{)} \\
    X_0 &= \hat M_t / (\|\hat M_t\|_F + \epsilon), \qquad
    X_{k+1} = a X_k + \big(b\, X_k X_k^H + c\, (X_k X_k^H)^2\big) X_k \\
    u_t &= X_K \;\approx\; U V^H \quad\text{where } \hat M_t = U S V^H
    \end{aligned}
    $$

    The quintic Newton–Schulz iteration drives every singular value towards
    (roughly) one, so the update is the nearest semi-orthogonal matrix to the
    momentum: steepest descent under the spectral norm. With a matrix taller
    than wide the iteration runs on its transpose. With `adaptive=True` the
    result is scaled by the nuclear norm estimate $\langle \hat M_t, u_t\rangle$
    (Bernstein & Newhouse, 2024).

    Leaves that `weight_dimension_numbers` does not select pass through
    unchanged and keep no momentum. Non-matrix leaves usually go to Adam:
    [`eqopt.contrib.muon`][] does that.

    **Arguments:**

    - `ns_coeffs`: the coefficients $(a, b, c)$, or one row of them per
      iteration (shape `(n, 3)`, then `ns_steps` is ignored), or a preset name
      (`"standard"`, `"dion"`, or `"polar_express"`: Amsel et al.'s five
      optimal quintics, see [`eqopt.contrib.polar_express_coefficients`][]
      for other counts).
    - `ns_steps`: the number of iterations $K$ (static).
    - `beta`: the momentum decay $\beta \in [0, 1)$.
    - `eps`: added to the norm before dividing.
    - `mu_dtype`: dtype to store the momentum in (default: the params'), or a
      [`eqopt.Quantized`][] format.
    - `nesterov`: use Nesterov momentum (default) or plain momentum.
    - `adaptive`: scale by the dual norm of the momentum.
    - `preconditioning`: how $X_0$ is scaled before iterating: `"frobenius"`
      (above), `"spectral"` (by the largest singular value: exact, costs an
      SVD), `"aol"` (row rescaling from $|X X^H|$ folded into the first
      iteration, Boissin et al. 2025) or `"schatten"` (by the Schatten-4 norm,
      Grishina et al. 2025).
    - `weight_dimension_numbers`: which leaves are matrices, and how to view
      them as matrices. `None` (default): every trainable leaf is a 2-D
      matrix. Otherwise an Equinox filter spec whose leaves may also be
      [`eqopt.contrib.MuonDimensionNumbers`][]: a predicate such as
      `lambda x: x.ndim == 2`, a prefix pytree built with `eqx.tree_at`, or
      Optax's tree of dimension numbers with `None` for leaves to skip.
      Unlike Optax, a callable is applied to each leaf (it returns a bool,
      dimension numbers or `None`), never to the whole params.

    **References:** Jordan et al., *Muon: An optimizer for hidden layers in
    neural networks*, 2024 (kellerjordan.github.io/posts/muon); Bernstein &
    Newhouse, *Old Optimizer, New Norm: An Anthology*, arXiv:2409.20325, 2024;
    Amsel et al., *The Polar Express*, arXiv:2505.16932, 2025.
    """

    ns_coeffs: Float[Array | np.ndarray, "3"] | Float[Array | np.ndarray, "steps 3"] = (
        eqx.field(default=_DEFAULT_NS_COEFFS, converter=_as_coefficients)
    )
    ns_steps: int = eqx.field(default=5, static=True)
    beta: Scalar = eqx.field(default=0.95, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    mu_dtype: MomentDType = eqx.field(default=None, static=True)
    nesterov: bool = eqx.field(default=True, static=True)
    adaptive: bool = eqx.field(default=False, static=True)
    preconditioning: Preconditioning = eqx.field(default="frobenius", static=True)
    weight_dimension_numbers: Any = None

    def __check_init__(self):
        check_decays(self, "beta")
        check_hyperparameter("eps", self.eps, low=0.0)
        shape = self.ns_coeffs.shape
        if not (len(shape) == 1 and shape == (3,) or len(shape) == 2 and shape[1] == 3):
            raise ValueError(
                f"ScaleByMuon: `ns_coeffs` must have shape (3,) or (n, 3), got {shape}."
            )
        if self.preconditioning not in _PRECONDITIONINGS:
            raise ValueError(
                f"ScaleByMuon: `preconditioning` must be one of {_PRECONDITIONINGS}, "
                f"got {self.preconditioning!r}."
            )
        if not isinstance(self.ns_steps, int) or self.ns_steps < 1:
            raise ValueError(
                f"ScaleByMuon: `ns_steps` must be a positive int, got {self.ns_steps!r}."
            )

    @property
    def elementwise(self) -> bool:
        return False

    def _dimension_numbers(self, tree: Any) -> Any:
        spec = (
            True
            if self.weight_dimension_numbers is None
            else self.weight_dimension_numbers
        )
        return resolve_dimension_numbers(
            spec, tree, MuonDimensionNumbers, owner="Muon", batch_axes=True
        )

    def init(self, params: Params) -> MuonState:
        dims = self._dimension_numbers(params)

        def zeros(p, d):
            if d is None:
                return None
            return moment_like(p, self.mu_dtype or p.dtype)

        mu = jax.tree.map(zeros, params, dims, is_leaf=lambda x: x is None)
        return MuonState(count=jnp.zeros([], jnp.int32), mu=mu)

    def update(
        self,
        updates: Updates,
        state: MuonState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, MuonState]:
        dims = self._dimension_numbers(updates if params is None else params)
        beta, eps = self.beta, self.eps
        count = safe_int32_increment(state.count)
        one_minus_beta = 1 - beta
        correction = 1 - beta**count
        next_correction = 1 - beta ** safe_int32_increment(count)

        @no_type_check
        def step(g, mu, d):
            if d is None:
                return g, mu
            mu_dtype = mu.dtype
            mu = beta * mu + one_minus_beta * g
            if self.nesterov:
                mu_hat = beta * debias(mu, next_correction) + one_minus_beta * debias(
                    g, correction
                )
            else:
                mu_hat = debias(mu, correction)
            update = orthogonalize(
                mu_hat, d, self.ns_coeffs, self.ns_steps, self.preconditioning, eps
            )
            if self.adaptive:
                update = jnp.sum(mu_hat.conj() * update) * update
            return update.astype(g.dtype), cast_moment(mu, self.mu_dtype or mu_dtype)

        updates, mu = leafwise(step, updates, state.mu, dims, n_out=2)
        return updates, MuonState(count=count, mu=mu)


def scale_by_muon(
    ns_coeffs: Coefficients = _DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: ScalarLike = 0.95,
    eps: ScalarLike = 1e-8,
    mu_dtype: MomentDType = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: Preconditioning = "frobenius",
    weight_dimension_numbers: Any = None,
) -> ScaleByMuon:
    """Optax spelling of [`eqopt.contrib.ScaleByMuon`][].

    `weight_dimension_numbers` is a filter spec whose leaves may be
    [`eqopt.contrib.MuonDimensionNumbers`][]; a callable is applied per leaf.
    """
    return ScaleByMuon(
        ns_coeffs=ns_coeffs,
        ns_steps=ns_steps,
        beta=beta,
        eps=eps,
        mu_dtype=mu_dtype,
        nesterov=nesterov,
        adaptive=adaptive,
        preconditioning=preconditioning,
        weight_dimension_numbers=weight_dimension_numbers,
    )


class ScaleByShape(AbstractGradientTransformation):
    r"""Scales each orthogonalised matrix by a factor of its shape (Muon's second step).

    With $n_{\text{in}}$ and $n_{\text{out}}$ the sizes of a leaf's reduction
    and output axes:

    $$
    u \mapsto \begin{cases}
    \sqrt{\max(1, n_{\text{out}} / n_{\text{in}})}\; u & \text{(default: width transfer)} \\
    \rho \sqrt{\max(n_{\text{in}}, n_{\text{out}})}\; u & \text{(with consistent RMS } \rho\text{)}
    \end{cases}
    $$

    The first keeps the spectral norm per unit of input width (Jordan et al.,
    2024); the second makes the update's root mean square about $\rho$ whatever
    the shape, like AdamW's (Liu et al., 2025, who recommend $\rho = 0.2$).
    Leaves the spec does not select pass through.

    **Arguments:**

    - `weight_dimension_numbers`: as for [`eqopt.contrib.ScaleByMuon`][].
    - `consistent_rms`: $\rho$, or `None` for the width-transfer scale.

    **References:** Liu et al., *Muon is Scalable for LLM Training*,
    arXiv:2502.16982, 2025.
    """

    weight_dimension_numbers: Any = None
    consistent_rms: Scalar | None = eqx.field(
        default=None, converter=as_optional_scalar
    )

    @property
    def elementwise(self) -> bool:
        return False

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(
        self,
        updates: Updates,
        state: EmptyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmptyState]:
        spec = (
            True
            if self.weight_dimension_numbers is None
            else self.weight_dimension_numbers
        )
        dims = resolve_dimension_numbers(
            spec,
            updates if params is None else params,
            MuonDimensionNumbers,
            owner="Muon",
            batch_axes=True,
        )

        @no_type_check
        def step(u, d):
            if d is None:
                return u
            fan_in, fan_out = fans(u.shape, d)
            if self.consistent_rms is None:
                factor = jnp.sqrt(jnp.maximum(1, fan_out / fan_in))
            else:
                factor = jnp.sqrt(jnp.maximum(fan_in, fan_out)) * self.consistent_rms
            return factor * u

        return leafwise(step, updates, dims), state


def _is_matrix(x: Any) -> bool:
    return x.ndim == 2


def muon(
    learning_rate: ScalarOrSchedule,
    ns_coeffs: Coefficients = _DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: ScalarLike = 0.95,
    eps: ScalarLike = 1e-8,
    weight_decay: ScalarOrSchedule = 0.0,
    weight_decay_mask: FilterSpec | None = None,
    mu_dtype: MomentDType = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: Preconditioning = "frobenius",
    adam_b1: ScalarLike = 0.9,
    adam_b2: ScalarLike = 0.999,
    adam_eps_root: ScalarLike = 0.0,
    adam_weight_decay: ScalarOrSchedule = 0.0,
    adam_learning_rate: ScalarOrSchedule | None = None,
    muon_weight_dimension_numbers: Any = None,
    consistent_rms: ScalarLike | None = None,
) -> Partition:
    r"""Muon for the matrices, AdamW for every other leaf.

    The selected matrices are updated by

    $$
    u_t = -\eta_t \big( s \cdot \operatorname{NS}(\hat M_t) + \lambda\, W_{t-1} \big)
    $$

    with $\operatorname{NS}(\hat M_t)$ the Newton–Schulz orthogonalisation of
    the (Nesterov) momentum ([`eqopt.contrib.ScaleByMuon`][]) and $s$ the shape
    factor of [`eqopt.contrib.ScaleByShape`][]. Every other leaf (biases,
    scalars, embeddings you leave out) is trained by [`eqopt.adamw`][] with
    `adam_*` hyperparameters, the same `eps`, `mu_dtype` and `nesterov`.

    The result is a [`eqopt.Partition`][] with groups `"muon"` (the chain
    `scale_by_muon`, `scale_by_shape`, `add_decayed_weights`,
    `scale_by_learning_rate`) and `"adam"`.

    **Which leaves get Muon** is an Equinox filter spec, given as
    `muon_weight_dimension_numbers`:

    - `None` (default): every 2-D leaf, i.e. the predicate `lambda x: x.ndim == 2`;
    - a per-leaf predicate, e.g. `lambda x: x.ndim == 2 and x.shape[0] > 16`;
    - a prefix pytree of bools built with `eqx.tree_at` on the model, e.g. only
      the hidden layers of an MLP;
    - Optax's tree of [`eqopt.contrib.MuonDimensionNumbers`][] (with `None` for
      Adam leaves), which also says how to view higher-rank leaves as matrices.
      A predicate may return dimension numbers too.

    Unlike Optax, a callable is applied to each leaf, never to the whole params.

    !!! example

        ```python
        hidden = jax.tree.map(lambda _: False, model)
        hidden = eqx.tree_at(
            lambda m: [layer.weight for layer in m.layers[1:-1]],
            hidden,
            replace_fn=lambda _: True,
        )
        opt = eqopt.contrib.muon(0.02, muon_weight_dimension_numbers=hidden,
                                 adam_learning_rate=3e-3)
        ```

    **Arguments:**

    - `learning_rate`: $\eta$ for the Muon group, a number or a schedule.
    - `ns_coeffs`, `ns_steps`, `beta`, `eps`, `mu_dtype`, `nesterov`,
      `adaptive`, `preconditioning`: as for [`eqopt.contrib.ScaleByMuon`][].
    - `weight_decay`: $\lambda$ for the Muon group (multiplied by the learning rate).
    - `weight_decay_mask`: a filter spec of the Muon leaves to decay.
    - `adam_b1`, `adam_b2`, `adam_eps_root`, `adam_weight_decay`: AdamW's
      hyperparameters for the other leaves.
    - `adam_learning_rate`: AdamW's learning rate (default: `learning_rate`).
    - `muon_weight_dimension_numbers`: the Muon leaves, as above.
    - `consistent_rms`: see [`eqopt.contrib.ScaleByShape`][].

    **Returns:** an [`eqopt.Partition`][].

    **References:** Jordan et al., *Muon: An optimizer for hidden layers in
    neural networks*, 2024; Bernstein & Newhouse, *Old Optimizer, New Norm: An
    Anthology*, arXiv:2409.20325, 2024; Liu et al., *Muon is Scalable for LLM
    Training*, arXiv:2502.16982, 2025.
    """
    if adam_learning_rate is None:
        adam_learning_rate = learning_rate
    spec = (
        _is_matrix
        if muon_weight_dimension_numbers is None
        else muon_weight_dimension_numbers
    )
    muon_part = Chain(
        ScaleByMuon(
            ns_coeffs=ns_coeffs,
            ns_steps=ns_steps,
            beta=beta,
            eps=eps,
            mu_dtype=mu_dtype,
            nesterov=nesterov,
            adaptive=adaptive,
            preconditioning=preconditioning,
            weight_dimension_numbers=spec,
        ),
        ScaleByShape(weight_dimension_numbers=spec, consistent_rms=consistent_rms),
        AddDecayedWeights(weight_decay, weight_decay_mask),
        ScaleByLearningRate(learning_rate),
    )
    adam_part = adamw(
        learning_rate=adam_learning_rate,
        b1=adam_b1,
        b2=adam_b2,
        eps=eps,
        eps_root=adam_eps_root,
        mu_dtype=mu_dtype,
        weight_decay=adam_weight_decay,
        nesterov=nesterov,
    )
    return _matrices_and_the_rest("muon", muon_part, adam_part, spec)


def _matrices_and_the_rest(
    name: str, matrix_part: Any, rest: Any, spec: Any
) -> Partition:
    """The partition of Muon's family: `matrix_part` on the leaves that the
    dimension-numbers `spec` selects (group `name`), `rest` on the others ("adam")."""
    return Partition(
        {name: matrix_part, "adam": rest},
        {
            name: selection_spec(spec, MuonDimensionNumbers),
            "adam": selection_spec(spec, MuonDimensionNumbers, complement=True),
        },
    )
