r"""Quantised optimiser moments: 8-bit and 4-bit codes with block-wise or rank-1 scales.

A moment tree normally holds one array per trainable leaf. Given a
[`eqopt.Quantized`][] format as its dtype (`mu_dtype=eqopt.Quantized(8)`), it
holds a [`eqopt.QuantizedArray`][] instead: one small integer code per element
and a few float32 scales (one per block of elements, or one per row and per
column of a matrix). `dequantize()` gives the moment back;
[`eqopt.tree.get`][] dequantises what it returns.

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

Two normalisations: a block of consecutive elements shares one scale, its
absolute maximum (Dettmers et al.); or, for a matrix, element $(i, j)$ is
divided by $\min(r_i, c_j)$, the smaller of its row's and its column's absolute
maxima (Li et al.'s *rank-1 normalisation*, which they prescribe for 4-bit
second moments: their outliers run along whole rows and columns). With more
axes, the least of the maxima of the slices through the element along each
axis. Blocks are the default; rank-1 is asked for with
`normalization="rank1"`.

Two roundings: to the nearest code, or *stochastic* (Gupta et al.), the code
just above with the probability that makes the decoded value right on
average. A moment is re-quantised every step after being multiplied by
$\beta$: at 4 bits, $\beta x$ (0.9 or 0.999 of $x$) usually rounds back to
the code of $x$, so with rounding to nearest a moment stops decaying and small
gradients stop reaching it; stochastic rounding keeps both on average. The
random number is a hash of the element's position and value, so no key is
stored and a state rounds the same way every time.

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
with 4-bit States*, NeurIPS 2023; Gupta, Agrawal, Gopalakrishnan & Narayanan,
*Deep Learning with Limited Numerical Precision*, ICML 2015 (stochastic
rounding).
"""

import dataclasses
import functools
import math
import threading
from typing import Any, Literal, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Float, UInt8

from ._sharding import explicit_sharding, gathered, like


