"""Filter specs: selecting leaves the way `eqx.filter` does ("Selecting parameters" in the docs)."""

import re
import warnings
from collections.abc import Callable
from typing import Any, TypeAlias, no_type_check

import jax
import jax.core
import numpy as np
from jaxtyping import Array, Bool, PyTree

from ._base import is_none, is_trainable, path_str
from ._layer_axes import one_layer, stack_axes_by_path
from ._leaves import outside_eqopt
from ._structure import first_difference
from .tree._state import _is_placeholder

#: A 0-d boolean array (NumPy or JAX) in a filter spec, read as the bool it holds.
BoolScalar: TypeAlias = np.bool_ | Bool[np.ndarray, ""] | Bool[Array, ""]

#: A filter spec: a bool, a per-leaf predicate, or a prefix pytree of these.
FilterSpec: TypeAlias = (
    bool
    | BoolScalar
    | Callable[[Any], Any]
    | PyTree[bool | BoolScalar | Callable[[Any], Any] | None]
)


@no_type_check
def as_filter_spec(filter_spec: Any) -> Any:
    """The filter spec with each 0-d boolean array (`np.array(True)`) as a Python bool.

    A mask is structure, decided when the transform is built: held as an array
    it would be traced under `jit`.
    """

    def as_bool(x):
        if isinstance(x, np.bool_):
            return bool(x)
        if (
            isinstance(x, (np.ndarray, jax.Array))
            and x.shape == ()
            and x.dtype == np.bool_
            and not isinstance(x, jax.core.Tracer)
        ):
            return bool(x)
        return x

    def is_leaf(x):
        return is_spec_leaf(x) or isinstance(x, (np.ndarray, jax.Array))

    return jax.tree.map(as_bool, filter_spec, is_leaf=is_leaf)


@no_type_check
def is_spec_leaf(x: Any) -> bool:
    # Equinox modules are callable pytrees: they are prefix trees, not predicates.
    return (
        x is None
        or isinstance(x, (bool, np.bool_))
        or (
            callable(x)
            and not isinstance(x, jax.tree_util.Partial)
            and not is_pytree_node(x)
        )
    )


@no_type_check
def is_pytree_node(x: Any) -> bool:
    return jax.tree_util.treedef_is_leaf(jax.tree.structure(x)) is False


def per_leaf_hint(where: str, kind: str, fix: str | None = None) -> str:
    """What every error about a callable written for Optax's whole-params call ends with.

    Optax calls a callable mask or label function on the whole params; eqopt
    applies it to each leaf, as `eqx.filter` does. `fix` is the call to show,
    e.g. `"masked(inner, mask_fn(params))"`.
    """
    example = f": `{fix}`" if fix else ""
    return (
        f"A callable in {where} is a per-leaf {kind}, applied to each leaf as "
        "`eqx.filter` does; it is never called on the whole params. For a function "
        "of the whole params (Optax's spelling), call it yourself and pass the tree "
        f"it returns{example}."
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:120]}" if text else type(error).__name__


def call_per_leaf(fn: Callable, leaf: Any, path, what: str, hint: str) -> Any:
    """`fn(leaf)`, with an error naming the leaf and the per-leaf rule if it raises."""
    try:
        return fn(leaf)
    except Exception as error:  # noqa: BLE001 - re-raised with the leaf's path
        raise ValueError(
            f"The {what} raised an error on the leaf at {path_str(path)} "
            f"({_first_line(error)}). {hint}"
        ) from error


