"""Quantised moments' codes (`eqopt/_quantize/_codec.py`): the maps against the
papers and bitsandbytes, arithmetic encoding and decoding, error bounds, zero
safety of the second moment, and stochastic rounding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _oracles import import_oracle

import eqopt
from eqopt._quantize import (
    QuantizedArray,
    _decode,
    _decode_dynamic_arithmetic,
    _encode,
    decoding_table,
    dynamic_map,
)

# ---------------------------------------------------------------------------
# The maps
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4])
def test_decoding_arithmetic_is_the_map_to_a_rounding(bits):
    """Codes are decoded arithmetically, or looked up in the map (stored 8-bit
    moments on CPU): the same values to float32's last bit."""
    codes = jnp.arange(2**bits, dtype=jnp.uint8)
    table = dynamic_map(bits)
    np.testing.assert_allclose(
        np.asarray(_decode_dynamic_arithmetic(codes, bits)), table, rtol=2.4e-7
    )
    np.testing.assert_array_equal(
        np.asarray(_decode(codes, "dynamic", bits, lookup=True)), table
    )


@pytest.mark.parametrize("bits", [8, 4])
def test_dynamic_map_is_the_papers_definition(bits):
    """Dettmers et al.: b-1 decades, 2^i linearly spaced midpoints in decade i,
    their negatives, zero and one."""
    table = dynamic_map(bits)
    decades = bits - 1
    assert table.shape == (2**bits,)
    assert np.all(np.diff(table) > 0)
    assert table[2**decades - 1] == 0.0 and table[-1] == 1.0
    positive = table[2**decades : -1]
    expected = []
    for i in range(decades):
        width = 0.9 / 2**i
        expected += [
            10.0 ** (i - decades + 1) * (0.1 + width * (j + 0.5)) for j in range(2**i)
        ]
    np.testing.assert_allclose(positive, expected, rtol=1e-6)
    np.testing.assert_array_equal(table[: 2**decades - 1], -positive[::-1])


@pytest.mark.parametrize("bits,exponent_bits", [(8, 7), (4, 3)])
def test_dynamic_map_matches_bitsandbytes(bits, exponent_bits):
    bnb_functional = import_oracle("bitsandbytes.functional", "bitsandbytes")
    reference = bnb_functional.create_dynamic_map(
        signed=True, max_exponent_bits=exponent_bits, total_bits=bits
    ).numpy()
    # bitsandbytes pads a map shorter than 256 entries with zeros.
    np.testing.assert_array_equal(np.unique(reference), dynamic_map(bits))


@pytest.mark.parametrize(
    "kind,bits", [(k, b) for k in ("dynamic", "linear", "sqrt") for b in (8, 4)]
)
def test_code_is_the_nearest_value_of_the_map(kind, bits):
    table = decoding_table(kind, bits)
    low = 0.0 if kind == "sqrt" else -1.0
    y = np.concatenate(
        [np.linspace(low, 1.0, 40001, dtype=np.float32), table, [0.0, 1e-9]]
    ).astype(np.float32)
    codes = np.asarray(_encode(jnp.asarray(y), kind, bits)).astype(np.int64)
    chosen = np.abs(y - table[codes])
    best = np.min(np.abs(y[:, None] - table[None, :]), axis=1)
    assert np.all(chosen <= best + 1e-7)
    # Every value of the map is its own code.
    np.testing.assert_array_equal(
        table[np.asarray(_encode(jnp.asarray(table), kind, bits)).astype(np.int64)],
        table,
    )


@pytest.mark.parametrize("bits", [8, 4])
def test_dynamic_decoding_is_the_map(bits):
    """Decoding is arithmetic too; it gives the map's values to one float32 rounding."""
    codes = jnp.arange(2**bits, dtype=jnp.uint8)[None, :]
    q = QuantizedArray(
        codes=codes if bits == 8 else (codes[:, 0::2] | (codes[:, 1::2] << 4)),
        scales=jnp.ones(1),
        shape=(2**bits,),
        dtype=jnp.float32,
        bits=bits,
        kind="dynamic",
    )
    np.testing.assert_allclose(q.dequantize(), dynamic_map(bits), rtol=2e-7, atol=0)


