"""Scion (`eqopt.contrib.scion`, `scale_by_scion`) against pytorch-optimizer's SCION,
constrained and unconstrained, and against heavyball's `Scion` (unconstrained), on
bare arrays and on Equinox layers, and the norm each leaf gets by default from its
layer.

heavyball's `Scion` differs in three ways, each handled in its test: it
re-initialises the parameters on its first step (the paper's initialisation, not
part of the update: switched off there); it takes the spectral norm of every
matrix, an embedding's too (`(vocab, dim)` read as `(out, in)`), and the RMS norm
of every vector, where the defaults here are ColNorm and sign (set explicitly
there); and it orthogonalises with its own five-step quintic schedule (passed as
`ns_coeffs`). Its bias-corrected average is the paper's d_t divided by
1 - beta^t, a positive factor that the norms' LMOs ignore."""

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
from eqopt.contrib import MuonDimensionNumbers, ScionNorm

ORACLE = "pytorch-optimizer's SCION and heavyball's Scion, compared over 20 steps in this file"

TRANSFORM_CASES = [
    Case(
        "contrib.scion",
        lambda: eqopt.contrib.scion(1e-2, weight_decay=0.1),
        None,
        no_parity_reason=ORACLE,
    ),
    Case(
        "contrib.scion-constrained-row",
        lambda: eqopt.contrib.scion(
            1e-2,
            0.5,
            lambda x: ScionNorm("row", 2.0) if x.ndim == 2 else "rms",
            constrained=True,
        ),
        None,
        no_parity_reason=ORACLE,
    ),
]

ROWS = MuonDimensionNumbers(reduction_axis=1, output_axis=0)  # PyTorch's (out, in)
TOKENS = MuonDimensionNumbers(reduction_axis=0, output_axis=1)  # (vocab, dim)


def _oracle(monkeypatch, groups, **kwargs):
    """pytorch-optimizer's SCION with its Newton-Schulz in float64; `groups` is a list
    of (names, norm type, norm kwargs, scale)."""
    po = import_oracle("pytorch_optimizer", "pytorch-optimizer")
    torch = import_oracle("torch")
    from pytorch_optimizer.optimizer import scion
    from pytorch_optimizer.optimizer.utils import matrix

    exact = functools.partial(
        matrix.zero_power_via_newton_schulz_5, dtype=torch.float64
    )
    monkeypatch.setattr(scion, "zero_power_via_newton_schulz_5", exact)
    norm = scion.LMONorm

    def make(tensors):
        return po.SCION(
            [
                {
                    "params": [tensors[k] for k in names],
                    "norm_type": getattr(norm, kind),
                    "norm_kwargs": options,
                    "scale": scale,
                }
                for names, kind, options, scale in groups
            ],
            foreach=False,
            **kwargs,
        )

    return make


def _relative(ours, theirs, start):
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        for k in b:
            moved = np.max(np.abs(b[k] - np.asarray(start[k], np.float64)))
            worst = max(worst, np.max(np.abs(np.asarray(a[k]) - b[k])) / moved)
    return worst


SHAPES = {"emb": (12, 6), "hidden": (8, 6), "head": (5, 8), "b": (8,)}


@pytest.mark.parametrize("constrained", [False, True])
def test_matches_pytorch_optimizer_on_bare_arrays(monkeypatch, constrained):
    """An embedding (ColNorm), a hidden matrix (spectral), a head (RowNorm or Sign)
    and a bias (RMS), each with its radius: 20 steps, relative difference < 1e-4."""
    params, grads = random_problem(SHAPES, 20, seed=0)
    head = "SIGN" if constrained else "ROW"
    norms = {
        "emb": ScionNorm("col", 1.0, TOKENS),
        "hidden": ScionNorm("spectral", 2.0, ROWS),
        "head": ScionNorm(head.lower(), 3.0, ROWS),
        "b": ScionNorm("rms", 0.5),
    }
    wd = 0.0 if constrained else 0.1
    ours = eqopt_steps(
        eqopt.contrib.scion(1e-2, 0.2, norms, constrained=constrained, weight_decay=wd),
        params,
        grads,
    )
    groups = [
        (["emb"], "COL", {"transpose": True}, 1.0),
        (["hidden"], "SPECTRAL", {}, 2.0),
        (["head"], head, {}, 3.0),
        (["b"], "BIAS", {}, 0.5),
    ]
    theirs = torch_steps(
        _oracle(
            monkeypatch,
            groups,
            lr=1e-2,
            momentum=0.2,
            constraint=constrained,
            weight_decay=wd,
        ),
        params,
        grads,
    )
    assert _relative(ours, theirs, params) < 1e-4


