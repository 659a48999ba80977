"""AdaBelief: registry cases and behaviour."""

import jax.numpy as jnp
import numpy as np
import optax
from _training import train
from helpers import Case, make_model

import eqopt

ALL = ("float32", "bfloat16", "complex64")


def _schedule(count):
    return 0.1 / (1.0 + count)


TRANSFORM_CASES = [
    Case(
        "adabelief",
        lambda: eqopt.adabelief(1e-2),
        lambda: optax.adabelief(1e-2),
        ALL,
        needs_params=False,
    ),
    Case(
        "adabelief-nesterov-schedule",
        lambda: eqopt.adabelief(_schedule, b1=0.8, eps_root=1e-8, nesterov=True),
        lambda: optax.adabelief(_schedule, b1=0.8, eps_root=1e-8, nesterov=True),
        ALL,
        needs_params=False,
    ),
    Case(
        "scale_by_belief",
        lambda: eqopt.scale_by_belief(b1=0.5, b2=0.75, eps=1e-6),
        lambda: optax.scale_by_belief(b1=0.5, b2=0.75, eps=1e-6),
        ALL,
        needs_params=False,
    ),
]


def test_adabelief_trains():
    first, last, _, _ = train(eqopt.adabelief(1e-2), problem="mlp-2-1")
    assert last < 0.1 * first


def test_belief_takes_large_steps_when_the_gradient_is_predictable():
    # A constant gradient is perfectly predicted: the prediction error shrinks
    # and AdaBelief's step grows, where Adam's stays at about 1.
    grads = {"w": jnp.full(3, 0.5)}
    belief = eqopt.scale_by_belief(b1=0.5, b2=0.5)
    adam = eqopt.scale_by_adam(b1=0.5, b2=0.5)
    belief_state, adam_state = belief.init(grads), adam.init(grads)
    for _ in range(20):
        belief_update, belief_state = belief.update(grads, belief_state)
        adam_update, adam_state = adam.update(grads, adam_state)
    np.testing.assert_allclose(adam_update["w"], 1.0, rtol=1e-4)
    assert np.all(belief_update["w"] > 100.0)


def test_belief_second_moment_is_real_for_complex_params():
    model = make_model(jnp.complex64)
    state = eqopt.scale_by_belief().init(model)
    assert state.nu.w.dtype == jnp.float32 and state.mu.w.dtype == jnp.complex64
    assert state.mu.indices is None
