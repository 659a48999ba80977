"""`flatten`: the inner transform sees one flat vector, beyond the registry."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from helpers import Case, assert_tree_allclose, make_model, random_grads

import eqopt

TRANSFORM_CASES = [
    Case(
        "flatten-adam",
        lambda: eqopt.flatten(eqopt.adam(1e-2)),
        lambda: optax.flatten(optax.adam(1e-2)),
        ("float32", "bfloat16", "complex64"),
    ),
    Case(
        "flatten-adamw",
        lambda: eqopt.flatten(eqopt.adamw(1e-2, weight_decay=0.1)),
        lambda: optax.flatten(optax.adamw(1e-2, weight_decay=0.1)),
    ),
    Case(
        "flatten-clip",
        # A per-leaf transform applied to the whole vector at once.
        lambda: eqopt.flatten(eqopt.clip(0.5)),
        lambda: optax.flatten(optax.clip(0.5)),
        needs_params=False,
    ),
]


class Recorder(eqx.Module):
    """An identity transform whose state is the shape of what it saw."""

    def init(self, params):
        return jnp.asarray(params.shape)

    def update(self, updates, state, params=None, **extra_args):
        return updates, jnp.asarray(updates.shape)


def test_inner_sees_one_vector_of_the_trainable_leaves():
    model = make_model()
    tx = eqopt.flatten(eqopt.GradientTransformation(Recorder().init, Recorder().update))
    state = tx.init(model)
    # 4 * 3 + 3 + 1 trainable entries; the int array, function and str are left out.
    np.testing.assert_array_equal(state.inner_state, [16])
    updates, state = tx.update(random_grads(model, 0), state, model)
    assert updates.activation is None and updates.indices is None
    assert_tree_allclose(
        eqx.filter(updates, eqx.is_array),
        eqx.filter(random_grads(model, 0), eqx.is_array),
        rtol=0,
        atol=0,
    )


def test_adam_state_is_one_vector_and_matches_per_leaf_adam():
    model = make_model()
    flat, per_leaf = eqopt.flatten(eqopt.adam(1e-2)), eqopt.adam(1e-2)
    state, reference_state = flat.init(model), per_leaf.init(model)
    assert state.inner_state[0].mu.shape == (16,)
    for step in range(2):
        grads = random_grads(model, step)
        updates, state = flat.update(grads, state, model)
        expected, reference_state = per_leaf.update(grads, reference_state, model)
        assert_tree_allclose(updates, expected, rtol=1e-6, atol=1e-7)


def test_none_gradients_pass_through():
    model = make_model()
    tx = eqopt.flatten(eqopt.sgd(1.0))
    state = tx.init(model)
    grads = eqx.tree_at(
        lambda g: g.b, random_grads(model, 0), None, is_leaf=lambda x: x is None
    )
    updates, state = tx.update(grads, state, model)
    assert updates.b is None
    np.testing.assert_allclose(updates.w, -grads.w)
    np.testing.assert_allclose(updates.s, -grads.s)
    # Without params, the vector is made of the updates that are not None.
    params = {"a": jnp.ones(2), "b": jnp.ones(3)}
    tx = eqopt.flatten(eqopt.scale(2.0))
    updates, _ = tx.update({"a": jnp.ones(2), "b": None}, tx.init(params))
    assert updates["b"] is None
    np.testing.assert_array_equal(updates["a"], 2.0)


def test_mixed_dtypes_promote_then_cast_back():
    params = {
        "low": jnp.ones(3, jnp.bfloat16),
        "high": jnp.ones(2, jnp.float32),
    }
    tx = eqopt.flatten(eqopt.adam(0.1))
    state = tx.init(params)
    assert state.inner_state[0].mu.dtype == jnp.float32
    grads = {
        "low": jnp.array([0.1, -0.2, 0.3], jnp.bfloat16),
        "high": jnp.array([1.0, -1.0], jnp.float32),
    }
    updates, _ = tx.update(grads, state, params)
    assert updates["low"].dtype == jnp.bfloat16 and updates["high"].dtype == jnp.float32
    # Real and complex leaves: a complex vector, real updates for the real leaf.
    params = {"r": jnp.ones(2), "c": jnp.ones(2, jnp.complex64)}
    tx = eqopt.flatten(eqopt.sgd(1.0))
    grads = {"r": jnp.array([1.0, 2.0]), "c": jnp.array([1j, 1.0], jnp.complex64)}
    updates, _ = tx.update(grads, tx.init(params), params)
    assert updates["r"].dtype == jnp.float32
    np.testing.assert_array_equal(updates["r"], [-1.0, -2.0])
    np.testing.assert_array_equal(updates["c"], -grads["c"])


def test_under_jit_without_retrace():
    model = make_model()
    tx = eqopt.flatten(eqopt.adam(1e-2))
    traces = []

    @eqx.filter_jit
    def step(tx, model, state, grads):
        traces.append(None)
        updates, state = tx.update(grads, state, model)
        return eqopt.apply_updates(model, updates), state

    state = tx.init(model)
    model, state = step(tx, model, state, random_grads(model, 0))
    slower = eqx.tree_at(lambda t: t.inner[-1].learning_rate, tx, eqopt.as_scalar(1e-3))
    step(slower, model, state, random_grads(model, 1))
    assert len(traces) == 1
    assert jax.tree.structure(state) == jax.tree.structure(tx.init(model))
