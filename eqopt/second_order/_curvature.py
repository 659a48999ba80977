"""Curvature of a loss with respect to a model: Hessian-vector products and the
diagonals of the Hessian and of the (observed) Fisher information."""

from collections.abc import Callable
from typing import Any, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Float, Inexact, PyTree

from .._deprecation import deprecated
from .._typecheck import checked

#: A loss `loss(params, inputs, targets)` returning a real scalar.
LossFn: TypeAlias = Callable[[Any, Any, Any], Float[Array, ""]]
#: Shaped like the params: an inexact array at every trainable leaf, `None` elsewhere.
Trainable: TypeAlias = PyTree[Inexact[Array, "..."] | None]


def _split(params: Any) -> tuple[Any, Any]:
    dynamic, static = eqx.partition(params, eqx.is_inexact_array)
    if not jax.tree.leaves(dynamic):
        raise ValueError(
            "`params` has no inexact-array leaves, so there is nothing to "
            "differentiate."
        )
    return dynamic, static


def _loss_of_trainable(loss: LossFn, static: Any, inputs: Any, targets: Any):
    def loss_fn(dynamic):
        return loss(eqx.combine(dynamic, static), inputs, targets)

    return loss_fn


def _tangent(v: Any, dynamic: Any) -> Any:
    """`v` as a pytree shaped and typed like the trainable leaves `dynamic`."""
    flat, unravel = ravel_pytree(dynamic)
    if eqx.is_array(v) and v.ndim == 1:
        if v.shape != flat.shape:
            raise ValueError(
                f"`v` is a flat vector of size {v.shape[0]}, but the params have "
                f"{flat.shape[0]} trainable entries."
            )
        return unravel(v)
    v = eqx.filter(v, eqx.is_inexact_array)
    if jax.tree.structure(v) != jax.tree.structure(dynamic):
        raise ValueError(
            "`v` must be a flat vector with one entry per trainable entry of "
            "`params`, or a pytree shaped like `params` with an inexact array at "
            "each trainable leaf. Got the structure "
            f"{jax.tree.structure(v)}, expected {jax.tree.structure(dynamic)}."
        )
    for path_and_leaf, p in zip(
        jax.tree_util.tree_leaves_with_path(v), jax.tree.leaves(dynamic), strict=True
    ):
        path, t = path_and_leaf
        if t.shape != p.shape:
            raise ValueError(
                f"`v` has shape {t.shape} at {jax.tree_util.keystr(path)}, where the "
                f"params have shape {p.shape}."
            )
    return jax.tree.map(lambda t, p: t.astype(p.dtype), v, dynamic)


@deprecated("`jax.jvp` of `jax.grad` (forward over reverse)")
@checked
def hvp(
    loss: LossFn,
    v: Inexact[Array, " d"] | PyTree[Any],
    params: PyTree[Any],
    inputs: PyTree[Any],
    targets: PyTree[Any],
) -> Trainable:
    r"""Multiplies a vector by the Hessian of `loss` at `params`, without forming the Hessian.

    $$ H v = \frac{\partial}{\partial \varepsilon}\Big|_{\varepsilon=0}
       \nabla_\theta L(\theta + \varepsilon v;\ \text{inputs}, \text{targets}) $$

    computed forward-over-reverse (`jax.jvp` of `jax.grad`), at about the cost of
    two gradient evaluations and the memory of one.

    `params` may be any pytree, such as an Equinox model with activation
    functions among its leaves: the derivatives are taken with respect to its
    inexact-array leaves only.

    **Arguments:**

    - `loss`: the loss, called as `loss(params, inputs, targets)` and returning
      a real scalar.
    - `v`: the vector, either flat (one entry per trainable entry of `params`,
      in the order of `jax.flatten_util.ravel_pytree`, as in Optax) or a pytree
      shaped like `params` (for example a gradient from `eqx.filter_grad`).
    - `params`: the point $\theta$ at which the Hessian is taken.
    - `inputs`, `targets`: the batch passed to `loss`.

    **Returns:** $Hv$, shaped like `params`: an array at each trainable leaf and
    `None` at every other leaf. (Optax also returns a pytree here.)

    **References:** B. A. Pearlmutter, *Fast Exact Multiplication by the
    Hessian*, Neural Computation 6(1), 1994.
    """
    dynamic, static = _split(params)
    tangent = _tangent(v, dynamic)
    grad_fn = jax.grad(_loss_of_trainable(loss, static, inputs, targets))
    return jax.jvp(grad_fn, (dynamic,), (tangent,))[1]