def _to_bool(value: Any, path, what: str, hint: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if (
        hasattr(value, "shape")
        and getattr(value, "shape", None) == ()
        and not isinstance(value, jax.core.Tracer)
    ):
        try:
            return bool(value)
        except Exception:  # noqa: BLE001 - fall through to the error below
            pass
    raise ValueError(
        f"The {what} gave {type(value).__name__} at {path_str(path)}; expected a bool. "
        + hint
    )


def _as_bool(value: Any) -> Any:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if (
        hasattr(value, "shape")
        and value.shape == ()
        and not isinstance(value, jax.core.Tracer)
    ):
        return bool(value)
    return NOT_A_VALUE


#: What `as_value` returns for a value that is not a mask's bool or a label.
NOT_A_VALUE: Any = object()


def refuse_whole_params_reading(
    fn: Callable,
    tree: Any,
    per_leaf: Any,
    what: str,
    hint: str,
    as_value: Callable[[Any], Any],
) -> None:
    """Refuses a callable written for Optax's whole-params call that reads differently per leaf.

    eqopt applies a callable mask or label function to each leaf. A function of
    the whole params (`jax.tree_util.tree_map_with_path(..., params)`) often runs
    on a single leaf too, where every path is empty, and silently selects
    something else. So the function is also called on the whole `tree`: when that
    returns a tree shaped like `tree` whose values differ from the per-leaf ones
    (`per_leaf`, shaped like `tree`) at a trainable leaf, this raises, naming the
    leaf. When both readings agree, the callable works either way and is kept.
    """
    if not is_pytree_node(tree):
        return
    try:
        whole = fn(tree)
    except Exception:  # noqa: BLE001 - not a function of the whole params
        return
    structure = jax.tree.structure(tree, is_leaf=is_none)
    if jax.tree.structure(whole, is_leaf=is_none) != structure:
        return
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_none)[0]
    whole_leaves = structure.flatten_up_to(whole)
    per_leaf_leaves = structure.flatten_up_to(per_leaf)
    for (path, leaf), as_whole, as_leaf in zip(
        flat, whole_leaves, per_leaf_leaves, strict=True
    ):
        if not is_trainable(leaf):
            continue
        value = as_value(as_whole)
        if value is NOT_A_VALUE:
            return
        if value != as_leaf:
            raise ValueError(
                f"The {what} reads as a function of the whole params: called on "
                "them it returns a tree shaped like them, which gives "
                f"{value!r} at {path_str(path)} where calling it on that leaf "
                f"gives {as_leaf!r}. {hint}"
            )


def resolve_filter(
    filter_spec: FilterSpec,
    tree: Any,
    *,
    what: str = "filter spec",
    fix: str | None = None,
) -> Any:
    """Resolves a filter spec against `tree` into a tree of Python bools.

    Predicates are called on trainable leaves (inexact arrays) only; every other
    leaf resolves to `False` unless a bool in the spec covers it. The result has the structure of `tree` (with `None` treated as a leaf): one
    bool per leaf. `None` in the spec means `False`. Raises a `ValueError`
    naming the path if the spec is not a prefix of `tree` or a predicate does not
    return a bool (ending with `per_leaf_hint`, showing `fix`).
    """
    hint = per_leaf_hint("a filter spec", "predicate", fix)
    if _is_placeholder(tree):
        # `eqopt.tree.map_params` builds the state on a stand-in for the whole
        # params: every part of it is selected, as the params will be.
        return tree
    # A predicate sees one layer of a stacked leaf (docs/design.md, "The model
    # knows its layers").
    stacks = stack_axes_by_path(tree)

    def resolve_subtree(spec, subtree, prefix):
        flat = jax.tree_util.tree_flatten_with_path(subtree, is_leaf=is_none)[0]
        leaves = []
        for path, leaf in flat:
            full = prefix + path
            if spec is None:
                leaves.append(False)
            elif isinstance(spec, (bool, np.bool_)):
                leaves.append(bool(spec))
            elif not is_trainable(leaf):
                # Only trainable leaves can be selected, so a predicate such as
                # `lambda x: x.ndim > 1` never sees an activation function or None.
                leaves.append(False)
            else:
                predicate = f"predicate in the {what}"
                one = one_layer(leaf, stacks.get(full, 0))
                value = call_per_leaf(spec, one, full, predicate, hint)
                leaves.append(_to_bool(value, full, predicate, hint))
        treedef = jax.tree.structure(subtree, is_leaf=is_none)
        return jax.tree.unflatten(treedef, leaves)

    if is_spec_leaf(filter_spec):
        resolved = resolve_subtree(filter_spec, tree, ())
        if callable(filter_spec):
            refuse_whole_params_reading(
                filter_spec, tree, resolved, f"predicate in the {what}", hint, _as_bool
            )
        return resolved
    return map_prefix(
        resolve_subtree,
        filter_spec,
        tree,
        is_leaf=is_spec_leaf,
        what=f"The {what}",
        hint=" Build it with, for example, `jax.tree.map(lambda _: False, model)` "
        "and `eqx.tree_at`.",
    )