def test_code_lookup_is_arithmetic():
    """No search or sort in the jitted quantiser (searchsorted took 3-10x a whole
    Adam step). The only gather is decoding on CPU: one lookup per code in the
    map's 2^bits values."""
    x = jnp.ones((64, 64))
    formats = [
        (bits, kind, normalization, rounding)
        for bits in (8, 4)
        for kind in ("dynamic", "linear", "sqrt")
        for normalization in ("block", "rank1")
        for rounding in ("nearest", "stochastic")
    ]
    for fmt in formats:
        closed = jax.make_jaxpr(
            lambda x, fmt=fmt: QuantizedArray.quantize(
                x, fmt[0], fmt[1], 256, None, fmt[2], fmt[3]
            ).dequantize()
        )(x)
        equations = list(_equations(closed.jaxpr))
        names = {eqn.primitive.name for eqn in equations}
        for primitive in ("sort", "while", "searchsorted", "scan"):
            assert primitive not in names, (fmt, primitive)
        tables = [
            eqn.invars[0].aval.shape
            for eqn in equations
            if eqn.primitive.name == "gather"
        ]
        assert all(shape == (2 ** fmt[0],) for shape in tables), (fmt, tables)


def _equations(jaxpr):
    """Every equation of `jaxpr`, those of its inner jaxprs (`pjit`'s) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", None)
            if inner is not None:
                yield from _equations(inner)


# ---------------------------------------------------------------------------
# Error bounds
# ---------------------------------------------------------------------------


def _blocks(x, block):
    return np.asarray(x).reshape(-1, block)


@pytest.mark.parametrize("bits", [8, 4])
def test_linear_first_moment_error_is_half_a_step_of_the_block_maximum(bits):
    block = 64
    x = jax.random.normal(jax.random.key(0), (32, block)) * jnp.exp(
        jax.random.normal(jax.random.key(1), (32, 1))
    )
    q = QuantizedArray.quantize(x, bits, "linear", block)
    error = np.abs(np.asarray(q.dequantize()) - np.asarray(x))
    bound = np.max(np.abs(_blocks(x, block)), axis=1, keepdims=True) / (
        2 * (2 ** (bits - 1) - 1)
    )
    assert np.all(error <= bound * (1 + 1e-5) + 1e-12)
    # Exact at zero and at each block's maximum.
    assert np.all(np.abs(np.asarray(q.dequantize()))[np.asarray(x) == 0] == 0)
    rows = _blocks(x, block)
    top = np.argmax(np.abs(rows), axis=1)
    deq = _blocks(q.dequantize(), block)
    np.testing.assert_allclose(
        deq[np.arange(32), top], rows[np.arange(32), top], rtol=1e-6
    )


@pytest.mark.parametrize("bits", [8, 4])
def test_dynamic_first_moment_error_is_half_a_step_of_its_decade(bits):
    block = 128
    x = jax.random.normal(jax.random.key(2), (16, block)) * 10.0 ** jax.random.uniform(
        jax.random.key(3), (16, block), minval=-4, maxval=0
    )
    q = QuantizedArray.quantize(x, bits, "dynamic", block)
    rows = _blocks(x, block)
    scale = np.max(np.abs(rows), axis=1, keepdims=True)
    y = rows / scale
    deq = _blocks(q.dequantize(), block) / scale
    # Half the gap between the two values of the map around y (-1 has no code:
    # it goes to the largest negative value, as in bitsandbytes); within decade i
    # that is half of 10^(i-E+1) * 0.9 / 2^i (the largest gap, between 0.99 and
    # 1, is 0.0066 of the block maximum at 8 bits).
    table = dynamic_map(bits)
    upper = np.clip(np.searchsorted(table, y), 1, len(table) - 1)
    bound = (table[upper] - table[upper - 1]) / 2
    bound = np.where(y < table[0], table[0] - y, bound)
    assert np.all(np.abs(deq - y) <= bound * (1 + 1e-5) + 1e-9)
    assert np.max(bound) <= (0.0071 if bits == 8 else 0.12)
    assert np.all(np.sign(deq)[deq != 0] == np.sign(rows)[deq != 0])


@pytest.mark.parametrize("bits", [8, 4])
def test_second_moment_is_zero_safe_and_bounded(bits):
    """sqrt(v) on a linear map without zero: error half a step of sqrt(max v) above
    the first level, never decoded to zero unless the block is zero (Li et al.)."""
    block, levels = 128, 2**bits
    v = (jax.random.normal(jax.random.key(4), (8, block)) * 1e-3) ** 2
    v = v.at[0].set(0.0).at[1, :5].set(0.0)
    q = QuantizedArray.quantize(v, bits, "sqrt", block)
    root = np.sqrt(_blocks(v, block))
    deq = np.sqrt(_blocks(q.dequantize(), block))
    scale = np.max(root, axis=1, keepdims=True)
    error = np.abs(deq - root)
    above = root >= scale / levels
    assert np.all(
        error[above]
        <= (scale / (2 * levels) * (1 + 1e-5) + 1e-12)[np.nonzero(above)[0]].ravel()
    )
    assert np.all(
        deq[~above] <= (scale / levels * (1 + 1e-5))[np.nonzero(~above)[0]].ravel()
    )
    # A zero block decodes to zero; elsewhere nothing decodes to zero.
    assert np.all(deq[0] == 0)
    assert np.all(deq[1:] > 0)


def test_linear_map_of_nu_itself_would_round_to_zero():
    """The failure the zero-free sqrt scheme avoids: a linear 8-bit map of v
    (with a zero code) sends small second moments to zero."""
    v = (
        jax.random.normal(jax.random.key(5), (256,))
        * jnp.exp(2 * jax.random.normal(jax.random.key(6), (256,)))
    ) ** 2
    naive = jnp.round(v / jnp.max(v) * 255) / 255 * jnp.max(v)
    assert int(jnp.sum(naive == 0)) > 10
    q = QuantizedArray.quantize(v, 8, "sqrt", 256)
    assert int(jnp.sum(q.dequantize() == 0)) == 0


# ---------------------------------------------------------------------------
# Stochastic rounding
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dynamic", "linear", "sqrt"])
def test_stochastic_rounding_is_unbiased_and_one_step_off(kind):
    """Each element goes to one of the two codes around it, the upper with the
    probability that makes the decoded value right on average; values of the
    map (zero, the maximum) are exact."""
    table = decoding_table(kind, 4)
    y = np.linspace(table[0], 1.0, 41, dtype=np.float32)
    # One block per value: 4095 copies of it and the block's maximum, 1 (a
    # second moment stores sqrt(v): v = y^2).
    x = np.concatenate([np.repeat(y[:, None], 4095, 1), np.ones((41, 1))], axis=1)
    x = jnp.asarray(x**2 if kind == "sqrt" else x, jnp.float32)

    def decoded(rounding):
        q = QuantizedArray.quantize(x, 4, kind, 4096, rounding=rounding)
        values = np.asarray(q.dequantize())
        assert np.all(values[:, -1] == 1.0)
        return np.sqrt(values[:, :-1]) if kind == "sqrt" else values[:, :-1]

    stochastic = decoded("stochastic")
    upper = table[np.searchsorted(table, y)]
    lower = table[np.searchsorted(table, y, side="right") - 1]
    assert np.all(stochastic >= lower[:, None] - 1e-6)
    assert np.all(stochastic <= upper[:, None] + 1e-6)
    step = np.max(upper - lower)
    np.testing.assert_allclose(stochastic.mean(axis=1), y, atol=4 * step / 64)
    on_map = lower == upper
    assert np.all(stochastic[on_map] == y[on_map, None])
    # Rounded to nearest, the copies all take one code: biased.
    assert np.max(np.abs(decoded("nearest").mean(axis=1) - y)) > 0.02


@pytest.mark.parametrize("kind", ["dynamic", "linear", "sqrt"])
def test_stochastic_codes_stay_in_the_map(kind):
    """A normalised value a rounding above 1 (or below -1) takes the end code."""
    ends = np.float32([1.0, np.nextafter(1.0, 2.0), 1.0 + 1e-6])
    y = np.concatenate([ends, -ends]) if kind != "sqrt" else ends
    y = jnp.asarray(np.repeat(y[:, None], 128, axis=1))
    codes = np.asarray(_encode(y, kind, 4, "stochastic"))
    table = decoding_table(kind, 4)
    np.testing.assert_array_equal(codes, np.asarray(_encode(y, kind, 4)))
    assert codes.max() < len(table) and np.all(np.abs(table[codes]) <= 1.0)


def test_stochastic_rounding_needs_no_key():
    """The random numbers hash each element's position and value: the same array
    rounds the same way, under jit too, and the state holds codes and scales only."""
    x = jax.random.normal(jax.random.key(3), (64, 128))
    fmt = dict(bits=4, kind="dynamic", block_size=128, rounding="stochastic")
    first = QuantizedArray.quantize(x, **fmt)
    again = jax.jit(lambda x: QuantizedArray.quantize(x, **fmt))(x)
    np.testing.assert_array_equal(first.codes, again.codes)
    assert len(jax.tree.leaves(first)) == 2


@pytest.mark.parametrize("rounding,decayed", [("nearest", False), ("stochastic", True)])
def test_decay_survives_stochastic_rounding(rounding, decayed):
    """Why 4-bit moments round stochastically: an element whose gradient is zero
    decays by beta each step, but rounded to nearest 0.9 x returns to x's code
    (the block's maximum, fed by its gradient, keeps the scale), so it never
    decays; rounded stochastically it decays by beta^t on average."""
    block = jnp.concatenate([jnp.ones((256, 1)), jnp.full((256, 127), 0.5)], axis=1)
    q = QuantizedArray.quantize(block, 4, "dynamic", 128, rounding=rounding)
    top = jnp.zeros((256, 128)).at[:, 0].set(1.0)
    for step in range(10):
        maximum = 1.0 + 0.01 * jnp.sin(step + jnp.arange(256.0))[:, None]
        q = q.requantize(top * maximum + (1 - top) * 0.9 * q.dequantize())
    mean = float(jnp.mean(q.dequantize()[:, 1:]))
    expected = 0.5 * 0.9**10
    if decayed:
        assert abs(mean - expected) < 0.1 * expected
    else:
        assert mean > 0.4


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("rounding", [None, "nearest"])
def test_decaying_adam_moments_reach_float32_to_the_maps_resolution(bits, rounding):
    """Adam's moments of elements whose gradient stops decay as float32's do, to
    the map's resolution, with the default rounding (stochastic), at 8 bits as
    at 4. After a gradient of 0.1 and 1000 steps without one, beside an element
    whose gradient stays 1, the roots of the second moments are on average
    within one step of the map (the block's root maximum over 2^bits) of
    float32's, three in four of them each within one step, and the first moments
    on average within the map's lowest value (relative to the block's maximum)
    of float32's zero. Each element's own error is a random walk of steps
    (up to a few): one code above the lowest, a root goes down with chance
    2 (1 - sqrt(0.999)), 0.1%, a step only, so with independent draws 14% ± 3%
    of them are still there after 1000 steps (10%, 15%, 17% over three keys
    of `jax.random`; nine in ten within one step held only by chance).
    Rounded to nearest, 0.999 v and 0.9 m round back to their
    codes: at 8 bits the second moments stall 7 steps up (6.2e-4 where
    float32's is 3.7e-6), at both widths the first moments far above zero."""
    fmt = eqopt.Quantized(bits, rounding=rounding)
    params = {"w": jnp.zeros(4096)}
    first = {"w": jnp.full(4096, 0.1).at[0].set(1.0)}
    later = {"w": jnp.zeros(4096).at[0].set(1.0)}

    def decayed(opt):
        state = opt.init(params)
        update = jax.jit(opt.update)
        _, state = update(first, state, params)
        for _ in range(1000):
            _, state = update(later, state, params)
        return state

    quantised = decayed(eqopt.adam(1e-3, mu_dtype=fmt, nu_dtype=fmt))
    reference = decayed(eqopt.adam(1e-3))
    nu, mu, nu_float32, mu_float32 = (
        np.asarray(eqopt.tree.get(state, name)["w"][1 : fmt.block])
        for state in (quantised, reference)
        for name in ("nu", "mu")
    )
    root_step = float(quantised[0].nu["w"].scales[0]) / 2**bits
    root_error = np.abs(np.sqrt(nu) - np.sqrt(nu_float32)) / root_step
    lowest = float(dynamic_map(bits)[2 ** (bits - 1)])
    mu_error = np.mean(np.abs(mu - mu_float32)) / float(quantised[0].mu["w"].scales[0])
    if rounding is None:
        assert np.mean(root_error) <= 1.0 and np.percentile(root_error, 75) <= 1.0
        assert mu_error <= lowest
    else:
        assert mu_error > 5 * lowest
        if bits == 8:
            assert np.mean(root_error) > 5.0 and nu[0] > 100 * nu_float32[0]
