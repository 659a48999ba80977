"""LaProp (`eqopt.contrib.laprop`, `scale_by_laprop`) against pytorch-optimizer's and
heavyball's LaProp over 20 steps, the paper's update written here, on bare arrays and
an Equinox MLP, and inside `eqopt.param_groups`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _oracles import import_oracle
from _torch_oracle import eqopt_steps, random_problem, torch_steps
from helpers import Case, spec_like

import eqopt

ORACLE = "pytorch-optimizer's and heavyball's LaProp, compared in this file"

TRANSFORM_CASES = [
    Case(
        "contrib.laprop",
        lambda: eqopt.contrib.laprop(1e-2, weight_decay=0.1),
        None,
        ("float32", "bfloat16", "complex64"),
        no_parity_reason=ORACLE,
    ),
    Case(
        "contrib.scale_by_laprop-options",
        lambda p: eqopt.contrib.laprop(
            1e-2,
            b1=0.8,
            b2=0.95,
            eps=1e-8,
            weight_decay=0.1,
            mask=spec_like(p, False, w=True),
            cautious_weight_decay=True,
        ),
        None,
        no_parity_reason=ORACLE,
    ),
]

SHAPES = {"w": (6, 5), "b": (5,)}
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


def _paper(params, grads, lr, b1, b2, eps, weight_decay=0.0):
    """Algorithm 1 of the paper (learning rate inside the momentum, bias-corrected by
    1 - b1^t for a constant rate) in float64, with decoupled decay."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    n = {k: np.zeros_like(v) for k, v in p.items()}
    out = []
    for t, g in enumerate(grads, 1):
        for k in p:
            n[k] = b2 * n[k] + (1 - b2) * g[k] ** 2
            normalised = g[k] / (np.sqrt(n[k] / (1 - b2**t)) + eps)
            m[k] = b1 * m[k] + (1 - b1) * lr * normalised
            p[k] = p[k] - m[k] / (1 - b1**t) - lr * weight_decay * p[k]
        out.append({k: v.copy() for k, v in p.items()})
    return out


def test_laprop_is_the_papers_update():
    params, grads = random_problem(SHAPES, STEPS)
    ours = eqopt_steps(
        eqopt.contrib.laprop(1e-2, b2=0.99, eps=1e-8, weight_decay=0.1), params, grads
    )
    theirs = _paper(params, grads, 1e-2, 0.9, 0.99, 1e-8, weight_decay=0.1)
    assert _relative(ours, theirs, params) < 1e-4


def test_laprop_matches_pytorch_optimizer():
    """pytorch-optimizer adds eps before the bias correction (so eps=1e-15 hides it)
    and applies its decay after the step (to p - lr*u), so it is compared without."""
    po = import_oracle("pytorch_optimizer", "pytorch-optimizer")
    params, grads = random_problem(SHAPES, STEPS, seed=1)
    ours = eqopt_steps(eqopt.contrib.laprop(1e-2, b2=0.99), params, grads)
    theirs = torch_steps(
        lambda t: po.LaProp(list(t.values()), lr=1e-2, betas=(0.9, 0.99)),
        params,
        grads,
    )
    assert _relative(ours, theirs, params) < 1e-4


@pytest.mark.parametrize("cautious", [False, True])
def test_laprop_matches_heavyball(monkeypatch, cautious):
    """heavyball's decay is ours (p(1 - lr wd) - lr u); its eps is a floor on the
    RMS, negligible at 1e-8 on these gradients. Cautious decay is heavyball's too."""
    heavyball = import_oracle("heavyball")
    monkeypatch.setattr(heavyball.utils, "compile_mode", None)
    params, grads = random_problem(SHAPES, STEPS, seed=2)
    tx = eqopt.contrib.laprop(
        1e-2, b2=0.99, eps=1e-8, weight_decay=0.5, cautious_weight_decay=cautious
    )
    ours = eqopt_steps(tx, params, grads)
    theirs = torch_steps(
        lambda t: heavyball.LaProp(
            list(t.values()),
            lr=1e-2,
            betas=(0.9, 0.99),
            eps=1e-8,
            weight_decay=0.5,
            cautious_weight_decay=cautious,
            compile_step=False,
        ),
        params,
        grads,
    )
    assert _relative(ours, theirs, params) < 1e-4


def test_momentum_is_of_the_normalised_gradient():
    """A gradient 1000 times larger after small ones moves no more than lr / (1 - b1)
    (LaProp), where Adam's momentum divided by a stale RMS would step far further."""
    tx = eqopt.contrib.scale_by_laprop(b1=0.9, b2=0.999)
    params = {"x": jnp.zeros(1)}
    state = tx.init(params)
    for _ in range(10):
        _, state = tx.update({"x": jnp.array([1e-3])}, state)
    big, _ = tx.update({"x": jnp.array([1.0])}, state)
    assert abs(float(big["x"][0])) < 1 / (1 - 0.9**11)
    np.testing.assert_array_equal(state.count, 10)


def test_on_an_equinox_mlp_and_in_param_groups():
    """On an `eqx.nn.MLP` it is the paper's update leaf by leaf; in `param_groups`
    a group's learning-rate multiplier scales its update."""
    model = eqx.nn.MLP(4, 2, width_size=8, depth=1, key=jax.random.key(0))
    grads = [
        jax.tree.map(
            lambda x, s=s: jax.random.normal(jax.random.key(s), x.shape),
            eqx.filter(model, eqx.is_inexact_array),
        )
        for s in range(5)
    ]
    tx = eqopt.contrib.laprop(1e-2, b2=0.99, eps=1e-8)
    state = tx.init(model)
    step = eqx.filter_jit(tx.update)
    current = model
    for g in grads:
        updates, state = step(g, state, current)
        current = eqopt.apply_updates(current, updates)
    flat = lambda m: dict(enumerate(jax.tree.leaves(eqx.filter(m, eqx.is_array))))  # noqa: E731
    theirs = _paper(flat(model), [flat(g) for g in grads], 1e-2, 0.9, 0.99, 1e-8)
    assert _relative([flat(current)], theirs[-1:], flat(model)) < 1e-4

    params = eqx.filter(model, eqx.is_inexact_array)
    grouped = eqopt.param_groups(
        tx, [eqopt.Group(r"^layers\[1\]\.", name="last", lr_mult=0.25)]
    )
    u_plain, _ = tx.update(grads[0], tx.init(params), params)
    u_grouped, _ = grouped.update(grads[0], grouped.init(params), params)
    np.testing.assert_allclose(
        u_grouped.layers[1].weight, 0.25 * u_plain.layers[1].weight, rtol=1e-6
    )
    np.testing.assert_allclose(u_grouped.layers[0].weight, u_plain.layers[0].weight)
