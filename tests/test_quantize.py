"""Quantised moments: the maps against the papers and bitsandbytes, rank-1
normalisation against Li et al.'s definition, stochastic rounding, error bounds,
zero safety, bytes per parameter, closeness to float32 Adam, and registry cases."""

import io

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Case

import eqopt
from eqopt._quantize import (
    QuantizedArray,
    _decode,
    _decode_dynamic_arithmetic,
    _encode,
    _rank1_scales,
    decoding_table,
    dynamic_map,
)

# Small blocks and no size threshold, so that the registry's 4x3 model is quantised.
Q8 = eqopt.Quantized(8, block_size=8, min_size=0)
Q4 = eqopt.Quantized(4, block_size=8, min_size=0)
NO_PARITY = (
    "quantised moments round the state, so Optax's float32 numbers cannot be "
    "matched exactly; test_quantize compares with float32 Adam (update cosine)"
)

TRANSFORM_CASES = [
    Case(
        "adam-8bit",
        lambda: eqopt.adam(1e-2, mu_dtype=Q8, nu_dtype=Q8),
        no_parity_reason=NO_PARITY,
    ),
    Case(
        "adamw-4bit",
        lambda: eqopt.adamw(1e-2, mu_dtype=Q4, nu_dtype=Q4),
        no_parity_reason=NO_PARITY,
    ),
    # Rank-1 scales for both moments (the 4x3 leaves are matrices) and
    # stochastic rounding, the 4-bit default.
    Case(
        "adamw-4bit-rank1",
        lambda: eqopt.adamw(
            1e-2,
            mu_dtype=eqopt.Quantized(4, 8, 0, normalization="rank1"),
            nu_dtype=eqopt.Quantized(4, 8, 0, normalization="rank1"),
        ),
        no_parity_reason=NO_PARITY,
    ),
    Case(
        "adam-8bit-linear-nesterov",
        lambda: eqopt.nadam(
            1e-2,
            mu_dtype=eqopt.Quantized(8, 8, 0, "linear"),
            nu_dtype=Q8,
        ),
        no_parity_reason=NO_PARITY,
    ),
    # Leaves below the default `min_size` stay float32: Optax's numbers exactly.
    Case(
        "adam-8bit-small-leaves-float32",
        lambda: eqopt.adam(
            1e-2, mu_dtype=eqopt.Quantized(8), nu_dtype=eqopt.Quantized(8)
        ),
        lambda: optax.adam(1e-2, mu_dtype=jnp.float32),
        ("float32",),
    ),
    Case(
        "lion-8bit", lambda: eqopt.lion(1e-3, mu_dtype=Q8), no_parity_reason=NO_PARITY
    ),
    Case(
        "rmsprop-8bit",
        lambda: eqopt.rmsprop(1e-2, initial_scale=0.1, nu_dtype=Q8),
        no_parity_reason=NO_PARITY,
    ),
    Case(
        "contrib.ademamix-8bit",
        lambda: eqopt.contrib.ademamix(1e-2, mu_dtype=Q8),
        no_parity_reason=NO_PARITY,
    ),
    Case(
        "contrib.muon-8bit",
        lambda: eqopt.contrib.muon(1e-2, mu_dtype=Q8),
        no_parity_reason=NO_PARITY,
    ),
]


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
    try:
        import bitsandbytes.functional as bnb_functional
    except Exception as error:  # noqa: BLE001 (any import failure: CPU-only builds vary)
        pytest.skip(f"bitsandbytes does not import here: {error}")
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


