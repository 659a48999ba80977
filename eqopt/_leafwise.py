"""Per-leaf helpers of the transforms: `leafwise` and the trees of zeros a state starts from.

`leafwise` is where a transform's per-leaf arithmetic meets the storage of its
state: a quantised moment (`eqopt.QuantizedArray`) is decoded for the
arithmetic and encoded again from its result (`eqopt._quantize`), and with
`elementwise=True` it may be computed in its rows of blocks.

It is also where a stack of layers becomes its layers: a per-layer function
(anything not `elementwise`) is run on each slice of a stacked leaf
(`per_slice`: `jax.vmap` over the stack axes that `eqopt._layer_axes`
describes), its state leaves sliced alike.
"""

from collections.abc import Callable
from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp

from ._checks import _paths
from ._layer_axes import stack_axes
from ._leaves import (
    InputError,
    Params,
    Updates,
    is_none,
    is_state_leaf,
    is_trainable,
)
from ._quantize import (
    call_dequantized,
    is_quantized,
    is_quantized_format,
    moment_like,
)
from ._structure import structure_mismatch_message
from ._typecheck import checked


def require_params(
    params: Any, name: str, call: str = "update(updates, state, params)"
) -> None:
    """Raises the one `ValueError` of transforms that need `params` and got none."""
    if params is None:
        raise InputError(f"{name} needs `params`: call `{call}`.")


@checked
def zeros_like_trainable(params: Params, dtype: Any = None) -> Updates:
    """A tree shaped like `params`: zeros at trainable leaves, `None` elsewhere.

    `dtype` may be a `eqopt.Quantized` format: the zeros are then a signed
    (first) moment stored in it.
    """
    if is_quantized_format(dtype):
        return moment_like(params, dtype)

    def zeros(p):
        if not is_trainable(p):
            return None
        return jnp.zeros_like(p, dtype=dtype if dtype is not None else p.dtype)

    return jax.tree.map(zeros, params)


def full_like_trainable_real(params: Params, value: Any) -> Updates:
    """A tree shaped like `params`: `value` at trainable leaves, `None` elsewhere.

    The arrays are real, in the real dtype of each parameter (`float32` for a
    `complex64` parameter): they hold squared moduli.
    """

    def full(p):
        if not is_trainable(p):
            return None
        # `full_like` keeps the parameter's sharding; `full(p.shape, ...)` would not.
        return jnp.full_like(p, value, dtype=jnp.finfo(p.dtype).dtype)

    return jax.tree.map(full, params)


@no_type_check
def per_slice(fn: Callable, stack: int) -> Callable:
    """`fn` run on each slice of a stack of `stack` leading axes (`jax.vmap`, batched).

    The first argument is a stacked leaf; every array among the arguments
    (through pytrees) whose leading axes are the first's stack axes is sliced
    alike, every other argument (`None`, a scalar, dimension numbers) is
    passed to each slice as it is. The outputs are stacked on the same axes.
    With `stack == 0` this is `fn` itself: an unstacked leaf runs as before.
    """
    if stack == 0:
        return fn

    @no_type_check
    def stacked(*args):
        lead = tuple(args[0].shape[:stack])
        flat, treedef = jax.tree.flatten(args, is_leaf=is_none)
        mapped = [
            eqx.is_array(x) and tuple(x.shape[:stack]) == lead and x.ndim >= stack
            for x in flat
        ]

        @no_type_check
        def one(*slices):
            it = iter(slices)
            leaves = [next(it) if m else x for x, m in zip(flat, mapped, strict=True)]
            return fn(*jax.tree.unflatten(treedef, leaves))

        for _ in range(stack):
            one = jax.vmap(one)
        return one(*[x for x, m in zip(flat, mapped, strict=True) if m])

    return stacked


