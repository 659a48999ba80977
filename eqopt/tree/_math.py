"""Arithmetic and reductions over the array leaves of pytrees."""

import builtins
import functools
import operator
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, PyTree, Real, Shaped

from .._numerics import abs_squared
from .._sharding import inner
from .._typecheck import checked
from ._paths import (
    array_leaves,
    check_broadcast,
    check_operand,
    map_arrays,
    map_single,
    path_str,
    zip_trees,
)

# ---------------------------------------------------------------------------
# Elementwise arithmetic
# ---------------------------------------------------------------------------


@checked
def add(tree_x: PyTree, tree_y: PyTree, *other_trees: PyTree) -> PyTree:
    r"""Adds two or more pytrees leafwise.

    $$ z = x + y \,(+\, w_1 + \dots) $$

    **Arguments:**

    - `tree_x`: the first pytree; it decides the structure and the non-array
      leaves of the result.
    - `tree_y`: the second pytree, of the same structure.
    - `*other_trees`: more pytrees of the same structure to add.

    **Returns:** a pytree shaped like `tree_x`. Non-array leaves of `tree_x` pass
    through; where any tree has `None`, `tree_x`'s leaf is kept (`None` where
    `tree_x` has `None`).

    **Raises:** `ValueError` naming the first path at which the structures or
    shapes disagree.
    """
    names = [("tree_x", tree_x), ("tree_y", tree_y)]
    names += [(f"other_trees[{i}]", t) for i, t in enumerate(other_trees)]
    return map_arrays(
        "add", lambda x, *ys: functools.reduce(operator.add, ys, x), names
    )


@checked
def sub(tree_x: PyTree, tree_y: PyTree) -> PyTree:
    r"""Subtracts one pytree from another leafwise.

    $$ z = x - y $$

    **Arguments:**

    - `tree_x`: the pytree to subtract from.
    - `tree_y`: the pytree to subtract, of the same structure.

    **Returns:** a pytree shaped like `tree_x` (see `eqopt.tree.add` for
    non-array and `None` leaves).
    """
    return map_arrays("sub", operator.sub, [("tree_x", tree_x), ("tree_y", tree_y)])


@checked
def mul(tree_x: PyTree, tree_y: PyTree) -> PyTree:
    r"""Multiplies two pytrees leafwise (the Hadamard product).

    $$ z = x \odot y $$

    **Arguments:**

    - `tree_x`, `tree_y`: pytrees of the same structure.

    **Returns:** a pytree shaped like `tree_x` (see `eqopt.tree.add` for
    non-array and `None` leaves).
    """
    return map_arrays("mul", operator.mul, [("tree_x", tree_x), ("tree_y", tree_y)])


@checked
def div(tree_x: PyTree, tree_y: PyTree) -> PyTree:
    r"""Divides one pytree by another leafwise.

    $$ z = x \oslash y $$

    **Arguments:**

    - `tree_x`: the numerator.
    - `tree_y`: the denominator, of the same structure.

    **Returns:** a pytree shaped like `tree_x` (see `eqopt.tree.add` for
    non-array and `None` leaves).
    """
    return map_arrays("div", operator.truediv, [("tree_x", tree_x), ("tree_y", tree_y)])


@checked
def scale(scalar: Shaped[ArrayLike, ""], tree: PyTree) -> PyTree:
    r"""Multiplies every array leaf of a pytree by a scalar.

    $$ z = \alpha\, x $$

    **Arguments:**

    - `scalar`: the factor $\alpha$.
    - `tree`: the pytree.

    **Returns:** a pytree shaped like `tree`; non-array leaves and `None` pass
    through. Dtypes follow JAX promotion (a Python number keeps each leaf's dtype).
    """
    return map_single(lambda x: scalar * x, tree)


@checked
def add_scale(tree_x: PyTree, scalar: Shaped[ArrayLike, ""], tree_y: PyTree) -> PyTree:
    r"""Adds a scaled pytree to another (an "axpy").

    $$ z = x + \alpha\, y $$

    **Arguments:**

    - `tree_x`: the pytree $x$.
    - `scalar`: the factor $\alpha$.
    - `tree_y`: the pytree $y$, of the same structure.

    **Returns:** a pytree shaped like `tree_x` (see `eqopt.tree.add` for
    non-array and `None` leaves: where `tree_y` is `None`, `tree_x` is kept, so
    `add_scale(model, -lr, grads)` works on the output of `eqx.filter_grad`).
    """
    return map_arrays(
        "add_scale",
        lambda x, y: x + scalar * y,
        [("tree_x", tree_x), ("tree_y", tree_y)],
    )


@checked
def conj(tree: PyTree) -> PyTree:
    r"""Takes the complex conjugate of every array leaf.

    $$ z = \bar x $$

    **Arguments:**

    - `tree`: the pytree.

    **Returns:** a pytree shaped like `tree`; real leaves are unchanged in value.
    """
    return map_single(jnp.conj, tree)


