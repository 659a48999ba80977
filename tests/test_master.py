"""Master weights and stochastic rounding: unbiasedness, the bfloat16 example,
determinism, jit/vmap, and registry cases."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Case

import eqopt

TRANSFORM_CASES = [
    # On float32 params both are the inner optimiser exactly.
    Case(
        "master_weights-adamw",
        lambda: eqopt.master_weights(eqopt.adamw(1e-2)),
        lambda: optax.adamw(1e-2),
        ("float32",),
    ),
    Case(
        "stochastic_rounding-adam",
        lambda: eqopt.chain(eqopt.adam(1e-2), eqopt.stochastic_rounding(0)),
        lambda: optax.adam(1e-2),
        ("float32",),
    ),
    Case(
        "master_weights-adam-8bit",
        lambda: eqopt.master_weights(
            eqopt.adam(1e-2, mu_dtype=eqopt.Quantized(8, 8, 0))
        ),
        no_parity_reason="quantised first moment; closeness in test_quantize_moments",
    ),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_stochastic_round_is_unbiased(dtype):
    x = jnp.asarray([1.0 + 1e-3, -3.14159, 1e-3, 2.0**-20, 123.456, -7e-5], jnp.float32)
    keys = jax.random.split(jax.random.key(0), 10_000)
    draws = jax.vmap(lambda k: eqopt.stochastic_round(x, dtype, k))(keys)
    assert draws.dtype == dtype
    mean = jnp.mean(draws.astype(jnp.float32), axis=0)
    nearest = x.astype(dtype)
    ulp = jnp.abs(
        jnp.nextafter(nearest, jnp.asarray(jnp.inf, dtype)).astype(jnp.float32)
        - nearest.astype(jnp.float32)
    )
    # Each draw is one of the two neighbours; their mean is x to within a few
    # hundredths of an ulp (the standard error over 10k draws is at most 0.005 ulp).
    assert np.all(np.abs(np.asarray(mean - x)) <= 0.03 * np.asarray(ulp))
    below = jnp.min(draws.astype(jnp.float32), axis=0)
    above = jnp.max(draws.astype(jnp.float32), axis=0)
    assert np.all(np.asarray(below) <= np.asarray(x)) and np.all(
        np.asarray(above) >= np.asarray(x)
    )


def test_stochastic_round_keeps_representable_and_special_values():
    x = jnp.asarray([1.0, -2.5, 0.0, jnp.inf, -jnp.inf, jnp.nan], jnp.float32)
    out = eqopt.stochastic_round(x, jnp.bfloat16, jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(out[:5], np.float32), np.asarray(x[:5]))
    assert bool(jnp.isnan(out[5]))


def test_stochastic_round_is_deterministic_for_a_key():
    x = jnp.linspace(0, 1, 1000) + 1e-4
    a = eqopt.stochastic_round(x, jnp.bfloat16, jax.random.key(3))
    b = jax.jit(eqopt.stochastic_round, static_argnums=1)(
        x, jnp.bfloat16, jax.random.key(3)
    )
    c = eqopt.stochastic_round(x, jnp.bfloat16, jax.random.key(4))
    np.testing.assert_array_equal(a, b)
    assert bool(jnp.any(a != c))


def _add_thousand_times(opt, key_count=200):
    def run(key):
        params = {"x": jnp.asarray(1.0, jnp.bfloat16)}
        tx = opt(key)
        state = tx.init(params)

        def body(carry, _):
            params, state = carry
            updates, state = tx.update({"x": jnp.ones((), jnp.bfloat16)}, state, params)
            return (eqopt.apply_updates(params, updates), state), None

        (params, _), _ = jax.lax.scan(body, (params, state), None, length=1000)
        return params["x"]

    return jax.jit(jax.vmap(run))(jax.random.split(jax.random.key(0), key_count))


def test_bfloat16_one_plus_a_thousand_thousandths():
    """The issue's example: nearest rounding keeps 1.0; stochastic rounding reaches 2."""
    nearest = _add_thousand_times(lambda key: eqopt.sgd(-1e-3), key_count=2)
    assert np.all(np.asarray(nearest, np.float32) == 1.0)
    rounded = _add_thousand_times(
        lambda key: eqopt.chain(eqopt.sgd(-1e-3), eqopt.stochastic_rounding(key))
    )
    assert rounded.dtype == jnp.bfloat16
    values = np.asarray(rounded, np.float32)
    # 200 runs: the mean is within 3 standard errors of 2 (spread ~0.08 per run).
    assert abs(values.mean() - 2.0) < 3 * 0.1 / np.sqrt(len(values))
    assert 0.03 < values.std() < 0.2
    master = _add_thousand_times(
        lambda key: eqopt.master_weights(eqopt.sgd(-1e-3)), key_count=1
    )
    np.testing.assert_allclose(np.asarray(master, np.float32), 2.0, rtol=4e-3)


def _bf16_model():
    model = eqx.nn.MLP(8, 4, 16, 2, key=jax.random.key(0))
    return jax.tree.map(
        lambda x: x.astype(jnp.bfloat16) if eqx.is_inexact_array(x) else x, model
    )


def test_master_weights_keep_float32_copies_and_land_on_them():
    model = _bf16_model()
    opt = eqopt.master_weights(eqopt.adamw(1e-2, weight_decay=0.1))
    state = opt.init(model)
    assert state.master.layers[0].weight.dtype == jnp.float32
    assert state.master.activation is None
    x = jnp.ones(8, jnp.bfloat16)

    @eqx.filter_jit
    def step(model, state):
        grads = eqx.filter_grad(lambda m: jnp.sum(m(x).astype(jnp.float32) ** 2))(model)
        updates, state = opt.update(grads, state, model)
        return eqopt.apply_updates(model, updates), state

    for _ in range(5):
        model, state = step(model, state)
    for param, master in zip(
        jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)),
        jax.tree.leaves(state.master),
        strict=True,
    ):
        assert param.dtype == jnp.bfloat16
        np.testing.assert_array_equal(param, master.astype(jnp.bfloat16))
    # The inner Adam moments are float32: made for the master weights.
    assert eqopt.tree.get(state, "mu").layers[0].weight.dtype == jnp.float32


def test_master_weights_accumulate_what_rounding_would_lose():
    params = {"w": jnp.full((4,), 1.0, jnp.bfloat16), "f": jnp.ones(3)}
    opt = eqopt.master_weights(eqopt.sgd(1e-4))
    state = opt.init(params)
    assert state.master["f"] is None
    grads = {"w": -jnp.ones(4, jnp.bfloat16), "f": -jnp.ones(3)}
    for _ in range(100):
        updates, state = opt.update(grads, state, params)
        params = eqopt.apply_updates(params, updates)
    np.testing.assert_allclose(state.master["w"], 1.01, rtol=1e-5)
    assert float(params["w"][0]) == float(jnp.asarray(1.01, jnp.bfloat16))
    np.testing.assert_allclose(params["f"], 1.01, rtol=1e-5)


def test_stochastic_rounding_needs_params():
    opt = eqopt.stochastic_rounding(0)
    with pytest.raises(ValueError, match="needs `params`"):
        opt.update({"w": jnp.ones(2)}, opt.init({"w": jnp.ones(2)}))
