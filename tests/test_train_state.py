"""Tests for `eqopt.TrainState`."""

import io

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from helpers import assert_tree_allclose

import eqopt


def _model(seed=0):
    # An MLP has non-array leaves: activation functions, sizes, `use_bias` flags.
    return eqx.nn.MLP(
        2, 1, width_size=8, depth=2, activation=jax.nn.tanh, key=jax.random.key(seed)
    )


def _data(steps=10, batch=16):
    x = jax.random.normal(jax.random.key(42), (steps, batch, 2))
    y = jnp.sin(x[..., :1]) + x[..., 1:] ** 2
    return x, y


def loss_fn(model, x, y):
    prediction = jax.vmap(model)(x)
    return jnp.mean((prediction - y) ** 2)


def _tx(learning_rate=1e-2):
    return eqopt.chain(
        eqopt.scale_by_adam(), eqopt.scale_by_learning_rate(learning_rate)
    )


def test_create():
    model, tx = _model(), _tx()
    state = eqopt.TrainState.create(model=model, tx=tx)
    assert state.step.dtype == jnp.int32 and int(state.step) == 0
    assert state.model is model and state.tx is tx
    assert eqx.tree_equal(state.opt_state, tx.init(model))


def test_apply_gradients_matches_manual_step():
    model, tx = _model(), _tx()
    state = eqopt.TrainState.create(model=model, tx=tx)
    x, y = _data(steps=1)
    grads = eqx.filter_grad(loss_fn)(model, x[0], y[0])
    new = state.apply_gradients(grads)
    updates, opt_state = tx.update(grads, tx.init(model), model)
    assert_tree_allclose(
        eqx.filter(new.model, eqx.is_array),
        eqx.filter(eqopt.apply_updates(model, updates), eqx.is_array),
        rtol=0,
        atol=0,
    )
    assert eqx.tree_equal(new.opt_state, opt_state)
    assert int(new.step) == 1
    # The non-array leaves are the model's own.
    assert new.model.activation is jax.nn.tanh and new.model.depth == 2
    assert jax.tree.structure(new.model) == jax.tree.structure(model)


def test_apply_gradients_forwards_extra_args():
    seen = []

    def update_fn(updates, state, params=None, **extra_args):
        seen.append(extra_args)
        return jax.tree.map(lambda g: -extra_args["value"] * g, updates), state

    tx = eqopt.GradientTransformation(lambda params: eqopt.EmptyState(), update_fn)
    state = eqopt.TrainState.create(model={"w": jnp.ones(3)}, tx=tx)
    state = state.apply_gradients({"w": jnp.ones(3)}, value=jnp.asarray(0.5))
    np.testing.assert_allclose(state.model["w"], 0.5 * jnp.ones(3))
    assert list(seen[0]) == ["value"]


def _scan_train(state, xs, ys):
    dynamic, static = eqx.partition(state, eqx.is_array)

    def body(dynamic, batch):
        state = eqx.combine(dynamic, static)
        loss, grads = eqx.filter_value_and_grad(loss_fn)(state.model, *batch)
        state = state.apply_gradients(grads)
        return eqx.filter(state, eqx.is_array), loss

    dynamic, losses = jax.lax.scan(body, dynamic, (xs, ys))
    return eqx.combine(dynamic, static), losses


def test_scan_over_steps_matches_loop():
    xs, ys = _data()
    start = eqopt.TrainState.create(model=_model(), tx=_tx())
    scanned, losses = eqx.filter_jit(_scan_train)(start, xs, ys)
    assert int(scanned.step) == 10 and losses.shape == (10,)
    assert losses[-1] < losses[0]

    step = eqx.filter_jit(
        lambda state, x, y: state.apply_gradients(
            eqx.filter_grad(loss_fn)(state.model, x, y)
        )
    )
    state = start
    for x, y in zip(xs, ys, strict=True):
        state = step(state, x, y)
    assert_tree_allclose(
        eqx.filter(scanned, eqx.is_array),
        eqx.filter(state, eqx.is_array),
        rtol=1e-5,
        atol=1e-6,
    )
    assert scanned.model.activation is jax.nn.tanh


def test_scan_with_injected_schedule():
    """A state holding `inject_hyperparams` (a dict of hyperparameters) is a valid carry."""
    xs, ys = _data()
    tx = eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(
        learning_rate=lambda count: 0.1 / (1.0 + count)
    )
    state, _ = eqx.filter_jit(_scan_train)(
        eqopt.TrainState.create(model=_model(), tx=tx), xs, ys
    )
    np.testing.assert_allclose(
        state.opt_state.hyperparams["learning_rate"], 0.1 / 10, rtol=1e-6
    )
    assert int(state.opt_state.count) == 10


def test_jit_step_does_not_retrace_when_learning_rate_changes():
    xs, ys = _data(steps=4)
    traces = []

    @eqx.filter_jit
    def train_step(state, x, y):
        traces.append(None)
        loss, grads = eqx.filter_value_and_grad(loss_fn)(state.model, x, y)
        return state.apply_gradients(grads), loss

    state = eqopt.TrainState.create(model=_model(), tx=_tx(1e-2))
    state, _ = train_step(state, xs[0], ys[0])
    # A new learning rate of the same (weak float32) type is a new leaf value.
    state = eqx.tree_at(lambda s: s.tx[1].learning_rate, state, eqopt.as_scalar(0.0))
    frozen, _ = train_step(state, xs[1], ys[1])
    assert_tree_allclose(
        eqx.filter(frozen.model, eqx.is_array),
        eqx.filter(state.model, eqx.is_array),
        rtol=0,
        atol=0,
    )
    state = eqx.tree_at(lambda s: s.tx[1].learning_rate, frozen, eqopt.as_scalar(1e-3))
    state, _ = train_step(state, xs[2], ys[2])
    assert len(traces) == 1
    assert int(state.step) == 3


def test_jit_step_with_injected_learning_rate():
    xs, ys = _data(steps=3)
    traces = []

    @eqx.filter_jit
    def train_step(state, x, y):
        traces.append(None)
        return state.apply_gradients(eqx.filter_grad(loss_fn)(state.model, x, y))

    tx = eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(learning_rate=1e-2)
    state = train_step(eqopt.TrainState.create(model=_model(), tx=tx), xs[0], ys[0])
    state = eqx.tree_at(
        lambda s: s.opt_state.hyperparams["learning_rate"], state, jnp.float32(0.0)
    )
    frozen = train_step(state, xs[1], ys[1])
    assert_tree_allclose(
        eqx.filter(frozen.model, eqx.is_array),
        eqx.filter(state.model, eqx.is_array),
        rtol=0,
        atol=0,
    )
    assert len(traces) == 1


def test_serialisation_round_trip():
    xs, ys = _data(steps=2)
    state = eqopt.TrainState.create(model=_model(), tx=_tx())
    for x, y in zip(xs, ys, strict=True):
        state = state.apply_gradients(eqx.filter_grad(loss_fn)(state.model, x, y))
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, state)
    buffer.seek(0)
    like = eqopt.TrainState.create(model=_model(seed=1), tx=_tx())
    restored = eqx.tree_deserialise_leaves(buffer, like)
    assert eqx.tree_equal(restored, state)
    assert int(restored.step) == 2