@dataclasses.dataclass(frozen=True)
class Quantized:
    """A storage format for optimiser moments: 8-bit or 4-bit codes with scales.

    Pass it wherever a moment dtype is accepted (`mu_dtype`, `nu_dtype` of
    [`eqopt.adam`][], [`eqopt.adamw`][], [`eqopt.lion`][], [`eqopt.rmsprop`][],
    [`eqopt.contrib.ademamix`][], [`eqopt.contrib.muon`][]...). Each moment leaf
    of at least `min_size` elements is then stored as a
    [`eqopt.QuantizedArray`][]: one code per element and float32 scales, one
    per block of `block_size` elements (the block's absolute maximum) or, with
    rank-1 normalisation, one per row and per column. Smaller leaves (biases,
    norms' scales) stay in float32, as bitsandbytes keeps them: they cost
    little memory and are the most sensitive to rounding.

    First moments use the signed dynamic map of Dettmers et al. (or a signed
    linear map); second moments store $\\sqrt v$ on a linear map without a zero
    point, the zero-safe scheme that Li et al.'s analysis calls for:

    $$
    \\hat x = s \\cdot q[c], \\qquad
    s = \\max_{i \\in B} |x_i| \\ \\text{(block } B\\text{)} \\quad \\text{or} \\quad
    s_{ij} = \\min\\big(\\max_k |x_{ik}|, \\max_k |x_{kj}|\\big) \\ \\text{(rank-1)},
    $$

    with $c$ the nearest code to $x / s$, or with stochastic rounding one of
    the two codes around it, chosen so that $\\hat x$ is $x$ on average.

    At 4 bits, moments are rounded stochastically by default: rounded to
    nearest, a 4-bit moment stops decaying, since $\\beta x$ rounds back to
    $x$'s code (on the digits MLP of `examples/low_memory.py`, 4-bit first
    moments alone then ended training 32% above float32 AdamW's loss, 4-bit
    second moments alone 20% below, and both together 8.9% above; rounded
    stochastically, 1.3% above). Li et al. prescribe rank-1 normalisation
    for 4-bit second moments (`Quantized(4, normalization="rank1")` as the
    `nu_dtype`); it is not the default because on the small matrices of the
    examples it did not measurably help, and on a CPU it makes a 4-bit Adam
    step about 1.6 times slower (the row and column maxima are two more
    reductions over each second moment).

    State bytes per parameter for Adam (two moments, scales included):
    8-bit with blocks of 256: 2.03; 4-bit with blocks of 128: 1.06, 1.04 with
    rank-1 second moments of 1024×1024 matrices (float32: 8).

    Quantised moments are exact at zero and at each block's maximum (with
    rank-1 scales, at each row's and each column's maximum). Rounded to
    nearest, the relative error of the dynamic map is at most half a step of
    its decade ($0.45 / 2^i$ of $10^{i-b+2}$); stochastic rounding errs by less
    than a whole step and by nothing on average. See the tests for the bounds.

    On a packed model ([`eqopt.pack`][], [`eqopt.bucketed`][]) a moment is by
    default quantised as one array per buffer (`packed_blocks="buffer"`): the
    step runs on the buffers as they are, as float32 Adam's does, where
    cutting the model into leaves and gluing the update back made a packed
    8-bit Adam step 1.2 (H100) to 2 (CPU) times the per-leaf one
    (`benchmarks/lowbit_bench.py`). Blocks then run across the boundaries
    between leaves, and leaves under `min_size` are quantised with their
    neighbours (a buffer under `min_size` stays in float32), so the numbers
    are those of the transform on the buffers taken as leaves, not the
    per-leaf ones; training is as close to float32 Adam either way (the
    tests compare both). `packed_blocks="leaf"` unpacks the
    model for the transform instead and gives the per-leaf numbers and state;
    so does rank-1 normalisation, which needs the leaves' matrices.

    **Arguments:**

    - `bits`: 8 or 4.
    - `block_size`: elements per block (default 256 for 8 bits, 128 for 4 bits,
      the papers' choices). A multiple of 2.
    - `min_size`: leaves with fewer elements stay in float32 (default 4096, as
      bitsandbytes).
    - `first_moment_map`: `"dynamic"` (default) or `"linear"`.
    - `normalization`: `"block"` (default: a scale per block of `block_size`
      elements) or `"rank1"` (a scale per row and per column, per index of
      every axis: fewer scales than blocks for a large matrix, more for a
      small one), for leaves with two axes longer than one; vectors keep
      blocks, as in Li et al.
    - `rounding`: `"nearest"` or `"stochastic"`. Default `None`: stochastic at
      4 bits, nearest at 8.
    - `packed_blocks`: on a packed model, `"buffer"` (default: each buffer's
      moment is one quantised array, blocks across leaves) or `"leaf"` (the
      model is unpacked for the transform: blocks within leaves, small leaves
      in float32, the per-leaf numbers).

    !!! example

        ```python
        opt = eqopt.adamw(1e-3, mu_dtype=eqopt.Quantized(8), nu_dtype=eqopt.Quantized(8))
        state = opt.init(model)
        mu = eqopt.tree.get(state, "mu")   # model-shaped float32 arrays
        ```

    **References:** Dettmers et al., *8-bit Optimizers via Block-wise
    Quantization*, ICLR 2022; Li et al., *Memory Efficient Optimizers with 4-bit
    States*, NeurIPS 2023 (rank-1 normalisation, the zero-free second moment);
    Gupta et al., *Deep Learning with Limited Numerical Precision*, ICML 2015
    (stochastic rounding).
    """

    bits: int = 8
    block_size: int | None = None
    min_size: int = 4096
    first_moment_map: Literal["dynamic", "linear"] = "dynamic"
    normalization: Literal["block", "rank1"] = "block"
    rounding: Literal["nearest", "stochastic"] | None = None
    packed_blocks: Literal["buffer", "leaf"] = "buffer"

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
        if self.normalization not in ("block", "rank1"):
            raise ValueError(
                "Quantized: `normalization` must be 'block' or 'rank1', got "
                f"{self.normalization!r}."
            )
        if self.packed_blocks not in ("buffer", "leaf"):
            raise ValueError(
                "Quantized: `packed_blocks` must be 'buffer' or 'leaf', got "
                f"{self.packed_blocks!r}."
            )
        if self.rounding not in (None, "nearest", "stochastic"):
            raise ValueError(
                "Quantized: `rounding` must be 'nearest', 'stochastic' or None, got "
                f"{self.rounding!r}."
            )

    @property
    def block(self) -> int:
        """The block size in use."""
        if self.block_size is not None:
            return self.block_size
        return 256 if self.bits == 8 else 128

    def normalization_of(self, shape: tuple[int, ...]) -> str:
        """The normalisation of a moment of `shape`: `"rank1"` where asked for and
        the leaf has two axes longer than one (vectors keep blocks, as in Li et
        al.), `"block"` otherwise."""
        matrix = sum(length > 1 for length in shape) >= 2
        return "rank1" if self.normalization == "rank1" and matrix else "block"

    @property
    def rounding_in_use(self) -> str:
        """The rounding in use: as given, or by default stochastic at 4 bits and
        to nearest at 8."""
        if self.rounding is not None:
            return self.rounding
        return "stochastic" if self.bits == 4 else "nearest"


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
def _decode_dynamic(codes, bits, lookup=False):
    """The dynamic map's value of each code: arithmetically (fused into every
    kernel that reads it), or with `lookup` looked up in the map."""
    if not lookup:
        return _decode_dynamic_arithmetic(codes, bits)
    table = jnp.asarray(dynamic_map(bits))
    sharding = explicit_sharding(codes)
    if sharding is None:
        return jnp.take(table, codes.astype(jnp.int32), mode="clip")
    # Codes split over an explicit mesh axis: the values are split alike.
    return table.at[codes.astype(jnp.int32)].get(mode="clip", out_sharding=sharding)


