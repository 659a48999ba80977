r"""Quantised optimiser moments: block-wise 8-bit and 4-bit codes with per-block scales.

A moment tree normally holds one array per trainable leaf. Given a
[`eqopt.Quantized`][] format as its dtype (`mu_dtype=eqopt.Quantized(8)`), it
holds a [`eqopt.QuantizedArray`][] instead: one small integer code per element
and one float32 scale per block of elements. `dequantize()`
gives the moment back; [`eqopt.tree.get`][] dequantises what it returns.

Per-leaf code (`eqopt._base.leafwise`) dequantises a quantised input before the
transform's arithmetic runs and quantises the matching output with the same
format afterwards, so a transform supports quantised moments by creating them
in `init` ([`eqopt._quantize.moment_like`][]) and nothing else.

Two maps, after the papers:

- **First moments** (signed): the *dynamic* map of Dettmers et al. (default),
  whose $2^{b-1}-1$ positive values cover $b-1$ decades below the block's
  absolute maximum with $2^i$ linearly spaced values in the $i$-th decade, plus
  zero and $1$; or a signed *linear* map $c / (2^{b-1} - 1)$.
- **Second moments** (non-negative): Li et al. show that the zero code of the
  second moment is what breaks 4-bit Adam (a small $v$ rounded to zero makes
  $m / \sqrt{v}$ explode). The format stores $\sqrt v$ (halving the dynamic
  range in decades) on a linear map *without a zero point*,
  $(c + 1) / 2^b$, so a code never decodes to zero unless the whole block is
  zero (its scale is zero).

The nearest code is computed arithmetically (comparisons for the decade,
one floor for the grid cell), never searched: `jnp.searchsorted` over the
map cost 70-250 ms on 4M elements where the whole float32 Adam step took 25 ms.
The block maxima of all the quantised moments of a leaf are one reduction
(`requantize_all`), which fuses with the moment update.
Zeros and constants are built directly as codes and scales, never quantised
inside `jit` (quantising a large constant stalled XLA's constant folding for
seconds).

**References:** Dettmers, Lewis, Shleifer & Zettlemoyer, *8-bit Optimizers via
Block-wise Quantization*, ICLR 2022; Li, Chen & Zhu, *Memory Efficient Optimizers
with 4-bit States*, NeurIPS 2023.
"""

import dataclasses
import functools
import math
from typing import Any, Literal, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Float, UInt8

from ._sharding import gathered, like


@dataclasses.dataclass(frozen=True)
class Quantized:
    """A storage format for optimiser moments: block-wise 8-bit or 4-bit codes.

    Pass it wherever a moment dtype is accepted (`mu_dtype`, `nu_dtype` of
    [`eqopt.adam`][], [`eqopt.adamw`][], [`eqopt.lion`][], [`eqopt.rmsprop`][],
    [`eqopt.contrib.ademamix`][], [`eqopt.contrib.muon`][]...). Each moment leaf
    of at least `min_size` elements is then stored as a
    [`eqopt.QuantizedArray`][]: per block of `block_size` elements, one float32
    scale (the block's absolute maximum) and one code per element. Smaller
    leaves (biases, norms' scales) stay in float32, as bitsandbytes keeps them:
    they cost little memory and are the most sensitive to rounding.

    First moments use the signed dynamic map of Dettmers et al. (or a signed
    linear map); second moments store $\\sqrt v$ on a linear map without a zero
    point, the zero-safe scheme that Li et al.'s analysis calls for:

    $$
    \\hat x = s_B \\cdot q[c], \\qquad
    s_B = \\max_{i \\in B} |x_i|, \\qquad
    c = \\arg\\min_k |x / s_B - q[k]|
    $$

    State bytes per parameter for Adam (two moments, scales included):
    8-bit with blocks of 256: 2.03; 4-bit with blocks of 128: 1.06
    (float32: 8).

    Quantised moments are exact at zero and at each block's maximum, and the
    relative rounding error of the dynamic map is at most half a step of its
    decade ($0.45 / 2^i$ of $10^{i-b+2}$); see the tests for the bounds.

    A transform with a quantised moment is not elementwise (blocks group
    neighbouring elements), so a packed model ([`eqopt.pack`][]) is unpacked
    for it and the blocks never straddle two leaves: the numbers are the same
    packed or not.

    **Arguments:**

    - `bits`: 8 or 4.
    - `block_size`: elements per scale (default 256 for 8 bits, 128 for 4 bits,
      the papers' choices). A multiple of 2.
    - `min_size`: leaves with fewer elements stay in float32 (default 4096, as
      bitsandbytes).
    - `first_moment_map`: `"dynamic"` (default) or `"linear"`.

    !!! example

        ```python
        opt = eqopt.adamw(1e-3, mu_dtype=eqopt.Quantized(8), nu_dtype=eqopt.Quantized(8))
        state = opt.init(model)
        mu = eqopt.tree.get(state, "mu")   # model-shaped float32 arrays
        ```

    **References:** Dettmers et al., *8-bit Optimizers via Block-wise
    Quantization*, ICLR 2022; Li et al., *Memory Efficient Optimizers with 4-bit
    States*, NeurIPS 2023.
    """

    bits: int = 8
    block_size: int | None = None
    min_size: int = 4096
    first_moment_map: Literal["dynamic", "linear"] = "dynamic"

    def __post_init__(self):
        if self.bits not in (4, 8):
            raise ValueError(f"Quantized: `bits` must be 4 or 8, got {self.bits}.")
        if self.block_size is not None and (self.block_size < 2 or self.block_size % 2):
            raise ValueError(
                f"Quantized: `block_size` must be a positive even number, got {self.block_size}."
            )
        if self.first_moment_map not in ("dynamic", "linear"):
            raise ValueError(
                "Quantized: `first_moment_map` must be 'dynamic' or 'linear', got "
                f"{self.first_moment_map!r}."
            )

    @property
    def block(self) -> int:
        """The block size in use."""
        if self.block_size is not None:
            return self.block_size
        return 256 if self.bits == 8 else 128


