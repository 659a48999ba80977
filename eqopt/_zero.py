"""Optimiser state sharded over the data axis of a mesh (ZeRO stage 1).

In data-parallel training every device holds the whole model, and by default
the whole optimiser state: Adam's two moments are twice the model, on every
device. ZeRO-1 (Rajbhandari et al., 2020) splits the *state* over the devices
of the data axis, so that each holds $1/n$ of it, while the parameters and
gradients keep their own layout. eqopt owns its state, so the layout is one
call: these helpers compute shardings and constraints, and JAX's own engine
(`jit` with shardings, `jax.distributed`, Orbax) moves the bytes.

The rule, for each array leaf of the state: keep the sharding it has (the one
of its parameter), and add the data axis to its first dimension that divides
evenly by the axis size and is not already sharded. Leaves that cannot be
split keep their layout: scalars (counts, hyperparameters), leaves smaller than
`min_size`, and leaves with no such dimension. A leaf already sharded over the
axis (the moment of a fully sharded parameter) is left as it is. A quantised
moment (`eqopt.QuantizedArray`) is split over its blocks, codes and
scales together (rank-1 scales, one per row and column, stay whole); where
the number of blocks does not divide by the axis size, `zero_plan` and
`shard_state` first pad it with rows that decode to zero (`_padded`), so that
low-bit state is split like float32 state.

The plan of a training run (`eqopt.zero_plan`, `eqopt.ZeroPlan`) is in
`eqopt/_zero_plan.py`.
"""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.core
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from ._quantize import is_quantized
from ._quantize._array import _blocks, _with_rows
from ._sharding import host_kind, in_host_memory, to_memory
from ._typecheck import checked

#: Leaves with fewer elements than this keep their layout by default: splitting
#: them saves little memory and adds a collective per leaf to every step.
MIN_SIZE = 1024


def _is_array_like(x: Any) -> bool:
    # `eqx.is_array` is False for the `jax.ShapeDtypeStruct`s of an abstract state.
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct, np.ndarray))


def _axes(axis: str | Sequence[str]) -> tuple[str, ...]:
    return (axis,) if isinstance(axis, str) else tuple(axis)


def _axis_size(mesh: Any, axes: tuple[str, ...], caller: str) -> int:
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


def _padded(tree: Any, size: int, min_size: int) -> Any:
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


def _entries(sharding: Any, mesh: Any, ndim: int) -> list:
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


def _plan(tree: Any, mesh: Any, axis: str | Sequence[str], min_size: int, caller: str):
    """Per array leaf of `tree`: its ZeRO sharding on `mesh` and why it was not
    split (`None` where it was)."""
    axes = _axes(axis)
    size = _axis_size(mesh, axes, caller)

    def leaf_plan(x):
        if is_quantized(x):
            return quantized_plan(x)
        if not _is_array_like(x):
            return None
        sharding = getattr(x, "sharding", None)
        entries = _entries(sharding, mesh, len(x.shape))
        split, reason = _split_leaf(tuple(x.shape), entries, axes, size, min_size)
        # A leaf in host memory (`eqopt.offload`) stays there, split alike.
        kind = host_kind(sharding)
        return NamedSharding(mesh, PartitionSpec(*split), memory_kind=kind), reason

    def quantized_plan(x):
        # Codes and scales are split together over their blocks (rows), never
        # across a block: a block's scale then sits with its codes, and the
        # codes read back flat (a split width made `dequantize` a reshape
        # that explicit axes refuse). `min_size` counts the moment's elements.
        entries = _entries(getattr(x.codes, "sharding", None), mesh, 2)
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


def _is_plan(x: Any) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], NamedSharding)


def _shardings(plans: Any) -> Any:
    return jax.tree.map(lambda plan: plan[0], plans, is_leaf=_is_plan)


def _reasons(plans: Any) -> tuple[tuple[str, str], ...]:
    flat = jax.tree_util.tree_flatten_with_path(plans, is_leaf=_is_plan)[0]
    return tuple(
        (jax.tree_util.keystr(path), plan[1])
        for path, plan in flat
        if _is_plan(plan) and plan[1] is not None
    )