@checked
def real(tree: PyTree) -> PyTree:
    r"""Takes the real part of every array leaf.

    $$ z = \operatorname{Re} x $$

    **Arguments:**

    - `tree`: the pytree.

    **Returns:** a pytree shaped like `tree`, with real array leaves.
    """
    return map_single(jnp.real, tree)


@checked
def clip(
    tree: PyTree,
    min_value: Real[ArrayLike, "..."] | None = None,
    max_value: Real[ArrayLike, "..."] | None = None,
) -> PyTree:
    r"""Clips every array leaf to an interval.

    $$ z = \min(\max(x, a), b) $$

    **Arguments:**

    - `tree`: the pytree.
    - `min_value`: the lower bound $a$, or `None` for no lower bound.
    - `max_value`: the upper bound $b$, or `None` for no upper bound.

    **Returns:** a pytree shaped like `tree`.
    """
    return map_single(lambda x: jnp.clip(x, min_value, max_value), tree)


@checked
def where(condition: Bool[ArrayLike, "..."], tree_x: PyTree, tree_y: PyTree) -> PyTree:
    r"""Selects, leafwise, from `tree_x` where `condition` holds and from `tree_y` elsewhere.

    $$ z = \begin{cases} x & \text{if } c \\ y & \text{otherwise} \end{cases} $$

    **Arguments:**

    - `condition`: a boolean, or a boolean array broadcast against every leaf.
    - `tree_x`: the pytree chosen where `condition` is true.
    - `tree_y`: the pytree chosen elsewhere, of the same structure.

    **Returns:** a pytree shaped like `tree_x` (see `eqopt.tree.add` for
    non-array and `None` leaves).
    """
    return map_arrays(
        "where",
        lambda x, y: jnp.where(condition, x, y),
        [("tree_x", tree_x), ("tree_y", tree_y)],
    )


@checked
def batch_shape(tree: PyTree, shape: tuple[int, ...] = ()) -> PyTree:
    """Adds leading batch dimensions to every array leaf by broadcasting.

    **Arguments:**

    - `tree`: the pytree.
    - `shape`: the leading dimensions to add.

    **Returns:** a pytree whose array leaves have shape `shape + leaf.shape`.
    """
    return map_single(lambda x: jnp.broadcast_to(x, (*shape, *jnp.shape(x))), tree)


# ---------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------


def _pairwise(values: list[Any]) -> Any:
    """Sums a list as a balanced binary tree (an associative reduction)."""
    while len(values) > 1:
        values = [
            values[i] + values[i + 1] if i + 1 < len(values) else values[i]
            for i in range(0, len(values), 2)
        ]
    return values[0]


@checked
def sum(tree: PyTree, associative_reduction: bool = False) -> Shaped[Array, ""]:
    r"""The sum of all the elements of all the array leaves.

    $$ \sum_\ell \sum_i x_{\ell, i} $$

    **Arguments:**

    - `tree`: the pytree. Non-array leaves and `None` are ignored.
    - `associative_reduction`: sum the per-leaf sums as a balanced binary tree
      instead of left to right. This gives a shallower graph for models with
      many leaves, at the price of a different rounding order.

    **Returns:** a scalar array; `0` for a tree without array leaves.
    """
    sums = [jnp.sum(x) for x in array_leaves(tree)]
    zero = jnp.asarray(0)
    if not sums:
        return zero
    if associative_reduction:
        return _pairwise(sums) + zero
    return functools.reduce(operator.add, sums, zero)


@checked
def max(tree: PyTree) -> Shaped[Array, ""]:
    r"""The largest element over all the array leaves.

    $$ \max_{\ell, i} x_{\ell, i} $$

    **Arguments:**

    - `tree`: the pytree. Non-array leaves, `None` and empty arrays are ignored.

    **Returns:** a scalar array; $-\infty$ for a tree without elements.
    """
    maxima = [jnp.max(x) for x in array_leaves(tree) if x.size]
    return functools.reduce(jnp.maximum, maxima, jnp.asarray(-jnp.inf))


@checked
def min(tree: PyTree) -> Shaped[Array, ""]:
    r"""The smallest element over all the array leaves.

    $$ \min_{\ell, i} x_{\ell, i} $$

    **Arguments:**

    - `tree`: the pytree. Non-array leaves, `None` and empty arrays are ignored.

    **Returns:** a scalar array; $+\infty$ for a tree without elements.
    """
    minima = [jnp.min(x) for x in array_leaves(tree) if x.size]
    return functools.reduce(jnp.minimum, minima, jnp.asarray(jnp.inf))


