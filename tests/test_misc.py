"""Small corrections (`eqopt/_transform/misc.py`): centralize, zero_nans and
keep_params_nonnegative."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import ALL_DTYPES, REAL_DTYPES, Case

import eqopt


def _nan_where_negative(updates, params):
    """Puts NaNs into the updates (where the real part is negative), to be zeroed."""
    return jax.tree.map(
        lambda g: None if g is None else jnp.where(jnp.real(g) < 0, jnp.nan, g),
        updates,
        is_leaf=lambda x: x is None,
    )


TRANSFORM_CASES = [
    Case(
        "centralize", eqopt.centralize, optax.centralize, ALL_DTYPES, needs_params=False
    ),
    Case("zero_nans", eqopt.zero_nans, optax.zero_nans, ALL_DTYPES, needs_params=False),
    Case(
        "zero_nans-with_nans",
        lambda: eqopt.chain(eqopt.stateless(_nan_where_negative), eqopt.zero_nans()),
        lambda: optax.chain(optax.stateless(_nan_where_negative), optax.zero_nans()),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "keep_params_nonnegative",
        lambda: eqopt.chain(eqopt.scale(-0.5), eqopt.keep_params_nonnegative()),
        lambda: optax.chain(optax.scale(-0.5), optax.keep_params_nonnegative()),
        REAL_DTYPES,
    ),
]


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
