"""Adan: registry cases and behaviour (eqopt follows the paper where Optax 0.2.8 does not)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _training import train
from helpers import Case, as_dict, make_model, random_grads, spec_like

import eqopt

ALL = ("float32", "bfloat16", "complex64")
PAPER = (
    "Optax 0.2.8 weights the gradient difference by 1 - b2 (optax PR #1715), "
    "the paper by b2; they agree at b2 = 0.5 (the adan-b2_half cases) and "
    "test_adan_follows_the_paper checks the default"
)

TRANSFORM_CASES = [
    Case(
        "adan-b2_half",
        lambda: eqopt.adan(1e-2, b2=0.5, weight_decay=0.1),
        lambda: optax.adan(1e-2, b2=0.5, weight_decay=0.1),
        ALL,
    ),
    Case(
        "adan-b2_half-mask",
        lambda: eqopt.adan(1e-2, b2=0.5, weight_decay=0.1, mask=lambda x: x.ndim > 1),
        lambda p: optax.adan(1e-2, b2=0.5, weight_decay=0.1, mask=spec_like(p, w=True)),
        ALL,
    ),
    Case(
        "scale_by_adan-b2_half",
        lambda: eqopt.scale_by_adan(b1=0.9, b2=0.5, b3=0.9, eps_root=1e-8),
        lambda: optax.scale_by_adan(b1=0.9, b2=0.5, b3=0.9, eps_root=1e-8),
        ALL,
        needs_params=False,
    ),
    Case("adan", lambda: eqopt.adan(1e-2), None, no_parity_reason=PAPER),
    Case("scale_by_adan", lambda: eqopt.scale_by_adan(), None, no_parity_reason=PAPER),
]


def _paper_adan(grads, b1=0.98, b2=0.92, b3=0.99, eps=1e-8, eps_root=0.0):
    """Algorithm 1 of Xie et al. with the decays written as in Adam (the paper's
    beta is 1 - b) and the bias corrections of the authors' code."""
    m = v = n = previous = np.zeros_like(grads[0])
    out = []
    for t, g in enumerate(grads, start=1):
        difference = np.zeros_like(g) if t == 1 else g - previous
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * difference
        n = b3 * n + (1 - b3) * (g + b2 * difference) ** 2
        m_hat, v_hat, n_hat = m / (1 - b1**t), v / (1 - b2**t), n / (1 - b3**t)
        out.append((m_hat + b2 * v_hat) / (np.sqrt(n_hat + eps_root) + eps))
        previous = g
    return out


def test_adan_follows_the_paper():
    grads = [
        np.asarray(jax.random.normal(jax.random.key(i), (5,)), np.float64)
        for i in range(6)
    ]
    tx = eqopt.scale_by_adan()
    state = tx.init({"w": jnp.zeros(5)})
    for g, expected in zip(grads, _paper_adan(grads), strict=True):
        updates, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state)
        np.testing.assert_allclose(updates["w"], expected, rtol=1e-4, atol=1e-6)


def test_adan_differs_from_optax_after_the_first_step():
    model = make_model()
    params = as_dict(model)
    tx, reference = eqopt.scale_by_adan(), optax.scale_by_adan()
    state, reference_state = tx.init(model), reference.init(params)
    differences = []
    for step in range(3):
        grads = random_grads(model, step)
        updates, state = tx.update(grads, state)
        reference_updates, reference_state = reference.update(
            as_dict(grads), reference_state
        )
        differences.append(float(jnp.max(jnp.abs(updates.w - reference_updates["w"]))))
    assert differences[0] < 1e-5 and differences[1] > 1e-2


def test_adan_state_keeps_the_previous_gradient():
    model = make_model()
    tx = eqopt.scale_by_adan()
    grads = random_grads(model, 0)
    _, state = tx.update(grads, tx.init(model))
    assert int(state.t) == 1
    np.testing.assert_array_equal(state.g.w, grads.w)
    assert state.g.indices is None and state.n.w.dtype == jnp.float32


def test_adan_trains():
    first, last, _, _ = train(eqopt.adan(1e-2), problem="mlp-2-1")
    assert last < 0.2 * first
