"""`conditionally_transform` and `conditionally_mask`, beyond the registry."""

import jax.numpy as jnp
import numpy as np
import optax
from helpers import Case, assert_tree_allclose

import eqopt

ALL_F32 = ("float32", "bfloat16", "complex64")


def _even(step):
    return step % 2 == 0


def _after_two(step):
    return step >= 2


TRANSFORM_CASES = [
    Case(
        "conditionally_transform-adam",
        lambda: eqopt.conditionally_transform(eqopt.adam(1e-2), _even),
        lambda: optax.conditionally_transform(optax.adam(1e-2), _even),
        ALL_F32,
    ),
    Case(
        "conditionally_mask-adam",
        lambda: eqopt.conditionally_mask(eqopt.adam(1e-2), _after_two),
        lambda: optax.conditionally_mask(optax.adam(1e-2), _after_two),
        ALL_F32,
    ),
    Case(
        "conditionally_mask-sgd_momentum",
        lambda: eqopt.conditionally_mask(eqopt.sgd(0.1, momentum=0.9), _even),
        lambda: optax.conditionally_mask(optax.sgd(0.1, momentum=0.9), _even),
    ),
]


def _params():
    return {"w": jnp.array([1.0, -2.0, 3.0])}


def _grads(step):
    return {"w": jnp.array([0.5, 1.0, -1.5]) * (step + 1)}


def test_transform_passes_through_and_keeps_inner_state():
    tx = eqopt.conditionally_transform(eqopt.scale_by_adam(), _even)
    params = _params()
    state = tx.init(params)
    updates, state = tx.update(_grads(0), state)
    assert int(state.step) == 1 and int(state.inner_state.count) == 1
    before = state.inner_state
    updates, state = tx.update(_grads(1), state)
    # Odd step: the updates are returned as they came, the inner state is kept.
    np.testing.assert_array_equal(updates["w"], _grads(1)["w"])
    assert_tree_allclose(state.inner_state, before, rtol=0, atol=0)
    assert int(state.step) == 2


def test_mask_returns_zeros_and_keeps_inner_state():
    tx = eqopt.conditionally_mask(eqopt.scale_by_adam(), _after_two)
    params = _params()
    state = tx.init(params)
    for step in range(2):
        updates, state = tx.update(_grads(step), state)
        np.testing.assert_array_equal(updates["w"], 0.0)
        assert int(state.inner_state.count) == 0
    updates, state = tx.update(_grads(2), state)
    assert np.all(np.asarray(updates["w"]) != 0) and int(state.inner_state.count) == 1


def test_forward_extra_args():
    calls = []

    def should_transform(step, *, loss):
        calls.append(loss)
        return loss > 1.0

    for cls, otherwise in (
        (eqopt.conditionally_transform, _grads(0)["w"]),
        (eqopt.conditionally_mask, jnp.zeros(3)),
    ):
        tx = cls(eqopt.scale(-1.0), should_transform, forward_extra_args=True)
        state = tx.init(_params())
        updates, state = tx.update(_grads(0), state, loss=jnp.asarray(2.0))
        np.testing.assert_array_equal(updates["w"], -_grads(0)["w"])
        updates, state = tx.update(_grads(0), state, loss=jnp.asarray(0.5))
        np.testing.assert_array_equal(updates["w"], otherwise)
    assert len(calls) == 4


def test_extra_args_reach_the_inner_transform():
    seen = []

    def update(updates, state, params=None, **extra):
        seen.append(sorted(extra))
        return updates, state

    inner = eqopt.GradientTransformation(lambda p: eqopt.EmptyState(), update)
    tx = eqopt.conditionally_transform(inner, lambda step: True)
    tx.update(_grads(0), tx.init(_params()), value=jnp.asarray(1.0))
    # (Traced once more to learn the output dtypes when the condition is traced.)
    assert seen and all(names == ["value"] for names in seen)


def test_signatures_and_state_fields_are_optaxs():
    params = _params()
    ours = eqopt.conditionally_mask(eqopt.sgd(0.1), _even).init(params)
    theirs = optax.conditionally_mask(optax.sgd(0.1), _even).init(params)
    assert tuple(type(ours).__dataclass_fields__) == theirs._fields
    ours = eqopt.conditionally_transform(eqopt.sgd(0.1), _even).init(params)
    theirs = optax.conditionally_transform(optax.sgd(0.1), _even).init(params)
    assert tuple(type(ours).__dataclass_fields__) == theirs._fields