#: A moment's storage: a dtype, `None` (the params'), or a [`eqopt.Quantized`][] format.
MomentDType = DTypeLike | Quantized | None


@no_type_check  # called once per leaf at trace time
def is_quantized_format(dtype: Any) -> bool:
    """Whether a moment dtype is a [`eqopt.Quantized`][] format."""
    return isinstance(dtype, Quantized)


# ---------------------------------------------------------------------------
# Maps
# ---------------------------------------------------------------------------


def _grid(n: int) -> np.ndarray:
    # `n` points from 0.1 to 1 in float32, computed as bitsandbytes' tables are
    # (float32 ends, a float64 step, each half counted from its own end).
    start, end = np.float32(0.1), np.float32(1.0)
    step = np.float64(end - start) / (n - 1)
    half = n // 2
    points = [
        start + i * step if i < half else end - (n - 1 - i) * step for i in range(n)
    ]
    return np.asarray(points).astype(np.float32)


@functools.cache
def dynamic_map(bits: int) -> np.ndarray:
    """The signed dynamic map of Dettmers et al. with `bits` bits, sorted ascending.

    With $E = b - 1$ decades, the $i$-th decade ($i = 0 \\ldots E - 1$) holds the
    $2^i$ midpoints of a linear grid from $0.1$ to $1$, scaled by $10^{i - E + 1}$;
    with their negatives, zero and one this makes $2^b$ values (bitsandbytes'
    `create_dynamic_map(signed=True, max_exponent_bits=E, total_bits=b)`).
    """
    decades = bits - 1
    positive = []
    for i in range(decades):
        grid = _grid(2**i + 1)
        means = (grid[:-1] + grid[1:]) / np.float32(2.0)
        positive.extend((10.0 ** (i - decades + 1) * means).astype(np.float32))
    positive = np.asarray(positive, np.float32)
    table = np.concatenate([-positive[::-1], [0.0], positive, [1.0]])
    return table.astype(np.float32)


