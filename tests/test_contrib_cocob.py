"""COCOB: registry cases against `optax.contrib.cocob`, betting behaviour, training."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case, spec_like

import eqopt

TRANSFORM_CASES = [
    Case(
        "contrib.scale_by_cocob",
        lambda: eqopt.contrib.scale_by_cocob(),
        lambda: optax.contrib.scale_by_cocob(),
    ),
    Case("contrib.cocob", lambda: eqopt.contrib.cocob(), lambda: optax.contrib.cocob()),
    Case(
        "contrib.cocob-options-mask",
        lambda p: eqopt.contrib.cocob(
            0.5, alpha=10.0, weight_decay=0.1, mask=spec_like(p, False, w=True)
        ),
        lambda p: optax.contrib.cocob(
            0.5, alpha=10.0, weight_decay=0.1, mask=spec_like(p, False, w=True)
        ),
    ),
]


def test_consistent_gradients_grow_the_bet():
    # With a gradient of constant sign the reward grows, and so does the step.
    tx = eqopt.contrib.scale_by_cocob()
    params = {"x": jnp.zeros(2)}
    state = tx.init(params)
    steps = []
    for _ in range(20):
        updates, state = tx.update({"x": jnp.array([1.0, -1.0])}, state, params)
        params = eqopt.apply_updates(params, updates)
        steps.append(float(updates["x"][0]))
    assert all(s < 0 for s in steps)  # a descent step, without negation
    assert abs(steps[-1]) > 5 * abs(steps[0])
    assert float(params["x"][1]) > 0
    np.testing.assert_array_equal(state.init_particles["x"], jnp.zeros(2))


def test_complex_parameters_are_refused_with_a_pointer():
    with pytest.raises(TypeError, match=r"split_real_and_imaginary"):
        eqopt.contrib.cocob().init({"z": jnp.ones(2, jnp.complex64)})


def test_training_reduces_loss():
    initial, final, _, _ = train(eqopt.contrib.cocob(), steps=100, problem="mlp-4-1")
    assert final < 0.5 * initial
