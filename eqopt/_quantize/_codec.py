"""The maps from normalised values to codes and back: the dynamic, linear and
zero-free maps, rounding to nearest or stochastically (with a dither drawn by
position),
and two 4-bit codes to a byte."""

import functools
from typing import no_type_check

import jax
import jax.numpy as jnp
import numpy as np

from .._backend import decodes_by_lookup
from .._sharding import explicit_sharding


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
def _encode(y, kind, bits, rounding="nearest", first_row=0, salt=None):
    # `first_row`: the index of `y`'s first row among the moment's, and `salt`
    # one per row of `y` (stochastic rounding draws by position: `_dither`).
    if rounding == "stochastic":
        return _encode_stochastic(y, kind, bits, first_row, salt)
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
def _mix(h):
    """MurmurHash3's 32-bit finaliser: every bit of `h` (uint32) moves every bit out."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


@no_type_check
def row_salts(scales, kind, step):
    """The salt of each row of a moment's next quantisation: a hash of the step
    (`step`, the optimiser's count), the moment's kind, and the row's current
    scale (its float bits, as stored).

    All three are the same in every program layout (ZeRO-1, a mesh, a
    checkpoint restored): the step makes each step draw afresh, the scale
    sets apart the leaves, whose positions all start at zero.
    """
    kinds = {"dynamic": 0x68E31DA4, "linear": 0xB5297A4D, "sqrt": 0x1B56C4E9}
    bits = jax.lax.bitcast_convert_type(jnp.asarray(scales, jnp.float32), jnp.uint32)
    step = _mix(jnp.asarray(step).astype(jnp.uint32) * jnp.uint32(0x27D4EB2F))
    return _mix(bits ^ jnp.uint32(kinds[kind]) ^ step)


@no_type_check
def _dither(y, first_row=0, salt=None):
    """A uniform number in [0, 1) per element of `y` (rows of a moment): a
    counter-based hash of the element's position in the moment (its index in
    the flattened array, from row `first_row` on) and of its row's `salt`
    (`row_salts`, one per row), so that rounding needs no key in the state and
    a restored checkpoint rounds as the uninterrupted run does.

    Nothing of the value being rounded goes in: two programs that compute the
    value alike but lay it out otherwise (ZeRO-1 pads and splits the rows over
    devices) draw the same numbers. A transform that gives no step (`salt`
    `None`) hashes the value's float bits in place of the salt, as every
    transform did before (MurmurHash3's finaliser of both): a value that
    comes back bit for bit rounds the same way again, and a last bit that
    another layout computes otherwise is a new draw."""
    row = jax.lax.broadcasted_iota(jnp.uint32, y.shape, 0) + jnp.uint32(first_row)
    index = row * jnp.uint32(y.shape[1]) + jax.lax.broadcasted_iota(
        jnp.uint32, y.shape, 1
    )
    if salt is None:
        salt = jax.lax.bitcast_convert_type(y, jnp.uint32)
    else:
        salt = jnp.asarray(salt, jnp.uint32).reshape(-1, 1)
    h = _mix(salt ^ (index * jnp.uint32(0x9E3779B9)))
    return (h >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)


@no_type_check
def _encode_stochastic(y, kind, bits, first_row=0, salt=None):
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
            (_dither(y, first_row, salt) < position - below)
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
    up = _dither(y, first_row, salt) * (high - low) < y - low
    return jnp.where(up, above, below).astype(jnp.uint8)


@no_type_check
def _pack_nibbles(codes):
    low, high = codes[..., 0::2], codes[..., 1::2]
    return low | jnp.left_shift(high, 4)


@no_type_check
def _unpack_nibbles(packed):
    low, high = packed & 15, jnp.right_shift(packed, 4)
    return jnp.stack([low, high], axis=-1).reshape(*packed.shape[:-1], -1)


@no_type_check
def _looks_up(bits, lookup=True):
    """Whether a stored moment's codes are decoded by a lookup in the map: where
    the backend makes that the faster way (`eqopt._backend.decodes_by_lookup`,
    with its measurements), unless the moment says not (`lookup=False`: a leaf
    cut from a packed buffer, where the lookup made the step 1.7-2.4 times as
    long)."""
    return lookup and decodes_by_lookup(bits)
