"""Quantised moments in a step's kernels (`eqopt/_quantize/_call.py`, `_array.py`):
one reduction for a leaf's block maxima, elementwise transforms in the moments'
rows of blocks where a lookup decodes them (CPU), cut moments, and the peak
memory of a training step."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqopt
from eqopt._quantize import QuantizedArray, _call, requantize_all
from eqopt._quantize._array import _rows, _salts


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
    if jax.default_backend() != "cpu":
        pytest.skip("the lookup, and so the rows, are CPU's")
    # Rounded to nearest: stochastic rounding (the default) hashes a value's
    # float bits, so a last bit computed otherwise moves a code by one step.
    fmt = eqopt.Quantized(bits, block_size=64, min_size=0, rounding="nearest")
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
    # Counted where `call_dequantized` looks it up: its own module.
    block_rows = _call._block_rows

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

    monkeypatch.setattr(_call, "_block_rows", counted)
    in_rows = run()
    lookup = bits == 8 and name != "rmsprop"
    # Every leaf in rows where its first moment is looked up.
    assert set(used) == ({64} if lookup else {None})
    monkeypatch.setattr(_call, "_block_rows", lambda u, rest: None)
    shaped = run()
    for a, b in zip(jax.tree.leaves(in_rows), jax.tree.leaves(shaped), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6 * np.abs(b).max())


@pytest.mark.parametrize("step", [None, 7])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("bits, kind", [(8, "dynamic"), (8, "sqrt"), (4, "linear")])
def test_a_cut_moment_has_the_codes_of_the_padded_one(bits, kind, rounding, step):
    """A moment of 2 blocks and 22 elements is requantised as its whole blocks and,
    apart, its padded rest (`requantize_all`): the codes and scales of the whole
    padded at once, stochastic rounding's draws included (they depend on the
    position in the moment and, given a step, on the step and the old scales)."""
    x = jax.random.normal(jax.random.key(3), (5, 30)) * jnp.logspace(-4, 0, 30)[None]
    if kind == "sqrt":
        x = x * x
    old = QuantizedArray.quantize(x * 0.5, bits, kind, 64, rounding=rounding)
    rows = _rows(x, kind, 64)
    salt = None if rounding == "nearest" or step is None else _salts(old, step)
    padded = QuantizedArray._from_rows(
        rows, jnp.max(jnp.abs(rows), axis=1), x.shape, bits, kind, jnp.float32,
        rounding, salt=salt,
    )  # fmt: skip
    (cut,) = requantize_all([old], [x], step)
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
