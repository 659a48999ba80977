"""The stateless blocks and scalings (`eqopt/_transform/basic.py`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    ALL_DTYPES,
    Case,
    as_dict,
    assert_tree_allclose,
    decaying_schedule,
    make_model,
    model_loss,
    random_grads,
)

import eqopt

TREE = {
    "a": jnp.array([1.0, -2.0, 3.0]),
    "b": jnp.array([[0.5, 0.0], [-1.5, 2.0]]),
}


def _double_plus_params(updates, params):
    return jax.tree.map(
        lambda g, p: None if g is None else 2 * g + p,
        updates,
        params,
        is_leaf=lambda x: x is None,
    )


TRANSFORM_CASES = [
    Case("identity", eqopt.identity, optax.identity, ALL_DTYPES, needs_params=False),
    Case(
        "set_to_zero",
        eqopt.set_to_zero,
        optax.set_to_zero,
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale",
        lambda: eqopt.scale(-0.3),
        lambda: optax.scale(-0.3),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_learning_rate",
        lambda: eqopt.scale_by_learning_rate(0.1),
        lambda: optax.scale_by_learning_rate(0.1),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_learning_rate-schedule",
        lambda: eqopt.scale_by_learning_rate(decaying_schedule),
        lambda: optax.scale_by_learning_rate(decaying_schedule),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_schedule",
        lambda: eqopt.scale_by_schedule(decaying_schedule),
        lambda: optax.scale_by_schedule(decaying_schedule),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "stateless",
        lambda: eqopt.stateless(_double_plus_params),
        lambda: optax.stateless(_double_plus_params),
    ),
    Case(
        "stateless_with_tree_map",
        lambda: eqopt.stateless_with_tree_map(lambda g, p: g * 2 + p),
        lambda: optax.stateless_with_tree_map(lambda g, p: g * 2 + p),
        ALL_DTYPES,
    ),
]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_learning_rate(value):
    with pytest.raises(ValueError, match="learning_rate.*finite"):
        eqopt.scale_by_learning_rate(value)


def test_with_extra_args_support_and_init_empty_state():
    tx = eqopt.scale(2.0)
    assert eqopt.with_extra_args_support(tx) is tx
    wrapped = eqopt.with_extra_args_support(optax.scale(2.0))
    updates, _ = wrapped.update(TREE, wrapped.init(TREE), loss=jnp.asarray(1.0))
    assert_tree_allclose(updates, jax.tree.map(lambda g: 2 * g, TREE))
    assert eqopt.init_empty_state(TREE) == eqopt.EmptyState()


def test_vmap_over_learning_rate_is_one_program():
    model = make_model()
    grads = eqx.filter_grad(model_loss)(model)

    def run(learning_rate):
        tx = eqopt.chain(
            eqopt.scale_by_adam(), eqopt.scale_by_learning_rate(learning_rate)
        )
        updates, _ = tx.update(grads, tx.init(model), model)
        return updates.w

    learning_rates = jnp.array([0.1, 0.01, 0.001])
    swept = eqx.filter_jit(jax.vmap(run))(learning_rates)
    for i, learning_rate in enumerate(learning_rates):
        np.testing.assert_allclose(swept[i], run(float(learning_rate)), rtol=1e-6)


def test_grad_through_learning_rate():
    model = make_model()

    def after_step(learning_rate):
        tx = eqopt.chain(
            eqopt.scale_by_adam(), eqopt.scale_by_learning_rate(learning_rate)
        )
        grads = eqx.filter_grad(model_loss)(model)
        updates, _ = tx.update(grads, tx.init(model), model)
        return model_loss(eqopt.apply_updates(model, updates))

    learning_rate = 0.01
    derivative = jax.grad(after_step)(learning_rate)
    step = 1e-3
    numeric = (after_step(learning_rate + step) - after_step(learning_rate - step)) / (
        2 * step
    )
    assert np.isfinite(derivative)
    np.testing.assert_allclose(derivative, numeric, rtol=1e-2)


def test_stateless_on_a_whole_model_with_non_array_leaves():
    """An Optax-style function mapping over updates and params works on a whole model.

    The function sees the params with `None` where the update is `None` (the
    activation function, the integer leaves), so the two trees have the same
    structure for `jax.tree.map`.
    """
    model = make_model()

    def double_plus_params(updates, params):
        return jax.tree.map(lambda g, p: 2 * g + p, updates, params)

    tx = eqopt.stateless(double_plus_params)
    reference = optax.stateless(double_plus_params)
    grads = random_grads(model, 0)
    updates, _ = tx.update(grads, tx.init(model), model)
    reference_updates, _ = reference.update(
        as_dict(grads), reference.init(as_dict(model)), as_dict(model)
    )
    assert updates.activation is None and updates.indices is None
    for name, expected in reference_updates.items():
        np.testing.assert_allclose(getattr(updates, name), expected, rtol=1e-6)
    # Without params the function gets None, as in Optax.
    seen = []
    tx = eqopt.stateless(lambda updates, params: seen.append(params) or updates)
    tx.update(grads, tx.init(model))
    assert seen == [None]
    # In a chain under filter_jit, with the model as params.
    chained = eqopt.chain(tx, eqopt.stateless(double_plus_params))
    step = eqx.filter_jit(chained.update)
    updates, _ = step(grads, chained.init(model), model)
    np.testing.assert_allclose(updates.w, 2 * grads.w + model.w, rtol=1e-6)


def test_every_learning_rate_casts_its_factor_to_the_update_dtype():
    # One product for every learning rate (`eqopt._leaf_scales.scale_updates`):
    # the factor, weak or strong, times the multiplier where groups set one, in
    # the update's dtype: bfloat16 stays bfloat16, complex stays complex.
    from eqopt._leaf_scales import LeafScales, scale_updates

    g = {"b": jnp.array([0.3, -1.7], jnp.bfloat16), "c": jnp.array([1 - 2j])}
    rate = jnp.float32(0.37)  # strongly typed, as a schedule's value is

    def check(updates, factor, keys=("b", "c")):
        for key in keys:
            want = jnp.asarray(factor).astype(g[key].dtype) * g[key]
            assert updates[key].dtype == g[key].dtype
            np.testing.assert_array_equal(updates[key], want)

    def first_update(tx):
        return tx.update(g, tx.init(g))[0]

    check(first_update(eqopt.scale(0.37)), 0.37)
    check(first_update(eqopt.scale_by_learning_rate(0.37)), -0.37)
    check(first_update(eqopt.scale_by_schedule(lambda t: rate)), rate)
    check(first_update(eqopt.scale_by_learning_rate(lambda t: rate)), -rate)
    swept = jax.vmap(lambda r: scale_updates(g, r))(jnp.stack([rate, 2 * rate]))
    assert jax.tree.map(lambda x: x.dtype, swept) == jax.tree.map(lambda x: x.dtype, g)
    scales = LeafScales.build(jax.tree.structure(g), (2.0, None))
    by_leaf = scale_updates(g, rate, scales)
    check(by_leaf, rate * jnp.float32(2.0), keys=("b",))
    assert by_leaf["c"] is g["c"]  # no multiplier: not scaled