@deprecated("the diagonal of `jax.hessian`")
@checked
def hessian_diag(
    loss: LossFn,
    params: PyTree[Any],
    inputs: PyTree[Any],
    targets: PyTree[Any],
    *,
    batch_size: int = 128,
) -> Trainable:
    r"""Computes the diagonal of the Hessian of `loss` at `params`.

    $$ \operatorname{diag}(H)_i = e_i^\top H e_i $$

    Each entry comes from one Hessian-vector product with a basis vector $e_i$
    (see `eqopt.second_order.hvp`). The products are evaluated
    `batch_size` at a time with `jax.lax.map`, so memory grows as
    `batch_size` times the number of parameters $d$: the $d \times d$ Hessian is
    never formed. The cost is $d$ Hessian-vector products, so this is meant for
    small models or for checking cheaper estimates.

    **Arguments:**

    - `loss`: the loss, called as `loss(params, inputs, targets)` and returning
      a real scalar.
    - `params`: the point at which the Hessian is taken; any pytree, its
      inexact-array leaves being the variables.
    - `inputs`, `targets`: the batch passed to `loss`.
    - `batch_size`: how many Hessian-vector products to evaluate at once
      (keyword-only; not in Optax).

    **Returns:** the diagonal, shaped like `params`: an array at each trainable
    leaf and `None` elsewhere. Optax returns the same numbers as one flat
    vector; `jax.flatten_util.ravel_pytree(result)[0]` gives it.

    **References:** B. A. Pearlmutter, *Fast Exact Multiplication by the
    Hessian*, Neural Computation 6(1), 1994.
    """
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be positive, got {batch_size}.")
    dynamic, static = _split(params)
    return _hessian_diag(loss, dynamic, static, inputs, targets, batch_size)


# Compiled once per loss and shapes: `lax.map` outside `jit` would be traced and
# compiled again on every call.
@eqx.filter_jit
def _hessian_diag(loss, dynamic, static, inputs, targets, batch_size):
    flat, unravel = ravel_pytree(dynamic)
    size = flat.shape[0]
    grad_fn = jax.grad(_loss_of_trainable(loss, static, inputs, targets))

    def diagonal_entry(index):
        basis_vector = jnp.zeros_like(flat).at[index].set(1)
        product = jax.jvp(grad_fn, (dynamic,), (unravel(basis_vector),))[1]
        return ravel_pytree(product)[0][index]

    diagonal = jax.lax.map(
        diagonal_entry, jnp.arange(size), batch_size=min(batch_size, size)
    )
    return unravel(diagonal)


@deprecated("the mean of squared per-example gradients from `jax.vmap(jax.grad(loss))`")
@checked
def fisher_diag(
    negative_log_likelihood: LossFn,
    params: PyTree[Any],
    inputs: PyTree[Any],
    targets: PyTree[Any],
) -> Trainable:
    r"""Computes the diagonal of the observed (empirical) Fisher information of a negative log-likelihood.

    $$ \operatorname{diag}(F) = \big(\nabla_\theta\, \ell(\theta;\ \text{inputs}, \text{targets})\big)^{\odot 2} $$

    the elementwise square of the gradient of the negative log-likelihood $\ell$.
    For a single example this is the diagonal of the empirical Fisher
    $\nabla\ell\,\nabla\ell^\top$. When $\ell$ sums or averages over a batch it
    is the square of the batch gradient, not the average of per-example squares:
    for the latter, `jax.vmap` this function over examples and average.

    **Arguments:**

    - `negative_log_likelihood`: called as
      `negative_log_likelihood(params, inputs, targets)`, returning a real scalar.
    - `params`: any pytree; its inexact-array leaves are the variables.
    - `inputs`, `targets`: the data passed to `negative_log_likelihood`.

    **Returns:** the diagonal, shaped like `params`: an array at each trainable
    leaf and `None` elsewhere. Optax returns the same numbers as one flat
    vector; `jax.flatten_util.ravel_pytree(result)[0]` gives it.

    **References:** J. Martens, *New Insights and Perspectives on the Natural
    Gradient Method*, JMLR 21, 2020 (arXiv:1412.1193, 2014), §11 on the
    empirical Fisher.
    """
    dynamic, static = _split(params)
    loss_fn = _loss_of_trainable(negative_log_likelihood, static, inputs, targets)
    gradient = jax.grad(loss_fn)(dynamic)
    return jax.tree.map(jnp.square, gradient)
