"""Yogi: registry cases and behaviour."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case, make_model

import eqopt

ALL = ("float32", "bfloat16", "complex64")

TRANSFORM_CASES = [
    Case(
        "yogi",
        lambda: eqopt.yogi(1e-2),
        lambda: optax.yogi(1e-2),
        ALL,
        needs_params=False,
    ),
    Case(
        "scale_by_yogi",
        lambda: eqopt.scale_by_yogi(
            b1=0.5, b2=0.75, eps_root=1e-6, initial_accumulator_value=0.1
        ),
        lambda: optax.scale_by_yogi(
            b1=0.5, b2=0.75, eps_root=1e-6, initial_accumulator_value=0.1
        ),
        ALL,
        needs_params=False,
    ),
]


def test_yogi_second_moment_changes_additively():
    # After a large gradient, zero gradients leave Yogi's v where it is (the
    # change is proportional to |g|^2), where Adam's v decays by b2 each step.
    large, zero = {"w": jnp.full(2, 10.0)}, {"w": jnp.zeros(2)}
    yogi, adam = eqopt.scale_by_yogi(b2=0.5), eqopt.scale_by_adam(b2=0.5)
    _, yogi_state = yogi.update(large, yogi.init(large))
    _, adam_state = adam.update(large, adam.init(large))
    yogi_v, adam_v = yogi_state.nu["w"], adam_state.nu["w"]
    for _ in range(3):
        _, yogi_state = yogi.update(zero, yogi_state)
        _, adam_state = adam.update(zero, adam_state)
    np.testing.assert_array_equal(yogi_state.nu["w"], yogi_v)
    np.testing.assert_allclose(adam_state.nu["w"], adam_v / 8)
    # Towards a smaller gradient v moves by (1 - b2) |g|^2, not towards |g|^2.
    _, yogi_state = yogi.update({"w": jnp.full(2, 1.0)}, yogi_state)
    np.testing.assert_allclose(yogi_state.nu["w"], yogi_v - 0.5, rtol=1e-6)


def test_yogi_state_starts_at_the_initial_accumulator_value():
    state = eqopt.scale_by_yogi(initial_accumulator_value=0.5).init(make_model())
    np.testing.assert_array_equal(state.mu.w, 0.5)
    np.testing.assert_array_equal(state.nu.b, 0.5)
    assert state.mu.indices is None


def test_yogi_rejects_non_positive_initial_accumulator():
    with pytest.raises(ValueError, match="initial_accumulator_value"):
        eqopt.scale_by_yogi(initial_accumulator_value=0.0)


def test_yogi_trains():
    first, last, _, _ = train(eqopt.yogi(1e-2), problem="mlp-2-1")
    assert last < 0.2 * first
