"""Mechanic: registry cases against `optax.contrib.mechanize`, the learned scale, training."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case

import eqopt

ALL_DTYPES = ("float32", "bfloat16", "complex64")

TRANSFORM_CASES = [
    Case(
        "contrib.mechanize-sgd",
        lambda: eqopt.contrib.mechanize(eqopt.sgd(0.1)),
        lambda: optax.contrib.mechanize(optax.sgd(0.1)),
        ALL_DTYPES,
    ),
    # A large initial scale so the updates are far from zero and every
    # statistic (including the clipped h in r) matters.
    Case(
        "contrib.mechanize-adam-large-scale",
        lambda: eqopt.contrib.mechanize(
            eqopt.adam(0.1), weight_decay=0.1, s_init=0.1, num_betas=4
        ),
        lambda: optax.contrib.mechanize(
            optax.adam(0.1), weight_decay=0.1, s_init=0.1, num_betas=4
        ),
        ("float32", "bfloat16"),
        steps=8,
    ),
]


def test_scale_grows_when_the_base_steps_are_too_small():
    tx = eqopt.contrib.mechanize(eqopt.sgd(1e-3))
    params = {"x": jnp.zeros(5)}
    state = tx.init(params)
    for _ in range(50):
        updates, state = tx.update({"x": params["x"] - 3.0}, state, params)
        params = eqopt.apply_updates(params, updates)
    assert float(jnp.sum(state.s)) > 100 * 1e-6
    assert float(jnp.abs(params["x"] - 3.0).max()) < 3.0


def test_delta_accumulates_the_base_updates():
    base = eqopt.sgd(0.1)
    tx = eqopt.contrib.mechanize(base)
    params = {"x": jnp.ones(3)}
    state = tx.init(params)
    grads = {"x": jnp.array([1.0, 2.0, 3.0])}
    for _ in range(3):
        _, state = tx.update(grads, state, params)
    np.testing.assert_allclose(state.delta["x"], -0.3 * grads["x"], rtol=1e-6)
    assert state.s.shape == (6,) and state.base_optimizer_state[1] is not None


def test_an_optax_base_optimiser_is_accepted():
    # On a dict of arrays (Optax's own transforms cannot init a whole model).
    params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "b": jnp.ones(3)}
    ours = eqopt.contrib.mechanize(optax.sgd(0.1, momentum=0.9), s_init=0.1)
    reference = optax.contrib.mechanize(optax.sgd(0.1, momentum=0.9), s_init=0.1)
    state, reference_state = ours.init(params), reference.init(params)
    for step in range(5):
        grads = {k: jnp.cos(v + step) for k, v in params.items()}
        updates, state = ours.update(grads, state, params)
        expected, reference_state = reference.update(grads, reference_state, params)
        for key in params:
            np.testing.assert_allclose(
                updates[key], expected[key], rtol=1e-4, atol=1e-6
            )
        params = eqopt.apply_updates(params, updates)


def test_elementwise_follows_the_base():
    assert eqopt.contrib.mechanize(eqopt.adam(1e-3)).elementwise
    masked = eqopt.masked(eqopt.sgd(1.0), lambda x: x.ndim > 1)
    assert not eqopt.contrib.mechanize(masked).elementwise


def test_bad_num_betas_is_named():
    with pytest.raises(ValueError, match="num_betas"):
        eqopt.contrib.mechanize(eqopt.sgd(0.1), num_betas=0)


def test_training_reduces_loss():
    initial, final, _, _ = train(
        eqopt.contrib.mechanize(eqopt.adam(1e-2)), steps=100, problem="mlp-4-1"
    )
    assert final < 0.5 * initial


def test_bfloat16_parameters_are_trained_where_optax_stalls():
    # Optax recovers the sum of base updates from x_t - x_0, which bfloat16
    # rounds to zero while the scale is small: its parameters never move.
    # eqopt keeps the sum in the state.
    results = {}
    for library in (optax, eqopt):
        tx = library.contrib.mechanize(library.sgd(1e-2))
        params = {"x": jnp.ones(5, jnp.bfloat16)}
        state = tx.init(params)
        for _ in range(100):
            updates, state = tx.update({"x": params["x"] - 3.0}, state, params)
            params = library.apply_updates(params, updates)
        results[library.__name__] = float(params["x"][0])
    assert results["optax"] == 1.0
    assert abs(results["eqopt"] - 3.0) < 0.1
