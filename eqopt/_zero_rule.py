"""The ZeRO-1 rule: which dimension of each state leaf takes the data axis.

For each array leaf of the state: keep the sharding it has (the one of its
parameter), and add the data axis to its first dimension that divides evenly
by the axis size and is not already sharded. Leaves that cannot be split keep
their layout: scalars (counts, hyperparameters), leaves smaller than
`min_size`, and leaves with no such dimension. A leaf already sharded over the
axis (the moment of a fully sharded parameter) is left as it is. A quantised
moment (`eqopt.QuantizedArray`) is split over its blocks, codes and scales
together (rank-1 scales, one per row and column, stay whole); where the number
of blocks does not divide by the axis size, it is first padded with rows that
decode to zero (`pad_quantized`), so that low-bit state is split like float32
state.

Used by the state helpers (`eqopt/_zero.py`: `zero_shardings`, `shard_state`)
and by the plan of a training run (`eqopt/_zero_plan.py`).
"""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ._quantize import is_quantized
from ._quantize._array import _blocks, _with_rows
from ._sharding import host_kind, in_host_memory, to_memory

#: Leaves with fewer elements than this keep their layout by default: splitting
#: them saves little memory and adds a collective per leaf to every step.
MIN_SIZE = 1024


def is_array_like(x: Any) -> bool:
    # `eqx.is_array` is False for the `jax.ShapeDtypeStruct`s of an abstract state.
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct, np.ndarray))


def axes_of(axis: str | Sequence[str]) -> tuple[str, ...]:
    return (axis,) if isinstance(axis, str) else tuple(axis)


def axis_size(mesh: Any, axes: tuple[str, ...], caller: str) -> int:
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    missing = [name for name in axes if name not in sizes]
    if missing:
        raise ValueError(
            f"{caller}: the mesh has no axis {missing[0]!r} (its axes are "
            f"{tuple(mesh.axis_names)}); pass the data axis to split the state "
            f"over as `axis=`, for example `{caller}(..., axis="
            f"{mesh.axis_names[0]!r})`"
        )
    return int(np.prod([sizes[name] for name in axes]))


