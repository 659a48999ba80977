"""AdaMuon (`eqopt.contrib.adamuon`, `scale_by_adamuon`) against pytorch-optimizer's
AdaMuon on an Equinox MLP and on bare arrays, and the paper's RMS and sign step."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _oracles import import_oracle
from _torch_oracle import eqopt_steps, random_problem, torch_steps
from helpers import Case

import eqopt
from eqopt.contrib import MuonDimensionNumbers
from eqopt.contrib._newton_schulz import _as_coefficients, orthogonalize

ORACLE = "pytorch-optimizer's AdaMuon, compared over 20 steps in this file"

TRANSFORM_CASES = [
    Case(
        "contrib.adamuon",
        lambda: eqopt.contrib.adamuon(1e-2, weight_decay=0.1),
        None,
        no_parity_reason=ORACLE,
    ),
    Case(
        "contrib.scale_by_adamuon-sign-gram",
        lambda: eqopt.contrib.scale_by_adamuon(
            sign_momentum=True,
            orthogonalization="gram",
            weight_dimension_numbers=lambda x: x.ndim == 2,
        ),
        None,
        needs_params=False,
        no_parity_reason=ORACLE,
    ),
]

# PyTorch's layout for bare arrays: (out, in), as an `eqx.nn.Linear` weight.
ROWS = MuonDimensionNumbers(reduction_axis=1, output_axis=0)


def _oracle(monkeypatch, groups, **kwargs):
    """pytorch-optimizer's AdaMuon, its Newton-Schulz in float64 (its default is
    bfloat16, which would hide any difference under rounding). `groups` maps each
    group's `use_muon` to its parameter names and options."""
    po = import_oracle("pytorch_optimizer", "pytorch-optimizer")
    torch = import_oracle("torch")
    from pytorch_optimizer.optimizer.muon import adamuon
    from pytorch_optimizer.optimizer.utils import matrix

    exact = functools.partial(
        matrix.zero_power_via_newton_schulz_5, dtype=torch.float64
    )
    monkeypatch.setattr(adamuon, "zero_power_via_newton_schulz_5", exact)

    def make(tensors):
        return po.AdaMuon(
            [
                {"params": [tensors[k] for k in names], "use_muon": muon, **options}
                for muon, (names, options) in groups.items()
            ],
            **kwargs,
        )

    return make


def _relative(ours, theirs, start):
    """The largest difference over steps and leaves, relative to the leaf's change."""
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        for k in b:
            moved = np.max(np.abs(b[k] - np.asarray(start[k], np.float64)))
            worst = max(worst, np.max(np.abs(np.asarray(a[k]) - b[k])) / moved)
    return worst


def test_matches_pytorch_optimizer_on_an_equinox_mlp(monkeypatch):
    """20 steps on an `eqx.nn.MLP` (hidden weights to AdaMuon, read (out, in) from
    each `Linear`; biases to AdamW): relative difference < 1e-4."""
    model = eqx.nn.MLP(6, 3, width_size=10, depth=2, key=jax.random.key(0))
    names = [f"{k}{i}" for i in range(3) for k in ("w", "b")]
    get = lambda m: [  # noqa: E731
        getattr(m.layers[int(n[1])], "weight" if n[0] == "w" else "bias") for n in names
    ]
    start = {n: np.asarray(x) for n, x in zip(names, get(model), strict=True)}
    _, grads = random_problem({n: x.shape for n, x in start.items()}, 20, seed=1)
    opt = eqopt.contrib.adamuon(
        2e-2, weight_decay=0.1, adam_learning_rate=3e-3, adam_weight_decay=0.01
    )
    state = opt.init(eqx.filter(model, eqx.is_inexact_array))

    @eqx.filter_jit
    def step(model, state, g):
        g = eqx.tree_at(get, eqx.filter(model, eqx.is_inexact_array), g)
        updates, state = opt.update(g, state, model)
        return eqx.apply_updates(model, updates), state

    ours = []
    for g in grads:
        model, state = step(model, state, [jnp.asarray(g[n]) for n in names])
        ours.append(dict(zip(names, map(np.asarray, get(model)), strict=True)))
    groups = {
        True: ([n for n in names if n[0] == "w"], {"lr": 2e-2, "weight_decay": 0.1}),
        False: ([n for n in names if n[0] == "b"], {"lr": 3e-3, "weight_decay": 0.01}),
    }
    theirs = torch_steps(_oracle(monkeypatch, groups, eps=1e-10), start, grads)
    assert _relative(ours, theirs, start) < 1e-4


