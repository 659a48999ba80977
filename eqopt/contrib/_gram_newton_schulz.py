r"""Gram Newton–Schulz: Muon's orthogonalisation iterated on the short side's Gram matrix.

For $X \in \mathbb{R}^{m \times n}$ with $m \le n$ (a tall matrix is
transposed first), each quintic Newton–Schulz step is
$X_{k+1} = P_k X_k$ with $P_k = a_k I + b_k R_k + c_k R_k^2$ and
$R_k = X_k X_k^H$, an $m \times m$ matrix. Every $P_k$ is a polynomial in
$R_0$, so the iteration never needs $X_k$ itself:

$$
\begin{aligned}
R_{k+1} &= P_k R_k P_k, \qquad Q_{k+1} = Q_k P_k, \qquad Q_0 = I, \\
X_K &= Q_K X_0,
\end{aligned}
$$

costing $m^3$ products per step instead of $m^2 n$, and two products with
$X$ (the first Gram matrix and the final $Q_K X_0$). In finite precision the
accumulated $Q_k$ drifts from the product that keeps $R_k$ consistent, so at
each *reset* iteration $r$ the accumulated polynomial is applied,
$X_r = Q_r X_0$, the Gram matrix is recomputed from it, and $Q$ restarts
from the identity (the reference resets once, before the third step).

A square matrix gains nothing ($m = n$) and runs the standard iteration, as
in the reference.

**References:** Zhang, Amsel, Chen & Dao, *Gram Newton–Schulz: A Fast,
Hardware-Aware Newton–Schulz Algorithm for Muon*, 2026 (their
`gram-newton-schulz` package); Jordan et al., *Muon*, 2024.
"""

from typing import no_type_check

import jax
import jax.numpy as jnp

# The reference's default: one restart, before the third iteration.
GRAM_RESETS = (2,)


@no_type_check
def gram_newton_schulz(x, rows, preconditioning, eps, resets=GRAM_RESETS):
    """Orthogonalises one matrix `x` by the quintics `rows` (a list of `(a, b, c)`),
    iterating on the Gram matrix of its short side."""
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    if preconditioning == "frobenius":
        x = x / (jnp.linalg.norm(x) + eps)
    elif preconditioning == "spectral":
        wide = x.astype(jnp.promote_types(x.dtype, jnp.float32))
        norm = jnp.linalg.norm(wide, ord=2).astype(jnp.finfo(x.dtype).dtype)
        x = x / (norm + eps)
    gram = x @ x.T.conj()
    if preconditioning == "aol":
        # Boissin et al. (2025), as in the standard iteration: rows rescaled by
        # (sum_j |R_ij|)^(-1/2), the Gram matrix alike on both sides.
        scaling = jax.lax.rsqrt(jnp.clip(jnp.abs(gram).sum(axis=-1), min=eps))
        x = x * scaling[:, None]
        gram = gram * scaling[:, None] * scaling[None, :]
    elif preconditioning == "schatten":
        scaling = jax.lax.rsqrt(jnp.clip(jnp.linalg.norm(gram), min=eps))
        x = x * scaling
        gram = gram * scaling**2
    identity = jnp.eye(x.shape[0], dtype=x.dtype)
    q = None
    last = len(rows) - 1
    for index, (a, b, c) in enumerate(rows):
        if index in resets and index != 0:
            x = q @ x
            gram = x @ x.T.conj()
            q = None
        z = b * gram + c * gram @ gram
        p = a * identity + z
        q = p if q is None else q @ p
        if index < last and index + 1 not in resets:
            gram = p @ (gram @ p)
    x = q @ x
    return x.T if transposed else x
