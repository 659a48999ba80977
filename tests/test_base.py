"""The protocol's helpers: numerics, update helpers, function-pair transforms."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import assert_tree_allclose

import eqopt

TREE = {
    "a": jnp.array([1.0, -2.0, 3.0]),
    "b": jnp.array([[0.5, 0.0], [-1.5, 2.0]]),
}
OTHER = {"a": jnp.array([0.1, 0.2, -0.3]), "b": jnp.array([[1.0, -1.0], [0.0, 0.25]])}


def test_numerics_match_optax():
    assert_tree_allclose(eqopt.global_norm(TREE), optax.global_norm(TREE))
    x = TREE["b"]
    for min_norm in (0.0, 1.0, 10.0):
        assert_tree_allclose(eqopt.safe_norm(x, min_norm), optax.safe_norm(x, min_norm))
        assert_tree_allclose(
            eqopt.safe_norm(x, min_norm, axis=1), optax.safe_norm(x, min_norm, axis=1)
        )
        assert_tree_allclose(
            eqopt.safe_root_mean_squares(x, min_norm),
            optax.safe_root_mean_squares(x, min_norm),
        )
    for count in (jnp.asarray(3, jnp.int32), jnp.asarray(2**31 - 1, jnp.int32)):
        assert eqopt.safe_int32_increment(count) == optax.safe_int32_increment(count)
        assert eqopt.safe_increment(count) == optax.safe_increment(count)
    assert eqopt.safe_increment(jnp.asarray(2.0)) == 3.0
    count = jnp.asarray(4, jnp.int32)
    assert_tree_allclose(
        eqopt.bias_correction(TREE, 0.9, count), optax.bias_correction(TREE, 0.9, count)
    )
    for order in (1, 2, 3):
        assert_tree_allclose(
            eqopt.update_moment(OTHER, TREE, 0.9, order),
            optax.update_moment(OTHER, TREE, 0.9, order),
        )
        assert_tree_allclose(
            eqopt.update_moment_per_elem_norm(OTHER, TREE, 0.9, order),
            optax.update_moment_per_elem_norm(OTHER, TREE, 0.9, order),
        )
    assert_tree_allclose(
        eqopt.update_infinity_moment(OTHER, TREE, 0.9, 1e-3),
        optax.update_infinity_moment(OTHER, TREE, 0.9, 1e-3),
    )


def test_safe_norm_gradient_is_finite_at_zero():
    grad = jax.grad(lambda x: eqopt.safe_norm(x, 1e-6))(jnp.zeros(3))
    assert np.all(np.isfinite(grad)) and np.all(grad == 0)


def test_global_norm_of_whole_model_ignores_non_arrays():
    model = eqx.nn.MLP(2, 2, 3, 1, key=jax.random.key(0))
    expected = optax.global_norm(eqx.filter(model, eqx.is_array))
    assert_tree_allclose(eqopt.global_norm(model), expected)


def test_incremental_and_periodic_update_match_optax_and_keep_model_leaves():
    assert_tree_allclose(
        eqopt.incremental_update(TREE, OTHER, 0.25),
        optax.incremental_update(TREE, OTHER, 0.25),
    )
    for step in (0, 3, 10):
        assert_tree_allclose(
            eqopt.periodic_update(TREE, OTHER, jnp.asarray(step), 5),
            optax.periodic_update(TREE, OTHER, jnp.asarray(step), 5),
        )
    new = eqx.nn.MLP(2, 2, 3, 1, key=jax.random.key(0))
    old = eqx.nn.MLP(2, 2, 3, 1, key=jax.random.key(1))
    mixed = eqopt.incremental_update(new, old, 0.5)
    assert mixed.activation is new.activation
    np.testing.assert_allclose(
        mixed.layers[0].weight, 0.5 * (new.layers[0].weight + old.layers[0].weight)
    )
    copied = eqopt.periodic_update(new, old, jnp.asarray(10), 5)
    np.testing.assert_array_equal(copied.layers[0].weight, new.layers[0].weight)
    with pytest.raises(ValueError, match=r"\['b'\]"):
        eqopt.incremental_update(TREE, {"a": OTHER["a"], "b": jnp.ones(3)}, 0.5)


def test_gradient_transformation_wraps_function_pairs():
    """An Optax-style pair of functions becomes an eqopt transform; extra args are forwarded if taken."""

    def init_fn(params):
        return eqopt.EmptyState()

    def update_fn(updates, state, params=None):
        return jax.tree.map(lambda g: 2 * g, updates), state

    seen = {}

    def update_with_extra(updates, state, params=None, **extra_args):
        seen.update(extra_args)
        return updates, state

    tx = eqopt.GradientTransformation(init_fn, update_fn)
    updates, _ = tx.update(TREE, tx.init(TREE), value=1.0)  # `value` is dropped
    assert_tree_allclose(updates, jax.tree.map(lambda g: 2 * g, TREE))
    init, update = tx  # Optax code unpacks transforms
    assert init(TREE) == eqopt.EmptyState()
    tx = eqopt.GradientTransformation(init_fn, update_with_extra)
    tx.update(TREE, tx.init(TREE), value=1.0)
    assert seen == {"value": 1.0}
    # Optax transforms themselves chain with eqopt ones.
    chained = eqopt.chain(optax.scale(2.0), eqopt.scale(0.5))
    updates, _ = chained.update(TREE, chained.init(TREE))
    assert_tree_allclose(updates, TREE)


def test_with_extra_args_support_and_init_empty_state():
    tx = eqopt.scale(2.0)
    assert eqopt.with_extra_args_support(tx) is tx
    wrapped = eqopt.with_extra_args_support(optax.scale(2.0))
    updates, _ = wrapped.update(TREE, wrapped.init(TREE), loss=jnp.asarray(1.0))
    assert_tree_allclose(updates, jax.tree.map(lambda g: 2 * g, TREE))
    assert eqopt.init_empty_state(TREE) == eqopt.EmptyState()


def test_multi_transform_is_partition():
    tx = eqopt.multi_transform(
        {"x": eqopt.scale(2.0), "y": eqopt.scale(-1.0)}, {"a": "x", "b": "y"}
    )
    assert isinstance(tx, eqopt.Partition)
    updates, _ = tx.update(TREE, tx.init(TREE))
    assert_tree_allclose(updates, {"a": 2 * TREE["a"], "b": -TREE["b"]})


def test_tree_map_params_over_a_chain_state():
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    opt = eqopt.adam(1e-3)
    state = opt.init(params)
    doubled = eqopt.tree_map_params(opt, lambda p: p + 2.0, state)
    assert_tree_allclose(doubled[0].mu, jax.tree.map(lambda x: x + 2.0, state[0].mu))
    assert doubled[0].count == state[0].count


def test_apply_updates_casts_and_skips_none():
    params = {"a": jnp.ones(2, jnp.bfloat16), "n": 3, "f": jax.nn.relu}
    updates = {"a": jnp.full(2, 0.5, jnp.float32), "n": None, "f": None}
    new = eqopt.apply_updates(params, updates)
    assert new["a"].dtype == jnp.bfloat16 and new["n"] == 3 and new["f"] is jax.nn.relu
    np.testing.assert_allclose(new["a"].astype(jnp.float32), 1.5)
