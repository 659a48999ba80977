"""Small linear-algebra helpers used by optimisers: power iteration, inverse p-th
roots, non-negative least squares, gradient scaling, and the matrix decompositions
of per-layer preconditioners (one slice of a stack at a time on the CPU)."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Float, Inexact, Int, PRNGKeyArray, PyTree, Real

from ._backend import decomposes_one_slice_at_a_time
from ._typecheck import checked
from .tree import norm as tree_norm, scale as tree_scale, vdot as tree_vdot


def _leaves(tree: Any) -> list[Array]:
    return [x for x in jax.tree.leaves(tree) if eqx.is_array(x)]


def _normalise(tree: Any) -> Any:
    return tree_scale(1.0 / tree_norm(tree), tree)


# ---------------------------------------------------------------------------
# Power iteration
# ---------------------------------------------------------------------------


@checked
def power_iteration(
    matrix: Inexact[ArrayLike, "n n"] | Callable[[PyTree[Any]], PyTree[Any]],
    *,
    v0: PyTree[Any] | None = None,
    num_iters: Int[ArrayLike, ""] = 100,
    error_tolerance: Real[ArrayLike, ""] = 1e-6,
    precision: lax.Precision = lax.Precision.HIGHEST,
    key: PRNGKeyArray | None = None,
) -> tuple[Inexact[Array, ""], PyTree[Any]]:
    r"""Estimates the dominant eigenvalue and eigenvector of a matrix by power iteration.

    Starting from a unit vector $v_0$, repeats

    $$ z_{k} = A v_{k-1}, \qquad \lambda_k = \langle v_{k-1}, z_k \rangle, \qquad
       v_k = z_k / \|z_k\| $$

    until the relative residual $\|z_k - \lambda_k v_{k-1}\| / |\lambda_k|$ drops
    below `error_tolerance` or `num_iters` iterations have run.

    **Arguments:**

    - `matrix`: a square array, or a callable computing the matrix-vector product
      $v \mapsto A v$ on a pytree (for example a Hessian-vector product on a
      model's parameters). An Equinox Module is a callable and is treated as one.
    - `v0`: the initial vector. Required when `matrix` is a callable, in which case
      it is a pytree shaped like the callable's input. When `matrix` is an array
      and `v0` is `None`, a vector uniform in $[-1, 1]$ drawn from `key` is used.
    - `num_iters`: the largest number of iterations.
    - `error_tolerance`: the relative residual at which to stop.
    - `precision`: the precision of the matrix-vector product when `matrix` is
      an array.
    - `key`: the key for the random initial vector; `jax.random.PRNGKey(0)` when
      `None`.

    **Returns:** a pair `(eigenvalue, eigenvector)`, the eigenvector normalised to
    unit norm and shaped like `v0`.

    **References:** R. von Mises and H. Pollaczek-Geiringer, *Praktische
    Verfahren der Gleichungsauflösung*, ZAMM 9, 1929.
    """
    if callable(matrix):
        if v0 is None:
            raise ValueError("`v0` must be given when `matrix` is a callable.")
        matvec = matrix
    else:
        matrix = jnp.asarray(matrix)
        if v0 is None:
            if key is None:
                key = jax.random.PRNGKey(0)
            v0 = jax.random.uniform(
                key, matrix.shape[-1:], dtype=matrix.dtype, minval=-1.0, maxval=1.0
            )
        elif not eqx.is_array(v0) or v0.shape != matrix.shape[-1:]:
            raise ValueError(
                f"`v0` must be a vector of shape {matrix.shape[-1:]} for a matrix of "
                f"shape {matrix.shape}, got {jax.tree.map(jnp.shape, v0)}."
            )

        def matrix_product(v):
            return jnp.matmul(matrix, v, precision=precision)

        matvec = matrix_product

    if not _leaves(v0):
        raise ValueError("`v0` has no array leaves.")
    v0 = _normalise(v0)
    z0 = matvec(v0)
    eig_dtype = jnp.result_type(*_leaves(v0), *_leaves(z0))

    def cond(carry):
        vector, product, eigenvalue, step = carry
        residual = jax.tree.map(
            lambda z, v: z - eigenvalue * v if eqx.is_array(z) else z, product, vector
        )
        converged = jnp.abs(tree_norm(residual) / eigenvalue) < error_tolerance
        return ~converged & (step < num_iters)

    def body(carry):
        _, product, _, step = carry
        vector = _normalise(product)
        product = matvec(vector)
        return vector, product, tree_vdot(vector, product), step + 1

    init = (v0, z0, jnp.zeros((), eig_dtype), jnp.asarray(0))
    _, product, eigenvalue, _ = lax.while_loop(cond, body, init)
    return eigenvalue, _normalise(product)


# ---------------------------------------------------------------------------
# Decompositions of stacked layers
# ---------------------------------------------------------------------------


def _one_slice_at_a_time(decomposition: Callable[..., Any]) -> Callable[..., Any]:
    """`decomposition` of one matrix; under `vmap`, a loop over the slices on the CPU.

    Per-layer optimisers vmap their step over a scanned model's stack axes, so a
    decomposition there becomes one batched LAPACK call. On the CPU, jaxlib
    splits a batched call over XLA's thread pool and blocks a pool thread until
    its parts finish; two such calls running at once on a two-thread pool wait
    for each other for ever (SOAP's two QRs of a `(24, 256, 64)` stack on a
    2-core machine, jax 0.10.2). Looping over the slices calls LAPACK once per
    matrix, as a list of layers does (`_backend.decomposes_one_slice_at_a_time`
    says where: on the CPU).
    The arguments are arrays; those not batched are shared by every slice.
    Derivatives are `decomposition`'s own.
    """

    @jax.custom_batching.custom_vmap
    def decompose(*args):
        return decomposition(*args)

    @decompose.def_vmap
    def _batched(axis_size, in_batched, *args):
        if not any(in_batched):
            out = decompose(*args)
        elif decomposes_one_slice_at_a_time():

            def one(sliced):
                sliced = iter(sliced)
                batched = zip(args, in_batched, strict=True)
                return decompose(*(next(sliced) if b else a for a, b in batched))

            batched = zip(args, in_batched, strict=True)
            out = lax.map(one, tuple(a for a, b in batched if b))
        else:
            axes = tuple(0 if b else None for b in in_batched)
            out = jax.vmap(decomposition, in_axes=axes)(*args)
        return out, jax.tree.map(lambda _: any(in_batched), out)

    # Differentiated, it is `decomposition` itself (`custom_vmap` has no JVP).
    @jax.custom_jvp
    def differentiable(*args):
        return decompose(*args)

    @differentiable.defjvp
    def _jvp(primals, tangents):
        return jax.jvp(decomposition, primals, tangents)

    return differentiable


#: `jnp.linalg.eigh`, `jnp.linalg.qr` (reduced) and the thin `jnp.linalg.svd` of
#: one matrix, and the solve `X A = B` of an upper-triangular `A` (Kron's), safe
#: to vmap over a stack on the CPU (`_one_slice_at_a_time`).
eigh = _one_slice_at_a_time(jnp.linalg.eigh)
qr = _one_slice_at_a_time(jnp.linalg.qr)
thin_svd = _one_slice_at_a_time(lambda m: jnp.linalg.svd(m, full_matrices=False))
solve_upper_right = _one_slice_at_a_time(
    lambda a, b: lax.linalg.triangular_solve(a, b, left_side=False, lower=False)
)


# ---------------------------------------------------------------------------
# Inverse p-th root
# ---------------------------------------------------------------------------


def _matrix_power(matrix: Array, p: Any, precision: lax.Precision) -> Array:
    """`matrix ** p` for a positive integer `p`, by repeated squaring."""
    mm = lambda a, b: jnp.matmul(a, b, precision=precision)
    if isinstance(p, int):
        result, square = None, matrix
        while p > 0:
            if p & 1:
                result = square if result is None else mm(result, square)
            p >>= 1
            if p:
                square = mm(square, square)
        if result is None:
            raise ValueError("`p` must be a positive integer.")
        return result

    # `p` is an array: the same squaring, in a loop over its bits.
    def body(carry):
        result, square, k = carry
        result = jnp.where(k % 2 == 1, mm(result, square), result)
        square = lax.cond(k > 1, lambda s: mm(s, s), lambda s: s, square)
        return result, square, k // 2

    identity = jnp.eye(matrix.shape[0], dtype=matrix.dtype)
    result, _, _ = lax.while_loop(
        lambda carry: carry[2] > 0, body, (identity, matrix, jnp.asarray(p, jnp.int32))
    )
    return result


@checked
def matrix_inverse_pth_root(
    matrix: Float[ArrayLike, "n n"],
    p: int | Int[ArrayLike, ""],
    num_iters: Int[ArrayLike, ""] = 100,
    ridge_epsilon: Real[ArrayLike, ""] = 1e-6,
    error_tolerance: Real[ArrayLike, ""] = 1e-6,
    precision: lax.Precision = lax.Precision.HIGHEST,
) -> tuple[Float[Array, "n n"], Float[ArrayLike, ""]]:
    r"""Computes $A^{-1/p}$ of a symmetric positive semi-definite matrix by coupled Newton iterations.

    The matrix is first damped, $A_\epsilon = A + \epsilon\,\lambda_{\max}(A)\,I$
    (with $\lambda_{\max}$ from `eqopt.power_iteration`), then, with
    $z = (1 + p) / (2\|A_\epsilon\|_F)$, $M_0 = z A_\epsilon$ and
    $H_0 = z^{1/p} I$, the coupled iteration

    $$ T_k = \tfrac{p + 1}{p} I - \tfrac{1}{p} M_k, \qquad
       M_{k+1} = T_k^{\,p} M_k, \qquad H_{k+1} = H_k T_k $$

    drives $M_k \to I$ and $H_k \to A_\epsilon^{-1/p}$. It stops once
    $\max|M_k - I| \le$ `error_tolerance`, after `num_iters` iterations, or as soon
    as that error grows by more than 20%, in which case the previous $H$ is kept.

    **Arguments:**

    - `matrix`: the symmetric positive semi-definite matrix $A$.
    - `p`: the positive integer $p$.
    - `num_iters`: the largest number of iterations.
    - `ridge_epsilon`: the relative damping $\epsilon$.
    - `error_tolerance`: the error $\max|M_k - I|$ at which to stop.
    - `precision`: the precision of the matrix products.

    **Returns:** a pair `(root, error)`: the approximation of $A_\epsilon^{-1/p}$
    (in the dtype of `matrix`) and the final error $\max|M_k - I|$.

    **References:** N. J. Higham, *Functions of Matrices: Theory and Computation*,
    SIAM 2008, §7.3 (Eq. 7.18); C.-H. Guo and N. J. Higham, *A Schur–Newton
    method for the matrix p-th root and its inverse*, SIAM J. Matrix Anal. Appl.
    28(3), 2006.
    """
    if isinstance(p, int) and p < 1:
        raise ValueError(f"`p` must be a positive integer, got {p}.")
    matrix = jnp.asarray(matrix)
    size = matrix.shape[0]
    compute_dtype = jnp.promote_types(matrix.dtype, jnp.float32)
    alpha = jnp.asarray(-1.0 / p, compute_dtype)
    identity = jnp.eye(size, dtype=compute_dtype)
    max_eigenvalue, _ = power_iteration(
        matrix, num_iters=100, error_tolerance=1e-6, precision=precision
    )
    ridge_epsilon = ridge_epsilon * jnp.maximum(max_eigenvalue, 1e-16)

    if size == 1:
        root = (matrix + ridge_epsilon) ** alpha
        return root.astype(matrix.dtype), jnp.zeros((), compute_dtype)

    damped = matrix + ridge_epsilon * identity
    z = (1 + p) / (2 * jnp.linalg.norm(damped))
    mat_m = damped * z
    mat_h = identity * jnp.power(z, 1.0 / p)
    error = jnp.max(jnp.abs(mat_m - identity))

    def cond(carry):
        step, _, _, _, error, improving = carry
        return (step < num_iters) & (error > error_tolerance) & improving

    def body(carry):
        step, mat_m, mat_h, _, error, _ = carry
        mat_t = (1 - alpha) * identity + alpha * mat_m
        new_mat_m = jnp.matmul(
            _matrix_power(mat_t, p, precision), mat_m, precision=precision
        )
        new_mat_h = jnp.matmul(mat_h, mat_t, precision=precision)
        new_error = jnp.max(jnp.abs(new_mat_m - identity))
        return step + 1, new_mat_m, new_mat_h, mat_h, new_error, new_error < 1.2 * error

    init = (jnp.asarray(0), mat_m, mat_h, mat_h, error, jnp.asarray(True))
    _, mat_m, mat_h, previous_mat_h, _, improving = lax.while_loop(cond, body, init)
    error = jnp.max(jnp.abs(mat_m - identity))
    root = jnp.where(improving, mat_h, previous_mat_h)
    return root.astype(matrix.dtype), error


# ---------------------------------------------------------------------------
# Non-negative least squares
# ---------------------------------------------------------------------------


def _spectral_radius_upper_bound(matrix: Array) -> Array:
    if matrix.size == 0:
        return jnp.zeros((), matrix.dtype)
    frobenius = jnp.linalg.norm(matrix, ord="fro")
    one_norm = jnp.linalg.norm(matrix, ord=1)
    return jnp.minimum(frobenius, one_norm)


@checked
def nnls(
    A: Float[ArrayLike, "m n"],
    b: Float[ArrayLike, " m"] | Float[ArrayLike, "m k"],
    iters: int,
    unroll: int | bool = 1,
    L: Real[ArrayLike, ""] | None = None,
) -> Float[Array, " n"] | Float[Array, "n k"]:
    r"""Solves the non-negative least-squares problem by fast projected gradient.

    $$ \min_{x \ge 0} \tfrac12 \|A x - b\|_2^2 $$

    With $Q = A^\top A$, $q = A^\top b$, $L \ge \rho(Q)$, and $x_0 = y_0 = 0$,
    $c_0 = 0$, each of the `iters` steps is

    $$ x_{k+1} = \max\big(0,\ y_k - (Q y_k - q)/L\big), \quad
       c_{k+1} = \tfrac{1 + \sqrt{1 + 4 c_k^2}}{2}, \quad
       y_{k+1} = x_{k+1} + \tfrac{c_k - 1}{c_{k+1}} (x_{k+1} - x_k). $$

    **Arguments:**

    - `A`: the matrix, of shape `(M, N)`.
    - `b`: the right-hand side, of shape `(M,)` or `(M, K)` (K problems at once).
    - `iters`: the number of iterations.
    - `unroll`: the `unroll` argument of the underlying `lax.scan`.
    - `L`: an upper bound on the spectral radius of $A^\top A$; when `None`, the
      smaller of its Frobenius and 1-norms.

    **Returns:** the solution, of shape `(N,)` or `(N, K)`.

    **References:** R. A. Polyak, *Projected gradient method for non-negative
    least square*, Contemporary Mathematics 636, 2015.
    """
    A, b = jnp.asarray(A), jnp.asarray(b)
    Q = A.mT @ A
    q = A.mT @ b
    if L is None:
        L = _spectral_radius_upper_bound(Q)
    L = jnp.where(L == 0, 1, L)  # all-zero A: any step size works

    def step(carry, _):
        x, y, c = carry
        c_next = (1 + jnp.sqrt(1 + 4 * c**2)) / 2
        x_next = jnp.clip(y - (Q @ y - q) / L, 0)
        y_next = x_next + (c - 1) / c_next * (x_next - x)
        return (x_next, y_next, c_next), None

    x = jnp.zeros_like(b, shape=A.shape[-1:] + b.shape[1:])
    (x, _, _), _ = lax.scan(step, (x, x, jnp.asarray(0.0)), length=iters, unroll=unroll)
    return x


# ---------------------------------------------------------------------------
# Gradient scaling
# ---------------------------------------------------------------------------


@jax.custom_vjp
def _scale_gradient(inputs, scale):
    return inputs


def _scale_gradient_fwd(inputs, scale):
    return inputs, scale


def _scale_gradient_bwd(scale, cotangents):
    scaled = jax.tree.map(lambda g: (g * scale).astype(g.dtype), cotangents)
    return scaled, None


_scale_gradient.defvjp(_scale_gradient_fwd, _scale_gradient_bwd)


@checked
def scale_gradient(inputs: PyTree[Any], scale: Real[ArrayLike, ""]) -> PyTree[Any]:
    r"""Returns `inputs` unchanged, with the gradient flowing back through it scaled.

    $$ y = x, \qquad \frac{\partial \mathcal L}{\partial x} = s\,\frac{\partial \mathcal L}{\partial y} $$

    Only inexact-array leaves are affected; every other leaf (activation
    functions, integers...) is returned as it is, so `inputs` may be a whole
    Equinox model. No gradient flows to `scale`. A concrete scale of `1` returns
    `inputs` as is and a concrete scale of `0` stops the gradient.

    **Arguments:**

    - `inputs`: any pytree.
    - `scale`: the factor $s$ applied to the gradient on the backward pass.

    **Returns:** `inputs`, with a scaled backward pass.

    **References:** used for example in Y. Ganin and V. Lempitsky, *Unsupervised
    Domain Adaptation by Backpropagation*, ICML 2015 (gradient reversal, $s=-1$).
    """
    dynamic, static = eqx.partition(inputs, eqx.is_inexact_array)
    concrete = not isinstance(scale, jax.core.Tracer)
    if concrete and jnp.ndim(scale) == 0 and scale == 1:
        return inputs
    if concrete and jnp.ndim(scale) == 0 and scale == 0:
        return eqx.combine(lax.stop_gradient(dynamic), static)
    return eqx.combine(_scale_gradient(dynamic, scale), static)
