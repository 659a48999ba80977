"""What a leaf is: the predicates every module uses (a leaf module: it imports only
the quantised-moment type, which imports nothing of eqopt)."""

from typing import Any, no_type_check

import equinox as eqx
import jax

from ._quantize import QuantizedArray


# Called once per leaf (often as `is_leaf`): exempt from the type-check wrapper.
@no_type_check
def is_none(x: Any) -> bool:
    """Whether a leaf is `None` (an absent gradient or state)."""
    return x is None


@no_type_check
def is_trainable(x: Any) -> bool:
    """Whether a leaf is trained: an inexact (floating or complex) JAX array."""
    return eqx.is_inexact_array(x)


@no_type_check
def is_quantized_moment(x: Any) -> bool:
    """Whether a leaf is a quantised moment ([`eqopt.QuantizedArray`][])."""
    return isinstance(x, QuantizedArray)


@no_type_check
def is_state_leaf(x: Any) -> bool:
    """Where a per-leaf loop stops in a moment tree: `None` or a quantised moment."""
    return x is None or isinstance(x, QuantizedArray)


@no_type_check
def is_float0(x: Any) -> bool:
    """Whether a leaf is a `float0` gradient, as `jax.grad(..., allow_int=True)` gives
    for integer leaves. eqopt treats it as `None`: no update."""
    return getattr(x, "dtype", None) == jax.dtypes.float0


@no_type_check
def drop_float0(tree: Any) -> Any:
    """`tree` with every `float0` leaf replaced by `None` (the tree itself if it has none)."""
    if tree is None:
        return None
    leaves = jax.tree.leaves(tree)
    if not any(is_float0(leaf) for leaf in leaves):
        return tree
    return jax.tree.map(lambda x: None if is_float0(x) else x, tree)


@no_type_check
def first_non_inexact(tree: Any) -> tuple[str, Any] | None:
    """The path and value of the first leaf that is neither an inexact array, `None`,
    `float0` nor a quantised moment, or `None` if there is no such leaf."""
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_quantized_moment)[0]
    for path, leaf in flat:
        if not (
            eqx.is_inexact_array(leaf)
            or is_float0(leaf)
            or isinstance(leaf, QuantizedArray)
        ):
            return jax.tree_util.keystr(path) or "<root>", leaf
    return None