def map_prefix(
    fn: Callable[[Any, Any, tuple], Any],
    prefix: Any,
    tree: Any,
    *,
    is_leaf: Callable[[Any], bool],
    what: str,
    hint: str = "",
) -> Any:
    """Maps `fn(prefix_leaf, subtree, path)` over a prefix tree of `tree`.

    Each leaf of `prefix` (as told by `is_leaf`) is paired with the subtree of
    `tree` below it and its path; the results are put back in the structure of
    `prefix`. Raises a `ValueError` starting with `what` if `prefix` is not a
    prefix of `tree`.
    """
    prefix_flat, prefix_def = jax.tree_util.tree_flatten_with_path(
        prefix, is_leaf=is_leaf
    )
    try:
        subtrees = prefix_def.flatten_up_to(tree)
    except (ValueError, TypeError) as error:
        found = first_difference(prefix, tree, prefix=True)
        where = (
            f"at {found[0]}, it has {found[1]} where the params have {found[2]}"
            if found is not None
            else "it does not match them"
        )
        # JAX's name for the kind of difference ("Dict key mismatch"), if any.
        kind = re.match(r"[\w ]+ mismatch", str(error))
        kind = f" ({kind.group()})" if kind else ""
        raise ValueError(
            f"{what} is not a prefix of the params' structure{kind}: {where}.{hint}"
        ) from None
    results = [
        fn(leaf, subtree, path)
        for (path, leaf), subtree in zip(prefix_flat, subtrees, strict=True)
    ]
    return jax.tree.unflatten(prefix_def, results)


def select_trainable(
    filter_spec: FilterSpec, tree: Any, *, what: str = "mask", fix: str | None = None
) -> Any:
    """The bools of `resolve_filter`, and-ed with "is a trainable leaf"."""
    mask = resolve_filter(filter_spec, tree, what=what, fix=fix)
    return jax.tree.map(
        lambda selected, leaf: selected and is_trainable(leaf),
        mask,
        tree,
        is_leaf=is_none,
    )


def describe_spec(filter_spec: Any) -> str:
    """A few words naming a filter spec in a message: `lambda`, a function's name, a tree."""
    if isinstance(filter_spec, (bool, np.bool_)):
        return str(bool(filter_spec))
    if callable(filter_spec) and not is_pytree_node(filter_spec):
        name = getattr(filter_spec, "__qualname__", type(filter_spec).__name__)
        return "a lambda" if "<lambda>" in name else f"`{name}`"
    return f"a prefix tree of bools and predicates ({type(filter_spec).__name__})"


def warn_if_selects_nothing(
    selection: Any, what: str, filter_spec: Any, consequence: str
) -> None:
    """Warns once (at `init`) when a mask or group selects no trainable leaf.

    Configuration-driven code ("freeze the first k layers" with k = 0) builds
    such masks on purpose, so this is allowed; but it is also the sign of a
    mistyped spec, so it is said.
    """
    if not any(jax.tree.leaves(selection)):
        warnings.warn(
            f"The {what} ({describe_spec(filter_spec)}) selects no trainable leaf "
            f"(no inexact array), so {consequence}.",
            UserWarning,
            stacklevel=outside_eqopt(),
        )


def keep_selected(tree: Any, mask: Any) -> Any:
    """`tree` with `None` where the mask is False."""
    return jax.tree.map(
        lambda leaf, selected: leaf if selected else None, tree, mask, is_leaf=is_none
    )


def merge_selected(selected_tree: Any, other_tree: Any, mask: Any) -> Any:
    """Leaves of `selected_tree` where the mask is True, of `other_tree` elsewhere."""
    return jax.tree.map(
        lambda chosen, other, selected: chosen if selected else other,
        selected_tree,
        other_tree,
        mask,
        is_leaf=is_none,
    )
