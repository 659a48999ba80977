"""`apply_if_finite`, `skip_not_finite` and `skip_large_updates`, beyond the registry."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Case, assert_tree_allclose, make_model

import eqopt

TRANSFORM_CASES = [
    Case(
        "apply_if_finite-adam",
        lambda: eqopt.apply_if_finite(eqopt.adam(1e-2), 2),
        lambda: optax.apply_if_finite(optax.adam(1e-2), 2),
        ("float32", "bfloat16", "complex64"),
    ),
    Case(
        "apply_if_finite-sgd_momentum",
        lambda: eqopt.apply_if_finite(eqopt.sgd(0.1, momentum=0.9), 0),
        lambda: optax.apply_if_finite(optax.sgd(0.1, momentum=0.9), 0),
    ),
]


def _nan_grads():
    return {"w": jnp.array([1.0, jnp.nan, 2.0]), "b": jnp.array(0.5)}


def _good_grads():
    return {"w": jnp.array([1.0, -1.0, 2.0]), "b": jnp.array(0.5)}


def test_nan_step_is_skipped_and_counted():
    params = {"w": jnp.zeros(3), "b": jnp.zeros(())}
    tx = eqopt.apply_if_finite(eqopt.sgd(0.1, momentum=0.9), max_consecutive_errors=2)
    state = tx.init(params)
    _, state = tx.update(_good_grads(), state, params)
    before = state.inner_state
    updates, state = tx.update(_nan_grads(), state, params)
    np.testing.assert_array_equal(updates["w"], 0.0)
    np.testing.assert_array_equal(updates["b"], 0.0)
    assert int(state.notfinite_count) == 1 and int(state.total_notfinite) == 1
    assert not bool(state.last_finite)
    assert_tree_allclose(state.inner_state, before, rtol=0, atol=0)
    # A finite step resets the consecutive count, not the total.
    _, state = tx.update(_good_grads(), state, params)
    assert int(state.notfinite_count) == 0 and int(state.total_notfinite) == 1
    assert bool(state.last_finite)


def test_applies_after_max_consecutive_errors():
    params = {"w": jnp.zeros(3), "b": jnp.zeros(())}
    tx = eqopt.apply_if_finite(eqopt.sgd(1.0), max_consecutive_errors=2)
    reference = optax.apply_if_finite(optax.sgd(1.0), 2)
    state, reference_state = tx.init(params), reference.init(params)
    applied = []
    for _ in range(4):
        updates, state = tx.update(_nan_grads(), state, params)
        reference_updates, reference_state = reference.update(
            _nan_grads(), reference_state, params
        )
        assert_tree_allclose(updates, reference_updates, equal_nan=True)
        applied.append(bool(np.any(np.asarray(updates["w"]) != 0)))
        assert int(state.notfinite_count) == int(reference_state.notfinite_count)
        assert int(state.total_notfinite) == int(reference_state.total_notfinite)
    # Two skipped, then given up on: the third and later bad steps are applied.
    assert applied == [False, False, True, True]


def test_whole_model_with_none_gradients():
    model = make_model()
    tx = eqopt.apply_if_finite(eqopt.adam(1e-2), 1)
    state = tx.init(model)
    grads = type(model)(
        jnp.full((4, 3), jnp.inf), None, jnp.asarray(1.0), None, None, None, None
    )
    updates, state = tx.update(grads, state, model)
    assert updates.b is None and updates.activation is None
    np.testing.assert_array_equal(updates.w, 0.0)
    assert int(state.total_notfinite) == 1


def test_state_fields_are_optaxs():
    params = {"w": jnp.zeros(2)}
    ours = eqopt.apply_if_finite(eqopt.sgd(0.1), 3).init(params)
    theirs = optax.apply_if_finite(optax.sgd(0.1), 3).init(params)
    assert tuple(type(ours).__dataclass_fields__) == theirs._fields


def test_max_consecutive_errors_is_checked():
    with pytest.raises(ValueError, match="max_consecutive_errors"):
        eqopt.apply_if_finite(eqopt.sgd(0.1), -1)


@pytest.mark.parametrize(
    "updates",
    [
        {"w": jnp.array([1.0, jnp.nan, jnp.inf]), "b": jnp.array(-jnp.inf)},
        {"w": jnp.array([1.0, 2.0, 3.0]), "b": jnp.array(4.0)},
    ],
)
def test_skip_not_finite_matches_optax(updates):
    skip, info = eqopt.skip_not_finite(updates, jnp.asarray(0), None)
    reference_skip, reference_info = optax.skip_not_finite(updates, 0, None)
    assert bool(skip) == bool(reference_skip)
    assert int(info["num_not_finite"]) == int(reference_info["num_not_finite"])
    assert set(info) == set(reference_info)


@pytest.mark.parametrize("limit", [1.0, 14.0, 100.0])
@pytest.mark.parametrize("last", [3.0, jnp.nan])
def test_skip_large_updates_matches_optax(limit, last):
    updates = {"w": jnp.array([1.0, 2.0, last]), "b": None}
    skip, info = eqopt.skip_large_updates(updates, jnp.asarray(0), None, limit)
    reference_skip, reference_info = optax.skip_large_updates(
        {"w": updates["w"]}, 0, None, limit
    )
    assert bool(skip) == bool(reference_skip)
    np.testing.assert_allclose(info["norm_squared"], reference_info["norm_squared"])
    assert set(info) == set(reference_info)
    assert bool(skip) == (not float(info["norm_squared"]) < limit)


def test_skip_rules_on_a_whole_model():
    model = make_model()
    grads = type(model)(model.w, None, jnp.asarray(jnp.nan), None, None, None, None)
    skip, info = eqopt.skip_not_finite(grads, jnp.asarray(0), model)
    assert bool(skip) and int(info["num_not_finite"]) == 1
    skip, info = eqopt.skip_large_updates(
        type(model)(model.w, None, None, None, None, None, None),
        jnp.asarray(0),
        model,
        max_squared_norm=1e6,
    )
    assert not bool(skip)
    np.testing.assert_allclose(info["norm_squared"], jnp.sum(model.w**2), rtol=1e-6)