@no_type_check
def _decode_dynamic_arithmetic(codes, bits):
    """The dynamic map's value of each code, from the code's bits."""
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
def _encode(y, kind, bits, rounding="nearest", first_row=0):
    # `first_row`: the index of `y`'s first row among the moment's (stochastic
    # rounding draws by position).
    if rounding == "stochastic":
        return _encode_stochastic(y, kind, bits, first_row)
    if kind == "dynamic":
        return _encode_dynamic(y, bits)
    if kind == "linear":
        return _encode_linear_signed(y, bits)
    return _encode_linear_no_zero(y, bits)


@no_type_check
def _decode(codes, kind, bits, lookup=False):
    """The map's value of each code (integer codes of any dtype), before scaling;
    `lookup` as for `_decode_dynamic`."""
    if kind == "sqrt":
        return (codes.astype(jnp.float32) + 1.0) * (1.0 / 2**bits)
    if kind == "linear":
        half = 2 ** (bits - 1) - 1
        return (codes.astype(jnp.float32) - half) * (1.0 / half)
    return _decode_dynamic(codes, bits, lookup)


@no_type_check
def _dither(y, first_row=0):
    """A uniform number in [0, 1) per element of `y`: a hash of the element's
    position and float bits (MurmurHash3's 32-bit finaliser), so that rounding
    needs no key in the state and a restored checkpoint rounds as the
    uninterrupted run does. A moment changes every step, and so do its
    numbers; a value that comes back bit for bit (an element without gradient
    in a block whose scale stays exactly the same) rounds the same way again,
    which a training step, whose gradients move the scale, rarely repeats.
    The rows of `y` are the moment's from `first_row` on."""
    row = jax.lax.broadcasted_iota(jnp.uint32, y.shape, 0) + jnp.uint32(first_row)
    index = row * jnp.uint32(y.shape[1]) + jax.lax.broadcasted_iota(
        jnp.uint32, y.shape, 1
    )
    h = jax.lax.bitcast_convert_type(y, jnp.uint32) ^ (index * jnp.uint32(0x9E3779B9))
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    h = h ^ (h >> 16)
    return (h >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)


