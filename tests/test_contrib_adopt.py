"""ADOPT: registry cases against `optax.contrib.adopt`, its first step and clipping, training."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case

import eqopt


def _clip(count):
    return 0.5 * count**0.5


TRANSFORM_CASES = [
    Case(
        "contrib.scale_by_adopt",
        lambda: eqopt.contrib.scale_by_adopt(),
        lambda: optax.contrib.scale_by_adopt(),
    ),
    Case(
        "contrib.adopt",
        lambda: eqopt.contrib.adopt(1e-2),
        lambda: optax.contrib.adopt(1e-2),
    ),
    Case(
        "contrib.adopt-nesterov-no-clipping",
        lambda: eqopt.contrib.adopt(1e-2, b2=0.99, nesterov=True, use_clipping=False),
        lambda: optax.contrib.adopt(1e-2, b2=0.99, nesterov=True, use_clipping=False),
    ),
    Case(
        "contrib.adopt-clip-fn-mu-dtype",
        lambda: eqopt.contrib.adopt(1e-2, clip_value_fn=_clip, mu_dtype=jnp.float32),
        lambda: optax.contrib.adopt(1e-2, clip_value_fn=_clip, mu_dtype=jnp.float32),
    ),
]


def test_first_step_only_initialises_the_second_moment():
    tx = eqopt.contrib.scale_by_adopt()
    params = {"x": jnp.ones(3)}
    grads = {"x": jnp.array([1.0, -2.0, 0.5])}
    updates, state = tx.update(grads, tx.init(params), params)
    np.testing.assert_array_equal(updates["x"], jnp.zeros(3))
    np.testing.assert_allclose(state.nu["x"], grads["x"] ** 2)
    np.testing.assert_array_equal(state.mu["x"], jnp.zeros(3))


def test_clipping_bounds_the_normalised_gradient():
    tx = eqopt.contrib.scale_by_adopt(b1=0.0)
    params = {"x": jnp.ones(1)}
    state = tx.init(params)
    _, state = tx.update({"x": jnp.array([1e-3])}, state, params)
    # The next gradient is 1e4 times the previous RMS: clipped at 1**0.25 = 1.
    updates, _ = tx.update({"x": jnp.array([10.0])}, state, params)
    np.testing.assert_allclose(updates["x"], [1.0])
    unclipped = eqopt.contrib.scale_by_adopt(b1=0.0, use_clipping=False)
    updates, _ = unclipped.update({"x": jnp.array([10.0])}, state, params)
    np.testing.assert_allclose(updates["x"], [1e4], rtol=1e-5)


def test_complex_parameters_are_refused():
    with pytest.raises(TypeError, match="adopt"):
        eqopt.contrib.adopt(0.1).init({"z": jnp.ones(2, jnp.complex64)})


def test_training_reduces_loss():
    initial, final, _, _ = train(
        eqopt.contrib.adopt(1e-2), steps=100, problem="mlp-4-1"
    )
    assert final < 0.5 * initial
