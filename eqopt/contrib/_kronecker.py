"""Kronecker-factor bookkeeping shared by SOAP, Shampoo and PSGD Kron.

A tensor gradient $G$ of $k$ axes is preconditioned by one factor per axis; a
factor of `None` leaves that axis alone. These helpers merge small axes, form
the per-axis Gram matrices, apply one matrix per axis, and map a per-leaf
function over a gradient tree and state trees whose leaves are tuples of
factors.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, no_type_check

import jax
import jax.numpy as jnp

from .._base import is_none, is_trainable
from .._layer_axes import stack_axes
from .._leafwise import per_slice
from .._sharding import is_explicitly_sharded


def merge_small_dims(shape: Sequence[int], max_dim: int) -> tuple[int, ...]:
    """Merges neighbouring axes while their product stays at most `max_dim`.

    `(1, 2, 512, 1, 2048, 1, 3, 4)` with `max_dim=1024` becomes
    `(1024, 2048, 12)`; axes of size one disappear (all ones give `(1,)`), and a
    scalar stays a scalar.
    """
    if not shape:
        return ()
    merged, product = [], 1
    for size in shape:
        if product * size <= max_dim:
            product *= size
        else:
            if product > 1:
                merged.append(product)
            product = size
    if product > 1 or not merged:
        merged.append(product)
    return tuple(merged)


@no_type_check
def gram(x, axis):
    """$\\sum_{\\text{other axes}} x\\, \\bar x$: the Gram matrix of the slices of `x` along `axis`."""
    others = [i for i in range(x.ndim) if i != axis]
    return jnp.tensordot(x, x.conj(), axes=(others, others))


@no_type_check
def apply_per_axis(x, matrices, transpose=False):
    """Contracts axis $i$ of `x` with `matrices[i]` ($y_{\\ldots j \\ldots} =
    \\sum_k M_{kj} x_{\\ldots k \\ldots}$, or $M_{jk}$ with `transpose`); `None`
    leaves the axis as it is."""
    for matrix in matrices:
        if matrix is None:
            x = jnp.moveaxis(x, 0, -1)
        else:
            x = jnp.tensordot(x, matrix, axes=([0], [1 if transpose else 0]))
    return x


@dataclasses.dataclass(frozen=True)
class LeafGroup:
    """Rows (per-leaf tuples of arrays) with the same structure, shapes and dtypes.

    Their arrays are stacked along a new leading axis and the per-leaf work runs
    once, vmapped over it, so a model with many equal layers compiles one copy
    of that work instead of one per leaf. A row holding an explicitly sharded
    array is a group of its own and is not stacked (stacking would mix
    shardings). A leaf stacked with `eqx.filter_vmap` (one stack axis) is a
    group of its own whose rows are its slices: it is stacked already
    (`stacked`).
    """

    members: tuple[int, ...]
    batched: bool
    stacked: bool = False

    def stack(self, rows: Sequence[Any]) -> Any:
        """The members' rows, stacked (or the row itself, for a sharded one)."""
        if not self.batched or self.stacked:
            return rows[self.members[0]]
        return jax.tree.map(lambda *xs: jnp.stack(xs), *[rows[i] for i in self.members])

    def map(self, fn: Callable, *stacked: Any) -> Any:
        """`fn` on each member's slice of `stacked`."""
        return jax.vmap(fn)(*stacked) if self.batched else fn(*stacked)

    def unstack(self, stacked: Any, results: list) -> None:
        """Writes each member's slice of `stacked` into `results` at its index."""
        if not self.batched or self.stacked:
            results[self.members[0]] = stacked
            return
        for position, index in enumerate(self.members):
            results[index] = jax.tree.map(lambda x, j=position: x[j], stacked)


def group_leaves(
    rows: Sequence[Any], stacks: Sequence[int] | None = None
) -> list[LeafGroup]:
    """The rows grouped by structure, shapes and dtypes (see `LeafGroup`); a row
    whose leaf has a stack axis (`stacks`) is a stacked group of its own."""
    groups: dict[Any, list[int]] = {}
    sharded = set()
    stacked = set()
    for index, row in enumerate(rows):
        arrays, structure = jax.tree.flatten(row)
        if stacks is not None and stacks[index]:
            key = ("stacked", index)
            stacked.add(index)
        elif any(is_explicitly_sharded(x) for x in arrays):
            key = ("alone", index)
            sharded.add(index)
        else:
            key = (structure, tuple((x.shape, x.dtype) for x in arrays))
        groups.setdefault(key, []).append(index)
    return [
        LeafGroup(
            tuple(members),
            batched=members[0] not in sharded,
            stacked=members[0] in stacked,
        )
        for members in groups.values()
    ]


def map_leaves(fn: Callable, updates: Any, *trees: Any, n_out: int) -> tuple:
    """`fn(update, *parts)` per trainable leaf of `updates`, per layer.

    `trees` are shaped like `updates` up to its leaves and may hold a subtree
    (a tuple of factors) at each; where an update is `None` the outputs are
    `None` followed by the corresponding parts of `trees` unchanged.
    """
    leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    parts = [treedef.flatten_up_to(tree) for tree in trees]
    outs = []
    # Per layer: on a stacked leaf `fn` runs on each slice, its factors stacked.
    for u, stack, *rest in zip(leaves, stack_axes(updates), *parts, strict=True):
        if u is None:
            outs.append((None, *rest[: n_out - 1]))
        else:
            outs.append(per_slice(fn, stack)(u, *rest))
    return tuple(
        jax.tree.unflatten(treedef, [out[i] for out in outs]) for i in range(n_out)
    )


def map_params(fn: Callable, params: Any) -> Any:
    """`fn(leaf)` at each trainable (inexact array) leaf of `params`, `None` elsewhere."""
    return jax.tree.map(lambda p: fn(p) if is_trainable(p) else None, params)