def pad_quantized(tree: Any, size: int, min_size: int) -> Any:
    """`tree` with each quantised moment of at least `min_size` elements given
    rows of codes to a multiple of `size` (padding rows past its blocks, which
    decode to zero, or none where its blocks divide; `_with_rows`).

    Without them, a moment whose block count does not divide the data axis
    (a 777×1000 weight has 3036 blocks of 256) stayed whole on every device:
    8-bit Adam then held more bytes per device than float32 Adam. Requantising
    keeps the rows, so the state keeps this shape from step to step. Works on
    an abstract state too (`jax.ShapeDtypeStruct` codes and scales).
    """

    def pad(x):
        # Rank-1 moments keep their rows: their scales stay whole, and their
        # codes are decoded whole (cut padding on an explicit axis cannot be).
        if not is_quantized(x) or x.size < min_size or x.normalization == "rank1":
            return x
        rows = -(-_blocks(x) // size) * size
        if not isinstance(x.codes, jax.ShapeDtypeStruct):
            # An offloaded moment is padded in device memory (`eqopt.offload`).
            host = in_host_memory(x.codes)
            x = jax.tree.map(lambda a: to_memory(a, False), x) if host else x
            x = _with_rows(x, rows)
            return jax.tree.map(lambda a: to_memory(a, True), x) if host else x
        if x.codes.shape[0] == rows:
            return x
        codes = jax.ShapeDtypeStruct(
            (rows, x.codes.shape[1]), x.codes.dtype, sharding=x.codes.sharding
        )
        scales = jax.ShapeDtypeStruct(
            (rows,), x.scales.dtype, sharding=x.scales.sharding
        )
        return eqx.tree_at(lambda q: (q.codes, q.scales), x, (codes, scales))

    return jax.tree.map(pad, tree, is_leaf=is_quantized)


def entries_of(sharding: Any, mesh: Any, ndim: int) -> list:
    """The `PartitionSpec` entries of `sharding` padded to `ndim`, or all `None`
    where the leaf is not laid out on a mesh with `mesh`'s axes."""
    spec = getattr(sharding, "spec", None)
    if spec is None or tuple(sharding.mesh.axis_names) != tuple(mesh.axis_names):
        return [None] * ndim
    return [*spec, *[None] * (ndim - len(spec))]


def _names(entry: Any) -> tuple:
    if entry is None:
        return ()
    return entry if isinstance(entry, tuple) else (entry,)


def _split_leaf(
    shape: tuple[int, ...],
    entries: list,
    axes: tuple[str, ...],
    size: int,
    min_size: int,
) -> tuple[list, str | None]:
    """The entries with `axes` added by the ZeRO rule, and why not where it is not."""
    if not shape:
        return entries, "a scalar"
    used = {name for entry in entries for name in _names(entry)}
    if used & set(axes):
        return entries, None  # split already (by its parameter, or an FSDP layout)
    if int(np.prod(shape)) < min_size:
        return (
            entries,
            f"{int(np.prod(shape))} elements, fewer than min_size={min_size}",
        )
    for dim, (length, entry) in enumerate(zip(shape, entries, strict=True)):
        if entry is None and length % size == 0:
            split = list(entries)
            split[dim] = axes[0] if len(axes) == 1 else axes
            return split, None
    return entries, f"no unsharded dimension of {shape} divisible by {size}"


def plan_leaves(
    tree: Any, mesh: Any, axis: str | Sequence[str], min_size: int, caller: str
):
    """Per array leaf of `tree`: its ZeRO sharding on `mesh` and why it was not
    split (`None` where it was)."""
    axes = axes_of(axis)
    size = axis_size(mesh, axes, caller)

    def leaf_plan(x):
        if is_quantized(x):
            return quantized_plan(x)
        if not is_array_like(x):
            return None
        sharding = getattr(x, "sharding", None)
        entries = entries_of(sharding, mesh, len(x.shape))
        split, reason = _split_leaf(tuple(x.shape), entries, axes, size, min_size)
        # A leaf in host memory (`eqopt.offload`) stays there, split alike.
        kind = host_kind(sharding)
        return NamedSharding(mesh, PartitionSpec(*split), memory_kind=kind), reason

    def quantized_plan(x):
        # Codes and scales are split together over their blocks (rows), never
        # across a block: a block's scale then sits with its codes, and the
        # codes read back flat (a split width made `dequantize` a reshape
        # that explicit axes refuse). `min_size` counts the moment's elements.
        entries = entries_of(getattr(x.codes, "sharding", None), mesh, 2)
        blocks = x.codes.shape[0]
        split, reason = _split_leaf((blocks,), entries[:1], axes, size, 0)
        if reason is not None:
            reason = (
                f"{blocks} blocks of codes, not divisible by {size} "
                "(`eqopt.zero_plan` and `eqopt.shard_state` pad them)"
            )
        if x.size < min_size:
            split = entries[:1]
            reason = f"{x.size} elements, fewer than min_size={min_size}"
        kind = host_kind(getattr(x.codes, "sharding", None))
        codes = NamedSharding(
            mesh, PartitionSpec(*split, *entries[1:]), memory_kind=kind
        )
        # Rank-1 scales (a maximum per row and per column) are not per block:
        # few, and read whole by every block, they stay whole.
        rank1 = getattr(x, "normalization", "block") == "rank1"
        scales = NamedSharding(
            mesh, PartitionSpec(*([None] if rank1 else split)), memory_kind=kind
        )
        return eqx.tree_at(
            lambda q: (q.codes, q.scales), x, ((codes, reason), (scales, reason))
        )

    return jax.tree.map(leaf_plan, tree, is_leaf=lambda x: x is None or is_quantized(x))


def is_plan(x: Any) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], NamedSharding)


def shardings_of(plans: Any) -> Any:
    return jax.tree.map(lambda plan: plan[0], plans, is_leaf=is_plan)


def reasons_of(plans: Any) -> tuple[tuple[str, str], ...]:
    flat = jax.tree_util.tree_flatten_with_path(plans, is_leaf=is_plan)[0]
    return tuple(
        (jax.tree_util.keystr(path), plan[1])
        for path, plan in flat
        if is_plan(plan) and plan[1] is not None
    )
