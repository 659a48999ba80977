"""Hyperball (`eqopt.contrib.hyperball`, `adamh`, `muonh`) against heavyball's
HyperBallAdamW over 20 steps, the update written here for Muon, the norms kept per
layer of a stack, and inside `eqopt.param_groups`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _oracles import import_oracle
from _stacked_model import make_models
from _torch_oracle import eqopt_steps, random_problem, torch_steps
from helpers import Case

import eqopt

ORACLE = "heavyball's HyperBallAdamW, compared in this file"

TRANSFORM_CASES = [
    Case(
        "contrib.adamh",
        lambda: eqopt.contrib.adamh(1e-2),
        None,
        no_parity_reason=ORACLE,
    ),
    Case(
        "contrib.muonh",
        lambda: eqopt.contrib.muonh(2e-2, adam_learning_rate=1e-2),
        None,
        no_parity_reason="the Hyperball step on Muon is written in this file",
    ),
]

SHAPES = {"w": (6, 5), "v": (4, 3, 2), "b": (5,)}
STEPS = 20


def _relative(ours, theirs, start) -> float:
    """The largest difference over steps and leaves, relative to the params' change."""
    worst = 0.0
    for our, their in zip(ours, theirs, strict=True):
        for k in their:
            moved = np.max(np.abs(their[k] - np.asarray(start[k], np.float64)))
            gap = np.max(np.abs(np.asarray(our[k], np.float64) - their[k]))
            worst = max(worst, gap / moved)
    return worst


def test_adamh_matches_heavyball(monkeypatch):
    """heavyball's HyperBallAdamW scales by the second moment only (no first
    moment, whatever its `betas[0]`): AdamH with `b1=0`. Its eps is a floor on the
    RMS, negligible at 1e-8 here; every leaf of two or more axes is on its sphere."""
    heavyball = import_oracle("heavyball")
    monkeypatch.setattr(heavyball.utils, "compile_mode", None)
    params, grads = random_problem(SHAPES, STEPS)
    ours = eqopt_steps(eqopt.contrib.adamh(2e-2, b1=0.0, b2=0.99), params, grads)
    theirs = torch_steps(
        lambda t: heavyball.HyperBallAdamW(
            list(t.values()), lr=2e-2, betas=(0.9, 0.99), compile_step=False
        ),
        params,
        grads,
    )
    assert _relative(ours, theirs, params) < 1e-4
    for k in ("w", "v"):
        np.testing.assert_allclose(
            np.linalg.norm(ours[-1][k]), np.linalg.norm(params[k]), rtol=1e-5
        )


def _muon_direction(g, m, t, beta=0.95):
    """eqopt's (Optax's) Muon direction: bias-corrected Nesterov momentum and
    Jordan's quintic Newton-Schulz, float64."""
    a, b, c = 3.4445, -4.7750, 2.0315
    m = beta * m + (1 - beta) * g
    x = beta * m / (1 - beta ** (t + 1)) + (1 - beta) * g / (1 - beta**t)
    x = x / (np.linalg.norm(x) + 1e-8)
    for _ in range(5):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x, m


def test_muonh_is_the_hyperball_step_on_muon():
    """The matrix `w` follows W <- R normalize(W - lr R normalize(NS(M))); the
    vector `b` is AdamW's (no decay)."""
    params, grads = random_problem({"w": (6, 5), "b": (5,)}, STEPS, seed=1)
    ours = eqopt_steps(eqopt.contrib.muonh(2e-2, eps=1e-8), params, grads)
    w = np.asarray(params["w"], np.float64)
    radius, m, theirs = np.linalg.norm(w), np.zeros_like(w), []
    for t, g in enumerate(grads, 1):
        u, m = _muon_direction(np.asarray(g["w"], np.float64), m, t)
        moved = w - 2e-2 * radius * u / np.linalg.norm(u)
        w = radius * moved / np.linalg.norm(moved)
        theirs.append({"w": w.copy()})
    assert _relative(ours, theirs, params) < 1e-4


