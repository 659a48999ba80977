r"""Euclidean projections onto convex sets, for arrays and pytrees.

Each function returns $\operatorname{argmin}_{p \in C} \|x - p\|_2$ for a set $C$,
where a pytree is seen as the one vector made of all its array leaves. Non-array
leaves (activation functions, ints...) and `None` pass through unchanged, so a
whole Equinox model can be projected.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, PyTree, Real

from .. import tree as _tree
from .._typecheck import checked
from ..tree._paths import map_arrays, map_single


def _restore_dtype(new: Array, old: Array) -> Array:
    """Casts a projected leaf back to its input's dtype, unless that was an integer one."""
    if jnp.issubdtype(old.dtype, jnp.inexact):
        return new.astype(old.dtype)
    return new


def _project_flat(
    function: str, tree: Any, project: Any, *, allow_empty: bool = False
) -> Any:
    """Projects the concatenation of all array leaves with `project(vector)`."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    arrays = [x for x in leaves if eqx.is_array(x)]
    if not arrays:
        if allow_empty:
            return tree
        raise ValueError(f"{function}: the pytree has no array leaves to project.")
    dtype = jnp.result_type(*arrays, float)
    vector = jnp.concatenate([jnp.ravel(x).astype(dtype) for x in arrays])
    projected = project(vector)
    out, offset = [], 0
    for leaf in leaves:
        if eqx.is_array(leaf):
            piece = projected[offset : offset + leaf.size].reshape(leaf.shape)
            out.append(_restore_dtype(piece, leaf))
            offset += leaf.size
        else:
            out.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, out)


# ---------------------------------------------------------------------------
# Coordinatewise sets
# ---------------------------------------------------------------------------


@checked
def projection_non_negative(tree: PyTree) -> PyTree:
    r"""Projects onto the non-negative orthant.

    $$ \operatorname{argmin}_{p \ge 0} \|x - p\|_2 = \max(x, 0) $$

    **Arguments:**

    - `tree`: an array or pytree. Non-array leaves and `None` pass through.

    **Returns:** a pytree shaped like `tree`.
    """
    return map_single(jax.nn.relu, tree)


def _bounds_tree(tree: Any, bound: Any) -> Any:
    """A bound given as one scalar/array for every leaf, or as a pytree like `tree`."""
    if eqx.is_array_like(bound):
        return map_single(lambda _: bound, tree)
    # Checked against `tree` (path-aware error) when the bounds are applied.
    return bound


@checked
def projection_box(tree: PyTree, lower: Any, upper: Any) -> PyTree:
    r"""Projects onto a box.

    $$ \operatorname{argmin}_{l \le p \le u} \|x - p\|_2 = \min(\max(x, l), u) $$

    **Arguments:**

    - `tree`: an array or pytree. Non-array leaves and `None` pass through.
    - `lower`: the lower bound $l$: a scalar (or array) used for every leaf, or a
      pytree shaped like `tree`.
    - `upper`: the upper bound $u$, likewise.

    **Returns:** a pytree shaped like `tree`.

    **Raises:** `ValueError` naming the first path at which a bound pytree does
    not match `tree`.
    """
    lower = _bounds_tree(tree, lower)
    upper = _bounds_tree(tree, upper)
    return map_arrays(
        "projection_box", jnp.clip, [("tree", tree), ("lower", lower), ("upper", upper)]
    )


@checked
def projection_hypercube(tree: PyTree, scale: Any = 1) -> PyTree:
    r"""Projects onto the hypercube $[0, s]^n$ (the unit hypercube by default).

    $$ \operatorname{argmin}_{0 \le p \le s} \|x - p\|_2 = \min(\max(x, 0), s) $$

    **Arguments:**

    - `tree`: an array or pytree. Non-array leaves and `None` pass through.
    - `scale`: the side $s$: a scalar, or a pytree shaped like `tree`.

    **Returns:** a pytree shaped like `tree`.
    """
    return projection_box(tree, 0, scale)


@checked
def projection_linf_ball(tree: PyTree, scale: Real[ArrayLike, ""] = 1) -> PyTree:
    r"""Projects onto the $\ell_\infty$ ball of radius $s$.

    $$ \operatorname{argmin}_{\|p\|_\infty \le s} \|x - p\|_2 = \min(\max(x, -s), s) $$

    **Arguments:**

    - `tree`: an array or pytree. Non-array leaves and `None` pass through.
    - `scale`: the radius $s$.

    **Returns:** a pytree shaped like `tree`.
    """
    return projection_box(tree, -jnp.asarray(scale), scale)


# ---------------------------------------------------------------------------
# Simplex and l1
# ---------------------------------------------------------------------------


def _simplex_vector(vector: Array, scale: Any) -> Array:
    """Sort-based projection of a vector onto $\\{p \\ge 0, \\sum p = s\\}$."""
    sorted_desc = jnp.sort(vector)[::-1]
    partial_sums = jnp.cumsum(sorted_desc)
    ranks = jnp.arange(1, vector.size + 1, dtype=vector.dtype)
    # The support size: how many sorted entries stay positive after the shift.
    support = jnp.sum(sorted_desc - (partial_sums - scale) / ranks > 0)
    support = jnp.maximum(support, 1)
    threshold = (partial_sums[support - 1] - scale) / support.astype(vector.dtype)
    return jnp.maximum(vector - threshold, 0)


@checked
def projection_simplex(tree: PyTree, scale: Real[ArrayLike, ""] = 1) -> PyTree:
    r"""Projects onto the simplex of sum $s$ (the probability simplex by default).

    $$
    \operatorname{argmin}_{p \ge 0,\ \sum_i p_i = s} \|x - p\|_2
    = \max(x - \tau, 0), \qquad
    \tau = \frac{1}{\rho}\Big(\sum_{j \le \rho} x_{(j)} - s\Big)
    $$

    where $x_{(1)} \ge x_{(2)} \ge \dots$ is $x$ sorted in decreasing order and
    $\rho$ the number of $j$ with $x_{(j)} > \frac{1}{j}(\sum_{k \le j} x_{(k)} - s)$.
    The whole pytree is one vector: its array leaves together sum to $s$.
    Differentiable almost everywhere.

    **Arguments:**

    - `tree`: an array or pytree. Non-array leaves and `None` pass through.
    - `scale`: the sum $s > 0$.

    **Returns:** a pytree shaped like `tree`; floating leaves keep their dtype,
    integer leaves become floating.

    **Raises:** `ValueError` if `tree` has no array leaves.

    **References:** Duchi, Shalev-Shwartz, Singer & Chandra, *Efficient
    Projections onto the ℓ1-Ball for Learning in High Dimensions*, ICML 2008;
    Condat, *Fast Projection onto the Simplex and the ℓ1 Ball*, Mathematical
    Programming 158, 2016.
    """
    return _project_flat(
        "projection_simplex",
        tree,
        lambda v: _simplex_vector(v, jnp.asarray(scale, v.dtype)),
    )


def _l1_sphere_vector(vector: Array, scale: Any) -> Array:
    return jnp.sign(vector) * _simplex_vector(jnp.abs(vector), scale)


@checked
def projection_l1_sphere(tree: PyTree, scale: Real[ArrayLike, ""] = 1) -> PyTree:
    r"""Projects onto the $\ell_1$ sphere of radius $s$.

    $$
    \operatorname{argmin}_{\|p\|_1 = s} \|x - p\|_2
    = \operatorname{sign}(x) \odot P_{\Delta_s}(|x|)
    $$

    with $P_{\Delta_s}$ the projection onto the simplex of sum $s$
    (`eqopt.projections.projection_simplex`). At $x = 0$ (where every point
    of the sphere is equally near) this returns $0$, as Optax does.

    **Arguments:**

    - `tree`: an array or pytree. Non-array leaves and `None` pass through.
    - `scale`: the radius $s > 0$.

    **Returns:** a pytree shaped like `tree`.

    **References:** Duchi, Shalev-Shwartz, Singer & Chandra, ICML 2008, §4;
    Condat, Mathematical Programming 158, 2016.
    """
    return _project_flat(
        "projection_l1_sphere",
        tree,
        lambda v: _l1_sphere_vector(v, jnp.asarray(scale, v.dtype)),
    )


@checked
def projection_l1_ball(tree: PyTree, scale: Real[ArrayLike, ""] = 1) -> PyTree:
    r"""Projects onto the $\ell_1$ ball of radius $s$.

    $$
    \operatorname{argmin}_{\|p\|_1 \le s} \|x - p\|_2 =
    \begin{cases}
    x & \text{if } \|x\|_1 \le s \\
    \operatorname{sign}(x) \odot P_{\Delta_s}(|x|) & \text{otherwise}
    \end{cases}
    $$

    with $P_{\Delta_s}$ the projection onto the simplex of sum $s$.

    **Arguments:**

    - `tree`: an array or pytree. Non-array leaves and `None` pass through.
    - `scale`: the radius $s > 0$.

    **Returns:** a pytree shaped like `tree`; a pytree without array leaves is
    returned unchanged.

    **References:** Duchi, Shalev-Shwartz, Singer & Chandra, *Efficient
    Projections onto the ℓ1-Ball for Learning in High Dimensions*, ICML 2008;
    Condat, *Fast Projection onto the Simplex and the ℓ1 Ball*, Mathematical
    Programming 158, 2016.
    """

    def project(vector):
        radius = jnp.asarray(scale, vector.dtype)
        inside = jnp.sum(jnp.abs(vector)) <= radius
        return jnp.where(inside, vector, _l1_sphere_vector(vector, radius))

    return _project_flat("projection_l1_ball", tree, project, allow_empty=True)


# ---------------------------------------------------------------------------
# l2
# ---------------------------------------------------------------------------


def _scale_leaves(tree: Any, factor: Array) -> Any:
    return map_single(lambda x: _restore_dtype(x * factor, x), tree)


@checked
def projection_l2_sphere(tree: PyTree, scale: Real[ArrayLike, ""] = 1) -> PyTree:
    r"""Projects onto the $\ell_2$ sphere of radius $s$.

    $$ \operatorname{argmin}_{\|p\|_2 = s} \|x - p\|_2 = \frac{s}{\|x\|_2}\, x $$

    The norm is that of all array leaves together. At $x = 0$ every point of
    the sphere is equally near and the result is NaN, as in Optax.

    **Arguments:**

    - `tree`: an array or pytree. Non-array leaves and `None` pass through.
    - `scale`: the radius $s$.

    **Returns:** a pytree shaped like `tree`.
    """
    return _scale_leaves(tree, jnp.asarray(scale) / _tree.norm(tree))


@checked
def projection_l2_ball(tree: PyTree, scale: Real[ArrayLike, ""] = 1) -> PyTree:
    r"""Projects onto the $\ell_2$ ball of radius $s$.

    $$ \operatorname{argmin}_{\|p\|_2 \le s} \|x - p\|_2 = \min\Big(1, \frac{s}{\|x\|_2}\Big)\, x $$

    The norm is that of all array leaves together. The gradient is finite
    everywhere, including at $x = 0$.

    **Arguments:**

    - `tree`: an array or pytree. Non-array leaves and `None` pass through.
    - `scale`: the radius $s$.

    **Returns:** a pytree shaped like `tree`.
    """
    squared_norm = _tree.norm(tree, squared=True)
    outside = squared_norm > jnp.square(scale)
    # Take the root only where it is used, so the gradient at 0 is not NaN.
    safe_norm = jnp.sqrt(jnp.where(outside, squared_norm, 1))
    factor = jnp.where(outside, scale / safe_norm, 1)
    return _scale_leaves(tree, factor)


# ---------------------------------------------------------------------------
# Affine sets
# ---------------------------------------------------------------------------


def _shift(function: str, x: Any, a: Any, coefficient: Array) -> Any:
    """$x - c\\,a$ leafwise, keeping $x$'s dtypes (a `None` in `a` counts as zero)."""
    return map_arrays(
        function,
        lambda xi, ai: _restore_dtype(xi - coefficient * ai, xi),
        [("x", x), ("a", a)],
    )


