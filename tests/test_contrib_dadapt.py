"""D-Adaptation AdamW: registry cases against `optax.contrib.dadapt_adamw`, its estimate, training."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case

import eqopt


def _schedule(count):
    return 1.0 / (1.0 + 0.5 * count)


TRANSFORM_CASES = [
    Case(
        "contrib.dadapt_adamw",
        lambda: eqopt.contrib.dadapt_adamw(),
        lambda: optax.contrib.dadapt_adamw(),
    ),
    # A large initial estimate so the updates are not tiny and d moves.
    Case(
        "contrib.dadapt_adamw-options",
        lambda: eqopt.contrib.dadapt_adamw(
            0.5, betas=(0.8, 0.99), estim_lr0=1e-2, weight_decay=0.1
        ),
        lambda: optax.contrib.dadapt_adamw(
            0.5, betas=(0.8, 0.99), estim_lr0=1e-2, weight_decay=0.1
        ),
        steps=6,
    ),
    Case(
        "contrib.dadapt_adamw-schedule",
        lambda: eqopt.contrib.dadapt_adamw(_schedule, estim_lr0=1e-2),
        lambda: optax.contrib.dadapt_adamw(_schedule, estim_lr0=1e-2),
    ),
]


def _quadratic_run(tx, steps, library):
    params = {"x": jnp.zeros(5)}
    state = tx.init(params)
    estimates = []
    for _ in range(steps):
        grads = {"x": params["x"] - 3.0}
        updates, state = tx.update(grads, state, params)
        params = library.apply_updates(params, updates)
        estimates.append(float(state.estim_lr))
    return np.array(estimates)


def test_estimate_grows_from_d0_and_matches_optax():
    estimates = _quadratic_run(eqopt.contrib.dadapt_adamw(), 40, eqopt)
    reference = _quadratic_run(optax.contrib.dadapt_adamw(), 40, optax)
    assert np.all(np.diff(estimates) >= 0)
    assert estimates[-1] > 1e3 * 1e-6
    np.testing.assert_allclose(estimates, reference, rtol=1e-4)


def test_zero_gradients_keep_the_estimate_finite():
    tx = eqopt.contrib.dadapt_adamw()
    params = {"x": jnp.ones(3)}
    state = tx.init(params)
    for grads in (jnp.zeros(3), jnp.ones(3)):
        updates, state = tx.update({"x": grads}, state, params)
    assert np.all(np.isfinite(updates["x"])) and np.isfinite(float(state.estim_lr))


def test_complex_parameters_use_the_modulus():
    tx = eqopt.contrib.dadapt_adamw(estim_lr0=1e-2)
    target = jnp.array([1 + 2j, -1j, 3.0], jnp.complex64)
    params = {"z": jnp.zeros(3, jnp.complex64)}
    state = tx.init(params)
    assert state.exp_avg_sq["z"].dtype == jnp.float32
    start = float(jnp.sum(jnp.abs(params["z"] - target)))
    for _ in range(30):
        updates, state = tx.update({"z": params["z"] - target}, state, params)
        params = eqopt.apply_updates(params, updates)
    assert float(jnp.sum(jnp.abs(params["z"] - target))) < 0.5 * start


def test_needs_params_and_names_betas():
    tx = eqopt.contrib.dadapt_adamw()
    params = {"x": jnp.ones(3)}
    with pytest.raises(ValueError, match="needs the current parameters"):
        tx.update(params, tx.init(params))
    with pytest.raises(ValueError, match="b2"):
        eqopt.contrib.dadapt_adamw(betas=(0.9, 1.0))
    assert isinstance(tx, eqopt.contrib.DAdaptAdamW)


def test_training_reduces_loss():
    initial, final, _, _ = train(
        eqopt.contrib.dadapt_adamw(), steps=100, problem="mlp-4-1"
    )
    assert final < 0.5 * initial
