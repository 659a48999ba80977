"""SPlus (`eqopt.contrib.splus`, `scale_by_splus`) against pytorch-optimizer's SPlus
over 20 steps (iterates and averaged evaluation parameters), its decay written here,
per layer on a stack, and inside `eqopt.param_groups`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _oracles import import_oracle
from _stacked_model import make_models
from _torch_oracle import random_problem, torch_steps
from helpers import Case

import eqopt

ORACLE = "pytorch-optimizer's SPlus, compared in tests/test_contrib_splus.py"

TRANSFORM_CASES = [
    Case(
        "contrib.splus",
        lambda: eqopt.contrib.splus(0.1, inverse_every=2),
        None,
        no_parity_reason=ORACLE,
    ),
    Case(
        "contrib.scale_by_splus-max-dim",
        lambda: eqopt.contrib.scale_by_splus(b2=0.9, inverse_every=3, max_dim=3),
        None,
        needs_params=False,
        no_parity_reason=ORACLE,
    ),
]

# Sides that differ by at most one: every eigenspace of the first (rank-deficient)
# covariances is a line, so the bases are the oracle's up to signs, which SPlus's
# update does not see.
SHAPES = {"w": (6, 5), "v": (4, 5), "b": (5,)}
STEPS = 20


def _relative(ours, theirs, start) -> float:
    worst = 0.0
    for our, their in zip(ours, theirs, strict=True):
        for k in their:
            moved = np.max(np.abs(their[k] - np.asarray(start[k], np.float64)))
            gap = np.max(np.abs(np.asarray(our[k], np.float64) - their[k]))
            worst = max(worst, gap / moved)
    return worst


def _jitted_steps(tx, params, grads):
    """The params after each step (one jitted step reused) and the last eval params."""
    step = eqx.filter_jit(tx.update)
    current = jax.tree.map(jnp.asarray, params)
    state, out = tx.init(current), []
    for g in grads:
        updates, state = step(jax.tree.map(jnp.asarray, g), state, current)
        current = eqopt.apply_updates(current, updates)
        out.append(jax.tree.map(np.asarray, current))
    return out, eqopt.contrib.splus_eval_params(state, current)


def test_splus_matches_pytorch_optimizer():
    """20 steps, eigenbases refreshed at steps 1, 5, 10, 15, 20, no decay (its decay
    acts after the step: see the next test); then its `eval()` parameters are
    `splus_eval_params`. The vector's constant is raised from 1e-3 so that its
    change (lr * c per step) stands above float32 rounding of the params."""
    po = import_oracle("pytorch_optimizer", "pytorch-optimizer")
    params, grads = random_problem(SHAPES, STEPS)
    tx = eqopt.contrib.splus(
        0.1, b2=0.99, weight_decay=0.0, inverse_every=5, nonstandard_constant=0.05
    )
    ours, evaluated = _jitted_steps(tx, params, grads)
    held = []
    theirs = torch_steps(
        lambda t: po.SPlus(
            list(t.values()),
            lr=0.1,
            betas=(0.9, 0.99),
            weight_decay=0.0,
            inverse_steps=5,
            nonstandard_constant=0.05,
        ),
        params,
        grads,
        before_first_step=lambda opt, tensors: held.append((opt, tensors)),
    )
    assert _relative(ours, theirs, params) < 1e-4

    optimizer, tensors = held[0]
    optimizer.eval()
    for k, t in tensors.items():
        theirs_k = t.detach().numpy()
        spread = np.max(np.abs(theirs_k - params[k]))
        assert np.max(np.abs(np.asarray(evaluated[k]) - theirs_k)) / spread < 1e-4


def test_decay_is_scaled_as_the_step():
    """theta <- theta - lr * s * (u + wd * theta): the difference made by the decay
    is -lr * s * wd * theta, s = 2 / (n + m) for a matrix, c for a vector."""
    params, grads = random_problem({"w": (6, 5), "b": (5,)}, 1, seed=3)
    params = jax.tree.map(jnp.asarray, params)
    g = jax.tree.map(jnp.asarray, grads[0])
    plain = eqopt.contrib.splus(0.1, weight_decay=0.0)
    decayed = eqopt.contrib.splus(0.1, weight_decay=0.5, nonstandard_constant=1e-3)
    a, _ = plain.update(g, plain.init(params), params)
    b, _ = decayed.update(g, decayed.init(params), params)
    for k, s in (("w", 2 / 11), ("b", 1e-3)):
        np.testing.assert_allclose(
            b[k] - a[k], -0.1 * s * 0.5 * params[k], rtol=1e-4, atol=1e-9
        )
    # The first step is the sign of the momentum (identity bases), scaled.
    np.testing.assert_allclose(a["w"], -0.1 * (2 / 11) * np.sign(g["w"]), rtol=1e-6)


def test_stacked_layers_have_their_own_bases():
    """Each slice of a stack of blocks has its own covariances and eigenbases (the
    updates are compared with the list's in tests/test_stacked.py); the layer norms'
    vectors have none."""
    stacked, _ = make_models(jnp.float32)
    state = eqopt.contrib.splus(0.1).init(stacked)
    left, right = state[0].bases.blocks.up.weight
    assert left.shape == (3, 48, 48) and right.shape == (3, 24, 24)
    np.testing.assert_array_equal(left[1], np.eye(48))
    assert state[0].sides.blocks.norm.weight is None


def test_inside_param_groups_and_complex_refused():
    model = eqx.nn.MLP(4, 2, width_size=8, depth=1, key=jax.random.key(2))
    params = eqx.filter(model, eqx.is_inexact_array)
    grads = jax.tree.map(lambda x: jnp.cos(jnp.arange(x.size)).reshape(x.shape), params)
    tx = eqopt.contrib.splus(0.1)
    grouped = eqopt.param_groups(
        tx, [eqopt.Group(r"^layers\[1\]\.", name="last", lr_mult=0.25)]
    )
    plain, _ = tx.update(grads, tx.init(params), params)
    scaled, _ = grouped.update(grads, grouped.init(params), params)
    np.testing.assert_allclose(
        scaled.layers[1].weight, 0.25 * plain.layers[1].weight, rtol=1e-6
    )
    np.testing.assert_allclose(scaled.layers[0].weight, plain.layers[0].weight)
    with pytest.raises(TypeError, match="complex"):
        tx.init({"z": jnp.ones((2, 2), jnp.complex64)})
