"""Behaviour of the RMS, sign and corrective transforms beyond Optax parity.

Parity with Optax runs in the registry (`_cases_more.py`); here are the
documented differences from Optax and what the registry cannot see (states,
edge values, errors).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqopt


def _complex(shape, seed=0):
    real, imag = jax.random.normal(jax.random.key(seed), (2, *shape))
    return (real + 1j * imag).astype(jnp.complex64)


@pytest.mark.parametrize(
    "make,moment",
    [
        (eqopt.scale_by_rms, lambda s: s.nu),
        (eqopt.scale_by_stddev, lambda s: s.nu),
        (eqopt.scale_by_rss, lambda s: s.sum_of_squares),
    ],
    ids=["rms", "stddev", "rss"],
)
def test_squared_moments_of_complex_params_are_real(make, moment):
    """Difference from Optax (which stores them complex): half the memory, same updates."""
    params = {"z": _complex((3, 2))}
    tx = make()
    state = tx.init(params)
    _, state = tx.update({"z": _complex((3, 2), 1)}, state)
    assert moment(state)["z"].dtype == jnp.float32


def test_bfloat16_state_stays_bfloat16():
    params = {"w": jnp.ones((2, 2), jnp.bfloat16)}
    grads = {"w": jnp.full((2, 2), 0.5, jnp.bfloat16)}
    for tx in (
        eqopt.scale_by_rms(bias_correction=True),
        eqopt.scale_by_stddev(),
        eqopt.scale_by_rss(),
        eqopt.scale_by_lion(),
        eqopt.rmsprop(0.1, momentum=0.9),
    ):
        state = tx.init(params)
        for _ in range(2):
            updates, state = tx.update(grads, state)
        assert updates["w"].dtype == jnp.bfloat16, tx
        for leaf in jax.tree.leaves(state):
            assert leaf.dtype in (jnp.bfloat16, jnp.int32), (tx, leaf.dtype)


def test_rms_with_bias_correction_is_adam_without_first_moment():
    params = {"w": jnp.linspace(-1.0, 1.0, 6)}
    rms = eqopt.scale_by_rms(
        decay=0.75, eps=1e-3, eps_in_sqrt=False, bias_correction=True
    )
    adam = eqopt.scale_by_adam(b1=0.0, b2=0.75, eps=1e-3)
    rms_state, adam_state = rms.init(params), adam.init(params)
    for step in range(3):
        grads = {"w": jnp.cos(params["w"] * (step + 1))}
        rms_updates, rms_state = rms.update(grads, rms_state)
        adam_updates, adam_state = adam.update(grads, adam_state)
        np.testing.assert_allclose(rms_updates["w"], adam_updates["w"], rtol=1e-6)


def test_adagrad_zero_accumulator_gives_zero_update():
    tx = eqopt.scale_by_rss(initial_accumulator_value=0.0)
    params = {"w": jnp.zeros(3)}
    updates, _ = tx.update({"w": jnp.array([0.0, 1.0, -2.0])}, tx.init(params))
    np.testing.assert_allclose(updates["w"], [0.0, 1.0, -1.0], rtol=1e-6)
    assert np.all(np.isfinite(updates["w"]))


def test_lion_smooth_on_complex_keeps_the_phase():
    """Difference from Optax: tanh of the modulus, not the complex tanh (which has poles)."""
    params = {"z": jnp.zeros(4, jnp.complex64)}
    grads = {"z": jnp.array([0.3 + 0.4j, -2.0j, 0.0, 1.5], jnp.complex64)}
    beta = 2.0
    tx = eqopt.scale_by_lion(b1=0.0, mode="smooth", smooth_beta=beta)
    updates, _ = tx.update(grads, tx.init(params))
    g = np.asarray(grads["z"])
    modulus = np.abs(g)
    expected = np.where(
        modulus > 0, np.tanh(beta * modulus) * g / np.where(modulus > 0, modulus, 1), 0
    )
    np.testing.assert_allclose(updates["z"], expected, rtol=1e-6, atol=1e-7)
    # On the real axis it is Optax's tanh; off it, Optax's complex tanh differs.
    reference = optax.scale_by_lion(b1=0.0, mode="smooth", smooth_beta=beta)
    reference_updates, _ = reference.update(grads, reference.init(params))
    np.testing.assert_allclose(updates["z"][3], reference_updates["z"][3], rtol=1e-6)
    assert not np.allclose(updates["z"][1], reference_updates["z"][1])
    # Near a pole of the complex tanh (i pi / 2), eqopt's stays bounded by one.
    near_pole = {"z": jnp.full(4, 1j * np.pi / (2 * beta), jnp.complex64)}
    updates, _ = tx.update(near_pole, tx.init(params))
    assert np.all(np.abs(np.asarray(updates["z"])) <= 1.0)


def test_lion_momentum_is_not_the_update_interpolation():
    """c_t uses b1, the stored momentum uses b2 (Chen et al., Algorithm 2)."""
    tx = eqopt.scale_by_lion(b1=0.5, b2=0.25, mode="refined")
    params = {"w": jnp.zeros(2)}
    state = tx.init(params)
    updates, state = tx.update({"w": jnp.array([0.4, -4.0])}, state)
    np.testing.assert_allclose(updates["w"], [0.2, -1.0])
    np.testing.assert_allclose(state.mu["w"], [0.3, -3.0])
    updates, state = tx.update({"w": jnp.array([0.0, 0.0])}, state)
    np.testing.assert_allclose(updates["w"], [0.15, -1.0])


def test_centralize_centres_each_output_unit_of_a_linear_layer():
    model = eqx.nn.Linear(5, 3, key=jax.random.key(0))
    grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.arange(5.0)) ** 3))(model)
    tx = eqopt.centralize()
    updates, _ = tx.update(grads, tx.init(model))
    np.testing.assert_allclose(jnp.mean(updates.weight, axis=1), 0.0, atol=1e-6)
    np.testing.assert_array_equal(updates.bias, grads.bias)  # vectors pass through
    assert not tx.elementwise


def test_zero_nans_records_where_on_a_whole_model():
    class Model(eqx.Module):
        w: jax.Array
        b: jax.Array
        activation: object = jax.nn.relu

    model = Model(jnp.ones((2, 2)), jnp.ones(2))
    tx = eqopt.zero_nans()
    state = tx.init(model)
    assert state.found_nan.activation is None and not state.found_nan.w
    grads = Model(jnp.array([[1.0, jnp.nan], [2.0, 3.0]]), jnp.ones(2), None)
    updates, state = tx.update(grads, state)
    np.testing.assert_array_equal(updates.w, [[1.0, 0.0], [2.0, 3.0]])
    assert bool(state.found_nan.w) and not bool(state.found_nan.b)
    # A leaf without a gradient found no NaN at the last call.
    updates, state = tx.update(Model(jnp.ones((2, 2)), None, None), state)
    assert (
        updates.b is None
        and not bool(state.found_nan.w)
        and not bool(state.found_nan.b)
    )
    # jit: found_nan is an array leaf, readable after the step.
    _, state = eqx.filter_jit(tx.update)(grads, state)
    assert bool(state.found_nan.w)


def test_keep_params_nonnegative():
    params = {"w": jnp.array([1.0, 0.5, 0.0, 2.0])}
    tx = eqopt.keep_params_nonnegative()
    updates, _ = tx.update(
        {"w": jnp.array([-2.0, 0.25, -1.0, -1.0])}, tx.init(params), params
    )
    np.testing.assert_allclose(updates["w"], [-1.0, 0.25, 0.0, -1.0])
    assert np.all(np.asarray(eqopt.apply_updates(params, updates)["w"]) >= 0)
    with pytest.raises(ValueError, match="needs `params`"):
        tx.update({"w": jnp.ones(4)}, tx.init(params))


def test_keep_params_nonnegative_rejects_complex_naming_the_path():
    """Difference from Optax (which compares complex numbers): an error naming the leaf."""
    params = {"a": jnp.ones(2), "z": jnp.ones(2, jnp.complex64)}
    tx = eqopt.keep_params_nonnegative()
    with pytest.raises(ValueError, match=r"\['z'\].*complex64"):
        tx.update(params, tx.init(params), params)


def test_adam_second_moment_is_real_for_complex_params():
    """Optax stores Adam's `nu` as complex with a zero imaginary part; eqopt stores it real.

    The updates are the same (the parity tests compare them on complex64).
    """
    params = {"w": jnp.array([1.0 + 2.0j, -0.5j])}
    for tx in (eqopt.scale_by_adam(), eqopt.scale_by_amsgrad()):
        state = tx.init(params)
        assert (
            state.nu["w"].dtype == jnp.float32 and state.mu["w"].dtype == jnp.complex64
        )
        _, state = tx.update({"w": jnp.array([0.3 - 0.1j, 2.0 + 0.0j])}, state)
        assert state.nu["w"].dtype == jnp.float32
    state = eqopt.scale_by_adam(nu_dtype=jnp.bfloat16).init({"w": jnp.ones(2)})
    assert state.nu["w"].dtype == jnp.bfloat16
