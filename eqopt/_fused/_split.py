"""Splitting a flat buffer into its leaves: one kernel per shape, one pass for the gradient.

Two costs made a training step through `Packed.unpack` slower than Optax's
per-leaf step; both are avoided here.

- **The gradient.** The transpose of one slice is a pad to the whole buffer,
  and the gradient of one slice per leaf was a sum of one pad per leaf: work,
  memory and program size proportional to (leaves x buffer size). Here the
  tangent of the pieces is one `lax.split`, whose transpose is a single
  concatenation: the packed gradient is assembled in one pass.
- **The compile time.** A slice at a constant offset is folded into the
  kernel that reads it, so every leaf's consumer (the bias add of each layer,
  the copy feeding each matrix product) became a kernel of its own, and XLA on
  CPU compiles each distinct kernel separately (about 25 ms each: 200 layers
  took 10 s where the unpacked model took 0.3 s). Here each leaf is a
  `dynamic_slice` at an offset that XLA sees only at run time (the offsets
  come out of a `lax.cond` whose two branches are the same table, so its
  predicate does not matter and XLA cannot fold it), and every leaf of a shape
  reads through the same kernel, as separate arrays would.

The numbers are those of slicing: only where the data is read from changes.
"""

from typing import Any, no_type_check

import jax
import numpy as np

#: Offsets are int32, so buffers up to this size take the runtime-offset path;
#: larger ones (and sharded ones, where a slice at an unknown offset would
#: gather the whole buffer) take static slices.
_MAX_RUNTIME_OFFSET_SIZE = 2**31 - 1


@no_type_check
def _runtime_offsets(buffer: Any, offsets: tuple[int, ...]) -> tuple:
    def table(_):
        return tuple(np.int32(offset) for offset in offsets)

    first = buffer[0]
    return jax.lax.cond(first == first, table, table, None)


@no_type_check
def _dynamic_pieces(buffer: Any, sizes: tuple[int, ...]) -> tuple:
    offsets = tuple(int(x) for x in np.cumsum((0,) + sizes[:-1]))
    return tuple(
        jax.lax.dynamic_slice_in_dim(buffer, offset, size)
        for offset, size in zip(_runtime_offsets(buffer, offsets), sizes, strict=True)
    )


@no_type_check
def _split_jvp(sizes, primals, tangents):
    (buffer,), (tangent,) = primals, tangents
    return _split_runtime(buffer, sizes), tuple(jax.lax.split(tangent, sizes))


_split_runtime = jax.custom_jvp(_dynamic_pieces, nondiff_argnums=(1,))
_split_runtime.defjvp(_split_jvp)


@no_type_check
def split_buffer(buffer: Any, sizes: tuple[int, ...], sharded: bool = False) -> tuple:
    """The consecutive pieces of a 1-D `buffer` of the given `sizes` (flat)."""
    if len(sizes) == 1:
        return (buffer,)
    if sharded or not 0 < buffer.shape[0] <= _MAX_RUNTIME_OFFSET_SIZE:
        return tuple(jax.lax.split(buffer, sizes))
    return _split_runtime(buffer, tuple(sizes))
