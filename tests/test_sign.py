"""signSGD's sign and Lion (`eqopt/_transform/sign.py`)."""

import jax.numpy as jnp
import numpy as np
import optax
from helpers import ALL_DTYPES, REAL_DTYPES, Case, assert_state_stays_bfloat16

import eqopt

TRANSFORM_CASES = [
    Case(
        "scale_by_sign",
        eqopt.scale_by_sign,
        optax.scale_by_sign,
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_lion",
        eqopt.scale_by_lion,
        optax.scale_by_lion,
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_lion-mu_dtype",
        lambda: eqopt.scale_by_lion(b1=0.5, mu_dtype=jnp.bfloat16),
        lambda: optax.scale_by_lion(b1=0.5, mu_dtype=jnp.bfloat16),
        ("float32",),
        needs_params=False,
    ),
    Case(
        # Complex is left out on purpose: eqopt saturates the modulus (see
        # test_lion_smooth_on_complex_keeps_the_phase).
        "scale_by_lion-smooth",
        lambda: eqopt.scale_by_lion(b2=0.9, mode="smooth", smooth_beta=2.0),
        lambda: optax.scale_by_lion(b2=0.9, mode="smooth", smooth_beta=2.0),
        REAL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_lion-refined",
        lambda: eqopt.scale_by_lion(mode="refined"),
        lambda: optax.scale_by_lion(mode="refined"),
        ALL_DTYPES,
        needs_params=False,
    ),
]


def test_bfloat16_state_stays_bfloat16():
    assert_state_stays_bfloat16(eqopt.scale_by_lion())


def test_lion_smooth_on_complex_keeps_the_phase():
    """Difference from Optax: tanh of the modulus, not the complex tanh (which has poles)."""
    params = {"z": jnp.zeros(4, jnp.complex64)}
    grads = {"z": jnp.array([0.3 + 0.4j, -2.0j, 0.0, 1.5], jnp.complex64)}
    beta = 2.0
    tx = eqopt.scale_by_lion(b1=0.0, mode="smooth", smooth_beta=beta)
    updates, _ = tx.update(grads, tx.init(params))
    g = np.asarray(grads["z"])
    modulus = np.abs(g)
    expected = np.where(
        modulus > 0, np.tanh(beta * modulus) * g / np.where(modulus > 0, modulus, 1), 0
    )
    np.testing.assert_allclose(updates["z"], expected, rtol=1e-6, atol=1e-7)
    # On the real axis it is Optax's tanh; off it, Optax's complex tanh differs.
    reference = optax.scale_by_lion(b1=0.0, mode="smooth", smooth_beta=beta)
    reference_updates, _ = reference.update(grads, reference.init(params))
    np.testing.assert_allclose(updates["z"][3], reference_updates["z"][3], rtol=1e-6)
    assert not np.allclose(updates["z"][1], reference_updates["z"][1])
    # Near a pole of the complex tanh (i pi / 2), eqopt's stays bounded by one.
    near_pole = {"z": jnp.full(4, 1j * np.pi / (2 * beta), jnp.complex64)}
    updates, _ = tx.update(near_pole, tx.init(params))
    assert np.all(np.abs(np.asarray(updates["z"])) <= 1.0)


def test_lion_momentum_is_not_the_update_interpolation():
    """c_t uses b1, the stored momentum uses b2 (Chen et al., Algorithm 2)."""
    tx = eqopt.scale_by_lion(b1=0.5, b2=0.25, mode="refined")
    params = {"w": jnp.zeros(2)}
    state = tx.init(params)
    updates, state = tx.update({"w": jnp.array([0.4, -4.0])}, state)
    np.testing.assert_allclose(updates["w"], [0.2, -1.0])
    np.testing.assert_allclose(state.mu["w"], [0.3, -3.0])
    updates, state = tx.update({"w": jnp.array([0.0, 0.0])}, state)
    np.testing.assert_allclose(updates["w"], [0.15, -1.0])
