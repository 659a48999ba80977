"""The path-aware input checks of `update`: one error naming the first offending leaf."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp

from ._fused._pack import contains_packed
from ._leaves import (
    InputError,
    first_non_inexact,
    is_none,
    is_trainable,
    path_str,
)
from ._structure import structure_mismatch_message


@no_type_check
def _paths(tree: Any) -> list[str]:
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_none)[0]
    return [path_str(path) for path, _ in leaves]


def _describe(x: Any) -> str:
    if x is None:
        return "None"
    if eqx.is_array(x):
        return f"{x.dtype}{list(x.shape)}"
    return type(x).__name__


def check_updates(
    updates: Any,
    reference: Any,
    *,
    name: str = "updates",
    reference_name: str = "params",
) -> None:
    """Checks `updates` against the params (or a moment tree shaped like them).

    Runs at trace time. Raises one `ValueError` naming the path of the first
    offending leaf: a different tree structure, an update that is not an array
    or `None`, an update for a leaf that is not trainable, a different shape,
    or a complex update for a real parameter.
    """
    leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    reference_leaves, reference_treedef = jax.tree.flatten(reference, is_leaf=is_none)
    if treedef != reference_treedef and contains_packed(updates) != contains_packed(
        reference
    ):
        packed, plain = (
            (name, reference_name)
            if contains_packed(updates)
            else (reference_name, name)
        )
        raise InputError(
            f"`{packed}` is packed (`eqopt.pack`) but `{plain}` is not: pass the packed "
            "model wherever its packed gradients go, or unpack both."
        )
    if treedef != reference_treedef:
        raise InputError(
            structure_mismatch_message(updates, reference, name, reference_name)
        )
    _check_leaves(updates, leaves, reference_leaves, name, reference_name)


@no_type_check
def _check_leaves(updates, leaves, reference_leaves, name, reference_name) -> None:
    # Leaf by leaf, trees of one structure: arrays, trainable, shapes, dtypes.
    for index, (update, ref) in enumerate(zip(leaves, reference_leaves, strict=False)):
        if update is None:
            continue
        problem = None
        if not eqx.is_array(update):
            problem = f"is a {type(update).__name__}, expected a JAX array or None"
        elif not is_trainable(ref):
            problem = (
                f"is an array but the `{reference_name}` leaf there is "
                f"{_describe(ref)}, which is not trainable (not an inexact array)"
            )
        elif update.shape != ref.shape:
            problem = (
                f"has shape {tuple(update.shape)} but the `{reference_name}` leaf has "
                f"shape {tuple(ref.shape)}"
            )
        elif jnp.iscomplexobj(update) and not jnp.iscomplexobj(ref):
            problem = (
                f"is complex ({update.dtype}) but the `{reference_name}` leaf is real "
                f"({ref.dtype})"
            )
        if problem is not None:
            path = _paths(updates)[index]
            raise InputError(f"`{name}` at {path} {problem}.")


@no_type_check
def check_structure(
    updates: Any, params: Any, shapes: bool = True, unpacks: bool = False
) -> None:
    """The input check every `update` entry runs first: `updates` match `params`.

    Run by the `update` entry (`eqopt/_entry.py`) before an `update` method's
    body, so no wrapper maps over `updates` and `params` together before they
    are known to match. Cheap (two flattens, at trace time); it raises
    `check_updates`'s error, naming the first place where the trees differ or
    the first leaf of another shape. With `shapes=False` (a transform taking
    per-example updates, which have a batch axis) only the structure is
    checked. Nothing to check when `params` is `None`, nor when one of the
    trees is packed and the other not and the transform `unpacks` them (the
    packed adapter does); for one that runs on the buffers that is an error. When
    `updates` is not a tree of inexact arrays (a state passed as `updates`,
    say), the type check of `updates` says what is wrong instead, which is more
    to the point.
    """
    if params is None:
        return
    leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    reference_leaves, reference_treedef = jax.tree.flatten(params, is_leaf=is_none)
    if treedef == reference_treedef:
        if shapes:
            try:
                _check_leaves(updates, leaves, reference_leaves, "updates", "params")
            except InputError:
                # Not gradients at all (the model itself, say): the type check
                # of `updates` says so, which is more to the point.
                if first_non_inexact(updates) is None:
                    raise
        return
    if first_non_inexact(updates) is not None:
        return
    if unpacks and contains_packed(updates) != contains_packed(params):
        # Packed updates for unpacked params (or the reverse): the adapter
        # unpacks them for this transform.
        return
    check_updates(updates, params)
