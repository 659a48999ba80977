"""Filter specs: selecting leaves the way `eqx.filter` does ("Selecting parameters" in the docs)."""

from collections.abc import Callable
from typing import Any, TypeAlias, no_type_check

import jax
import jax.core
import numpy as np
from jaxtyping import PyTree

from ._base import is_none, is_trainable, path_str

#: A filter spec: a bool, a per-leaf predicate, or a prefix pytree of these.
FilterSpec: TypeAlias = (
    bool | Callable[[Any], Any] | PyTree[bool | Callable[[Any], Any] | None]
)


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
                value = call_per_leaf(spec, leaf, full, predicate, hint)
                leaves.append(_to_bool(value, full, predicate, hint))
        treedef = jax.tree.structure(subtree, is_leaf=is_none)
        return jax.tree.unflatten(treedef, leaves)

    if is_spec_leaf(filter_spec):
        return resolve_subtree(filter_spec, tree, ())
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
        raise ValueError(
            f"{what} is not a prefix of the params' structure: {error}.{hint}"
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


def check_selects_something(mask: Any, what: str = "mask") -> None:
    if not any(jax.tree.leaves(mask)):
        raise ValueError(
            f"The {what} selects no trainable leaf (no inexact array). Check the filter "
            "spec: a mask that selects nothing is almost always a mistake."
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
