"""AdEMAMix and simplified AdEMAMix: registry cases against `optax.contrib`, training."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case, spec_like

import eqopt

ALL_DTYPES = ("float32", "bfloat16", "complex64")


def _b3(count):
    return 0.99 + 0.001 * jnp.minimum(count, 9)


def _alpha(count):
    return 0.5 * jnp.minimum(count, 10)


TRANSFORM_CASES = [
    Case(
        "contrib.scale_by_ademamix",
        lambda: eqopt.contrib.scale_by_ademamix(),
        lambda: optax.contrib.scale_by_ademamix(),
        ALL_DTYPES,
    ),
    Case(
        "contrib.ademamix",
        lambda: eqopt.contrib.ademamix(1e-2),
        lambda: optax.contrib.ademamix(1e-2),
        ALL_DTYPES,
    ),
    Case(
        "contrib.ademamix-schedules-decay-mask",
        lambda p: eqopt.contrib.ademamix(
            1e-2,
            b3=_b3,
            alpha=_alpha,
            eps_root=1e-8,
            weight_decay=0.1,
            mask=spec_like(p, False, w=True),
        ),
        lambda p: optax.contrib.ademamix(
            1e-2,
            b3=_b3,
            alpha=_alpha,
            eps_root=1e-8,
            weight_decay=0.1,
            mask=spec_like(p, False, w=True),
        ),
        ALL_DTYPES,
    ),
    # Without a learning rate the updates are O(10) (the momentum sums ~100
    # gradients), so bfloat16 rounding of the parameters exceeds the bfloat16
    # tolerance; simplified_ademamix below covers bfloat16 with small steps.
    Case(
        "contrib.scale_by_simplified_ademamix",
        lambda: eqopt.contrib.scale_by_simplified_ademamix(alpha=2.0),
        lambda: optax.contrib.scale_by_simplified_ademamix(alpha=2.0),
        ("float32",),
    ),
    Case(
        "contrib.simplified_ademamix",
        lambda: eqopt.contrib.simplified_ademamix(1e-2),
        lambda: optax.contrib.simplified_ademamix(1e-2),
    ),
    Case(
        "contrib.simplified_ademamix-schedule-decay",
        lambda: eqopt.contrib.simplified_ademamix(
            1e-2, b1=0.9, alpha=_alpha, weight_decay=0.1
        ),
        lambda: optax.contrib.simplified_ademamix(
            1e-2, b1=0.9, alpha=_alpha, weight_decay=0.1
        ),
    ),
]


def test_simplified_momentum_is_an_undamped_sum():
    # m_t = b1 m_{t-1} + g_t (no 1 - b1, no bias correction); n is Adam's.
    b1, b2, alpha = 0.5, 0.9, 0.3
    tx = eqopt.contrib.scale_by_simplified_ademamix(b1=b1, b2=b2, alpha=alpha, eps=0.0)
    params = {"x": jnp.ones(3)}
    grads = [np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.1, -1.0])]
    state = tx.init(params)
    m = n = 0.0
    for t, g in enumerate(grads, start=1):
        updates, state = tx.update({"x": jnp.asarray(g)}, state)
        m, n = b1 * m + g, b2 * n + (1 - b2) * g**2
        expected = (m + alpha * g) / np.sqrt(n / (1 - b2**t))
        np.testing.assert_allclose(updates["x"], expected, rtol=1e-5)


def test_slow_ema_is_not_bias_corrected():
    tx = eqopt.contrib.scale_by_ademamix(b1=0.0, b2=0.0, b3=0.5, alpha=1.0, eps=0.0)
    params = {"x": jnp.ones(1)}
    updates, state = tx.update({"x": jnp.array([2.0])}, tx.init(params))
    # (g + 1 * (1 - b3) g) / |g| = 1.5
    np.testing.assert_allclose(updates["x"], [1.5])


def test_complex_simplified_uses_the_modulus():
    tx = eqopt.contrib.scale_by_simplified_ademamix()
    state = tx.init({"z": jnp.ones(2, jnp.complex64)})
    assert state.n["z"].dtype == jnp.float32


@pytest.mark.parametrize(
    "make",
    [
        lambda: eqopt.contrib.ademamix(1e-2),
        lambda: eqopt.contrib.simplified_ademamix(1e-3),
    ],
    ids=["ademamix", "simplified"],
)
def test_training_reduces_loss(make):
    initial, final, _, _ = train(make(), steps=100, problem="mlp-4-1")
    assert final < 0.5 * initial
