"""What a leaf is: the predicates, paths and tree types every module uses.

It imports only the quantised-moment type (`_quantize`, which imports nothing of
eqopt).
"""

import sys
from typing import Any, TypeAlias, no_type_check

import equinox as eqx
import jax
from jax.tree_util import DictKey, FlattenedIndexKey

from ._quantize import QuantizedArray


class InputError(ValueError):
    """A `ValueError` in what was passed to eqopt, named by the leaf's path.

    Raised by the path checks of `init` and `update` (a tree that does not
    match the params, a leaf of the wrong shape, a mask that selects nothing);
    the entry of the outermost transform raises it again from its own frame,
    so the user's traceback ends at their call (see `eqopt/_entry.py`).
    """


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
    """Whether a leaf is a quantised moment (`eqopt.QuantizedArray`)."""
    # `type() is`: `isinstance` of a Module is Python code (an ABC's check), and
    # this runs on every node of a tree; `QuantizedArray` is final.
    return type(x) is QuantizedArray


@no_type_check
def is_state_leaf(x: Any) -> bool:
    """Where a per-leaf loop stops in a moment tree: `None` or a quantised moment."""
    return x is None or type(x) is QuantizedArray


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
    leaves = jax.tree.leaves(tree, is_leaf=is_quantized_moment)
    # Paths only when a leaf fails: building them costs more than the check
    # (this runs at every `update` of every transform, on every leaf).
    if all(map(_inexact_or_absent, leaves)):
        return None
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_quantized_moment)[0]
    for path, leaf in flat:
        if not _inexact_or_absent(leaf):
            return path_str(path), leaf
    return None


@no_type_check
def _inexact_or_absent(leaf: Any) -> bool:
    return eqx.is_inexact_array(leaf) or is_float0(leaf) or type(leaf) is QuantizedArray


@no_type_check
def path_str(path: Any, *, relative: bool = False) -> str:
    """A leaf's path, spelled one way across eqopt: `jax.tree_util.keystr`'s
    (`.blocks[3].w`, `['w']` for a dict's entry), with a name for the root.

    `relative=True` spells it as parameter groups match it and their report
    prints it: without the leading dot, and a dict's key that is a name
    written as an attribute (`blocks[3].w`, `w`), so that a group's regular
    expression reads as the model's code does (`^head\\.`).
    """
    path = tuple(path)
    if not relative:
        return jax.tree_util.keystr(path) or "<root>"
    return "".join(map(_relative, path)).removeprefix(".") or "<root>"


@no_type_check
def _relative(key: Any) -> str:
    if isinstance(key, DictKey) and isinstance(key.key, str) and key.key.isidentifier():
        return f".{key.key}"
    if isinstance(key, FlattenedIndexKey):
        return f"[{key.key}]"
    return jax.tree_util.keystr((key,))


#: Parameters: any pytree, typically a whole Equinox model. Its inexact arrays are
#: trainable. (`Any` rather than jaxtyping's `PyTree[Any]`: every object is a pytree,
#: so the check would accept anything after a walk over the whole model.)
Params: TypeAlias = Any


class _InexactTreeMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return first_non_inexact(obj) is None

    def explain(cls, obj: Any) -> str:
        """Why `obj` is not an `InexactTree`: the first offending leaf, by path."""
        found = first_non_inexact(obj)
        if found is None:
            return ""
        path, leaf = found
        kind = (
            f"an array of dtype {leaf.dtype}"
            if eqx.is_array(leaf)
            else f"a {type(leaf).__name__}"
        )
        return (
            f"a pytree of floating or complex arrays (None where a leaf is not trained), "
            f"but the leaf at {path} is {kind}. Pass gradients as `eqx.filter_grad` "
            "makes them (None at non-trainable leaves), not the model itself"
        )


class InexactTree(metaclass=_InexactTreeMeta):
    """The type of a pytree whose leaves are inexact arrays, `None` marking an absent leaf.

    It means `PyTree[Inexact[Array, "..."] | None]` and is checked by beartype
    like any class, in one pass over the leaves. jaxtyping's own `PyTree[...]`
    check costs about fifty times more per leaf, and eqopt checks updates and
    moments at every transform boundary: on a model of thousands of leaves that
    would dominate tracing.
    """


#: Updates or gradients: shaped like the params, `None` where a leaf is not trainable.
Updates: TypeAlias = InexactTree
#: An optimiser state: an `eqx.Module` for eqopt's own transforms, any pytree
#: otherwise (`Any`, as for `Params`).
OptState: TypeAlias = Any


_LIBRARIES = ("eqopt", "jaxtyping", "equinox", "beartype", "jax")


@no_type_check
def outside_eqopt() -> int:
    # The stack level of the first caller outside eqopt and the libraries it
    # calls through, so a warning points at the user's line.
    level, frame = 1, sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.split(".")[0] not in _LIBRARIES:
            return level
        frame, level = frame.f_back, level + 1
    return level
