"""Quantised moments in optimisers: registry cases, bytes per parameter, closeness
to float32 Adam, serialisation and checkpoints, packed models, vmap, and the
format's errors."""

import io

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Case

import eqopt

# Small blocks and no size threshold, so that the registry's 4x3 model is quantised.
Q8 = eqopt.Quantized(8, block_size=8, min_size=0)
Q4 = eqopt.Quantized(4, block_size=8, min_size=0)
NO_PARITY = (
    "quantised moments round the state, so Optax's float32 numbers cannot be "
    "matched exactly; test_quantize_moments compares with float32 Adam (update cosine)"
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
