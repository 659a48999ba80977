"""Polyak step size: registry cases and behaviour."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case

import eqopt

ALL = ("float32", "bfloat16", "complex64")


def _value(model, grads):
    """A positive objective value that changes with the params (model or dict)."""
    leaves = jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array))
    return {"value": 1.0 + sum(jnp.sum(jnp.abs(x) ** 2) for x in leaves) / 10}


def _schedule(count):
    return 1.0 / (1.0 + count)


TRANSFORM_CASES = [
    Case(
        "polyak_sgd",
        lambda: eqopt.polyak_sgd(),
        lambda: optax.polyak_sgd(),
        ALL,
        extra_args=_value,
        needs_params=False,
    ),
    Case(
        "polyak_sgd-sps_plus",
        lambda: eqopt.polyak_sgd(
            max_learning_rate=0.05, scaling=0.5, f_min=2.0, eps=1e-3, variant="sps+"
        ),
        lambda: optax.polyak_sgd(
            max_learning_rate=0.05, scaling=0.5, f_min=2.0, eps=1e-3, variant="sps+"
        ),
        ALL,
        extra_args=_value,
        needs_params=False,
    ),
    Case(
        "polyak_sgd-scaling_schedule",
        lambda: eqopt.polyak_sgd(scaling=_schedule),
        lambda: optax.polyak_sgd(scaling=_schedule),
        ALL,
        extra_args=_value,
        needs_params=False,
    ),
    Case(
        "scale_by_polyak",
        lambda: eqopt.scale_by_polyak(f_min=0.5, max_learning_rate=10.0),
        lambda: optax.scale_by_polyak(f_min=0.5, max_learning_rate=10.0),
        ALL,
        extra_args=_value,
        needs_params=False,
    ),
]


def test_polyak_halves_a_quadratic():
    # f(x) = |x|^2 has f* = 0 and gradient 2x: the Polyak step is
    # |x|^2 / |2x|^2 = 1/4, so each step halves x (and quarters f).
    def f(x):
        return jnp.sum(x**2)

    opt = eqopt.polyak_sgd()
    x = jnp.array([1.0, 2.0, 3.0])
    state = opt.init(x)
    values = []
    for _ in range(4):
        value, grad = jax.value_and_grad(f)(x)
        updates, state = opt.update(grad, state, x, value=value)
        x = eqopt.apply_updates(x, updates)
        values.append(float(f(x)))
    np.testing.assert_allclose(values, [3.5, 0.875, 0.21875, 0.0546875], rtol=1e-6)


def test_polyak_step_is_capped_and_sps_plus_clips_the_gap():
    grads = {"w": jnp.array([3.0, 4.0])}  # |g|^2 = 25
    capped = eqopt.scale_by_polyak(max_learning_rate=0.1)
    updates, _ = capped.update(grads, capped.init(grads), value=jnp.asarray(100.0))
    np.testing.assert_allclose(updates["w"], 0.1 * grads["w"])
    below = jnp.asarray(-5.0)  # the value is below f_min
    sps = eqopt.scale_by_polyak()
    updates, _ = sps.update(grads, sps.init(grads), value=below)
    np.testing.assert_allclose(updates["w"], -0.2 * grads["w"])
    sps_plus = eqopt.scale_by_polyak(variant="sps+")
    updates, _ = sps_plus.update(grads, sps_plus.init(grads), value=below)
    np.testing.assert_array_equal(updates["w"], 0.0)


def test_polyak_zero_gradient_gives_zero_update():
    zero = {"w": jnp.zeros(3)}
    tx = eqopt.scale_by_polyak()
    for value in (0.0, 1.0):
        updates, _ = tx.update(zero, tx.init(zero), value=jnp.asarray(value))
        np.testing.assert_array_equal(updates["w"], 0.0)


def test_polyak_without_value_is_a_clear_error():
    grads = {"w": jnp.ones(3)}
    opt = eqopt.polyak_sgd()
    # A missing argument is a TypeError, as in Python and Optax.
    with pytest.raises(TypeError, match=r"value=loss"):
        opt.update(grads, opt.init(grads), grads)


def test_polyak_rejects_unknown_variant():
    # A bad choice is a ValueError (as in Optax), from the check of the Optax
    # spelling and of the class alike.
    with pytest.raises(ValueError, match=r"`variant` must be one of 'sps', 'sps\+'"):
        eqopt.scale_by_polyak(variant="sps2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="variant"):
        eqopt.ScaleByPolyak(variant="sps2")  # type: ignore[arg-type]


def test_polyak_ignores_the_structure_of_params():
    # As in Optax: params are not read, so a params tree of another structure is
    # fine, and the missing value is what is reported.
    updates = (jnp.array([500.0, 5.0]), jnp.array([300.0, 3.0]))
    params = jnp.array([1.0, -1.0])
    tx = eqopt.scale_by_polyak()
    with pytest.raises(TypeError, match="value"):
        tx.update(updates, tx.init(params), params)
    new, _ = tx.update(updates, tx.init(params), params, value=jnp.asarray(1.0))
    assert jax.tree.structure(new) == jax.tree.structure(updates)


def test_polyak_trains():
    first, last, _, _ = train(eqopt.polyak_sgd(), with_value=True, problem="mlp-2-1")
    assert last < 0.1 * first
