"""Prodigy: registry cases against `optax.contrib.prodigy`, its d estimate, training."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case

import eqopt

# Optax squares complex gradients (g * g) where eqopt uses |g|^2, so complex
# parameters are compared only where that does not show (the default d0 makes
# every update tiny); test_complex_parameters_use_the_modulus checks them.
ALL_DTYPES = ("float32", "bfloat16", "complex64")


def _schedule(count):
    return 1.0 / (1.0 + 0.5 * count)


TRANSFORM_CASES = [
    Case(
        "contrib.prodigy",
        lambda: eqopt.contrib.prodigy(),
        lambda: optax.contrib.prodigy(),
        ALL_DTYPES,
    ),
    # A large initial estimate so the updates are not tiny and d moves.
    Case(
        "contrib.prodigy-options",
        lambda: eqopt.contrib.prodigy(
            0.5,
            betas=(0.8, 0.99),
            beta3=0.9,
            estim_lr0=1e-2,
            estim_lr_coef=2.0,
            weight_decay=0.1,
        ),
        lambda: optax.contrib.prodigy(
            0.5,
            betas=(0.8, 0.99),
            beta3=0.9,
            estim_lr0=1e-2,
            estim_lr_coef=2.0,
            weight_decay=0.1,
        ),
        steps=6,
    ),
    Case(
        "contrib.prodigy-schedule-safeguard",
        lambda: eqopt.contrib.prodigy(_schedule, estim_lr0=1e-2, safeguard_warmup=True),
        lambda: optax.contrib.prodigy(_schedule, estim_lr0=1e-2, safeguard_warmup=True),
    ),
]


def _quadratic_run(tx, steps, reference=False):
    """Minimises |x - 3|^2 / 2 from x = 0; returns the d estimates along the way."""
    params = {"x": jnp.zeros(5)}
    state = tx.init(params)
    estimates = []
    for _ in range(steps):
        grads = {"x": params["x"] - 3.0}
        updates, state = tx.update(grads, state, params)
        params = (optax if reference else eqopt).apply_updates(params, updates)
        estimates.append(float(state.estim_lr))
    return np.array(estimates), params


def test_d_estimate_grows_from_d0_and_matches_optax():
    estimates, params = _quadratic_run(eqopt.contrib.prodigy(estim_lr0=1e-6), 40)
    reference, _ = _quadratic_run(optax.contrib.prodigy(estim_lr0=1e-6), 40, True)
    assert estimates[0] == pytest.approx(1e-6)
    assert np.all(np.diff(estimates) >= 0)  # d never decreases
    assert estimates[-1] > 1e3 * estimates[0]  # and grows by orders of magnitude
    np.testing.assert_allclose(estimates, reference, rtol=1e-4)


def test_zero_gradients_keep_d_finite():
    tx = eqopt.contrib.prodigy()
    params = {"x": jnp.ones(3)}
    state = tx.init(params)
    updates, state = tx.update({"x": jnp.zeros(3)}, state, params)
    assert float(state.estim_lr) == pytest.approx(1e-6)
    updates, state = tx.update({"x": jnp.ones(3)}, state, params)
    assert np.all(np.isfinite(updates["x"])) and np.isfinite(float(state.estim_lr))


def test_complex_parameters_use_the_modulus():
    tx = eqopt.contrib.prodigy(estim_lr0=1e-2)
    target = jnp.array([1 + 2j, -1j, 3.0], jnp.complex64)
    params = {"z": jnp.zeros(3, jnp.complex64)}
    state = tx.init(params)
    assert state.exp_avg_sq["z"].dtype == jnp.float32
    start = float(jnp.sum(jnp.abs(params["z"] - target)))
    for _ in range(30):
        updates, state = tx.update({"z": params["z"] - target}, state, params)
        params = eqopt.apply_updates(params, updates)
    assert float(jnp.sum(jnp.abs(params["z"] - target))) < 0.5 * start


def test_needs_params():
    tx = eqopt.contrib.prodigy()
    params = {"x": jnp.ones(3)}
    with pytest.raises(ValueError, match="needs the current parameters"):
        tx.update(params, tx.init(params))


def test_state_fields_and_class():
    tx = eqopt.contrib.prodigy(betas=(0.8, 0.9))
    assert isinstance(tx, eqopt.contrib.Prodigy)
    assert float(tx.b1) == pytest.approx(0.8) and tx.beta3 is None
    state = tx.init({"x": jnp.ones(3, jnp.bfloat16)})
    assert isinstance(state, eqopt.contrib.ProdigyState)
    assert state.estim_lr.dtype == jnp.float32
    assert state.exp_avg["x"].dtype == jnp.bfloat16


@pytest.mark.parametrize("bad", [{"betas": (1.5, 0.9)}, {"estim_lr0": 0.0}])
def test_bad_hyperparameters_name_the_argument(bad):
    with pytest.raises(ValueError, match="b1|estim_lr0"):
        eqopt.contrib.prodigy(**bad)


def test_training_reduces_loss():
    initial, final, _, _ = train(eqopt.contrib.prodigy(), steps=100, problem="mlp-4-1")
    assert final < 0.5 * initial


def test_jit_value():
    # The estimate is a traced scalar: the update compiles once.
    tx = eqopt.contrib.prodigy()
    params = {"x": jnp.ones(3)}
    update = jax.jit(tx.update)
    state = tx.init(params)
    for _ in range(3):
        _, state = update(params, state, params)
    assert update._cache_size() == 1
