"""ACProp: registry cases against `optax.contrib.acprop`, the asynchronous denominator, training."""

import jax.numpy as jnp
import numpy as np
import optax
from _training import train
from helpers import Case, spec_like

import eqopt

ALL_DTYPES = ("float32", "bfloat16", "complex64")

TRANSFORM_CASES = [
    Case(
        "contrib.scale_by_acprop",
        lambda: eqopt.contrib.scale_by_acprop(),
        lambda: optax.contrib.scale_by_acprop(),
        ALL_DTYPES,
    ),
    Case(
        "contrib.acprop",
        lambda: eqopt.contrib.acprop(1e-2),
        lambda: optax.contrib.acprop(1e-2),
        ALL_DTYPES,
    ),
    Case(
        "contrib.acprop-options-mask",
        lambda p: eqopt.contrib.acprop(
            1e-2,
            b1=0.8,
            b2=0.99,
            eps=1e-8,
            eps_root=1e-8,
            weight_decay=0.1,
            mask=spec_like(p, False, w=True),
        ),
        lambda p: optax.contrib.acprop(
            1e-2,
            b1=0.8,
            b2=0.99,
            eps=1e-8,
            eps_root=1e-8,
            weight_decay=0.1,
            mask=spec_like(p, False, w=True),
        ),
        ALL_DTYPES,
    ),
]


def test_denominator_does_not_see_the_current_gradient():
    tx = eqopt.contrib.scale_by_acprop(eps=0.0, eps_root=0.0)
    params = {"x": jnp.ones(1)}
    state = tx.init(params)
    first, state = tx.update({"x": jnp.array([2.0])}, state)
    np.testing.assert_allclose(first["x"], [2.0])  # the first step is the gradient
    # s_1 = (1 - b2) * (2 - 0)^2, corrected by 1 - b2: sqrt = 2, whatever g_2 is.
    for g in (1.0, 100.0):
        second, _ = tx.update({"x": jnp.array([g])}, state)
        np.testing.assert_allclose(second["x"], [g / 2.0], rtol=1e-5)


def test_training_reduces_loss():
    initial, final, _, _ = train(
        eqopt.contrib.acprop(1e-2), steps=100, problem="mlp-4-1"
    )
    assert final < 0.5 * initial
