"""Cautious weight decay (`cautious=True` of `eqopt.AddDecayedWeights`, spelled
`cautious_weight_decay=True` on `adamw`, `lion`, `contrib.muon`, `contrib.laprop`):
the paper's formula written here, heavyball's AdamW over 20 steps, packed params,
parameter groups, and the default left bit for bit as it was.

The formula (Chen et al., *Cautious Weight Decay*, arXiv:2510.12402, Algorithm 1):

    x_{t+1} = x_t - lr * (u_t + wd * 1[u_t * x_t >= 0] * x_t)

pytorch-optimizer 4.1.0 has no cautious weight decay (its `cautious` options are
the cautious *optimiser*'s update mask, `eqopt.cautious`); heavyball's
`cautious_weight_decay` is the oracle."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _oracles import import_oracle
from _torch_oracle import eqopt_steps, random_problem, torch_steps
from helpers import Case

import eqopt

TRANSFORM_CASES = [
    Case(
        "adamw-cautious-weight-decay",
        lambda: eqopt.adamw(1e-2, weight_decay=0.5, cautious_weight_decay=True),
        None,
        ("float32", "bfloat16", "complex64"),
        no_parity_reason="Optax has no cautious weight decay: heavyball's is "
        "compared in tests/test_cautious_weight_decay.py",
    ),
    Case(
        "contrib.muon-cautious-weight-decay",
        lambda: eqopt.contrib.muon(
            2e-2, weight_decay=0.5, adam_weight_decay=0.5, cautious_weight_decay=True
        ),
        None,
        no_parity_reason="Optax has no cautious weight decay: the paper's formula "
        "is checked in tests/test_cautious_weight_decay.py",
    ),
]


def _mlp():
    return eqx.nn.MLP(4, 3, width_size=8, depth=1, key=jax.random.key(0))


def _grads(model, seed):
    params = eqx.filter(model, eqx.is_inexact_array)
    return jax.tree.map(
        lambda x: jax.random.normal(jax.random.key(seed), x.shape), params
    )


@pytest.mark.parametrize(
    ("make", "lr"),
    [
        (
            lambda wd, c: eqopt.adamw(1e-2, weight_decay=wd, cautious_weight_decay=c),
            1e-2,
        ),
        (
            lambda wd, c: eqopt.lion(1e-3, weight_decay=wd, cautious_weight_decay=c),
            1e-3,
        ),
        (
            lambda wd, c: eqopt.contrib.muon(
                2e-2, weight_decay=wd, adam_weight_decay=wd, cautious_weight_decay=c
            ),
            2e-2,
        ),
    ],
    ids=["adamw", "lion", "muon"],
)
def test_the_papers_formula_on_each_optimiser(make, lr):
    """Over 3 steps on an MLP, the cautious update is the undecayed one plus
    -lr * wd * 1[u * x >= 0] * x, `u` the optimiser's direction (before the learning
    rate), which the undecayed update gives as -update / lr."""
    model = _mlp()
    params = eqx.filter(model, eqx.is_inexact_array)
    wd = 0.5
    plain, cautious = make(0.0, False), make(wd, True)
    plain_state, cautious_state = plain.init(params), cautious.init(params)
    masked_somewhere = False
    for seed in range(3):
        g = _grads(model, seed)
        u0, plain_state = plain.update(g, plain_state, params)
        u1, cautious_state = cautious.update(g, cautious_state, params)
        for a, b, x in zip(
            jax.tree.leaves(u0),
            jax.tree.leaves(u1),
            jax.tree.leaves(params),
            strict=True,
        ):
            direction = -np.asarray(a, np.float64) / lr
            x = np.asarray(x, np.float64)
            keep = direction * x >= 0
            masked_somewhere |= bool(np.any(~keep))
            expected = -lr * (direction + wd * keep * x)
            np.testing.assert_allclose(b, expected, rtol=2e-5, atol=1e-8)
    assert masked_somewhere


@pytest.mark.parametrize("weight_decay", [0.0, 0.5])
def test_adamw_matches_heavyball(monkeypatch, weight_decay):
    """heavyball's AdamW (its eps a floor on the RMS: negligible at 1e-8 here)
    with `cautious_weight_decay=True`, 20 steps, relative to the params' change."""
    heavyball = import_oracle("heavyball")
    monkeypatch.setattr(heavyball.utils, "compile_mode", None)
    params, grads = random_problem({"w": (6, 5), "b": (5,)}, 20)
    ours = eqopt_steps(
        eqopt.adamw(
            1e-2, b2=0.99, weight_decay=weight_decay + 1.0, cautious_weight_decay=True
        ),
        params,
        grads,
    )
    theirs = torch_steps(
        lambda t: heavyball.AdamW(
            list(t.values()),
            lr=1e-2,
            betas=(0.9, 0.99),
            eps=1e-8,
            weight_decay=weight_decay + 1.0,
            cautious_weight_decay=True,
            compile_step=False,
        ),
        params,
        grads,
    )
    worst = 0.0
    for our, their in zip(ours, theirs, strict=True):
        for k in their:
            moved = np.max(np.abs(their[k] - params[k]))
            worst = max(worst, np.max(np.abs(our[k] - their[k])) / moved)
    assert worst < 1e-4