def test_block_maxima_are_one_pass_over_all_moments():
    """Adam's two quantised moments of a leaf take their block maxima in one
    variadic reduction (it fuses with the moment update and reads the gradient
    once); a `reduce_max` per moment was handed to XLA CPU's library reduction
    over a float32 temporary of the moment (benchmarks/lowbit_bench.py)."""
    fmt = eqopt.Quantized(8, block_size=64, min_size=0)
    opt = eqopt.adam(1e-3, mu_dtype=fmt, nu_dtype=fmt)
    params = {"w": jnp.ones((64, 64)), "v": jnp.ones((32, 64))}
    state = opt.init(params)
    jaxpr = jax.make_jaxpr(lambda g, s: opt.update(g, s, params))(params, state)
    reductions = [e for e in jaxpr.eqns if e.primitive.name.startswith("reduce")]
    assert [e.primitive.name for e in reductions] == ["reduce"] * 2
    assert all(len(e.invars) == 4 for e in reductions)  # 2 moments + 2 inits


def test_block_maxima_of_one_moment_are_not_a_library_reduction():
    """One quantised moment (RMSProp's) takes its block maxima in a loop fused
    with the moment update. A single-operand maximum, or two operands of which
    XLA merges or drops one, went to XLA CPU's library reduction over a float32
    temporary of the moment: an 8-bit RMSProp-like step took 1.7 times as long."""
    opt = eqopt.rmsprop(1e-3, nu_dtype=eqopt.Quantized(8, min_size=0))
    params = {"w": jnp.ones((128, 512))}  # codes in 256 rows of 256
    state = opt.init(params)
    text = jax.jit(opt.update).lower(params, state, params).compile().as_text()
    entry = text[text.index("ENTRY") :]
    assert "kind=kCustom" not in entry
    # No float32 temporary of the moment's rows: the codes are the only output.
    assert "f32[256,256]" not in entry


_ELEMENTWISE = {
    "adam": lambda fmt: eqopt.adam(1e-2, mu_dtype=fmt, nu_dtype=fmt),
    "lion": lambda fmt: eqopt.lion(1e-3, mu_dtype=fmt),
    "rmsprop": lambda fmt: eqopt.rmsprop(1e-2, initial_scale=0.1, nu_dtype=fmt),
    "ademamix": lambda fmt: eqopt.contrib.ademamix(1e-2, mu_dtype=fmt),
}


@pytest.mark.parametrize(
    "name, bits",
    [("adam", 8), ("lion", 8), ("ademamix", 8), ("adam", 4), ("rmsprop", 8)],
)
def test_moments_in_rows_of_blocks_are_the_leaf_shaped_numbers(name, bits, monkeypatch):
    """Where a stored first moment is decoded by a lookup (8-bit dynamic codes
    on CPU), elementwise transforms compute a quantised leaf in its moments'
    rows of blocks (`call_dequantized`): a leaf that is not a whole number of
    blocks as its whole blocks and, apart, the rest (even when it has no whole
    block); every leaf of a 4-bit or second-moment-only transform goes through
    its own shape. The numbers of the leaf-shaped step, to float32's rounding
    (XLA compiles the same arithmetic into other kernels: the last bit of an
    update may differ)."""
    import eqopt._quantize as quantize

    if jax.default_backend() != "cpu":
        pytest.skip("the lookup, and so the rows, are CPU's")
    fmt = eqopt.Quantized(bits, block_size=64, min_size=0)
    keys = jax.random.split(jax.random.key(0), 6)
    params = {
        "w": jax.random.normal(keys[0], (32, 64)),  # 32 blocks
        "v": jax.random.normal(keys[1], (5, 30)),  # 2 blocks and 22 elements
        "b": jax.random.normal(keys[1], (30,)) * 1e-3,  # less than a block
    }
    grads = [
        jax.tree.map(lambda p, k=k: jax.random.normal(k, p.shape), params)
        for k in keys[2:]
    ]
    used = []
    block_rows = quantize._block_rows

    def counted(u, rest):
        used.append(block_rows(u, rest))
        return used[-1]

    def run():
        opt = _ELEMENTWISE[name](fmt)
        step = jax.jit(opt.update)
        state, updates = opt.init(params), []
        for g in grads:
            u, state = step(g, state, params)
            updates.append(u)
        return updates, eqopt.tree.get(state, "mu" if name != "rmsprop" else "nu")

    monkeypatch.setattr(quantize, "_block_rows", counted)
    in_rows = run()
    lookup = bits == 8 and name != "rmsprop"
    # Every leaf in rows where its first moment is looked up.
    assert set(used) == ({64} if lookup else {None})
    monkeypatch.setattr(quantize, "_block_rows", lambda u, rest: None)
    shaped = run()
    for a, b in zip(jax.tree.leaves(in_rows), jax.tree.leaves(shaped), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6 * np.abs(b).max())


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("bits, kind", [(8, "dynamic"), (8, "sqrt"), (4, "linear")])
def test_a_cut_moment_has_the_codes_of_the_padded_one(bits, kind, rounding):
    """A moment of 2 blocks and 22 elements is requantised as its whole blocks and,
    apart, its padded rest (`requantize_all`): the codes and scales of the whole
    padded at once, stochastic rounding's draws included (they depend on the
    position in the moment)."""
    from eqopt._quantize import QuantizedArray, requantize_all

    x = jax.random.normal(jax.random.key(3), (5, 30)) * jnp.logspace(-4, 0, 30)[None]
    if kind == "sqrt":
        x = x * x
    padded = QuantizedArray.quantize(x, bits, kind, 64, jnp.float32, rounding=rounding)
    (cut,) = requantize_all([padded], [x])
    assert cut.codes.shape == padded.codes.shape == (3, 64 if bits == 8 else 32)
    np.testing.assert_array_equal(np.asarray(cut.codes), np.asarray(padded.codes))
    np.testing.assert_array_equal(np.asarray(cut.scales), np.asarray(padded.scales))