@checked
def vdot(tree_x: PyTree, tree_y: PyTree) -> Shaped[Array, ""]:
    r"""The inner product of two pytrees, conjugating the first.

    $$ \langle x, y \rangle = \sum_\ell \sum_i \bar x_{\ell, i}\, y_{\ell, i} $$

    Each leaf's product is computed at the highest matmul precision.

    **Arguments:**

    - `tree_x`, `tree_y`: pytrees of the same structure and leaf shapes. Leaves
      that are `None` in either tree, or not arrays in `tree_x`, are skipped.

    **Returns:** a scalar array; `0` for trees without array leaves.

    **Raises:** `ValueError` naming the first path at which the structures or
    shapes disagree.
    """
    path_leaves, _, (y_leaves,) = zip_trees(
        "vdot", [("tree_x", tree_x), ("tree_y", tree_y)]
    )
    products = []
    for (path, x), y in zip(path_leaves, y_leaves, strict=True):
        if not eqx.is_array(x) or y is None:
            continue
        check_operand("vdot", path, "tree_y", y)
        if jnp.shape(x) != jnp.shape(y):
            raise ValueError(
                f"vdot: the leaves at {path_str(path)} have different shapes "
                f"({list(jnp.shape(x))} in `tree_x`, {list(jnp.shape(y))} in `tree_y`)."
            )
        products.append(inner(x, y))
    return functools.reduce(operator.add, products, jnp.asarray(0))


@checked
def norm(
    tree: PyTree, ord: int | float | str | None = None, squared: bool = False
) -> Real[Array, ""]:
    r"""The vector norm of all the array leaves taken together.

    $$
    \|x\|_2 = \Big(\sum_{\ell, i} |x_{\ell, i}|^2\Big)^{1/2}, \quad
    \|x\|_1 = \sum_{\ell, i} |x_{\ell, i}|, \quad
    \|x\|_\infty = \max_{\ell, i} |x_{\ell, i}|
    $$

    **Arguments:**

    - `tree`: the pytree. Non-array leaves and `None` are ignored.
    - `ord`: `None` or `2` for the Euclidean norm, `1`, or `jnp.inf` / `"inf"` /
      `"infinity"`.
    - `squared`: return the square of the norm. For `ord=2` the sum of squares is
      returned directly, without a square root.

    **Returns:** a real scalar array; `0` for a tree without array leaves.

    **Raises:** `ValueError` for any other `ord`.
    """
    leaves = array_leaves(tree)
    if ord is None or (not isinstance(ord, str) and ord == 2):
        sum_of_squares = functools.reduce(
            operator.add, [jnp.sum(abs_squared(x)) for x in leaves], jnp.asarray(0)
        )
        return sum_of_squares if squared else jnp.sqrt(sum_of_squares)
    if not isinstance(ord, str) and ord == 1:
        result = functools.reduce(
            operator.add, [jnp.sum(jnp.abs(x)) for x in leaves], jnp.asarray(0)
        )
    elif ord in ("inf", "infinity") or (not isinstance(ord, str) and ord == jnp.inf):
        # |x| >= 0, so starting the maximum at 0 changes nothing but the empty case.
        result = functools.reduce(
            jnp.maximum,
            [jnp.max(jnp.abs(x)) for x in leaves if x.size],
            jnp.asarray(0.0),
        )
    else:
        raise ValueError(f"Unsupported ord: {ord!r}. Use None, 1, 2, jnp.inf or 'inf'.")
    return jnp.square(result) if squared else result


@checked
def size(tree: PyTree) -> int:
    """The total number of elements of the array leaves.

    **Arguments:**

    - `tree`: the pytree. Non-array leaves and `None` are ignored.

    **Returns:** a Python `int`.
    """
    return builtins.sum(int(jnp.size(x)) for x in array_leaves(tree))


def _is_number(x: Any) -> bool:
    """A Python or NumPy number other than a bool."""
    return isinstance(x, (int, float, complex, np.number)) and not isinstance(
        x, (bool, np.bool_)
    )


@checked
def allclose(
    a: PyTree,
    b: PyTree,
    rtol: Real[ArrayLike, ""] = 1e-05,
    atol: Real[ArrayLike, ""] = 1e-08,
    equal_nan: bool = False,
) -> Bool[Array, ""]:
    r"""Whether two pytrees are elementwise equal within a tolerance.

    $$ |a - b| \le \text{atol} + \text{rtol}\, |b| \quad \text{everywhere} $$

    **Arguments:**

    - `a`, `b`: pytrees of the same structure. Array leaves, and Python or
      NumPy numbers on both sides, are compared with `jnp.allclose`; other
      leaves must be equal (`==`); a `None` matches only `None`.
    - `rtol`, `atol`: the relative and absolute tolerances.
    - `equal_nan`: whether NaNs in the same place count as equal.

    **Returns:** a boolean scalar array; `True` for trees without array leaves.

    **Raises:** `ValueError` naming the first path at which the structures or
    shapes disagree.
    """
    path_leaves, _, (b_leaves,) = zip_trees("allclose", [("a", a), ("b", b)])
    result = jnp.asarray(True)
    for (path, x), y in zip(path_leaves, b_leaves, strict=True):
        if x is None or y is None:
            if x is not y:
                return jnp.asarray(False)
            continue
        if eqx.is_array(x) or eqx.is_array(y) or (_is_number(x) and _is_number(y)):
            check_operand("allclose", path, "a", x)
            check_operand("allclose", path, "b", y)
            check_broadcast("allclose", path, ["a", "b"], [x, y])
            result = result & jnp.allclose(
                x, y, rtol=rtol, atol=atol, equal_nan=equal_nan
            )
        elif x != y:
            return jnp.asarray(False)
    return result
