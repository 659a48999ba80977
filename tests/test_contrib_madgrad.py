"""MADGRAD: registry cases against `optax.contrib.madgrad`, dual averaging, training."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case

import eqopt


def _schedule(count):
    return 0.1 / (1.0 + count)


TRANSFORM_CASES = [
    Case(
        "contrib.scale_by_madgrad",
        lambda: eqopt.contrib.scale_by_madgrad(0.1),
        lambda: optax.contrib.scale_by_madgrad(0.1),
    ),
    Case(
        "contrib.madgrad",
        lambda: eqopt.contrib.madgrad(1e-2),
        lambda: optax.contrib.madgrad(1e-2),
    ),
    Case(
        "contrib.madgrad-schedule-decay",
        lambda: eqopt.contrib.madgrad(
            _schedule, momentum=0.5, weight_decay=0.1, eps=1e-3
        ),
        lambda: optax.contrib.madgrad(
            _schedule, momentum=0.5, weight_decay=0.1, eps=1e-3
        ),
    ),
]


def test_without_momentum_the_iterate_is_the_dual_average():
    # momentum = 0: x_{k+1} = x_0 - s_{k+1} / (cbrt(v_{k+1}) + eps).
    tx = eqopt.contrib.scale_by_madgrad(0.5, momentum=0.0, eps=0.0)
    params = {"x": jnp.array([1.0, -2.0])}
    x0 = params["x"]
    state = tx.init(params)
    s = v = 0.0
    for k, g in enumerate([jnp.array([1.0, 2.0]), jnp.array([-3.0, 0.5])]):
        updates, state = tx.update({"x": g}, state, params)
        params = eqopt.apply_updates(params, updates)
        weight = 0.5 * np.sqrt(k + 1)
        s, v = s + weight * g, v + weight * g**2
        np.testing.assert_allclose(params["x"], x0 - s / np.cbrt(v), rtol=1e-5)


def test_complex_parameters_are_refused():
    with pytest.raises(TypeError, match="madgrad"):
        eqopt.contrib.madgrad(0.1).init({"z": jnp.ones(2, jnp.complex64)})


def test_training_reduces_loss():
    initial, final, _, _ = train(
        eqopt.contrib.madgrad(1e-2), steps=100, problem="mlp-4-1"
    )
    assert final < 0.5 * initial