def test_training_step_keeps_the_state_saving_at_its_peak():
    """XLA's peak memory for a whole training step (loss, gradient, update, apply)
    of a 9-layer MLP: with 8-bit Adam it stays at least 3 bytes per parameter
    under float32 Adam's (the state saves 6). Decoded through the leaves' shape,
    the old first moments were a kernel that depended on nothing the step
    computes: on CPU XLA ran it for every leaf before the backward pass and
    kept them all, and the peak was 1.7 bytes under float32's."""
    model = eqx.nn.MLP(512, 512, 512, depth=8, key=jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    size = sum(p.size for p in jax.tree.leaves(params))
    x = jnp.ones((64, 512))

    def peak(opt):
        def step(params, state, x):
            def loss(p):
                return jnp.mean(jax.vmap(eqx.combine(p, static))(x) ** 2)

            grads = jax.grad(loss)(params)
            updates, state = opt.update(grads, state, params)
            return eqopt.apply_updates(params, updates), state

        state = opt.init(params)
        jitted = jax.jit(step, donate_argnums=(0, 1))
        analysis = jitted.lower(params, state, x).compile().memory_analysis()
        used = analysis.argument_size_in_bytes + analysis.temp_size_in_bytes
        return used / size

    fmt = eqopt.Quantized(8)
    quantized = peak(eqopt.adam(1e-3, mu_dtype=fmt, nu_dtype=fmt))
    full = peak(eqopt.adam(1e-3))
    assert quantized <= full - 3.0, (quantized, full)


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
# Rank-1 normalisation (Li et al.)
# ---------------------------------------------------------------------------


def _rows_times_columns(shape, key=7):
    """Positive values whose size is mostly a row's times a column's, each spread
    over decades (the outlier pattern Li et al. find in second moments)."""
    keys = jax.random.split(jax.random.key(key), 3)
    rows = 1.5 * jax.random.normal(keys[0], (shape[0], 1))
    columns = 1.5 * jax.random.normal(keys[1], (1, shape[1]))
    return jnp.exp(rows + columns + 0.5 * jax.random.normal(keys[2], shape))


@pytest.mark.parametrize("kind", ["sqrt", "dynamic", "linear"])
def test_rank1_scale_is_the_smaller_of_row_and_column_maxima(kind):
    """Li et al.: element (i, j) is normalised by min(max_k |x_ik|, max_k |x_kj|);
    the scales are the row maxima then the column maxima (of sqrt(v) for a
    second moment), and every row's and column's maximum is exact."""
    v = _rows_times_columns((96, 160))
    x = v if kind == "sqrt" else v * jnp.sign(jnp.sin(jnp.arange(160.0) * 3))[None, :]
    q = QuantizedArray.quantize(x, 4, kind, 128, normalization="rank1")
    magnitude = np.sqrt(np.asarray(v)) if kind == "sqrt" else np.abs(np.asarray(x))
    rows, columns = magnitude.max(axis=1), magnitude.max(axis=0)
    np.testing.assert_allclose(q.scales, np.concatenate([rows, columns]), rtol=1e-6)
    scale = np.minimum(rows[:, None], columns[None, :])
    np.testing.assert_allclose(_rank1_scales(q.scales, (96, 160)), scale, rtol=1e-6)
    assert q.scales.shape == (96 + 160,) and q.normalization == "rank1"
    assert q.codes.shape == (96 * 160 // 128, 64) and q.dequantize().shape == (96, 160)
    deq = np.asarray(q.dequantize())
    for axis in (0, 1):
        top = np.argmax(magnitude, axis=axis)
        index = (top, np.arange(160)) if axis == 0 else (np.arange(96), top)
        # The dynamic map has no -1 (as bitsandbytes'): positive maxima are exact.
        exact = np.asarray(x)[index] >= 0 if kind == "dynamic" else slice(None)
        np.testing.assert_allclose(
            deq[index][exact], np.asarray(x)[index][exact], rtol=1e-5
        )


def test_rank1_error_is_half_a_step_of_the_elements_scale():
    """Rounded to nearest, sqrt(v) errs by at most half a level of min(r_i, c_j)
    (the block bound, with the element's own scale); where sizes go by rows and
    columns, the update's typical error is well below the block-wise one."""
    v = _rows_times_columns((128, 256))
    rank1 = QuantizedArray.quantize(v, 4, "sqrt", 128, normalization="rank1")
    block = QuantizedArray.quantize(v, 4, "sqrt", 128)
    root = np.sqrt(np.asarray(v))
    scale = np.minimum(root.max(axis=1, keepdims=True), root.max(axis=0, keepdims=True))
    error = np.abs(np.sqrt(np.asarray(rank1.dequantize())) - root)
    above = root >= scale / 16
    assert np.all(error[above] <= (scale / 32 * (1 + 1e-5))[above])
    assert np.all(np.asarray(rank1.dequantize()) > 0)

    def update_error(q):  # of 1 / sqrt(v), the factor Adam's step takes
        return np.median(
            np.abs(np.sqrt(np.asarray(v) / np.asarray(q.dequantize())) - 1)
        )

    assert update_error(rank1) < 0.75 * update_error(block)


def test_rank1_with_more_axes_takes_the_least_of_every_axis_maximum():
    x = (
        _rows_times_columns((12, 40))[:, :, None]
        * jnp.linspace(1.0, 3.0, 30)[None, None]
    )
    q = QuantizedArray.quantize(x, 4, "dynamic", 128, normalization="rank1")
    magnitude = np.abs(np.asarray(x))
    maxima = [
        magnitude.max(axis=(1, 2)),
        magnitude.max(axis=(0, 2)),
        magnitude.max(axis=(0, 1)),
    ]
    np.testing.assert_allclose(q.scales, np.concatenate(maxima), rtol=1e-6)
    scale = np.minimum(
        np.minimum(maxima[0][:, None, None], maxima[1][None, :, None]),
        maxima[2][None, None, :],
    )
    np.testing.assert_allclose(_rank1_scales(q.scales, x.shape), scale, rtol=1e-6)
    assert np.all(np.abs(np.asarray(q.dequantize()) - magnitude) <= 0.12 * scale)


def test_which_leaves_are_rank1():
    """Asked for, rank-1 applies to every leaf with two axes longer than one;
    vectors keep blocks (Li et al.). Blocks and rounding to nearest at 8 bits,
    stochastic rounding at 4 bits, are the defaults."""
    rank1 = eqopt.Quantized(4, normalization="rank1")
    assert rank1.normalization_of((128, 64)) == "rank1"
    assert rank1.normalization_of((8, 16, 16)) == "rank1"
    assert rank1.normalization_of((4096, 1)) == "block"
    assert rank1.normalization_of((1 << 20,)) == "block"
    four, eight = eqopt.Quantized(4), eqopt.Quantized(8)
    assert four.normalization_of((1024, 512)) == "block"
    assert four.rounding_in_use == "stochastic" and eight.rounding_in_use == "nearest"
    params = {"w": jnp.ones((128, 64)), "v": jnp.ones(8192)}
    state = eqopt.adam(1e-3, mu_dtype=four, nu_dtype=rank1).init(params)
    nu, mu = state[0].nu, state[0].mu
    assert nu["w"].normalization == "rank1" and nu["w"].scales.shape == (192,)
    assert nu["v"].normalization == "block" and mu["w"].normalization == "block"
    assert nu["w"].rounding == mu["w"].rounding == "stochastic"
    np.testing.assert_array_equal(nu["w"].dequantize(), 0.0)


def test_rank1_scales_stay_whole_under_zero():
    """ZeRO-1 splits a rank-1 moment's codes over their blocks; its scales (a
    maximum per row and per column) are not per block and stay whole."""
    mesh = jax.sharding.AbstractMesh(
        (4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,)
    )
    opt = eqopt.adam(
        1e-3,
        mu_dtype=eqopt.Quantized(4),
        nu_dtype=eqopt.Quantized(4, normalization="rank1"),
    )
    state = eqx.filter_eval_shape(opt.init, {"w": jnp.ones((1000, 257))})
    shardings = eqopt.zero_shardings(state, mesh, min_size=0)
    P = jax.sharding.PartitionSpec
    assert shardings[0].nu["w"].codes.spec == P("data", None)
    assert shardings[0].nu["w"].scales.spec == P(None)
    assert shardings[0].mu["w"].scales.spec == P("data")
    assert not any("nu" in path for path in eqopt.zero_unsplit(state, mesh, min_size=0))


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


# ---------------------------------------------------------------------------
# State, memory and training
# ---------------------------------------------------------------------------


def _big_model():
    keys = jax.random.split(jax.random.key(0), 3)
    return {
        "w": jax.random.normal(keys[0], (1024, 1024)) * 0.02,
        "v": jax.random.normal(keys[1], (1000, 257)) * 0.02,
        "b": jnp.zeros(1024),
    }


def _state_bytes(state):
    return sum(
        x.size * x.dtype.itemsize
        for x in jax.tree.leaves(state)
        if eqx.is_array(x) and x.ndim > 0
    )


@pytest.mark.parametrize(
    "bits,normalization,limit",
    [(8, "block", 2.1), (4, "block", 1.1), (4, "rank1", 1.05)],
)
def test_adam_state_bytes_per_parameter(bits, normalization, limit):
    params = _big_model()
    n = sum(x.size for x in jax.tree.leaves(params))
    fmt = eqopt.Quantized(bits)
    nu_fmt = eqopt.Quantized(bits, normalization=normalization)
    state = eqopt.adam(1e-3, mu_dtype=fmt, nu_dtype=nu_fmt).init(params)
    per_param = _state_bytes(state) / n
    assert per_param <= limit
    assert isinstance(state[0].mu["w"], eqopt.QuantizedArray)
    # Rank-1 scales: rows + columns, fewer than the blocks of a large matrix.
    if normalization == "rank1":
        assert state[0].nu["w"].scales.shape == (1024 + 1024,)
        assert state[0].nu["v"].scales.shape == (1000 + 257,)
    # The bias is below `min_size`: kept in float32.
    assert state[0].mu["b"].dtype == jnp.float32
    assert _state_bytes(eqopt.adam(1e-3).init(params)) / n == 8


def test_init_builds_codes_without_quantising():
    params = _big_model()
    fmt = eqopt.Quantized(8)
    opt = eqopt.adam(1e-3, mu_dtype=fmt, nu_dtype=fmt)
    jaxpr = str(jax.make_jaxpr(opt.init)(params))
    assert "log" not in jaxpr and "round" not in jaxpr and "reduce_max" not in jaxpr
    state = opt.init(params)
    assert float(jnp.max(jnp.abs(state[0].mu["w"].dequantize()))) == 0.0
    rms = eqopt.rmsprop(1e-3, initial_scale=0.25, nu_dtype=fmt).init(params)
    np.testing.assert_allclose(rms[0].nu["w"].dequantize(), 0.25, rtol=1e-6)


def _train(opt, params, steps=60, spread=1.0, packed=False):
    """Trains `params` on noisy gradients; `packed`: kept packed (`eqopt.pack`),
    with the same gradients, and returned unpacked."""
    if packed:
        params = eqopt.pack(params)
    state = opt.init(params)

    @jax.jit
    def step(params, state, key):
        model = params.unpack() if packed else params
        keys = jax.random.split(key)
        scales = jnp.exp(spread * jax.random.normal(jax.random.key(9), (1024, 1)))
        grads = jax.tree.map(
            lambda p: 1e-3 * jax.random.normal(keys[0], p.shape), model
        )
        grads["w"] = grads["w"] * scales + 1e-3 * jnp.sin(model["w"] * 10)
        if packed:
            grads = eqopt.Packed.like(params, grads)
        updates, state = opt.update(grads, state, params)
        return eqopt.apply_updates(params, updates), state, updates

    for i in range(steps):
        params, state, updates = step(params, state, jax.random.key(i))
    if packed:
        return params.unpack(), state, updates.unpack()
    return params, state, updates


def _cosine(a, b):
    a, b = jnp.ravel(a), jnp.ravel(b)
    return float(a @ b / (jnp.linalg.norm(a) * jnp.linalg.norm(b)))


@pytest.mark.parametrize(
    "bits,rounding,cosine", [(8, None, 0.99), (4, "nearest", 0.9), (4, None, 0.85)]
)
def test_quantised_adam_stays_close_to_float32_adam(bits, rounding, cosine):
    """Step by step; stochastic rounding (the 4-bit default) trades a noisier
    step (0.89 here, 0.93 rounded to nearest) for moments right on average
    (`test_decay_survives_stochastic_rounding`)."""
    params = _big_model()
    fmt = eqopt.Quantized(bits, rounding=rounding)
    reference = _train(eqopt.adam(1e-3), params)
    quantised = _train(eqopt.adam(1e-3, mu_dtype=fmt, nu_dtype=fmt), params)
    assert _cosine(reference[2]["w"], quantised[2]["w"]) > cosine
    moved = reference[0]["w"] - params["w"]
    assert _cosine(moved, quantised[0]["w"] - params["w"]) > cosine
    # The readable state: `tree.get` dequantises, close to float32 Adam's moments.
    mu = eqopt.tree.get(quantised[1], "mu")["w"]
    assert mu.shape == (1024, 1024) and mu.dtype == jnp.float32
    assert _cosine(mu, eqopt.tree.get(reference[1], "mu")["w"]) > cosine


def _quantised_adam(bits):
    """Adam with quantised moments; at 4 bits, Li et al.'s rank-1 second moment."""
    return eqopt.adam(
        1e-3,
        mu_dtype=eqopt.Quantized(bits),
        nu_dtype=eqopt.Quantized(bits, normalization="rank1" if bits == 4 else "block"),
    )


def test_quantised_state_serialises_and_round_trips():
    params = _big_model()
    opt = _quantised_adam(4)
    _, state, _ = _train(opt, params, steps=3)
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, state)
    buffer.seek(0)
    restored = eqx.tree_deserialise_leaves(buffer, opt.init(params))
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)
    assert restored[0].mu["w"].codes.dtype == jnp.uint8
    assert restored[0].nu["w"].normalization == "rank1"
    np.testing.assert_array_equal(
        restored[0].nu["w"].dequantize(), state[0].nu["w"].dequantize()
    )


