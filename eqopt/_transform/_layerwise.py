"""Per-leaf mapping for states that are not shaped like the params.

`leafwise` pairs each update with state leaves of the same shape. Layer-wise
transforms keep other things per leaf: a scalar (NovoGrad's second moment,
DoG's distance), or a tuple of vectors (SM3's accumulators). `layerwise` pairs
each update with whatever subtree each state holds at that leaf's position.
Both run per layer: on a leaf stacked with `eqx.filter_vmap` the function
sees one slice, and the state holds one value per slice (stacked on the same
leading axes).
"""

from collections.abc import Callable
from typing import Any, no_type_check

import jax
import jax.numpy as jnp

from .._base import Params, Updates, is_none, is_trainable, path_str
from .._layer_axes import stack_axes
from .._leafwise import per_slice
from .._structure import structure_mismatch_message


@no_type_check
def layerwise(fn: Callable, updates: Updates, *trees: Any, n_out: int) -> Any:
    """Maps `fn(update, *subtrees)` over the leaves of `updates`.

    Each of `trees` has the structure of `updates` down to its leaves, and any
    subtree (a scalar, a tuple of arrays, `None`) below each. Where an update is
    `None`, `fn` is not called: the outputs are `None` followed by the
    corresponding subtrees of the first `n_out - 1` trees, unchanged.

    Returns a tuple of `n_out` trees.
    """
    leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    others = []
    for tree in trees:
        try:
            others.append(treedef.flatten_up_to(tree))
        except (ValueError, TypeError):
            raise ValueError(
                structure_mismatch_message(
                    updates, tree, "updates", "state", prefix=True
                )
            ) from None
    outs = []
    # A stacked leaf is its layers: `fn` runs on each slice (`per_slice`).
    for u, stack, *rest in zip(leaves, stack_axes(updates), *others, strict=True):
        if u is None:
            outs.append((None, *rest[: n_out - 1]))
        else:
            outs.append(per_slice(fn, stack)(u, *rest))
    return tuple(
        jax.tree.unflatten(treedef, [o[i] for o in outs]) for i in range(n_out)
    )


@no_type_check
def map_trainable(fn: Callable, params: Params) -> Any:
    """`fn(leaf)` at each trainable leaf of `params`, `None` elsewhere (a state
    shaped like the params; `eqopt._leafwise.map_layers` for one per layer)."""
    return jax.tree.map(lambda p: fn(p) if is_trainable(p) else None, params)


@no_type_check
def real_dtype(x) -> Any:
    """The real dtype of an inexact array (`float32` for `complex64`)."""
    return jnp.finfo(x.dtype).dtype


def check_real(params: Params, name: str) -> None:
    """Raises a `ValueError` naming the first complex trainable leaf of `params`."""
    for path, p in jax.tree_util.tree_leaves_with_path(params):
        if is_trainable(p) and jnp.iscomplexobj(p):
            raise ValueError(
                f"{name} does not support complex parameters: the parameter at "
                f"{path_str(path)} is {p.dtype}. Train its real and imaginary "
                "parts as separate real arrays."
            )
