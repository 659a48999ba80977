"""MoMo and MoMo-Adam: registry cases against `optax.contrib`, the `value` argument, training."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case

import eqopt

ALL_DTYPES = ("float32", "bfloat16", "complex64")


def _value(params, grads):
    # A positive loss computed from the params (a model or a dict of the same
    # arrays, so both libraries get the same value).
    leaves = [x for x in jax.tree.leaves(params) if eqx.is_inexact_array(x)]
    squares = sum(jnp.sum(jnp.abs(x.astype(jnp.complex64)) ** 2) for x in leaves)
    return {"value": 0.2 + 0.5 * squares}


def _small_value(model, grads):
    return {"value": jnp.asarray(1e-3)}


TRANSFORM_CASES = [
    Case(
        "contrib.momo",
        lambda: eqopt.contrib.momo(),
        lambda: optax.contrib.momo(),
        ALL_DTYPES,
        extra_args=_value,
    ),
    Case(
        "contrib.momo-decay-bound",
        lambda: eqopt.contrib.momo(0.3, beta=0.8, lower_bound=0.1, weight_decay=0.1),
        lambda: optax.contrib.momo(0.3, beta=0.8, lower_bound=0.1, weight_decay=0.1),
        ALL_DTYPES,
        extra_args=_value,
    ),
    Case(
        "contrib.momo-adapt-lower-bound",
        lambda: eqopt.contrib.momo(
            0.3, lower_bound=0.05, weight_decay=0.1, adapt_lower_bound=True
        ),
        lambda: optax.contrib.momo(
            0.3, lower_bound=0.05, weight_decay=0.1, adapt_lower_bound=True
        ),
        ALL_DTYPES,
        extra_args=_small_value,
    ),
    Case(
        "contrib.momo_adam",
        lambda: eqopt.contrib.momo_adam(),
        lambda: optax.contrib.momo_adam(),
        extra_args=_value,
    ),
    Case(
        "contrib.momo_adam-decay-bound",
        lambda: eqopt.contrib.momo_adam(0.3, lower_bound=0.1, weight_decay=0.1),
        lambda: optax.contrib.momo_adam(0.3, lower_bound=0.1, weight_decay=0.1),
        extra_args=_value,
    ),
    Case(
        "contrib.momo_adam-adapt-lower-bound",
        lambda: eqopt.contrib.momo_adam(
            0.3, lower_bound=0.05, weight_decay=0.1, adapt_lower_bound=True
        ),
        lambda: optax.contrib.momo_adam(
            0.3, lower_bound=0.05, weight_decay=0.1, adapt_lower_bound=True
        ),
        extra_args=_small_value,
    ),
]


@pytest.mark.parametrize(
    "make", [eqopt.contrib.momo, eqopt.contrib.momo_adam], ids=["momo", "momo_adam"]
)
def test_missing_value_is_a_clear_error(make):
    tx = make()
    params = {"x": jnp.ones(3)}
    with pytest.raises(ValueError, match=r"value=loss"):
        tx.update(params, tx.init(params), params)


def test_non_scalar_value_is_named():
    tx = eqopt.contrib.momo()
    params = {"x": jnp.ones(3)}
    with pytest.raises(ValueError, match="`value` must be the loss"):
        tx.update(params, tx.init(params), params, value=jnp.ones(3))


def test_polyak_step_reaches_the_lower_bound_of_a_linear_model():
    # f(x) = 0.5 |x|^2 with f* = 0: the first step is the Polyak step
    # f / |g|^2 = 0.5, landing at x / 2 (not beyond the learning-rate cap).
    tx = eqopt.contrib.momo(learning_rate=10.0)
    params = {"x": jnp.array([1.0, 2.0, 3.0])}
    value = 0.5 * jnp.sum(params["x"] ** 2)
    updates, state = tx.update({"x": params["x"]}, tx.init(params), params, value=value)
    np.testing.assert_allclose(updates["x"], -0.5 * params["x"], rtol=1e-6)
    capped = eqopt.contrib.momo(learning_rate=0.1)
    updates, _ = capped.update(
        {"x": params["x"]}, capped.init(params), params, value=value
    )
    np.testing.assert_allclose(updates["x"], -0.1 * params["x"], rtol=1e-6)


def test_adapted_lower_bound_never_goes_below_the_given_one():
    tx = eqopt.contrib.momo(adapt_lower_bound=True, lower_bound=0.05)
    params = {"x": jnp.array([1.0, 2.0])}
    state = tx.init(params)
    for _ in range(5):
        value = jnp.asarray(1e-3)
        updates, state = tx.update({"x": params["x"]}, state, params, value=value)
        params = eqopt.apply_updates(params, updates)
        assert float(state.lb) >= 0.05


@pytest.mark.parametrize(
    "make",
    [lambda: eqopt.contrib.momo(), lambda: eqopt.contrib.momo_adam()],
    ids=["momo", "momo_adam"],
)
def test_training_reduces_loss(make):
    initial, final, _, _ = train(make(), steps=100, with_value=True, problem="mlp-4-1")
    assert final < 0.5 * initial