@pytest.mark.parametrize("bits", [8, 4])
def test_quantised_state_checkpoints_with_orbax(tmp_path, bits):
    ocp = pytest.importorskip("orbax.checkpoint")
    params = _big_model()
    opt = _quantised_adam(bits)
    _, state, _ = _train(opt, params, steps=2)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "state", state)
    checkpointer.wait_until_finished()
    restored = checkpointer.restore(tmp_path / "state", opt.init(params))
    np.testing.assert_array_equal(restored[0].nu["w"].codes, state[0].nu["w"].codes)
    np.testing.assert_array_equal(restored[0].nu["w"].scales, state[0].nu["w"].scales)
    assert restored[0].nu["w"].normalization == state[0].nu["w"].normalization
    np.testing.assert_array_equal(
        restored[0].mu["w"].dequantize(), state[0].mu["w"].dequantize()
    )


@pytest.mark.parametrize("packed_blocks", ["leaf", "rank1"])
def test_packed_model_with_leaf_blocks_gives_the_per_leaf_numbers(packed_blocks):
    """`packed_blocks="leaf"`, or rank-1 normalisation (which needs the leaves'
    matrices), unpacks a packed model for the transform: the numbers and the
    state are those of the model as it is."""
    params = _big_model()
    if packed_blocks == "rank1":
        opt = _quantised_adam(4)
    else:
        fmt = eqopt.Quantized(8, packed_blocks="leaf")
        opt = eqopt.adam(1e-3, mu_dtype=fmt, nu_dtype=fmt)
    assert not opt.elementwise and not opt.runs_on_buffers
    packed = eqopt.pack(params)
    state, packed_state = opt.init(params), opt.init(packed)
    grads = jax.tree.map(lambda p: jnp.cos(p * 7.0), params)
    updates, _ = opt.update(grads, state, params)
    packed_updates, packed_state = opt.update(
        eqopt.Packed.like(packed, grads), packed_state, packed
    )
    for a, b in zip(
        jax.tree.leaves(packed_updates.unpack()), jax.tree.leaves(updates), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    assert isinstance(packed_state[0].mu["w"], eqopt.QuantizedArray)


@pytest.mark.parametrize("bits", [8, 4])
def test_packed_buffer_is_quantised_as_one_array(bits):
    """By default a packed buffer's moment is one `QuantizedArray`: the step runs
    on the buffers as they are (no unpacking), the bytes per parameter are the
    per-leaf ones, and training is as close to float32 Adam as per leaf."""
    params = _big_model()
    fmt = eqopt.Quantized(bits)
    opt = eqopt.adam(1e-3, mu_dtype=fmt, nu_dtype=fmt)
    assert not opt.elementwise and opt.runs_on_buffers
    size = sum(x.size for x in jax.tree.leaves(params))

    packed = eqopt.pack(params)
    state = opt.init(packed)
    mu = state[0].mu
    assert isinstance(mu, eqopt.Packed)
    (moment,) = mu.buffers
    assert isinstance(moment, eqopt.QuantizedArray) and moment.shape == (size,)
    # The 1024 elements of `b` are quantised with their neighbours.
    assert _state_bytes(state) / size <= (2.1 if bits == 8 else 1.1)

    grads = eqopt.Packed.like(packed, jax.tree.map(jnp.cos, params))
    text = jax.jit(opt.update).lower(grads, state, packed).as_text()
    # No array shaped like a leaf: the step never unpacks the model.
    assert "1024x1024" not in text and "1000x257" not in text

    reference = _train(eqopt.adam(1e-3), params)
    per_leaf = _train(opt, params)
    on_buffers = _train(opt, params, packed=True)
    moved = reference[0]["w"] - params["w"]
    leaf_cosine = _cosine(moved, per_leaf[0]["w"] - params["w"])
    buffer_cosine = _cosine(moved, on_buffers[0]["w"] - params["w"])
    assert buffer_cosine > (0.99 if bits == 8 else 0.9)
    assert abs(buffer_cosine - leaf_cosine) < (0.002 if bits == 8 else 0.02)

    # The state reads as the model's: `tree.get` dequantises, `unpack` splits.
    mu = eqopt.tree.get(on_buffers[1], "mu").unpack()
    assert jax.tree.structure(mu) == jax.tree.structure(params)
    assert mu["w"].shape == (1024, 1024) and mu["w"].dtype == jnp.float32
    cosine = _cosine(mu["w"], eqopt.tree.get(reference[1], "mu")["w"])
    assert cosine > (0.99 if bits == 8 else 0.85)
    # Bucketed, the state is the same buffer, read back model-shaped.
    bucketed = eqopt.bucketed(opt, always=True)
    unpacked = bucketed.init(params).unpacked()
    assert unpacked[0].mu["w"].shape == (1024, 1024)


def test_packed_gradient_is_cut_at_offsets_xla_sees_only_for_4_bits():
    # With run-time offsets (`_split.py`), XLA on CPU did not vectorise the
    # kernel that packs 4-bit codes two to a byte: a packed 4-bit Adam step
    # took 3-4 times as long as with static slices (benchmarks/lowbit_bench.py).
    # 8-bit codes keep the run-time offsets (same speed, fewer kernels).
    params = _big_model()
    packed = eqopt.pack(params)
    grads = eqopt.Packed.like(packed, jax.tree.map(jnp.cos, params))
    for bits in (8, 4):
        fmt = eqopt.Quantized(bits, packed_blocks="leaf")
        opt = eqopt.adam(1e-3, mu_dtype=fmt, nu_dtype=fmt)
        state = opt.init(packed)

        def step(packed, state, grads, opt=opt):
            updates, state = opt.update(grads, state, packed)
            return eqopt.apply_updates(packed, updates), state

        text = jax.jit(step).lower(packed, state, grads).as_text()
        assert ("dynamic_slice" in text) == (bits == 8)


def test_vmap_over_learning_rates_with_quantised_moments():
    params = {"w": jnp.ones((64, 64))}
    fmt = eqopt.Quantized(8, min_size=0)
    grads = {"w": jnp.linspace(-1, 1, 64 * 64).reshape(64, 64)}

    def step(lr):
        opt = eqopt.adam(lr, mu_dtype=fmt, nu_dtype=fmt)
        return opt.update(grads, opt.init(params), params)[0]["w"]

    out = jax.vmap(step)(jnp.array([1e-3, 1e-2]))
    np.testing.assert_allclose(out[1], 10 * out[0], rtol=1e-5)


def test_bad_format_is_one_short_error():
    with pytest.raises(ValueError, match="bits"):
        eqopt.Quantized(3)
    with pytest.raises(ValueError, match="block_size"):
        eqopt.Quantized(8, block_size=7)
    with pytest.raises(ValueError, match="normalization"):
        eqopt.Quantized(4, normalization="rows")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="rounding"):
        eqopt.Quantized(4, rounding="up")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="packed_blocks"):
        eqopt.Quantized(8, packed_blocks="model")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="uncentred"):
        eqopt.rmsprop(1e-3, centered=True, nu_dtype=eqopt.Quantized(8))