@no_type_check
def _encode_stochastic(y, kind, bits, first_row=0):
    """Stochastic rounding (Gupta et al.): the code of the map's value just below
    or just above `y`, the upper one with probability (y - below) / (above -
    below), so that the decoded value is `y` on average. Values beyond the
    map's ends (below the second moment's first level, under the signed dynamic
    map's lowest value) go to the end, as with rounding to nearest."""
    if kind != "dynamic":
        # Evenly spaced values: the one below is a floor, the chance of going up
        # what it leaves; under the first level of the second moment's map (no
        # zero), the first level.
        levels = 2**bits if kind == "sqrt" else 2 ** (bits - 1) - 1
        position = y * levels - 1.0 if kind == "sqrt" else (y + 1.0) * levels
        # The top code: 1 (a normalised value may exceed it by a rounding).
        top = levels - 1 if kind == "sqrt" else 2 * levels
        below = jnp.clip(jnp.floor(position), 0.0, top)
        up = (
            (_dither(y, first_row) < position - below)
            & (position >= 0.0)
            & (below < top)
        )
        return (below + up.astype(jnp.float32)).astype(jnp.uint8)
    nearest = _encode(y, kind, bits).astype(jnp.int32)
    value = _decode(nearest, kind, bits)
    # The other neighbour of `y` (one decode fewer than decoding both).
    under = y < value
    other = jnp.clip(jnp.where(under, nearest - 1, nearest + 1), 0, 2**bits - 1)
    other_value = _decode(other, kind, bits)
    below = jnp.where(under, other, nearest)
    above = jnp.where(under, nearest, other)
    low = jnp.where(under, other_value, value)
    high = jnp.where(under, value, other_value)
    # Up with probability (y - low) / (high - low), without a division; never up
    # where the two are one value (at the map's ends).
    up = _dither(y, first_row) * (high - low) < y - low
    return jnp.where(up, above, below).astype(jnp.uint8)


@no_type_check
def _pack_nibbles(codes):
    low, high = codes[..., 0::2], codes[..., 1::2]
    return low | jnp.left_shift(high, 4)


@no_type_check
def _unpack_nibbles(packed):
    low, high = packed & 15, jnp.right_shift(packed, 4)
    return jnp.stack([low, high], axis=-1).reshape(*packed.shape[:-1], -1)


class _Decoding(threading.local):
    #: Set while a transform runs on the leaves of an unpacked packed model.
    on_unpacked_leaves = False


DECODING = _Decoding()


@no_type_check
def _looks_up(bits):
    """Whether a stored moment's dynamic-map codes are decoded by a lookup.

    On CPU, at 8 bits: XLA runs the gather as a pass of its own that writes
    the values once, where the arithmetic was repeated in each of the three
    kernels that read a moment (its block maxima, the update, the new codes):
    an 8-bit Adam step took 0.7-0.8 of the time (`benchmarks/lowbit_bench.py`).
    Not at 4 bits, nor on the leaves cut from a packed buffer: there the
    lookup made the step 1.7-2.4 times as long. Off CPU, arithmetic: fused
    into each kernel, it costs no memory traffic (on an H100 the lookup was no
    faster). Both give the map's values to float32's last bit (the
    arithmetic's differs for 66 of the 256 8-bit codes).
    """
    return (
        bits == 8 and not DECODING.on_unpacked_leaves and jax.default_backend() == "cpu"
    )


# ---------------------------------------------------------------------------
# The quantised array
# ---------------------------------------------------------------------------