class _Net(eqx.Module):
    embedding: eqx.nn.Embedding
    hidden: eqx.nn.Linear
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.embedding = eqx.nn.Embedding(12, 6, key=k1)
        self.hidden = eqx.nn.Linear(6, 8, key=k2)
        self.head = eqx.nn.Linear(8, 5, key=k3)


def _leaves(model):
    if isinstance(model, dict):
        return model
    return {
        "emb": model.embedding.weight,
        "hw": model.hidden.weight,
        "hb": model.hidden.bias,
        "ow": model.head.weight,
        "ob": model.head.bias,
    }


def _layer_steps(opt, model, grads):
    """The leaves of `model` after each step of `opt` fed `grads` (dicts by name)."""
    params = eqx.filter(model, eqx.is_inexact_array)
    state = opt.init(params)
    where = lambda m: list(_leaves(m).values())  # noqa: E731

    @eqx.filter_jit
    def step(params, state, g):
        g = eqx.tree_at(where, params, g)
        updates, state = opt.update(g, state, params)
        return eqx.apply_updates(params, updates), state

    ours = []
    for g in grads:
        params, state = step(params, state, [jnp.asarray(g[k]) for k in _leaves(g)])
        ours.append({k: np.asarray(v) for k, v in _leaves(params).items()})
    return ours


def test_matches_pytorch_optimizer_on_equinox_layers(monkeypatch):
    """The norms read from the layers (embedding: ColNorm, Linear weights: spectral as
    (out, in)); biases set to RMS (the oracle's Sign needs a matrix)."""
    model = _Net(jax.random.key(0))
    start = {k: np.asarray(v) for k, v in _leaves(model).items()}
    _, grads = random_problem({k: v.shape for k, v in start.items()}, 20, seed=1)
    opt = eqopt.contrib.scion(1e-2, norms=lambda x: "rms" if x.ndim == 1 else None)
    ours = _layer_steps(opt, model, grads)
    groups = [
        (["emb"], "COL", {"transpose": True}, 1.0),
        (["hw", "ow"], "SPECTRAL", {}, 1.0),
        (["hb", "ob"], "BIAS", {}, 1.0),
    ]
    theirs = torch_steps(_oracle(monkeypatch, groups, lr=1e-2), start, grads)
    assert _relative(ours, theirs, start) < 1e-4


def test_default_norms_from_the_layers():
    """Embedding: each token's vector to RMS one; Linear: spectral, sqrt(out / in);
    biases: sign."""
    model = _Net(jax.random.key(1))
    params = eqx.filter(model, eqx.is_inexact_array)
    grads = jax.tree.map(
        lambda x: jax.random.normal(jax.random.key(x.size), x.shape), params
    )
    tx = eqopt.contrib.scale_by_scion(momentum=1.0)
    u, _ = tx.update(grads, tx.init(params), params)
    rms = np.sqrt(np.mean(np.square(u.embedding.weight), axis=1))
    np.testing.assert_allclose(rms, 1.0, rtol=1e-5)
    singular = np.linalg.svd(np.asarray(u.hidden.weight), compute_uv=False)
    assert np.all(np.abs(singular / np.sqrt(8 / 6) - 1) < 0.35)  # Jordan's quintic
    np.testing.assert_array_equal(u.head.bias, np.sign(grads.head.bias))
    # A prefix pytree of the model (its layers are callable) is a tree of choices.
    spec = jax.tree.map(lambda _: None, params)
    tx = eqopt.contrib.scale_by_scion(momentum=1.0, norms=spec)
    u_tree, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_array_equal(u_tree.embedding.weight, u.embedding.weight)
    with pytest.raises(ValueError, match=r"hidden\.bias"):
        bad = eqopt.contrib.scale_by_scion(norms=lambda x: "spectral")
        bad.init(params)


def test_spectral_scale_is_heavyballs():
    utils = import_oracle("heavyball.utils", "heavyball")
    torch = import_oracle("torch")
    g = np.random.default_rng(0).normal(size=(8, 6))
    theirs = utils._scion_spectral_direction(torch.tensor(g, dtype=torch.float32))
    ours, _ = eqopt.contrib.scale_by_scion(
        momentum=1.0, norms=ScionNorm("spectral", 1.0, ROWS)
    ).update(
        {"w": jnp.asarray(g, jnp.float32)},
        eqopt.contrib.scale_by_scion(
            momentum=1.0, norms=ScionNorm("spectral", 1.0, ROWS)
        ).init({"w": jnp.zeros((8, 6))}),
    )
    # Both scale U V^T by sqrt(8 / 6); the orthogonalisers differ (their own
    # iteration against Jordan's quintic), so compare the scale only.
    their_norm = np.linalg.norm(theirs.numpy(), 2)
    np.testing.assert_allclose(their_norm, np.sqrt(8 / 6), rtol=0.05)
    assert abs(np.linalg.norm(np.asarray(ours["w"]), 2) / np.sqrt(8 / 6) - 1) < 0.35