@no_type_check
def _encode_dynamic(y, bits):
    """Nearest code of `y` (in [-1, 1]) in the dynamic map, computed arithmetically.

    Decade $i$ of the map spans $[10^{i-E}, 10^{i-E+1})$ (the lowest reaches
    down to zero) and holds the midpoints of the $2^i$ cells of a linear grid,
    so the cell that `y` falls in is its nearest value, except in the lowest
    fifth of a decade's first cell, where the top value of the decade below
    (or zero) is nearer, and above the midpoint of the map's two largest
    values, where one is. The decade comes from $E - 1$ comparisons (selects,
    no logarithm, power or division per element: those made this several
    times slower on CPU).
    """
    decades = bits - 1
    a = jnp.abs(y)
    width = jnp.ones_like(a)
    inverse_power = jnp.full_like(a, 10.0 ** (decades - 1))
    for k in range(1, decades):
        above = a >= jnp.float32(10.0 ** (k - decades))
        width = jnp.where(above, jnp.float32(2.0**k), width)
        inverse_power = jnp.where(
            above, jnp.float32(10.0 ** (decades - 1 - k)), inverse_power
        )
    # Position in the decade, in cells: the value of cell j sits at j + 1/2.
    cells = (a * inverse_power - 0.1) * (width * (1 / 0.9))
    rank = width - 1.0 + jnp.clip(jnp.floor(cells), 0.0, width - 1.0)
    # The value below the decade's first (0.1 - 0.09 / w of the decade's top;
    # zero below the lowest decade) is nearer under this many cells.
    edge = jnp.where(width == 1.0, jnp.float32(0.175 / 0.9), jnp.float32(0.2))
    rank = jnp.where(cells < edge, rank - 1.0, rank)
    top = jnp.float32(1.0 - 0.225 / 2 ** (decades - 1))
    rank = jnp.where(a > top, jnp.float32(2**decades - 1), rank)
    # rank -1 is zero; ranks 0..2^E-1 are positive (the last is 1, which has
    # no negative: -1 goes to the largest negative value, as in bitsandbytes).
    code = jnp.where(y < 0, -1.0 - jnp.minimum(rank, 2**decades - 2), 1.0 + rank)
    return (code + (2**decades - 1)).astype(jnp.uint8)


@no_type_check
def _decode_dynamic(codes, bits):
    """The dynamic map's value of each code, computed arithmetically (a table
    lookup is a gather, which XLA on CPU runs as a pass of its own)."""
    decades = bits - 1
    signed = codes.astype(jnp.float32) - (2**decades - 1)
    # One more than the rank among positive values: 2^i + j in decade i.
    position = jnp.abs(signed)
    # 2^i and 2^-i from the float's exponent bits (exact for integers).
    exponent = jax.lax.bitcast_convert_type(position, jnp.int32) & 0x7F800000
    width = jax.lax.bitcast_convert_type(exponent, jnp.float32)
    inverse_width = jax.lax.bitcast_convert_type(0x7F000000 - exponent, jnp.float32)
    power = jnp.full_like(position, 10.0 ** (1 - decades))
    for k in range(1, decades):
        power = jnp.where(
            position >= 2.0**k, jnp.float32(10.0 ** (k - decades + 1)), power
        )
    value = power * (0.1 + 0.9 * (position - width + 0.5) * inverse_width)
    value = jnp.where(position >= 2**decades, 1.0, value)
    value = jnp.where(position == 0, 0.0, value)
    return jnp.where(signed < 0, -value, value)


@no_type_check
def _encode_linear_signed(y, bits):
    half = 2 ** (bits - 1) - 1
    return (jnp.round(y * half) + half).astype(jnp.uint8)


@no_type_check
def _encode_linear_no_zero(y, bits):
    levels = 2**bits
    return jnp.clip(jnp.round(y * levels) - 1, 0, levels - 1).astype(jnp.uint8)


@functools.cache
def decoding_table(kind: str, bits: int) -> np.ndarray:
    """The value of every code of a map (`kind`: `"dynamic"`, `"linear"`, `"sqrt"`)."""
    if kind == "dynamic":
        return dynamic_map(bits)
    if kind == "linear":
        half = 2 ** (bits - 1) - 1
        values = (np.arange(2**bits) - half) / half
        return np.clip(values, -1.0, 1.0).astype(np.float32)
    return ((np.arange(2**bits) + 1) / 2**bits).astype(np.float32)


@no_type_check
def _encode(y, kind, bits):
    if kind == "dynamic":
        return _encode_dynamic(y, bits)
    if kind == "linear":
        return _encode_linear_signed(y, bits)
    return _encode_linear_no_zero(y, bits)


@no_type_check
def _pack_nibbles(codes):
    low, high = codes[..., 0::2], codes[..., 1::2]
    return low | jnp.left_shift(high, 4)


@no_type_check
def _unpack_nibbles(packed):
    low, high = packed & 15, jnp.right_shift(packed, 4)
    return jnp.stack([low, high], axis=-1).reshape(*packed.shape[:-1], -1)


# ---------------------------------------------------------------------------
# The quantised array
# ---------------------------------------------------------------------------


