"""Dtypes of pytrees: reading them and casting to them."""

from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import PyTree

from .._typecheck import checked
from ._paths import flatten, map_single, path_str, zip_trees


def _order(first: Any, second: Any, highest: bool) -> Any:
    """The higher (or lower) of two dtypes in the promotion order, if comparable."""
    promoted = jnp.promote_types(first, second)
    if promoted == jnp.dtype(second):
        return second if highest else first
    if promoted == jnp.dtype(first):
        return first if highest else second
    raise ValueError(
        f"Cannot order the dtypes {jnp.dtype(first)} and {jnp.dtype(second)}: "
        "neither is promoted to the other."
    )


@checked
def dtype(
    tree: PyTree,
    mixed_dtype_handler: Literal["promote", "highest", "lowest"] | None = None,
) -> np.dtype:
    """The dtype of the array leaves of a pytree.

    **Arguments:**

    - `tree`: the pytree. Non-array leaves and `None` are ignored.
    - `mixed_dtype_handler`: what to do when the array leaves have several dtypes.
        - `None`: raise a `ValueError` naming the first leaf whose dtype differs.
        - `"promote"`: their common type under `jnp.promote_types`.
        - `"highest"` / `"lowest"`: the highest / lowest in the order
          "$d_1 \\le d_2$ when $d_1$ promotes to $d_2$"; a `ValueError` if two
          dtypes are not comparable (e.g. `bfloat16` and `float16`).

    **Returns:** a NumPy dtype; JAX's default floating dtype for a tree without
    array leaves.
    """
    path_leaves = [(p, x) for p, x in flatten(tree)[0] if eqx.is_array(x)]
    if not path_leaves:
        return jnp.dtype(jnp.result_type(float))
    result = path_leaves[0][1].dtype
    for path, leaf in path_leaves[1:]:
        if mixed_dtype_handler is None:
            if leaf.dtype != result:
                raise ValueError(
                    f"dtype: the array leaves have different dtypes: {result} at "
                    f"{path_str(path_leaves[0][0])} but {leaf.dtype} at {path_str(path)}. "
                    "Pass `mixed_dtype_handler` to combine them."
                )
        elif mixed_dtype_handler == "promote":
            result = jnp.promote_types(result, leaf.dtype)
        else:
            result = _order(
                result, leaf.dtype, highest=mixed_dtype_handler == "highest"
            )
    return jnp.dtype(result)


@checked
def cast(tree: PyTree, dtype: DTypeLike | None) -> PyTree:
    """Casts every array leaf to a dtype.

    **Arguments:**

    - `tree`: the pytree. Non-array leaves and `None` pass through.
    - `dtype`: the dtype, or `None` to return `tree` unchanged.

    **Returns:** a pytree shaped like `tree`.
    """
    if dtype is None:
        return tree
    return map_single(lambda x: x.astype(dtype), tree)


@checked
def cast_like(tree: PyTree, other_tree: PyTree) -> PyTree:
    """Casts every array leaf to the dtype of the matching leaf of another pytree.

    **Arguments:**

    - `tree`: the pytree to cast.
    - `other_tree`: a pytree of the same structure whose array leaves give the
      dtypes. Where it has `None` or a non-array leaf, `tree`'s leaf is unchanged.

    **Returns:** a pytree shaped like `tree`.

    **Raises:** `ValueError` naming the first path at which the structures differ.
    """

    # Only dtypes are taken from `other_tree`, so shapes need not agree.
    path_leaves, treedef, (other_leaves,) = zip_trees(
        "cast_like", [("tree", tree), ("other_tree", other_tree)]
    )
    out = [
        x.astype(y.dtype) if eqx.is_array(x) and eqx.is_array(y) else x
        for (_, x), y in zip(path_leaves, other_leaves, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, out)
