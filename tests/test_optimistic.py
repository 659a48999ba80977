"""Optimistic gradient methods: registry cases and behaviour."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case

import eqopt

ALL = ("float32", "bfloat16", "complex64")


def _schedule(count):
    return 0.1 / (1.0 + count)


TRANSFORM_CASES = [
    Case(
        "optimistic_gradient_descent",
        lambda: eqopt.optimistic_gradient_descent(1e-2),
        lambda: optax.optimistic_gradient_descent(1e-2),
        ALL,
        needs_params=False,
    ),
    Case(
        "optimistic_gradient_descent-alpha_beta-schedule",
        lambda: eqopt.optimistic_gradient_descent(_schedule, alpha=0.5, beta=2.0),
        lambda: optax.optimistic_gradient_descent(_schedule, alpha=0.5, beta=2.0),
        ALL,
        needs_params=False,
    ),
    Case(
        "optimistic_adam",
        lambda: eqopt.optimistic_adam(1e-2),
        lambda: optax.optimistic_adam(1e-2),
        ALL,
        needs_params=False,
    ),
    Case(
        "optimistic_adam-optimism",
        lambda: eqopt.optimistic_adam(1e-2, 0.5, b2=0.75, nesterov=False),
        lambda: optax.optimistic_adam(1e-2, 0.5, b2=0.75, nesterov=False),
        ALL,
        needs_params=False,
    ),
    Case(
        "optimistic_adam_v2",
        lambda: eqopt.optimistic_adam_v2(_schedule, alpha=0.5, beta=0.3),
        lambda: optax.optimistic_adam_v2(_schedule, alpha=0.5, beta=0.3),
        ALL,
        needs_params=False,
    ),
    Case(
        "scale_by_optimistic_gradient",
        lambda: eqopt.scale_by_optimistic_gradient(alpha=2.0, beta=3.0),
        lambda: optax.scale_by_optimistic_gradient(alpha=2.0, beta=3.0),
        ALL,
        needs_params=False,
    ),
]


def test_optimistic_gradient_formula():
    tx = eqopt.scale_by_optimistic_gradient(alpha=2.0, beta=3.0)
    g1, g2 = {"w": jnp.array([1.0, -2.0])}, {"w": jnp.array([0.5, 1.0])}
    state = tx.init(g1)
    u1, state = tx.update(g1, state)
    u2, state = tx.update(g2, state)
    np.testing.assert_allclose(u1["w"], 2.0 * g1["w"])  # no previous gradient yet
    np.testing.assert_allclose(u2["w"], 5.0 * g2["w"] - 3.0 * g1["w"])
    assert not bool(state.is_initial_step)


def _bilinear_game(opt, steps=200):
    """min_x max_y x * y from (1, 1): the players' distance to the equilibrium."""

    def step(carry, _):
        params, state = carry
        x, y = params
        grads = (y, -x)  # descent for x, ascent for y
        updates, state = opt.update(grads, state, params)
        return (eqopt.apply_updates(params, updates), state), None

    params = (jnp.array(1.0), jnp.array(1.0))
    (params, _), _ = jax.lax.scan(step, (params, opt.init(params)), length=steps)
    return float(jnp.hypot(*params))


def test_optimism_converges_where_gradient_descent_ascent_diverges():
    start = float(jnp.hypot(1.0, 1.0))
    assert _bilinear_game(eqopt.sgd(0.1)) > 2 * start
    assert _bilinear_game(eqopt.optimistic_gradient_descent(0.1)) < 0.5 * start
    assert _bilinear_game(eqopt.optimistic_adam(1e-2, 1.0), steps=1024) < 0.1


def test_optimistic_adam_v2_is_optimistic_adam_with_unit_rate():
    params = {"w": jnp.array([1.0, -1.0, 2.0])}
    first, second = (
        eqopt.optimistic_adam(0.05, 0.3),
        eqopt.optimistic_adam_v2(1.0, alpha=0.05, beta=0.3),
    )
    first_state, second_state = first.init(params), second.init(params)
    for step in range(3):
        grads = {"w": jax.random.normal(jax.random.key(step), (3,))}
        first_updates, first_state = first.update(grads, first_state)
        second_updates, second_state = second.update(grads, second_state)
        np.testing.assert_allclose(first_updates["w"], second_updates["w"], rtol=1e-6)


def test_optimistic_alpha_must_be_a_number():
    with pytest.raises(TypeError, match="alpha"):
        eqopt.optimistic_gradient_descent(0.1, alpha=_schedule)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "opt",
    [
        eqopt.optimistic_gradient_descent(0.1),
        eqopt.optimistic_adam(1e-2),
        eqopt.optimistic_adam_v2(1e-2),
    ],
    ids=["ogd", "optimistic_adam", "optimistic_adam_v2"],
)
def test_optimistic_trains(opt):
    first, last, _, _ = train(opt, problem="mlp-2-1")
    assert last < 0.3 * first