@no_type_check
@checked
def leafwise(
    fn: Callable,
    updates: Updates,
    *trees: Any,
    n_out: int | None = None,
    elementwise: bool = False,
    per_layer: bool | None = None,
    step: Any = None,
) -> Any:
    """Maps `fn` over the leaves of `updates` and trees shaped like it.

    Where an update is `None`, `fn` is not called: the output is `None` (or, when
    `fn` returns a tuple of `n_out` values, `None` followed by the corresponding
    inputs from `trees` unchanged, so moments of untouched leaves are kept).

    With `elementwise` (`fn` acts on each element alone), quantised moments
    may be computed in their rows of blocks (`call_dequantized`). Without it,
    `fn` is a per-layer function: on a stacked leaf (`eqopt._layer_axes`:
    a layer built with `eqx.filter_vmap`, or the user's `stack_axes`) it runs
    on each slice, batched (`per_slice`), and sees one layer. A leaf without
    stack axes runs exactly as before. `per_layer=False` runs `fn` on the whole
    leaf even so: for a term of a global reduction (a norm of all the
    updates), where a slice's value is not wanted. `step` (the transform's
    step count) salts the stochastic rounding of quantised moments, so that
    it draws the same in every program layout (`eqopt._quantize`).

    Returns a tree, or with `n_out` a tuple of `n_out` trees.
    """
    leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    others = []
    for tree in trees:
        other_leaves, other_treedef = jax.tree.flatten(tree, is_leaf=is_state_leaf)
        if other_treedef != treedef:
            raise InputError(
                structure_mismatch_message(updates, tree, "updates", "state")
            )
        others.append(other_leaves)
    # Elementwise arithmetic is the same on a slice and on the stack.
    if per_layer is None:
        per_layer = not elementwise
    stacks = stack_axes(updates) if per_layer else None
    for index, (u, *rest) in enumerate(zip(leaves, *others, strict=False)):
        if u is None:
            continue
        for other in rest:
            if (eqx.is_array(other) or is_quantized(other)) and tuple(
                other.shape
            ) != tuple(u.shape):
                path = _paths(updates)[index]
                raise InputError(
                    f"`updates` at {path} has shape {tuple(u.shape)} but the state (or "
                    f"params) there has shape {tuple(other.shape)}: was the state made "
                    "for other params?"
                )

    @no_type_check
    def call(index: int, u: Any, rest: list) -> Any:
        try:
            # A quantised moment is dequantised for `fn` and its result re-quantised.
            f = fn if stacks is None else per_slice(fn, stacks[index])
            return call_dequantized(f, u, rest, elementwise, step)
        except (TypeError, AttributeError) as error:
            # A `None` where the update is an array: `init` saw a leaf that is not
            # trainable. (A transform may keep `None` on purpose and handle it, so
            # only a failure is reported.)
            if not any(other is None for other in rest):
                raise
            raise InputError(
                f"`updates` at {_paths(updates)[index]} is an array but the state "
                "(or params) holds nothing there: `init` saw a leaf that is not "
                "trainable (not an inexact array). Give that leaf no gradient "
                "(`None`), or make it an array before `init`."
            ) from error

    if n_out is None:
        out = [
            None if u is None else call(index, u, rest)
            for index, (u, *rest) in enumerate(zip(leaves, *others, strict=False))
        ]
        return jax.tree.unflatten(treedef, out)
    outs = []
    for index, (u, *rest) in enumerate(zip(leaves, *others, strict=False)):
        if u is None:
            outs.append((None, *rest[: n_out - 1]))
        else:
            outs.append(call(index, u, rest))
    return tuple(
        jax.tree.unflatten(treedef, [o[i] for o in outs]) for i in range(n_out)
    )


@no_type_check
def map_layers(fn: Callable, tree: Any, *others: Any) -> Any:
    """`fn(leaf, *subtrees)` at each trainable leaf of `tree`, `None` elsewhere, per layer.

    Each of `others` has the structure of `tree` down to its leaves and any
    subtree below (dimension numbers, `None`). On a stacked leaf `fn` runs on
    each slice (`per_slice`), so a state made by `init` from one layer's shape
    is stacked on the leaf's stack axes.
    """
    leaves, treedef = jax.tree.flatten(tree, is_leaf=is_none)
    rest = [treedef.flatten_up_to(other) for other in others]
    stacks = stack_axes(tree)
    out = [
        per_slice(fn, stack)(leaf, *subtrees) if is_trainable(leaf) else None
        for leaf, stack, *subtrees in zip(leaves, stacks, *rest, strict=True)
    ]
    return jax.tree.unflatten(treedef, out)
