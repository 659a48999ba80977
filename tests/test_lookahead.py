"""`lookahead` and `LookaheadParams`.

Lookahead has no `TRANSFORM_CASES`: its params are a `LookaheadParams` pair,
not the plain model the generic registry tests pass. The same checks are made
here on a whole model inside a `LookaheadParams`: init/update with non-array
leaves and `None` gradients, jit without retrace, a typed serialisable state,
and parity with Optax over several steps on float32 and bfloat16.
"""

import io

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import as_dict, assert_tree_allclose, make_model, random_grads

import eqopt


def _pair_dict(params):
    return optax.LookaheadParams(fast=as_dict(params.fast), slow=as_dict(params.slow))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("reset_state", [False, True])
def test_parity_with_optax(dtype, reset_state):
    model = make_model(jnp.dtype(dtype))
    params = eqopt.LookaheadParams.init_synced(model)
    reference_params = _pair_dict(params)
    tx = eqopt.lookahead(eqopt.adam(0.05), 3, 0.5, reset_state=reset_state)
    reference = optax.lookahead(optax.adam(0.05), 3, 0.5, reset_state=reset_state)
    state, reference_state = tx.init(params), reference.init(reference_params)
    tolerance = 2e-2 if dtype == "bfloat16" else 1e-5
    for step in range(7):
        grads = random_grads(params.fast, step)
        updates, state = tx.update(grads, state, params)
        reference_updates, reference_state = reference.update(
            as_dict(grads), reference_state, reference_params
        )
        params = eqopt.apply_updates(params, updates)
        reference_params = optax.apply_updates(reference_params, reference_updates)
        assert_tree_allclose(
            _pair_dict(params), reference_params, rtol=tolerance, atol=tolerance
        )
        assert int(state.steps_since_sync) == int(reference_state.steps_since_sync)
    assert params.fast.w.dtype == jnp.dtype(dtype)


def test_slow_weights_sync_every_k_steps():
    params = eqopt.LookaheadParams.init_synced({"w": jnp.zeros(2)})
    tx = eqopt.lookahead(eqopt.sgd(1.0), sync_period=3, slow_step_size=0.5)
    state = tx.init(params)
    grads = {"w": -jnp.ones(2)}  # each fast step moves +1
    fast, slow = [], []
    for _ in range(6):
        updates, state = tx.update(grads, state, params)
        params = eqopt.apply_updates(params, updates)
        fast.append(float(params.fast["w"][0]))
        slow.append(float(params.slow["w"][0]))
    # Three fast steps (1, 2, 3), then the slow weights move half way (1.5) and
    # the fast ones are reset to them; then 2.5, 3.5, 4.5 and a sync to 3.0.
    np.testing.assert_allclose(fast, [1, 2, 1.5, 2.5, 3.5, 3.0])
    np.testing.assert_allclose(slow, [0, 0, 1.5, 1.5, 1.5, 3.0])
    assert int(state.steps_since_sync) == 0


def test_reset_state_reinitialises_the_fast_optimizer():
    params = eqopt.LookaheadParams.init_synced({"w": jnp.zeros(2)})
    tx = eqopt.lookahead(eqopt.sgd(1.0, momentum=0.9), 2, 0.5, reset_state=True)
    state = tx.init(params)
    _, state = tx.update({"w": jnp.ones(2)}, state, params)
    assert float(state.fast_state[0].trace["w"][0]) == 1.0
    _, state = tx.update({"w": jnp.ones(2)}, state, params)
    np.testing.assert_array_equal(state.fast_state[0].trace["w"], 0.0)


def test_whole_model_with_none_gradients_jit_and_serialise():
    model = make_model()
    params = eqopt.LookaheadParams.init_synced(model)
    tx = eqopt.lookahead(eqopt.adam(1e-2), sync_period=2, slow_step_size=0.5)
    traces = []

    @eqx.filter_jit
    def step(tx, params, state, grads):
        traces.append(None)
        updates, state = tx.update(grads, state, params)
        return eqopt.apply_updates(params, updates), state, updates

    state = tx.init(params)
    grads = eqx.tree_at(
        lambda g: g.b, random_grads(model, 0), None, is_leaf=lambda x: x is None
    )
    params, state, updates = step(tx, params, state, grads)
    assert updates.fast.b is None and updates.slow.activation is None
    params, state, _ = step(
        eqx.tree_at(lambda t: t.slow_step_size, tx, eqopt.as_scalar(0.25)),
        params,
        state,
        grads,
    )
    assert len(traces) == 1
    assert params.fast.activation is jax.nn.relu and params.slow.name == "model"
    np.testing.assert_array_equal(params.fast.b, model.b)
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, state)
    buffer.seek(0)
    restored = eqx.tree_deserialise_leaves(buffer, tx.init(params))
    assert_tree_allclose(restored, state, rtol=0, atol=0)
    assert isinstance(state, eqopt.LookaheadState)


def test_plain_params_are_a_clear_error():
    model = make_model()
    tx = eqopt.lookahead(eqopt.sgd(0.1), 2, 0.5)
    with pytest.raises(TypeError, match="LookaheadParams.init_synced"):
        tx.init(model)
    state = tx.init(eqopt.LookaheadParams.init_synced(model))
    with pytest.raises(TypeError, match="must be an eqopt.LookaheadParams"):
        tx.update(random_grads(model, 0), state, model)
    with pytest.raises(TypeError, match="must be an eqopt.LookaheadParams"):
        tx.update(random_grads(model, 0), state)


def test_fast_and_slow_mismatch_is_a_clear_error():
    tx = eqopt.lookahead(eqopt.sgd(0.1), 2, 0.5)
    mismatched = eqopt.LookaheadParams(fast={"w": jnp.ones(3)}, slow={"w": jnp.ones(4)})
    with pytest.raises(ValueError, match=r"do not match.*\['w'\].*shape"):
        tx.init(mismatched)
    other = eqopt.LookaheadParams(fast={"w": jnp.ones(3)}, slow={"v": jnp.ones(3)})
    with pytest.raises(ValueError, match="do not match"):
        tx.init(other)


def test_lookahead_params_as_updates_is_a_clear_error():
    params = eqopt.LookaheadParams.init_synced({"w": jnp.ones(3)})
    tx = eqopt.lookahead(eqopt.sgd(0.1), 2, 0.5)
    with pytest.raises(TypeError, match=r"gradients with respect to\s+`params.fast`"):
        tx.update(params, tx.init(params), params)


@pytest.mark.parametrize("bad", [0, 1.5, True])
def test_bad_sync_period(bad):
    with pytest.raises((TypeError, ValueError), match="sync_period"):
        eqopt.lookahead(eqopt.sgd(0.1), bad, 0.5)


def test_init_synced_and_signature():
    model = make_model()
    params = eqopt.LookaheadParams.init_synced(model)
    assert params.fast is model and params.slow is model
    assert eqopt.lookahead(eqopt.sgd(0.1), 2, 0.5).elementwise