@checked
def zero_shardings(
    state: Any,
    mesh: Mesh | AbstractMesh,
    axis: str | Sequence[str] = "data",
    *,
    min_size: int = MIN_SIZE,
) -> Any:
    """The ZeRO-1 sharding of each array leaf of an optimiser state.

    Each array leaf keeps the sharding it has on `mesh` (its parameter's), and
    the `axis` of the mesh is added to its first dimension that divides evenly
    by the axis size and is not already sharded. Scalars, leaves smaller than
    `min_size` elements and leaves with no such dimension keep their layout
    (`eqopt.zero_unsplit` lists them); a leaf already sharded over `axis`
    is left as it is.

    **Arguments:**

    - `state`: an optimiser state, or the abstract one from
      `eqx.filter_eval_shape(opt.init, params)` (`jax.ShapeDtypeStruct` leaves,
      which `eqx.is_array` does not count as arrays; they are counted here).
    - `mesh`: the `jax.sharding.Mesh` (or a `jax.sharding.AbstractMesh`, to
      plan without devices).
    - `axis`: the mesh axis (or tuple of axes) to split the state over.
    - `min_size`: leaves with fewer elements are not split.

    **Returns:**

    A pytree shaped like `state` with a `jax.sharding.NamedSharding` at every
    array leaf and `None` elsewhere, for `jax.device_put`, `eqx.filter_shard`
    or the `out_shardings` of `jax.jit`.

    **References:**

    Rajbhandari, Rasley, Ruwase, He, *ZeRO: Memory Optimizations Toward Training
    Trillion Parameter Models*, SC 2020.
    """
    return _shardings(_plan(state, mesh, axis, min_size, "zero_shardings"))


@checked
def zero_unsplit(
    state: Any,
    mesh: Mesh | AbstractMesh,
    axis: str | Sequence[str] = "data",
    *,
    min_size: int = MIN_SIZE,
) -> dict[str, str]:
    """The array leaves of `state` that `eqopt.zero_shardings` leaves whole
    over `axis`, each with the reason: `{path: reason}`.

    Arguments as for `eqopt.zero_shardings`.
    """
    return dict(_reasons(_plan(state, mesh, axis, min_size, "zero_unsplit")))


def constrain(tree: Any, shardings: Any) -> Any:
    """Places each array of `tree` on the sharding at the same place in `shardings`.

    Outside `jit` this is `jax.device_put`; inside, a sharding constraint
    (`jax.lax.with_sharding_constraint` on automatic axes, `jax.sharding.reshard`
    on explicit ones), then a transfer to host memory where the sharding's
    memory kind is a host one (`eqopt.offload`); an array in host memory
    stays there. Leaves of `tree` that are not arrays, or where
    `shardings` has `None`, are returned unchanged; `tree` may have `None`
    where `shardings` has a sharding (a gradient that `eqx.filter_grad` did not
    compute).

    **Arguments:**

    - `tree`: a pytree (a state, gradients, updates, params).
    - `shardings`: a pytree shaped like `tree` with a sharding or `None` at each
      leaf, such as `eqopt.zero_shardings` or `eqopt.ZeroPlan`'s fields.

    **Returns:**

    `tree` with its arrays laid out on `shardings`.
    """

    def place(sharding, x):
        if sharding is None or not eqx.is_array(x):
            return x
        if isinstance(x, jax.core.Tracer):
            # The constraints keep an array's memory but do not move it.
            host = host_kind(sharding) is not None
            if host:
                sharding = NamedSharding(sharding.mesh, sharding.spec)
            if _explicit(sharding):
                x = jax.sharding.reshard(x, sharding)
            else:
                x = jax.lax.with_sharding_constraint(x, sharding)
            return to_memory(x, True) if host else x
        return jax.device_put(x, sharding)

    return jax.tree.map(place, shardings, tree, is_leaf=lambda x: x is None)


def _explicit(sharding: Any) -> bool:
    mesh = sharding.mesh
    return any(kind == AxisType.Explicit for kind in mesh.axis_types)


@checked
def shard_state(
    state: Any,
    mesh: Mesh,
    axis: str | Sequence[str] = "data",
    *,
    min_size: int = MIN_SIZE,
) -> Any:
    """`state` laid out on its `eqopt.zero_shardings`: ZeRO-1 for a state built
    already (outside `jit`; to build it straight into this layout without
    materialising it whole, use `eqopt.zero_plan`). A quantised moment whose
    block count does not divide the axis size is first padded with rows that
    decode to zero, as `eqopt.zero_plan` pads it.

    Arguments as for `eqopt.zero_shardings`; returns the state.
    """
    size = _axis_size(mesh, _axes(axis), "shard_state")
    state = _padded(state, size, min_size)
    return constrain(state, zero_shardings(state, mesh, axis, min_size=min_size))
