"""RAdam: registry cases and behaviour."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _training import train
from helpers import Case

import eqopt

ALL = ("float32", "bfloat16", "complex64")
# 1 - b2 a power of two: rho_inf is exact in float32 (see ScaleByRadam's note),
# and the rectified branch starts at step 6.
B2 = 1 - 2**-7

TRANSFORM_CASES = [
    Case(
        "radam",
        lambda: eqopt.radam(1e-2),
        lambda: optax.radam(1e-2),
        ALL,
        needs_params=False,
    ),
    Case(
        "radam-rectified",
        lambda: eqopt.radam(1e-2, b2=B2),
        lambda: optax.radam(1e-2, b2=B2),
        ALL,
        needs_params=False,
        steps=12,
    ),
    Case(
        "scale_by_radam-nesterov",
        lambda: eqopt.scale_by_radam(
            b1=0.8, b2=B2, eps_root=1e-6, threshold=6.0, nesterov=True
        ),
        lambda: optax.scale_by_radam(
            b1=0.8, b2=B2, eps_root=1e-6, threshold=6.0, nesterov=True
        ),
        ALL,
        needs_params=False,
        steps=12,
    ),
]


def _run(tx, grads):
    state = tx.init(grads[0])
    out = []
    for g in grads:
        update, state = tx.update(g, state)
        out.append(update["w"])
    return out


def test_radam_is_momentum_then_rectified_adam():
    grads = [{"w": jax.random.normal(jax.random.key(i), (4,))} for i in range(40)]
    radam = _run(eqopt.scale_by_radam(b2=B2), grads)
    adam = _run(eqopt.scale_by_adam(b2=B2), grads)
    momentum = _run(eqopt.chain(eqopt.ema(0.9, debias=True)), grads)
    # rho_t <= 5 for the first five steps: bias-corrected momentum only.
    for t in range(5):
        np.testing.assert_allclose(radam[t], momentum[t], rtol=1e-5)
    # Then Adam's step scaled by r_t < 1, with r_t increasing towards 1.
    ratios = [float(jnp.mean(radam[t] / adam[t])) for t in (5, 10, 39)]
    for t, ratio in zip((5, 10, 39), ratios, strict=True):
        np.testing.assert_allclose(radam[t] / adam[t], ratio, rtol=1e-4)
    assert 0 < ratios[0] < ratios[1] < ratios[2] < 1


def test_radam_trains():
    first, last, _, _ = train(eqopt.radam(1e-2), problem="mlp-2-1")
    assert last < 0.5 * first