def test_default_is_bit_for_bit_and_cautious_differs():
    model = _mlp()
    params = eqx.filter(model, eqx.is_inexact_array)
    g = _grads(model, 0)
    default = eqopt.adamw(1e-2, weight_decay=0.5)
    explicit = eqopt.adamw(1e-2, weight_decay=0.5, cautious_weight_decay=False)
    cautious = eqopt.adamw(1e-2, weight_decay=0.5, cautious_weight_decay=True)
    a, _ = default.update(g, default.init(params), params)
    b, _ = explicit.update(g, explicit.init(params), params)
    c, _ = cautious.update(g, cautious.init(params), params)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert not all(
        np.array_equal(x, y)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(c), strict=True)
    )
    assert default.add_decayed_weights.cautious is False
    assert eqopt.add_decayed_weights(0.1, cautious=True).cautious is True


def test_packed_masked_and_in_param_groups():
    """On packed params, with a mask, and under a group's `wd_mult`, the cautious
    decay gives the per-leaf numbers."""
    model = _mlp()
    params = eqx.filter(model, eqx.is_inexact_array)
    g = _grads(model, 1)
    decay = eqopt.add_decayed_weights(0.5, mask=lambda x: x.ndim == 2, cautious=True)
    u = jax.tree.map(lambda x: -x, g)
    out, _ = decay.update(u, decay.init(params), params)
    w, uw = np.asarray(params.layers[0].weight), np.asarray(u.layers[0].weight)
    np.testing.assert_allclose(
        out.layers[0].weight, uw + 0.5 * (uw * w >= 0) * w, rtol=1e-6
    )
    np.testing.assert_array_equal(out.layers[0].bias, u.layers[0].bias)

    packed, packed_u = eqopt.pack(params), eqopt.pack(u)
    whole = eqopt.add_decayed_weights(0.5, cautious=True)
    ref, _ = whole.update(u, whole.init(params), params)
    got, _ = whole.update(packed_u, whole.init(packed), packed)
    for x, y in zip(jax.tree.leaves(got.unpack()), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6)

    opt = eqopt.adamw(1e-2, weight_decay=0.5, cautious_weight_decay=True)
    grouped = eqopt.param_groups(
        opt, [eqopt.Group(r"^layers\[1\]\.", name="last", wd_mult=0.0)]
    )
    no_decay = eqopt.adamw(1e-2, weight_decay=0.0)
    a, _ = grouped.update(g, grouped.init(params), params)
    b, _ = no_decay.update(g, no_decay.init(params), params)
    c, _ = opt.update(g, opt.init(params), params)
    np.testing.assert_allclose(a.layers[1].weight, b.layers[1].weight, rtol=1e-6)
    np.testing.assert_allclose(a.layers[0].weight, c.layers[0].weight, rtol=1e-6)


def test_complex_leaves_decay_where_the_update_points_along_the_parameter():
    decay = eqopt.add_decayed_weights(1.0, cautious=True)
    p = {"z": jnp.array([1 + 1j, 1 + 1j])}
    u = {"z": jnp.array([1 - 0.5j, -1 + 0.5j])}  # Re(u conj p) = 0.5, -0.5
    out, _ = decay.update(u, decay.init(p), p)
    np.testing.assert_allclose(out["z"], [2 + 0.5j, -1 + 0.5j])
