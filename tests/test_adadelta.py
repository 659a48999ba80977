"""Adadelta: registry cases and behaviour."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case, as_dict, make_model, random_grads, spec_like

import eqopt

REAL = ("float32", "bfloat16")  # Optax squares complex gradients without conjugating


TRANSFORM_CASES = [
    Case(
        "adadelta",
        lambda: eqopt.adadelta(0.5, weight_decay=0.1),
        lambda: optax.adadelta(0.5, weight_decay=0.1),
        REAL,
    ),
    Case(
        "adadelta-mask",
        lambda: eqopt.adadelta(
            0.5, rho=0.75, weight_decay=0.1, weight_decay_mask=lambda x: x.ndim > 1
        ),
        lambda p: optax.adadelta(
            0.5, rho=0.75, weight_decay=0.1, weight_decay_mask=spec_like(p, w=True)
        ),
        REAL,
    ),
    Case(
        "adadelta-no_learning_rate",
        lambda: eqopt.adadelta(),
        None,
        no_parity_reason=(
            "Optax's adadelta() does not negate its updates; "
            "test_adadelta_without_learning_rate_descends compares the numbers"
        ),
    ),
    Case(
        "scale_by_adadelta",
        lambda: eqopt.scale_by_adadelta(rho=0.5, eps=1e-3),
        lambda: optax.scale_by_adadelta(rho=0.5, eps=1e-3),
        REAL,
        needs_params=False,
    ),
]


def test_adadelta_without_learning_rate_descends():
    """The paper's Adadelta descends; Optax's `adadelta()` climbs (its sign is the
    only difference, so `adadelta()` here equals `optax.adadelta(1.0)`)."""
    model = make_model()
    params = as_dict(model)
    tx, climbing, unit = eqopt.adadelta(), optax.adadelta(), optax.adadelta(1.0)
    state = tx.init(model)
    climbing_state, unit_state = climbing.init(params), unit.init(params)
    for step in range(3):
        grads = random_grads(model, step)
        updates, state = tx.update(grads, state, model)
        climbing_updates, climbing_state = climbing.update(
            as_dict(grads), climbing_state, params
        )
        unit_updates, unit_state = unit.update(as_dict(grads), unit_state, params)
        for key in ("w", "b", "s"):
            np.testing.assert_allclose(
                as_dict(updates)[key], -climbing_updates[key], rtol=1e-5
            )
            np.testing.assert_allclose(
                as_dict(updates)[key], unit_updates[key], rtol=1e-5
            )
        # The update opposes the gradient.
        assert np.all(np.sign(updates.w) == -np.sign(grads.w))


def test_adadelta_first_step_is_the_ratio_of_root_mean_squares():
    rho, eps = 0.9, 1e-6
    grads = {"w": jnp.array([0.5, -2.0, 0.0])}
    tx = eqopt.scale_by_adadelta(rho=rho, eps=eps)
    updates, state = tx.update(grads, tx.init(grads))
    g = np.asarray(grads["w"])
    expected = np.sqrt(eps) / np.sqrt((1 - rho) * g**2 + eps) * g
    np.testing.assert_allclose(updates["w"], expected, rtol=1e-5)
    np.testing.assert_allclose(state.e_x["w"], (1 - rho) * expected**2, rtol=1e-5)


def test_adadelta_trains():
    first, last, _, _ = train(eqopt.adadelta(), problem="mlp-2-1")
    assert last < 0.5 * first


def test_adadelta_rejects_bad_rho():
    with pytest.raises(ValueError, match="rho"):
        eqopt.adadelta(rho=1.5)


def test_adadelta_complex_updates_rotate_the_real_ones():
    # Optax squares complex gradients without conjugating (so it has no complex
    # parity case); eqopt uses |g|^2, so a complex gradient a e^{i phi} gets the
    # update of the real gradient a, rotated by e^{i phi}.
    magnitudes = [jnp.array([0.5, 2.0]), jnp.array([1.0, 0.1]), jnp.array([3.0, 1.0])]
    phase = jnp.exp(1j * jnp.array([0.3, -2.0])).astype(jnp.complex64)
    tx = eqopt.scale_by_adadelta(rho=0.5, eps=1e-3)
    real_state = tx.init({"w": jnp.zeros(2)})
    complex_state = tx.init({"w": jnp.zeros(2, jnp.complex64)})
    assert complex_state.e_g["w"].dtype == jnp.float32
    for a in magnitudes:
        real, real_state = tx.update({"w": a}, real_state)
        rotated, complex_state = tx.update({"w": a * phase}, complex_state)
        np.testing.assert_allclose(rotated["w"], real["w"] * phase, rtol=1e-5)