class QuantizedArray(eqx.Module):
    """An optimiser moment stored as block-wise codes with one scale per block.

    Made by `init` of a transform given a [`eqopt.Quantized`][] moment dtype.
    Read it with `dequantize()` (or through
    [`eqopt.tree.get`][], which dequantises); it serialises, checkpoints and
    crosses `jit` as its two arrays.

    **Fields:** `codes` (uint8, one row per block; two 4-bit codes per byte),
    `scales` (float32, one per block), and static `shape`, `dtype` (of the
    dequantised array), `bits` and `kind` (`"dynamic"` or `"linear"`: a signed
    first moment; `"sqrt"`: a second moment stored as $\\sqrt v$ on the linear
    map without zero).
    """

    codes: UInt8[Array, "blocks width"]
    scales: Float[Array, " blocks"]
    shape: tuple[int, ...] = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)
    bits: int = eqx.field(static=True)
    kind: str = eqx.field(static=True)

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
        codes = self.codes if self.bits == 8 else _unpack_nibbles(self.codes)
        if self.kind == "sqrt":
            values = (
                (codes.astype(jnp.float32) + 1.0)
                * (1.0 / 2**self.bits)
                * self.scales[:, None]
            )
            values = values * values
        elif self.kind == "linear":
            half = 2 ** (self.bits - 1) - 1
            values = (codes.astype(jnp.float32) - half) * (1.0 / half)
            values = values * self.scales[:, None]
        else:
            values = _decode_dynamic(codes, self.bits) * self.scales[:, None]
        flat = values.reshape(-1)
        if flat.shape[0] != self.size:
            flat = flat[: self.size]
        return flat.reshape(self.shape).astype(self.dtype)

    @classmethod
    def quantize(
        cls, x: Array, bits: int, kind: str, block_size: int, dtype: Any = None
    ) -> "QuantizedArray":
        """Quantises `x` block by block (`kind` as for the field)."""
        dtype = jnp.result_type(x) if dtype is None else dtype
        rows = _rows(x, kind, block_size)
        (maxima,) = _block_maxima([rows])
        return cls._from_rows(rows, maxima, tuple(x.shape), bits, kind, dtype)

    @classmethod
    def _from_rows(
        cls,
        rows: Array,
        maxima: Array,
        shape: tuple[int, ...],
        bits: int,
        kind: str,
        dtype: Any,
    ) -> "QuantizedArray":
        # A second moment stores sqrt(v): its scale is the root of the block's
        # maximum, and the root of each element is taken only here, by the
        # encoder (taken before the maximum, it made XLA keep sqrt(v) as a
        # float32 temporary shared by the reduction and the encoder).
        scales = maxima
        if kind == "sqrt":
            scales, rows = jnp.sqrt(maxima), jnp.sqrt(rows)
        inverse = jnp.where(scales > 0, 1.0 / jnp.where(scales > 0, scales, 1.0), 0.0)
        codes = _encode(rows * inverse[:, None], kind, bits)
        if bits == 4:
            codes = _pack_nibbles(codes)
        return cls(
            codes=codes, scales=scales, shape=shape, dtype=dtype, bits=bits, kind=kind
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
        scales = jnp.broadcast_to(scale, (blocks,)).astype(jnp.float32)
        return cls(
            codes=codes,
            scales=scales,
            shape=tuple(shape),
            dtype=dtype,
            bits=bits,
            kind=kind,
        )

    @property
    def block_size(self) -> int:
        """Elements per scale."""
        return self.codes.shape[1] * (1 if self.bits == 8 else 2)

    def requantize(self, x: Array) -> "QuantizedArray":
        """`x` (shaped like this array) quantised in this array's format."""
        (new,) = requantize_all([self], [x])
        return new


@no_type_check
def _rows(x, kind, block_size):
    """`x` flattened into rows of `block_size` (zero-padded; negative values of a
    second moment clipped to zero)."""
    # Blocks are flat: an array sharded over an explicit axis is gathered first.
    x, _ = gathered(jnp.asarray(x, jnp.float32))
    size = x.size
    blocks = -(-size // block_size)
    flat = x.reshape(-1)
    if blocks * block_size != size:
        flat = jnp.pad(flat, (0, blocks * block_size - size))
    rows = flat.reshape(blocks, block_size)
    if kind == "sqrt":
        rows = jnp.maximum(rows, 0.0)
    return rows


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
    # Two operands at least: a single-operand max goes to the library reduction.
    operands = [jnp.abs(r) for r in rows] + (
        [jnp.abs(rows[0])] if len(rows) == 1 else []
    )
    maxima = jax.lax.reduce(
        tuple(operands),
        tuple(jnp.float32(0) for _ in operands),
        lambda a, b: tuple(jnp.maximum(x, y) for x, y in zip(a, b, strict=True)),
        (1,),
    )
    return list(maxima[: len(rows)])


@no_type_check
def requantize_all(olds, news):
    """Each of `news` quantised in the format of the matching `olds`, with the block
    maxima of all of them taken in one pass."""
    rows = [
        _rows(new, old.kind, old.block_size)
        for old, new in zip(olds, news, strict=True)
    ]
    scales = _block_maxima(rows)
    return [
        QuantizedArray._from_rows(r, s, old.shape, old.bits, old.kind, old.dtype)
        for r, s, old in zip(rows, scales, olds, strict=True)
    ]


# ---------------------------------------------------------------------------
# What the transforms call
# ---------------------------------------------------------------------------


@no_type_check
def is_quantized(x: Any) -> bool:
    """Whether `x` is a [`eqopt.QuantizedArray`][]."""
    return isinstance(x, QuantizedArray)


@no_type_check
def moment_like(
    params: Any, dtype: Any, *, second: bool = False, value: float = 0.0
) -> Any:
    """A moment tree for `params` filled with `value`, stored in `dtype`.

    `dtype` may be `None` (each parameter's dtype; the real dtype for a second
    moment), a dtype, or a [`eqopt.Quantized`][] format (then leaves of at least
    `min_size` real elements are [`eqopt.QuantizedArray`][], smaller or complex
    ones float32 arrays). `None` where a leaf is not trainable.
    """
    quantized = is_quantized_format(dtype)

    def make(p):
        if not eqx.is_inexact_array(p):
            return None
        real = jnp.finfo(p.dtype).dtype
        if quantized:
            if p.size < dtype.min_size or jnp.iscomplexobj(p):
                float_dtype = jnp.promote_types(
                    real if second else p.dtype, jnp.float32
                )
                return jnp.full_like(p, value, dtype=float_dtype)
            kind = "sqrt" if second else dtype.first_moment_map
            return QuantizedArray.full(
                tuple(p.shape), value, dtype.bits, kind, dtype.block, jnp.float32
            )
        if dtype is None:
            dtype_here = real if second else p.dtype
        else:
            dtype_here = dtype
        return jnp.full_like(p, value, dtype=dtype_here)

    return jax.tree.map(make, params)


@no_type_check
def cast_moment(x: Any, dtype: Any) -> Any:
    """`x` cast to a moment dtype; unchanged for a quantised format (the per-leaf
    loop quantises it) or `None`."""
    if dtype is None or is_quantized_format(dtype):
        return x
    return x.astype(dtype)


@no_type_check
def dequantize_all(tree: Any, reference: Any = None) -> Any:
    """`tree` with every [`eqopt.QuantizedArray`][] replaced by its dequantised array
    (sharded like `reference` when that is an array sharded over an explicit axis)."""
    if is_quantized(tree):
        return (
            tree.dequantize()
            if reference is None
            else like(tree.dequantize(), reference)
        )
    leaves = jax.tree.leaves(tree, is_leaf=is_quantized)
    if not any(is_quantized(leaf) for leaf in leaves):
        return tree
    return jax.tree.map(
        lambda x: x.dequantize() if is_quantized(x) else x, tree, is_leaf=is_quantized
    )


@no_type_check
def call_dequantized(fn: Any, u: Any, rest: Any) -> Any:
    """`fn(u, *rest)` with each quantised moment of `rest` dequantised, and each
    output `k + 1` quantised again in the format of `rest[k]` where that was
    quantised (the per-leaf loop's convention: outputs after the update are the
    new values of the inputs after `u`)."""
    if not any(map(is_quantized, rest)):
        return fn(u, *rest)
    out = fn(u, *(dequantize_all(x, u) for x in rest))
    if not isinstance(out, tuple):
        return out
    pairs = [
        (k, old, new)
        for k, (new, old) in enumerate(zip(out[1:], rest, strict=False))
        if is_quantized(old)
    ]
    requantized = requantize_all(
        [old for _, old, _ in pairs], [new for _, _, new in pairs]
    )
    outputs = list(out[1:])
    for (k, _, _), new in zip(pairs, requantized, strict=True):
        outputs[k] = new
    return (out[0], *outputs)


def any_quantized(*dtypes: Any) -> bool:
    """Whether any of the moment dtypes is a quantised format."""
    return any(is_quantized_format(dtype) for dtype in dtypes)