class QuantizedArray(eqx.Module):
    """An optimiser moment stored as codes with block-wise or rank-1 scales.

    Made by `init` of a transform given a [`eqopt.Quantized`][] moment dtype.
    Read it with `dequantize()` (or through
    [`eqopt.tree.get`][], which dequantises); it serialises, checkpoints and
    crosses `jit` as its two arrays.

    **Fields:** `codes` (uint8, the flattened moment in rows of `block_size`
    elements; two 4-bit codes per byte), `scales` (float32: with `"block"`
    normalisation one per row of codes, the block's absolute maximum; with
    `"rank1"` the maxima of every slice along each axis, concatenated: a
    matrix's row maxima, then its column maxima), and static `shape`, `dtype`
    (of the dequantised array), `bits`, `kind` (`"dynamic"` or `"linear"`: a
    signed first moment; `"sqrt"`: a second moment stored as $\\sqrt v$ on the
    linear map without zero), `normalization` (`"block"` or `"rank1"`) and
    `rounding` (`"nearest"` or `"stochastic"`, for the next quantisation).
    """

    codes: UInt8[Array, "blocks width"]
    scales: Float[Array, " scales"]
    shape: tuple[int, ...] = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)
    bits: int = eqx.field(static=True)
    kind: str = eqx.field(static=True)
    normalization: str = eqx.field(static=True, default="block")
    rounding: str = eqx.field(static=True, default="nearest")

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
        return _decode(codes, self.kind, self.bits, _looks_up(self.bits))

    def _block_values(self, rows: slice = slice(None)) -> Array:
        # Block normalisation: the values in rows of `block_size` (with the
        # padding; those of `rows`, cut before decoding), in `dtype`.
        return self._values(self._unit(rows) * self.scales[rows, None])

    def _flat_values(self) -> Array:
        # Block normalisation: the values flattened, the padding cut from the
        # codes and scales before decoding (cut after, the decoded rows were a
        # float32 temporary of their own).
        unit = self._decoded(self.codes, self.size)
        rows = (self.scales.shape[0], self.block_size)
        scales = jnp.broadcast_to(self.scales[:, None], rows).reshape(-1)
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
    ) -> "QuantizedArray":
        # A second moment stores sqrt(v): its scale is the root of the block's
        # maximum, and the root of each element is taken only here, by the
        # encoder (taken before the maximum, it made XLA keep sqrt(v) as a
        # float32 temporary shared by the reduction and the encoder).
        scales = maxima
        if kind == "sqrt":
            scales, rows = jnp.sqrt(maxima), jnp.sqrt(rows)
        codes = _encode(
            rows * _inverse(scales)[:, None], kind, bits, rounding, first_row
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
def _quantize_rank1(x, bits, kind, block_size, dtype, rounding):
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
    codes = _encode(_flatten(normalised, block_size), kind, bits, rounding)
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
def requantize_all(olds, news):
    """Each of `news` quantised in the format of the matching `olds`, with the block
    maxima of all the block-normalised ones taken in one pass.

    A moment that is not a whole number of blocks is quantised as its whole
    blocks and, apart, the rest of the last one padded with zeros (the same
    codes as the whole padded): padded whole, the new moment was written to a
    padded float32 copy first, and an 8-bit Adam step on a width-1000 MLP took
    twice as long (`benchmarks/lowbit_bench.py --width 1000`).
    """
    cut = {
        index: _cut_rows(new, old.kind, old.block_size)
        for index, (old, new) in enumerate(zip(olds, news, strict=True))
        if old.normalization != "rank1"
    }
    return _quantized_rows(olds, news, cut)


@no_type_check
def _quantized_rows(olds, news, cut):
    """`requantize_all` with the block-normalised moments already in rows: `cut`
    maps their indices to (whole blocks, the padded rest or `None`)."""
    heads = {index: head for index, (head, _) in cut.items()}
    tails = {index: tail for index, (_, tail) in cut.items() if tail is not None}
    maxima, tail_maxima = (
        dict(zip(rows, _block_maxima(list(rows.values())) if rows else [], strict=True))
        for rows in (heads, tails)
    )

    def quantized(index, old, new):
        if index not in cut:
            return _quantize_rank1(
                new, old.bits, old.kind, old.block_size, old.dtype, old.rounding
            )
        head = heads[index]
        fields = (old.shape, old.bits, old.kind, old.dtype, old.rounding)
        first = QuantizedArray._from_rows(head, maxima[index], *fields)
        if index not in tails:
            return first
        last = QuantizedArray._from_rows(
            tails[index], tail_maxima[index], *fields, first_row=head.shape[0]
        )
        return _joined(first, last)

    return [
        quantized(index, old, new)
        for index, (old, new) in enumerate(zip(olds, news, strict=True))
    ]


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
                tuple(p.shape),
                value,
                dtype.bits,
                kind,
                dtype.block,
                jnp.float32,
                normalization=dtype.normalization_of(tuple(p.shape)),
                rounding=dtype.rounding_in_use,
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
def _block_rows(u: Any, rest: Any) -> int | None:
    """The block size in which an elementwise `fn(u, *rest)` runs on rows of
    blocks: where a quantised moment of `rest` is decoded by a lookup
    (`_looks_up`), every quantised moment is block-normalised with that block
    size, the other arrays of `rest` are shaped like `u`, and nothing is
    sharded over an explicit axis. `None` otherwise: decoded
    arithmetically, a moment fuses into each kernel that reads it in any
    shape (and on the leaves cut from a packed buffer rows made the step 1.2
    times as long)."""
    quantized = [x for x in rest if is_quantized(x)]
    sizes = {x.block_size for x in quantized}
    if len(sizes) != 1 or not eqx.is_array(u) or explicit_sharding(u) is not None:
        return None
    if not any(x.kind == "dynamic" and _looks_up(x.bits) for x in quantized):
        return None
    (block,) = sizes
    if any(
        x.normalization != "block" or x.codes.shape[0] != -(-u.size // block)
        for x in quantized
    ):
        return None
    others = [x for x in rest if not is_quantized(x) and x is not None]
    if any(not eqx.is_array(x) or x.shape != u.shape for x in others):
        return None
    return block


@no_type_check
def call_dequantized(fn: Any, u: Any, rest: Any, elementwise: bool = False) -> Any:
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
    pass (`benchmarks/lowbit_bench.py`, peak bytes)."""
    if not any(map(is_quantized, rest)):
        return fn(u, *rest)
    block = _block_rows(u, rest) if elementwise else None
    if block is not None:
        return _call_in_rows(fn, u, rest, block)
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


@no_type_check
def _call_in_rows(fn, u, rest, block):
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
            return x._block_values(slice(rows, None))[:, : size - whole]
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
    new = _quantized_rows(olds, [first[k] for k in moments], cut)
    result = [x if x is None else x.reshape(shape) for x in plain]
    for k, moment in zip(moments, new, strict=True):
        result[k] = moment
    return tuple(result) if len(result) > 1 else result[0]


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


def quantized_on_buffers(*dtypes: Any) -> bool:
    """Whether a transform whose arithmetic is elementwise, with these moment
    dtypes, runs on packed buffers as they are: every quantised format among
    them quantises a packed buffer as one array (`packed_blocks="buffer"`, block
    normalisation). True when none is quantised."""
    return all(
        dtype.packed_blocks == "buffer" and dtype.normalization == "block"
        for dtype in dtypes
        if is_quantized_format(dtype)
    )


def any_quantized(*dtypes: Any) -> bool:
    """Whether any of the moment dtypes is a quantised format."""
    return any(is_quantized_format(dtype) for dtype in dtypes)