def test_stacked_layers_keep_each_layers_norm():
    """On a stack of blocks each slice keeps its own initial norm, the radius is one
    number per layer, and the layer norms' scales and biases are not projected."""
    stacked, _ = make_models(jnp.float32)
    opt = eqopt.contrib.adamh(5e-2)
    state = opt.init(stacked)
    assert state.radius.blocks.up.weight.shape == (3,)
    assert state.radius.blocks.up.bias is None
    start = np.linalg.norm(np.asarray(stacked.blocks.up.weight), axis=(1, 2))
    np.testing.assert_allclose(state.radius.blocks.up.weight, start, rtol=1e-6)
    step = eqx.filter_jit(opt.update)
    model = stacked
    for k in range(3):
        grads = jax.tree.map(
            lambda x, k=k: jax.random.normal(jax.random.key(k), x.shape),
            eqx.filter(model, eqx.is_inexact_array),
        )
        updates, state = step(grads, state, model)
        model = eqopt.apply_updates(model, updates)
    after = np.linalg.norm(np.asarray(model.blocks.up.weight), axis=(1, 2))
    np.testing.assert_allclose(after, start, rtol=1e-5)
    assert not np.allclose(model.blocks.up.weight, stacked.blocks.up.weight)
    assert not np.allclose(
        np.linalg.norm(model.blocks.norm.weight),
        np.linalg.norm(stacked.blocks.norm.weight),
    )


def test_inside_param_groups_and_errors():
    """A group overriding the learning rate with 0 freezes its leaves (the ordinary
    step and the sphere's alike); `lr_mult`, which scales a `ScaleByLearningRate`
    step that Hyperball has not, is refused; the update needs params."""
    model = eqx.nn.MLP(4, 2, width_size=8, depth=1, key=jax.random.key(2))
    params = eqx.filter(model, eqx.is_inexact_array)
    grads = jax.tree.map(lambda x: jnp.cos(jnp.arange(x.size)).reshape(x.shape), params)
    opt = eqopt.contrib.adamh(1e-2)
    grouped = eqopt.param_groups(
        opt, [eqopt.Group(r"^layers\[1\]\.", name="last", learning_rate=0.0)]
    )
    plain, _ = opt.update(grads, opt.init(params), params)
    updates, _ = grouped.update(grads, grouped.init(params), params)
    np.testing.assert_allclose(updates.layers[0].weight, plain.layers[0].weight)
    assert not np.any(np.asarray(updates.layers[1].weight))
    assert np.any(np.asarray(plain.layers[1].weight))
    with pytest.raises(ValueError, match="lr_mult"):
        eqopt.param_groups(opt, [eqopt.Group(r"^layers", lr_mult=0.5)])
    with pytest.raises(ValueError, match="params"):
        opt.update(grads, opt.init(params))


def test_adamh_on_an_equinox_mlp_matches_heavyball(monkeypatch):
    """On an `eqx.nn.MLP` (weights read as matrices per layer, biases by Adam's
    step): heavyball on the same arrays, 10 steps of one jitted update."""
    heavyball = import_oracle("heavyball")
    monkeypatch.setattr(heavyball.utils, "compile_mode", None)
    model = eqx.nn.MLP(4, 2, width_size=8, depth=1, key=jax.random.key(1))
    params = eqx.filter(model, eqx.is_inexact_array)
    leaves, treedef = jax.tree.flatten(params)
    start = {str(i): np.asarray(x) for i, x in enumerate(leaves)}
    rng = np.random.default_rng(4)
    grads = [{k: rng.normal(size=v.shape) for k, v in start.items()} for _ in range(10)]
    opt = eqopt.contrib.adamh(2e-2, b1=0.0, b2=0.99)
    step = eqx.filter_jit(opt.update)
    state, current, ours = opt.init(model), model, []
    for g in grads:
        tree = jax.tree.unflatten(
            treedef, [jnp.asarray(g[str(i)]) for i in range(len(leaves))]
        )
        updates, state = step(tree, state, current)
        current = eqopt.apply_updates(current, updates)
        flat = jax.tree.leaves(eqx.filter(current, eqx.is_inexact_array))
        ours.append({str(i): np.asarray(x) for i, x in enumerate(flat)})
    theirs = torch_steps(
        lambda t: heavyball.HyperBallAdamW(
            list(t.values()), lr=2e-2, betas=(0.9, 0.99), compile_step=False
        ),
        start,
        grads,
    )
    assert _relative(ours, theirs, start) < 1e-4