def test_matches_pytorch_optimizer_on_bare_arrays(monkeypatch):
    """Bare (out, in) arrays, wide and tall, and a vector (AdamW);
    `consistent_rms=None` is the oracle's `use_adjusted_lr=False` (Muon's width
    factor; the default, 0.2, is compared on the MLP above)."""
    consistent_rms = None
    shapes = {"wide": (6, 10), "tall": (12, 5), "b": (5,)}
    params, grads = random_problem(shapes, 20, seed=2)
    ours = eqopt_steps(
        eqopt.contrib.adamuon(
            2e-2,
            beta=0.8,
            b2=0.9,
            consistent_rms=consistent_rms,
            adam_learning_rate=1e-2,
            adamuon_weight_dimension_numbers=lambda x: x.ndim == 2 and ROWS,
        ),
        params,
        grads,
    )
    groups = {True: (["wide", "tall"], {}), False: (["b"], {"lr": 1e-2})}
    theirs = torch_steps(
        _oracle(
            monkeypatch,
            groups,
            lr=2e-2,
            betas=(0.8, 0.9),
            use_adjusted_lr=consistent_rms is not None,
        ),
        params,
        grads,
    )
    assert _relative(ours, theirs, params) < 1e-4


def test_rms_is_the_papers_and_sign_momentum_orthogonalises_the_sign():
    g = jax.random.normal(jax.random.key(0), (8, 12)) * jnp.arange(1.0, 9.0)[:, None]
    tx = eqopt.contrib.scale_by_adamuon(b2=0.5)
    u, state = tx.update({"w": g}, tx.init({"w": g}))
    np.testing.assert_allclose(np.sqrt(np.mean(np.square(u["w"]))), 0.2, rtol=1e-5)
    assert state.nu["w"].shape == (8, 12) and int(state.count) == 1
    # Step 1: V = (1 - b2) O^2, debiased O^2, so u = 0.2 sqrt(nm) sign(O) / ||sign(O)||.
    signed = eqopt.contrib.scale_by_adamuon(sign_momentum=True)
    u_sign, _ = signed.update({"w": g}, signed.init({"w": g}))
    o = orthogonalize(
        jnp.sign(g),
        MuonDimensionNumbers(),
        _as_coefficients((3.4445, -4.775, 2.0315)),
        5,
        "frobenius",
        1e-10,
    )
    np.testing.assert_allclose(u_sign["w"], 0.2 * np.sign(o), rtol=1e-4)


def test_state_only_for_matrices_and_bad_values():
    model = eqx.nn.MLP(4, 2, width_size=8, depth=1, key=jax.random.key(1))
    state = eqopt.contrib.adamuon(1e-2).init(eqx.filter(model, eqx.is_inexact_array))
    inner = state.inner_states["adamuon"][0]
    assert inner.nu.layers[0].weight.shape == (8, 4)
    assert inner.nu.layers[0].bias is None and inner.mu.layers[1].bias is None
    with pytest.raises(ValueError, match="orthogonalization"):
        eqopt.contrib.scale_by_adamuon(orthogonalization="qr")  # type: ignore[arg-type]


def test_inside_param_groups():
    """A group's learning-rate multiplier scales its AdaMuon update."""
    model = eqx.nn.MLP(8, 4, width_size=16, depth=1, key=jax.random.key(2))
    params = eqx.filter(model, eqx.is_inexact_array)
    grads = jax.tree.map(lambda x: jnp.cos(jnp.arange(x.size)).reshape(x.shape), params)
    plain = eqopt.contrib.adamuon(1e-2)
    grouped = eqopt.param_groups(
        plain, [eqopt.Group(r"^layers\[1\]\.", name="last", lr_mult=0.25)]
    )
    u_plain, _ = plain.update(grads, plain.init(params), params)
    u_grouped, _ = grouped.update(grads, grouped.init(params), params)
    np.testing.assert_allclose(
        u_grouped.layers[1].weight, 0.25 * u_plain.layers[1].weight, rtol=1e-6
    )
    np.testing.assert_allclose(u_grouped.layers[0].weight, u_plain.layers[0].weight)