@checked
def projection_hyperplane(x: PyTree, a: PyTree, b: Real[ArrayLike, ""]) -> PyTree:
    r"""Projects onto the hyperplane $\{y : \langle a, y \rangle = b\}$.

    $$ \operatorname{argmin}_{\langle a, y \rangle = b} \|x - y\|_2
    = x - \frac{\langle a, x \rangle - b}{\|a\|_2^2}\, a $$

    **Arguments:**

    - `x`: an array or pytree to project. Non-array leaves and `None` pass through.
    - `a`: the normal vector, an array or pytree shaped like `x` (nonzero).
    - `b`: the offset.

    **Returns:** a pytree shaped like `x`, with `x`'s dtypes.

    **Raises:** `ValueError` naming the first path at which `a` does not match `x`.
    """
    coefficient = (_tree.vdot(a, x) - b) / _tree.vdot(a, a)
    return _shift("projection_hyperplane", x, a, coefficient)


@checked
def projection_halfspace(x: PyTree, a: PyTree, b: Real[ArrayLike, ""]) -> PyTree:
    r"""Projects onto the halfspace $\{y : \langle a, y \rangle \le b\}$.

    $$ \operatorname{argmin}_{\langle a, y \rangle \le b} \|x - y\|_2
    = x - \frac{\max(\langle a, x \rangle - b,\ 0)}{\|a\|_2^2}\, a $$

    **Arguments:**

    - `x`: an array or pytree to project. Non-array leaves and `None` pass through.
    - `a`: the normal vector, an array or pytree shaped like `x` (nonzero).
    - `b`: the offset.

    **Returns:** a pytree shaped like `x`, with `x`'s dtypes.

    **Raises:** `ValueError` naming the first path at which `a` does not match `x`.
    """
    coefficient = jax.nn.relu(_tree.vdot(a, x) - b) / _tree.vdot(a, a)
    return _shift("projection_halfspace", x, a, coefficient)


@checked
def projection_vector(x: PyTree, a: PyTree) -> PyTree:
    r"""Projects onto the line spanned by a vector $a$.

    $$ \operatorname{argmin}_{y = t a,\ t \in \mathbb{R}} \|x - y\|_2
    = \frac{\langle x, a \rangle}{\langle a, a \rangle}\, a $$

    **Arguments:**

    - `x`: an array or pytree to project.
    - `a`: the direction, an array or pytree shaped like `x` (nonzero).

    **Returns:** a pytree shaped like `a`; non-array leaves and `None` of `a`
    pass through.

    **Raises:** `ValueError` naming the first path at which `a` does not match `x`.
    """
    # `vdot` checks that `x` and `a` match, naming the first differing path.
    coefficient = _tree.vdot(x, a) / _tree.vdot(a, a)
    return map_single(lambda ai: _restore_dtype(coefficient * ai, ai), a)
