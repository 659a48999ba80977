"""The per-leaf call of a transform on quantised moments (`call_dequantized`),
and its CPU kernels in rows of blocks, where a lookup decodes the moments."""

from typing import Any, no_type_check

import equinox as eqx

from .._sharding import explicit_sharding
from ._array import _quantized_rows, _rows, is_quantized, requantize_all
from ._codec import _looks_up
from ._tree import dequantize_all


@no_type_check
def _block_rows(u: Any, rest: Any) -> int | None:
    """The block size in which an elementwise `fn(u, *rest)` runs on rows of
    blocks: where a quantised moment of `rest` is decoded by a lookup
    (`_looks_up`), every quantised moment is block-normalised with that block
    size, the other arrays of `rest` are shaped like `u`, and nothing is
    sharded over an explicit axis (a moment may have padding rows past its
    blocks: they are neither read nor computed). `None` otherwise: decoded
    arithmetically, a moment fuses into each kernel that reads it in any
    shape (and on the leaves cut from a packed buffer rows made the step 1.2
    times as long)."""
    quantized = [x for x in rest if is_quantized(x)]
    sizes = {x.block_size for x in quantized}
    if len(sizes) != 1 or not eqx.is_array(u) or explicit_sharding(u) is not None:
        return None
    if any(explicit_sharding(x.codes) is not None for x in quantized):
        return None  # padded under ZeRO, split where the leaf `u` is not
    if not any(x.kind == "dynamic" and _looks_up(x.bits, x.lookup) for x in quantized):
        return None
    (block,) = sizes
    if any(
        x.normalization != "block" or x.codes.shape[0] < -(-u.size // block)
        for x in quantized
    ):
        return None
    others = [x for x in rest if not is_quantized(x) and x is not None]
    if any(not eqx.is_array(x) or x.shape != u.shape for x in others):
        return None
    return block


@no_type_check
def call_dequantized(
    fn: Any, u: Any, rest: Any, elementwise: bool = False, step: Any = None
) -> Any:
    """`fn(u, *rest)` with each quantised moment of `rest` dequantised, and each
    output `k + 1` quantised again in the format of `rest[k]` where that was
    quantised (the per-leaf loop's convention: outputs after the update are the
    new values of the inputs after `u`).

    With `elementwise` (`fn` acts on each element alone), `fn` runs on the
    arrays cut into the moments' rows of blocks where `_block_rows` allows it:
    the values are the same, but the moments are decoded, updated and encoded
    in one shape, so XLA makes the new moment in the kernel that decodes the
    old one. Through the leaf's shape it decoded the old moment in a kernel of
    its own, which depends on nothing the step computes: a training step ran
    it early and kept every leaf's decoded moment alive through the backward
    pass (`benchmarks/lowbit_bench.py`, peak bytes). `step`: the optimiser's
    step count, which salts stochastic rounding (`requantize_all`)."""
    if not any(map(is_quantized, rest)):
        return fn(u, *rest)
    block = _block_rows(u, rest) if elementwise else None
    if block is not None:
        return _call_in_rows(fn, u, rest, block, step)
    out = fn(u, *(dequantize_all(x, u) for x in rest))
    if not isinstance(out, tuple):
        return out
    pairs = [
        (k, old, new)
        for k, (new, old) in enumerate(zip(out[1:], rest, strict=False))
        if is_quantized(old)
    ]
    requantized = requantize_all(
        [old for _, old, _ in pairs], [new for _, _, new in pairs], step
    )
    outputs = list(out[1:])
    for (k, _, _), new in zip(pairs, requantized, strict=True):
        outputs[k] = new
    return (out[0], *outputs)


@no_type_check
def _call_in_rows(fn, u, rest, block, step=None):
    """`call_dequantized` of an elementwise `fn` in rows of `block` elements.

    The update and the outputs that are not quantised again come back in the
    leaf's shape. A size that is not a whole number of blocks runs as its
    whole blocks and, apart, the rest of the last one (padded with zeros, as
    `_rows` pads), quantised apart and their codes joined (`requantize_all`);
    its update runs on the leaf flattened, the moments decoded without their
    padding (`_flat_values`), where joining the two parts' updates made XLA
    compile the parameter update into a loop it did not vectorise.
    """
    shape, size = u.shape, u.size
    whole = size // block * block
    rows = whole // block

    def head(x):
        if x is None:
            return None
        if is_quantized(x):
            return x._block_values(slice(rows))
        return x.reshape(-1)[:whole].reshape(rows, block)

    def tail(x):
        if x is None:
            return None
        if is_quantized(x):
            # The last block only (padding rows may follow it: `_with_rows`).
            return x._block_values(slice(rows, rows + 1))[:, : size - whole]
        return x.reshape(-1)[whole:][None]

    def flat(x):
        if x is None:
            return None
        return x._flat_values() if is_quantized(x) else x.reshape(-1)

    def outputs(out):
        return list(out) if isinstance(out, tuple) else [out]

    first = outputs(fn(*map(head, (u, *rest))))
    last = outputs(fn(*map(tail, (u, *rest)))) if whole != size else None
    plain = outputs(fn(*map(flat, (u, *rest)))) if whole != size else first
    moments = [k for k, old in enumerate(rest, 1) if is_quantized(old)]
    olds = [rest[k - 1] for k in moments]
    cut = {
        index: (
            _rows(first[k], old.kind, block),
            None if last is None else _rows(last[k], old.kind, block),
        )
        for index, (k, old) in enumerate(zip(moments, olds, strict=True))
    }
    new = _quantized_rows(olds, [first[k] for k in moments], cut, step)
    result = [x if x is None else x.reshape(shape) for x in plain]
    for k, moment in zip(moments, new, strict=True):
        result[k] = moment
    return tuple(result) if len(result) > 1 else result[0]
