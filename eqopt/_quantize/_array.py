"""`eqopt.QuantizedArray`: a moment as codes and scales, quantised and
requantised (block-wise, cut into whole blocks and a rest, or rank-1)."""

import dataclasses
import math
from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, UInt8

from .._sharding import gathered
from .._typecheck import checked
from ._codec import (
    _decode,
    _encode,
    _looks_up,
    _pack_nibbles,
    _unpack_nibbles,
    row_salts,
)


@checked
class QuantizedArray(eqx.Module):
    """An optimiser moment stored as codes with block-wise or rank-1 scales.

    Made by `init` of a transform given a `eqopt.Quantized` moment dtype.
    Read it with `dequantize()` (or through
    `eqopt.tree.get`, which dequantises); it serialises, checkpoints and
    crosses `jit` as its two arrays.

    **Fields:** `codes` (uint8, the flattened moment in rows of `block_size`
    elements; two 4-bit codes per byte; rows past the moment's last block,
    if any, are padding: `eqopt.zero_plan` adds them so that the rows divide
    by the data axis, and requantising keeps them), `scales` (float32: with
    `"block"` normalisation one per row of codes, the block's absolute
    maximum, zero on a padding row; with
    `"rank1"` the maxima of every slice along each axis, concatenated: a
    matrix's row maxima, then its column maxima), and static `shape`, `dtype`
    (of the dequantised array), `bits`, `kind` (`"dynamic"` or `"linear"`: a
    signed first moment; `"sqrt"`: a second moment stored as $\\sqrt v$ on the
    linear map without zero), `normalization` (`"block"` or `"rank1"`),
    `rounding` (`"nearest"` or `"stochastic"`, for the next quantisation) and
    `lookup` (whether the codes may be decoded by a lookup in the map where the
    backend makes that the faster way, `eqopt._backend.decodes_by_lookup`; a
    moment of a leaf cut from a packed buffer is not, for the packed adapter's
    call: see `with_lookup`).
    """

    codes: UInt8[Array, "blocks width"]
    scales: Float[Array, " scales"]
    shape: tuple[int, ...] = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)
    bits: int = eqx.field(static=True)
    kind: str = eqx.field(static=True)
    normalization: str = eqx.field(static=True, default="block")
    rounding: str = eqx.field(static=True, default="nearest")
    lookup: bool = eqx.field(static=True, default=True)

    @property
    def size(self) -> int:
        """The number of elements of the dequantised array."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes held: codes and scales."""
        return self.codes.size * self.codes.dtype.itemsize + self.scales.size * 4

    def dequantize(self) -> Array:
        """The moment as an array of `shape` and `dtype`."""
        if self.normalization == "rank1":
            scaled = _unflatten(self._unit(), self.shape) * _rank1_scales(
                self.scales, self.shape
            )
            return self._values(scaled)
        return self._flat_values().reshape(self.shape)

    def _unit(self, rows: slice = slice(None)) -> Array:
        # The map's value of each code, in rows (those of `rows`), before scaling.
        return self._decoded(self.codes[rows])

    def _decoded(self, codes: Array, size: int | None = None) -> Array:
        # The map's value of each code of `codes` (rows of this array's codes),
        # flattened and cut to `size` before decoding where `size` is given.
        codes = codes if self.bits == 8 else _unpack_nibbles(codes)
        if size is not None:
            codes = codes.reshape(-1)[:size]
        return _decode(codes, self.kind, self.bits, _looks_up(self.bits, self.lookup))

    def _block_values(self, rows: slice = slice(None)) -> Array:
        # Block normalisation: the values in rows of `block_size` (with the
        # padding; those of `rows`, cut before decoding), in `dtype`.
        return self._values(self._unit(rows) * self.scales[rows, None])

    def _flat_values(self) -> Array:
        # Block normalisation: the values flattened, the padding cut from the
        # codes and scales before decoding (cut after, the decoded rows were a
        # float32 temporary of their own).
        codes, scales = self.codes, self.scales
        if codes.shape[0] * self.block_size != self.size:
            # Cut below: a cut of codes split over an explicit axis (padding
            # rows under ZeRO) has no shape JAX can reshape, so gather first.
            (codes, _), (scales, _) = gathered(codes), gathered(scales)
        unit = self._decoded(codes, self.size)
        rows = (scales.shape[0], self.block_size)
        scales = jnp.broadcast_to(scales[:, None], rows).reshape(-1)
        return self._values(unit * scales[: self.size])

    def _values(self, scaled: Array) -> Array:
        # Scaled codes as the moment's values: squared for a second moment
        # (stored as its root), in `dtype`.
        if self.kind == "sqrt":
            scaled = scaled * scaled
        return scaled.astype(self.dtype)

    @classmethod
    def quantize(
        cls,
        x: Array,
        bits: int,
        kind: str,
        block_size: int,
        dtype: Any = None,
        normalization: str = "block",
        rounding: str = "nearest",
    ) -> "QuantizedArray":
        """Quantises `x` (`kind`, `normalization` and `rounding` as for the fields)."""
        dtype = jnp.result_type(x) if dtype is None else dtype
        if normalization == "rank1":
            return _quantize_rank1(x, bits, kind, block_size, dtype, rounding)
        rows = _rows(x, kind, block_size)
        (maxima,) = _block_maxima([rows])
        return cls._from_rows(rows, maxima, tuple(x.shape), bits, kind, dtype, rounding)

    @classmethod
    def _from_rows(
        cls,
        rows: Array,
        maxima: Array,
        shape: tuple[int, ...],
        bits: int,
        kind: str,
        dtype: Any,
        rounding: str = "nearest",
        first_row: int = 0,
        salt: Array | None = None,
    ) -> "QuantizedArray":
        # A second moment stores sqrt(v): its scale is the root of the block's
        # maximum, and the root of each element is taken only here, by the
        # encoder (taken before the maximum, it made XLA keep sqrt(v) as a
        # float32 temporary shared by the reduction and the encoder).
        scales = maxima
        if kind == "sqrt":
            scales, rows = jnp.sqrt(maxima), jnp.sqrt(rows)
        codes = _encode(
            rows * _inverse(scales)[:, None], kind, bits, rounding, first_row, salt
        )
        if bits == 4:
            codes = _pack_nibbles(codes)
        return cls(
            codes=codes,
            scales=scales,
            shape=shape,
            dtype=dtype,
            bits=bits,
            kind=kind,
            rounding=rounding,
        )

    @classmethod
    def full(
        cls,
        shape: tuple[int, ...],
        value: float | ArrayLike,
        bits: int,
        kind: str,
        block_size: int,
        dtype: Any = jnp.float32,
        like: Array | None = None,
        normalization: str = "block",
        rounding: str = "nearest",
    ) -> "QuantizedArray":
        """A constant, built as codes and scales (no quantisation runs)."""
        size = math.prod(shape)
        blocks = -(-size // block_size)
        # The code of 1: the scale carries the value (and its sign), so the
        # value may be traced and zero needs no code of its own.
        code = 2 * (2 ** (bits - 1) - 1) if kind == "linear" else 2**bits - 1
        value = jnp.asarray(value, jnp.float32)
        scale = jnp.sqrt(jnp.maximum(value, 0.0)) if kind == "sqrt" else value
        width = block_size if bits == 8 else block_size // 2
        byte = code if bits == 8 else code | (code << 4)
        codes = jnp.full((blocks, width), byte, jnp.uint8)
        # Rank-1: every slice's maximum is the constant, and so is their least.
        count = sum(shape) if normalization == "rank1" else blocks
        scales = jnp.broadcast_to(scale, (count,)).astype(jnp.float32)
        return cls(
            codes=codes,
            scales=scales,
            shape=tuple(shape),
            dtype=dtype,
            bits=bits,
            kind=kind,
            normalization=normalization,
            rounding=rounding,
        )

    @property
    def block_size(self) -> int:
        """Elements per row of codes (and per scale, with block normalisation)."""
        return self.codes.shape[1] * (1 if self.bits == 8 else 2)

    def requantize(self, x: Array) -> "QuantizedArray":
        """`x` (shaped like this array) quantised in this array's format."""
        (new,) = requantize_all([self], [x])
        return new


@no_type_check
def is_quantized(x: Any) -> bool:
    """Whether `x` is a `eqopt.QuantizedArray`."""
    return isinstance(x, QuantizedArray)


@no_type_check
def _inverse(scales):
    """`1 / scales`, zero where a scale is zero (its elements are all zero)."""
    return jnp.where(scales > 0, 1.0 / jnp.where(scales > 0, scales, 1.0), 0.0)


@no_type_check
def _unflatten(rows, shape):
    """Rows of codes' values back to the moment's `shape` (the padding dropped)."""
    flat = rows.reshape(-1)
    size = math.prod(shape)
    if flat.shape[0] != size:
        flat = flat[:size]
    return flat.reshape(shape)


@no_type_check
def _flatten(x, block_size):
    """`x` flattened into rows of `block_size` (zero-padded)."""
    size = x.size
    blocks = -(-size // block_size)
    flat = x.reshape(-1)
    if blocks * block_size != size:
        flat = jnp.pad(flat, (0, blocks * block_size - size))
    return flat.reshape(blocks, block_size)


@no_type_check
def _rows(x, kind, block_size):
    """`x` flattened into rows of `block_size` (zero-padded; negative values of a
    second moment clipped to zero)."""
    # Blocks are flat: an array sharded over an explicit axis is gathered first.
    x, _ = gathered(jnp.asarray(x, jnp.float32))
    rows = _flatten(x, block_size)
    if kind == "sqrt":
        rows = jnp.maximum(rows, 0.0)
    return rows


@no_type_check
def _rank1_scales(scales, shape):
    """Each element's rank-1 scale: the least of the maxima of the slices through
    it, one along each axis (`scales` holds them axis after axis)."""
    # Every element needs its row's and its column's maximum: read them whole.
    scales, _ = gathered(scales)
    result = None
    offset = 0
    for axis, length in enumerate(shape):
        maxima = scales[offset : offset + length]
        offset += length
        maxima = maxima.reshape([length if k == axis else 1 for k in range(len(shape))])
        result = maxima if result is None else jnp.minimum(result, maxima)
    return jnp.broadcast_to(result, shape)


@no_type_check
def _quantize_rank1(x, bits, kind, block_size, dtype, rounding, salt=None):
    """`x` quantised with rank-1 normalisation (Li et al.): each element divided by
    the least of its slices' absolute maxima, one slice along each axis."""
    x, _ = gathered(jnp.asarray(x, jnp.float32))
    if kind == "sqrt":
        # The maxima of v, rooted afterwards (as for blocks: the root of every
        # element is taken by the encoder only).
        x = jnp.maximum(x, 0.0)
    magnitude = jnp.abs(x)
    axes = range(x.ndim)
    scales = jnp.concatenate(
        [_maxima(magnitude, tuple(k for k in axes if k != axis)) for axis in axes]
    )
    if kind == "sqrt":
        scales, x = jnp.sqrt(scales), jnp.sqrt(x)
    normalised = x * _inverse(_rank1_scales(scales, x.shape))
    codes = _encode(_flatten(normalised, block_size), kind, bits, rounding, salt=salt)
    if bits == 4:
        codes = _pack_nibbles(codes)
    return QuantizedArray(
        codes=codes,
        scales=scales,
        shape=tuple(x.shape),
        dtype=dtype,
        bits=bits,
        kind=kind,
        normalization="rank1",
        rounding=rounding,
    )


@no_type_check
def _maxima(magnitude, dimensions):
    """The maximum of non-negative `magnitude` over `dimensions`, as a variadic
    reduction of two operands (see `_block_maxima`)."""
    maxima, negated = jax.lax.reduce(
        (magnitude, -magnitude),
        (jnp.float32(0), jnp.float32(0)),
        lambda a, b: (jnp.maximum(a[0], b[0]), jnp.maximum(a[1], b[1])),
        dimensions,
    )
    return jnp.maximum(maxima, negated)


@no_type_check
def _block_maxima(rows):
    """Each block's absolute maximum, for several arrays of rows at once.

    One variadic reduction: it fuses with the arithmetic that makes the rows
    (the moment update), reads the gradient once for all moments, and is not
    handed to XLA CPU's library reduction (a plain `jnp.max` was, which made
    the rows a float32 temporary written and read again).
    """
    shapes = {r.shape for r in rows}
    if len(shapes) > 1:
        return [m for r in rows for m in _block_maxima([r])]
    # Two operands at least: a single-operand max goes to the library reduction,
    # which reads the rows from a float32 temporary. The second operand of a
    # single array is its negation, whose maximum is folded into the result (it
    # is never larger than the absolute maximum): a copy of the first operand
    # would be merged with it, and an unused output removed, leaving a
    # single-operand reduction again.
    operands = [jnp.abs(r) for r in rows] + ([-rows[0]] if len(rows) == 1 else [])
    maxima = jax.lax.reduce(
        tuple(operands),
        tuple(jnp.float32(0) for _ in operands),
        lambda a, b: tuple(jnp.maximum(x, y) for x, y in zip(a, b, strict=True)),
        (1,),
    )
    if len(rows) == 1:
        return [jnp.maximum(maxima[0], maxima[1])]
    return list(maxima)


@no_type_check
def requantize_all(olds, news, step=None):
    """Each of `news` quantised in the format of the matching `olds`, with the block
    maxima of all the block-normalised ones taken in one pass.

    A moment that is not a whole number of blocks is quantised as its whole
    blocks and, apart, the rest of the last one padded with zeros (the same
    codes as the whole padded): padded whole, the new moment was written to a
    padded float32 copy first, and an 8-bit Adam step on a width-1000 MLP took
    twice as long (`benchmarks/lowbit_bench.py --width 1000`).

    `step` (the optimiser's step count, or `None`) salts stochastic rounding's
    draws (`_codec._dither`): given, they depend on positions, the step and
    the stored scales only, so that every program layout draws the same.
    """
    cut = {
        index: _cut_rows(new, old.kind, old.block_size)
        for index, (old, new) in enumerate(zip(olds, news, strict=True))
        if old.normalization != "rank1"
    }
    return _quantized_rows(olds, news, cut, step)


@no_type_check
def _quantized_rows(olds, news, cut, step=None):
    """`requantize_all` with the block-normalised moments already in rows: `cut`
    maps their indices to (whole blocks, the padded rest or `None`)."""
    heads = {index: head for index, (head, _) in cut.items()}
    tails = {index: tail for index, (_, tail) in cut.items() if tail is not None}
    maxima, tail_maxima = (
        dict(zip(rows, _block_maxima(list(rows.values())) if rows else [], strict=True))
        for rows in (heads, tails)
    )

    def quantized(index, old, new):
        salts = _salts(old, step)
        if index not in cut:
            return _quantize_rank1(
                new,
                old.bits,
                old.kind,
                old.block_size,
                old.dtype,
                old.rounding,
                None if salts is None else salts[0],
            )
        head = heads[index]
        rows = head.shape[0]
        fields = (old.shape, old.bits, old.kind, old.dtype, old.rounding)
        first = QuantizedArray._from_rows(
            head, maxima[index], *fields, salt=None if salts is None else salts[:rows]
        )
        if index not in tails:
            return first
        last = QuantizedArray._from_rows(
            tails[index],
            tail_maxima[index],
            *fields,
            first_row=rows,
            salt=None if salts is None else salts[rows : rows + 1],
        )
        return _joined(first, last)

    # The new moment keeps the old one's way of decoding (`lookup`) and its
    # rows of codes (padding rows past the moment's blocks, `_with_rows`).
    return [
        _with_rows(
            _with_lookup(quantized(index, old, new), old.lookup), old.codes.shape[0]
        )
        for index, (old, new) in enumerate(zip(olds, news, strict=True))
    ]


@no_type_check
def _salts(old, step):
    """The salts of the rows of `old`'s next quantisation at `step`
    (`row_salts` of its scales, gathered where they are split over an explicit
    axis), or `None` where it rounds to nearest or no step is given."""
    if old.rounding != "stochastic" or step is None:
        return None
    scales, _ = gathered(old.scales)
    return row_salts(scales, old.kind, step)


@no_type_check
def _blocks(x):
    """The rows of codes that hold `x`'s elements (without padding rows)."""
    return -(-x.size // x.block_size)


@no_type_check
def _with_rows(x, rows):
    """`x` with `rows` rows of codes: padding rows (codes zero, block scales zero,
    so they decode to zero) added past its blocks, or cut off, to that count.

    Padding lets a moment whose block count does not divide a mesh axis be
    split over it like its float32 counterpart (`eqopt.zero_plan`). The
    moment's elements and their codes are the same either way: blocks are
    cut and rounded by position from the first row, and the padding is never
    read (decoding cuts the codes to `size`).
    """
    rows = max(rows, _blocks(x))
    if x.codes.shape[0] == rows:
        return x
    extra = rows - x.codes.shape[0]
    if extra < 0:
        codes, scales = x.codes[:rows], x.scales
        if x.normalization != "rank1":
            scales = scales[:rows]
    else:
        codes = jnp.concatenate(
            [x.codes, jnp.zeros((extra, x.codes.shape[1]), x.codes.dtype)]
        )
        scales = x.scales
        if x.normalization != "rank1":
            scales = jnp.concatenate([scales, jnp.zeros((extra,), scales.dtype)])
    return eqx.tree_at(lambda q: (q.codes, q.scales), x, (codes, scales))


@no_type_check
def _with_lookup(x, lookup):
    """`x` with its static field `lookup` set (`x` itself if it is set already)."""
    return x if x.lookup == lookup else dataclasses.replace(x, lookup=lookup)


@no_type_check
def _cut_rows(x, kind, block_size):
    """`_rows` of `x` as its whole blocks and the rest of the last block, padded
    (`None` when there is no rest; all of `x` padded when it has no whole block)."""
    whole = x.size // block_size * block_size
    if whole in (0, x.size):
        return _rows(x, kind, block_size), None
    # Cut once gathered (`_rows` gathers an array split over an explicit axis).
    flat = gathered(x)[0].reshape(-1)
    return _rows(flat[:whole], kind, block_size), _rows(flat[whole:], kind, block_size)


@no_type_check
def _joined(first, last):
    """The quantised moment of `first`'s rows of codes followed by `last`'s."""
    return eqx.tree_at(
        lambda q: (q.codes, q.scales),
        first,
        (
            jnp.concatenate([first.codes, last.codes]),
            jnp.concatenate([first.scales, last.scales]),
        ),
    )