def test_inside_param_groups():
    model = _Net(jax.random.key(2))
    params = eqx.filter(model, eqx.is_inexact_array)
    grads = jax.tree.map(lambda x: jnp.cos(jnp.arange(x.size)).reshape(x.shape), params)
    plain = eqopt.contrib.scion(1e-2)
    grouped = eqopt.param_groups(
        plain, [eqopt.Group(r"^head\.", name="head", lr_mult=3.0)]
    )
    u_plain, _ = plain.update(grads, plain.init(params), params)
    u_grouped, _ = grouped.update(grads, grouped.init(params), params)
    np.testing.assert_allclose(
        u_grouped.head.weight, 3 * u_plain.head.weight, rtol=1e-6
    )
    np.testing.assert_allclose(u_grouped.hidden.weight, u_plain.hidden.weight)


# heavyball's Newton-Schulz: one quintic (a, b, c) per step, five steps.
HEAVYBALL_NS = np.array(
    [
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ]
)


def _heavyball(monkeypatch, **kwargs):
    """heavyball's Scion, uncompiled, without its first-step re-initialisation."""
    heavyball = import_oracle("heavyball")
    monkeypatch.setattr(heavyball.utils, "compile_mode", None)
    monkeypatch.setattr(heavyball.utils, "scion_auto_init_param_", lambda *a, **k: None)
    return lambda tensors: heavyball.Scion(
        list(tensors.values()), compile_step=False, **kwargs
    )


def test_matches_heavyball_on_bare_arrays(monkeypatch):
    """Spectral norm on the (out, in) matrices, RMS on the vector, one radius
    (heavyball's `scale`), decoupled decay: 20 steps, relative difference < 1e-4."""
    shapes = {"w": (8, 6), "v": (5, 8), "b": (8,)}
    params, grads = random_problem(shapes, 20, seed=3)
    norms = {
        "w": ScionNorm("spectral", 2.0, ROWS),
        "v": ScionNorm("spectral", 2.0, ROWS),
        "b": ScionNorm("rms", 2.0),
    }
    tx = eqopt.contrib.scion(1e-2, 0.2, norms, weight_decay=0.1, ns_coeffs=HEAVYBALL_NS)
    ours = eqopt_steps(tx, params, grads)
    make = _heavyball(
        monkeypatch, lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1, scale=2.0
    )
    theirs = torch_steps(make, params, grads)
    assert _relative(ours, theirs, params) < 1e-4


def test_matches_heavyball_on_equinox_layers(monkeypatch):
    """The Linear weights' norms read from the layers; the embedding set to heavyball's
    spectral norm of `(vocab, dim)` as `(out, in)` (ColNorm by default here, which
    differs: each token's vector to RMS one) and the biases to RMS (sign here)."""
    model = _Net(jax.random.key(3))
    start = {k: np.asarray(v) for k, v in _leaves(model).items()}
    _, grads = random_problem({k: v.shape for k, v in start.items()}, 20, seed=4)
    norms = jax.tree.map(lambda _: None, eqx.filter(model, eqx.is_inexact_array))
    norms = eqx.tree_at(
        lambda m: (m.embedding.weight, m.hidden.bias, m.head.bias),
        norms,
        (ScionNorm("spectral", 1.0, ROWS), "rms", "rms"),
        is_leaf=lambda x: x is None,
    )
    opt = eqopt.contrib.scion(1e-2, norms=norms, ns_coeffs=HEAVYBALL_NS)
    ours = _layer_steps(opt, model, grads)
    theirs = torch_steps(_heavyball(monkeypatch, lr=1e-2), start, grads)
    assert _relative(ours, theirs, start) < 1e-4
    # With the default ColNorm on the embedding, the first step differs there.
    default = eqopt.contrib.scion(
        1e-2, norms=lambda x: "rms" if x.ndim == 1 else None, ns_coeffs=HEAVYBALL_NS
    )
    first = _layer_steps(default, model, grads[:1])[0]
    moved = np.abs(theirs[0]["emb"] - start["emb"]).max()
    assert np.abs(first["emb"] - theirs[0]["emb"]).max() > 0.1 * moved
    np.testing.assert_allclose(first["hw"], theirs[0]["hw"], rtol=0, atol=1e-4 * moved)
