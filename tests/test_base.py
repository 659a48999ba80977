"""The protocol (`eqopt/_base.py`): apply_updates and friends, function-pair
transforms, and the errors that name the offending leaf's path."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import optax
import pytest
from helpers import assert_tree_allclose, make_mlp

import eqopt

TREE = {
    "a": jnp.array([1.0, -2.0, 3.0]),
    "b": jnp.array([[0.5, 0.0], [-1.5, 2.0]]),
}

OTHER = {"a": jnp.array([0.1, 0.2, -0.3]), "b": jnp.array([[1.0, -1.0], [0.0, 0.25]])}


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


def test_incremental_and_periodic_update_keep_none_of_new_tensors():
    """`None` new tensors (Optax: `incremental_update(None, x, 1)`) stay `None`."""
    x = jnp.array([1.0, 2.0, 3.0])
    assert eqopt.incremental_update(None, x, 1) is None
    assert eqopt.periodic_update(None, x, jnp.asarray(0), 2) is None
    mixed = eqopt.incremental_update({"a": None, "b": x}, {"a": x, "b": 2 * x}, 0.5)
    assert mixed["a"] is None
    np.testing.assert_allclose(mixed["b"], 1.5 * x)


def test_periodic_update_takes_a_traced_period():
    """Jitted as Optax's tests call it, with the period an argument (traced)."""
    update = jax.jit(eqopt.periodic_update)
    for step in (4, 5, 10, 11):
        assert_tree_allclose(
            update(TREE, OTHER, step, 5), optax.periodic_update(TREE, OTHER, step, 5)
        )


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


def test_apply_updates_casts_and_skips_none():
    params = {"a": jnp.ones(2, jnp.bfloat16), "n": 3, "f": jax.nn.relu}
    updates = {"a": jnp.full(2, 0.5, jnp.float32), "n": None, "f": None}
    new = eqopt.apply_updates(params, updates)
    assert new["a"].dtype == jnp.bfloat16 and new["n"] == 3 and new["f"] is jax.nn.relu
    np.testing.assert_allclose(new["a"].astype(jnp.float32), 1.5)


# ---------------------------------------------------------------------------
# Bad input gets one clear error that names the offending leaf's path
# ---------------------------------------------------------------------------


def grads_of(model):
    return eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(3)) ** 2))(model)


def test_gradient_shape_mismatch_names_path():
    model = make_mlp(in_size=3)
    opt = eqopt.adam(1e-3)
    state = opt.init(model)
    bad = eqx.tree_at(lambda g: g.layers[1].weight, grads_of(model), jnp.ones((3, 3)))
    with pytest.raises(
        ValueError, match=r"\.layers\[1\]\.weight.*shape \(3, 3\).*\(2, 4\)"
    ):
        opt.update(bad, state, model)


def test_gradient_structure_mismatch_names_path():
    params = {"a": jnp.ones(2), "b": jnp.ones(3)}
    opt = eqopt.scale_by_adam()
    state = opt.init(params)
    with pytest.raises(ValueError, match=r"\['c'\]"):
        opt.update(
            {"a": jnp.ones(2), "b": jnp.ones(3), "c": jnp.ones(1)}, state, params
        )
    with pytest.raises(ValueError, match=r"\['b'\]"):
        opt.update({"a": jnp.ones(2)}, state)


def test_gradient_for_non_trainable_leaf_names_path():
    model = make_mlp(in_size=3)
    grads = eqx.tree_at(
        lambda g: g.activation,
        grads_of(model),
        jnp.ones(()),
        is_leaf=lambda x: x is None,
    )
    with pytest.raises(ValueError, match=r"\.activation.*not trainable"):
        eqopt.apply_updates(model, grads)


def test_complex_update_for_real_param_names_path():
    params = {"w": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"\['w'\].*complex"):
        eqopt.apply_updates(params, {"w": jnp.ones(2, jnp.complex64)})


def test_state_from_another_model_names_path():
    opt = eqopt.scale_by_adam()
    state = opt.init({"a": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"\['b'\]"):
        opt.update({"a": jnp.ones(2), "b": jnp.ones(2)}, state)


def test_errors_at_trace_time_under_jit():
    params = {"a": jnp.ones(2)}
    opt = eqopt.scale_by_adam()
    state = opt.init(params)

    @eqx.filter_jit
    def step(updates, state):
        return opt.update(updates, state)

    with pytest.raises(ValueError, match=r"\['a'\].*shape \(3,\)"):
        step({"a": jnp.ones(3)}, state)


def test_wrong_state_type_is_a_type_error():
    params = {"a": jnp.ones(2)}
    with pytest.raises(jaxtyping.TypeCheckError):
        eqopt.scale_by_adam().update(params, eqopt.EmptyState())


def test_integer_gradient_is_a_type_error():
    """Updates are checked as a pytree of inexact arrays (with None) at every update."""
    params = {"a": jnp.ones(2)}
    opt = eqopt.scale_by_adam()
    with pytest.raises(jaxtyping.TypeCheckError, match="updates"):
        opt.update({"a": jnp.ones(2, jnp.int32)}, opt.init(params))
    with pytest.raises(jaxtyping.TypeCheckError):
        eqopt.ScaleByAdamState(
            count=jnp.zeros((), jnp.int32), mu={"a": jnp.ones(2, jnp.int32)}, nu=None
        )
