"""Path-aware flattening and structure checks shared by `eqopt.tree`.

Every function of `eqopt.tree` sees a pytree the way an Equinox user does:

- an *array leaf* is a JAX or NumPy array (`eqx.is_array`), and only array
  leaves are computed on;
- any other leaf (an activation function, an int, a string, a Python float such
  as `Dropout.p`) is passed through unchanged and ignored by reductions;
- `None` (as `eqx.filter_grad` produces) marks an absent value.
"""

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp

from .._leaves import is_none as is_none, path_str as path_str

KeyPath: TypeAlias = tuple[Any, ...]


def describe(x: Any) -> str:
    """A short description of a subtree, for error messages."""
    if x is None:
        return "None"
    if eqx.is_array(x):
        return f"array {x.dtype}{list(x.shape)}"
    if isinstance(x, dict):
        return f"dict with keys {sorted(x.keys(), key=repr)}"
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return f"{type(x).__name__} of length {len(x)}"
    return type(x).__name__


def children(node: Any) -> tuple[list[tuple[Any, Any]], Any] | None:
    """One level of a pytree: `([(key, child), ...], treedef)`, or `None` for a leaf.

    `None` counts as a leaf. `treedef.unflatten(new_children)` rebuilds the node
    (frozen Modules included) with other children.
    """
    if node is None:
        return None
    pairs, treedef = jax.tree_util.tree_flatten_with_path(
        node, is_leaf=lambda c: c is not node
    )
    if len(pairs) == 1 and pairs[0][0] == () and pairs[0][1] is node:
        return None
    return [(path[0], child) for path, child in pairs], treedef


def first_difference(
    x: Any, y: Any, path: KeyPath = ()
) -> tuple[KeyPath, str, str] | None:
    """The first path at which two pytrees differ in structure (`None` counts as a leaf)."""
    x_level, y_level = children(x), children(y)
    if x_level is None and y_level is None:
        return None
    if x_level is None or y_level is None or type(x) is not type(y):
        return path, describe(x), describe(y)
    if x_level[1] != y_level[1]:
        if describe(x) != describe(y):
            return path, describe(x), describe(y)
        x_keys = "".join(jax.tree_util.keystr((k,)) for k, _ in x_level[0])
        y_keys = "".join(jax.tree_util.keystr((k,)) for k, _ in y_level[0])
        if x_keys != y_keys:
            return (
                path,
                f"{describe(x)} with children {x_keys}",
                f"{describe(y)} with children {y_keys}",
            )
        note = " (their static fields or pytree metadata differ)"
        return path, describe(x), describe(y) + note
    for (key, x_child), (_, y_child) in zip(x_level[0], y_level[0], strict=True):
        found = first_difference(x_child, y_child, (*path, key))
        if found is not None:
            return found
    return None


def structure_error(
    function: str, name: str, tree: Any, other_name: str, other: Any
) -> ValueError:
    found = first_difference(tree, other)
    if found is None:  # the treedefs differ in a way the walk cannot localise
        found = ((), describe(tree), describe(other))
    path, here, there = found
    return ValueError(
        f"{function}: `{name}` and `{other_name}` have different structures at "
        f"{path_str(path)}: {here} in `{name}`, {there} in `{other_name}`."
    )


def flatten(tree: Any) -> tuple[list[tuple[KeyPath, Any]], Any]:
    """`tree_flatten_with_path`, with `None` as a leaf."""
    return jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_none)


def zip_trees(
    function: str, named_trees: Sequence[tuple[str, Any]]
) -> tuple[list[tuple[KeyPath, Any]], Any, list[list[Any]]]:
    """Flattens the first tree with paths and the others up to the same structure.

    Raises a `ValueError` naming the first differing path if the structures differ.
    """
    (name, tree), *rest = named_trees
    path_leaves, treedef = flatten(tree)
    others = []
    for other_name, other in rest:
        other_leaves, other_treedef = jax.tree_util.tree_flatten(other, is_leaf=is_none)
        if other_treedef != treedef:
            raise structure_error(function, name, tree, other_name, other)
        others.append(other_leaves)
    return path_leaves, treedef, others


def check_operand(function: str, path: KeyPath, name: str, value: Any) -> None:
    if not eqx.is_array_like(value):
        raise ValueError(
            f"{function}: expected an array at {path_str(path)} of `{name}`, "
            f"got {describe(value)}."
        )


def check_broadcast(
    function: str, path: KeyPath, names: Sequence[str], values: Sequence[Any]
) -> None:
    shapes = [jnp.shape(v) for v in values]
    try:
        jnp.broadcast_shapes(*shapes)
    except ValueError:
        listed = ", ".join(
            f"{n}: {list(s)}" for n, s in zip(names, shapes, strict=True)
        )
        raise ValueError(
            f"{function}: incompatible shapes at {path_str(path)} ({listed})."
        ) from None


def map_arrays(
    function: str, fn: Callable[..., Any], named_trees: Sequence[tuple[str, Any]]
) -> Any:
    """Applies `fn` leafwise at the array leaves of the first tree.

    The result has the first tree's structure. Where the first tree has `None` the
    result is `None`; where it has a non-array leaf, or where another tree has
    `None` (an absent value), the first tree's leaf is kept unchanged. The other
    trees' leaves must be array-like with broadcast-compatible shapes.
    """
    path_leaves, treedef, others = zip_trees(function, named_trees)
    names = [name for name, _ in named_trees]
    out = []
    for index, (path, leaf) in enumerate(path_leaves):
        operands = [other[index] for other in others]
        if not eqx.is_array(leaf) or any(o is None for o in operands):
            out.append(leaf)
            continue
        for name, operand in zip(names[1:], operands, strict=True):
            check_operand(function, path, name, operand)
        if operands:
            check_broadcast(function, path, names, [leaf, *operands])
        out.append(fn(leaf, *operands))
    return jax.tree_util.tree_unflatten(treedef, out)


def array_leaves(tree: Any) -> list[Any]:
    """The array leaves of a pytree, in order."""
    return [x for x in jax.tree_util.tree_leaves(tree) if eqx.is_array(x)]


def map_single(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Applies `fn` to the array leaves of one tree; other leaves and `None` pass through."""
    return jax.tree_util.tree_map(lambda x: fn(x) if eqx.is_array(x) else x, tree)
