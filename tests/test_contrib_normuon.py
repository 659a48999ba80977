"""NorMuon (`eqopt.contrib.normuon`, `scale_by_normuon`) against pytorch-optimizer's
NorMuon, the authors' update (written here from their code) on an Equinox MLP, and
the paper's RMS scaling against the authors' norm-preserving one."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _oracles import import_oracle
from _torch_oracle import eqopt_steps, max_difference, random_problem, torch_steps
from helpers import Case, make_model, spec_like

import eqopt
from eqopt.contrib import MuonDimensionNumbers

ORACLE = "pytorch-optimizer's NorMuon, compared over several steps in this file"

TRANSFORM_CASES = [
    Case(
        "contrib.normuon",
        lambda: eqopt.contrib.normuon(1e-2, weight_decay=0.1),
        None,
        no_parity_reason=ORACLE,
    ),
    Case(
        "contrib.normuon-nesterov-polar-express-columns",
        lambda p: eqopt.contrib.normuon(
            1e-2,
            ns_coeffs="polar_express",
            nesterov=True,
            consistent_rms=None,
            normuon_weight_dimension_numbers=spec_like(
                p, w=MuonDimensionNumbers(reduction_axis=0, output_axis=1)
            ),
        ),
        None,
        no_parity_reason=ORACLE,
    ),
    Case(
        "contrib.scale_by_normuon",
        lambda: eqopt.contrib.scale_by_normuon(
            weight_dimension_numbers=lambda x: (
                x.ndim == 2 and MuonDimensionNumbers(1, 0)
            )
        ),
        None,
        needs_params=False,
        no_parity_reason=ORACLE,
    ),
]

SHAPES = {"wide": (6, 10), "tall": (12, 5)}
# PyTorch's layout for the bare arrays given to pytorch-optimizer: neurons are rows
# (eqopt's default for a bare matrix is Optax's, neurons on the columns).
ROWS = MuonDimensionNumbers(reduction_axis=1, output_axis=0)


def _rows(x):
    return ROWS if x.ndim == 2 else None


def _oracle(monkeypatch, update_scale="match_rms", **kwargs):
    """pytorch-optimizer's NorMuon on every matrix, its Newton-Schulz in float64
    (its default is bfloat16, which would hide any difference under rounding)."""
    po = import_oracle("pytorch_optimizer", "pytorch-optimizer")
    torch = import_oracle("torch")
    from pytorch_optimizer.optimizer.muon import base, normuon
    from pytorch_optimizer.optimizer.utils import matrix

    exact = functools.partial(
        matrix.zero_power_via_newton_schulz_5, dtype=torch.float64
    )
    monkeypatch.setattr(normuon, "zero_power_via_newton_schulz_5", exact)
    monkeypatch.setattr(base, "zero_power_via_newton_schulz_5", exact)

    def make(tensors):
        return po.NorMuon(
            [{"params": list(tensors.values()), "use_muon": True}],
            update_scale=update_scale,
            **kwargs,
        )

    return make


@pytest.mark.parametrize("nesterov", [False, True])
def test_normuon_matches_pytorch_optimizer(monkeypatch, nesterov):
    params, grads = random_problem(SHAPES, 6)
    ours = eqopt_steps(
        eqopt.contrib.normuon(
            2e-2,
            beta=0.9,
            b2=0.95,
            weight_decay=0.1,
            nesterov=nesterov,
            eps=1e-10,
            normuon_weight_dimension_numbers=_rows,
        ),
        params,
        grads,
    )
    theirs = torch_steps(
        _oracle(
            monkeypatch,
            lr=2e-2,
            momentum=0.9,
            beta2=0.95,
            weight_decay=0.1,
            nesterov=nesterov,
            eps=1e-10,
        ),
        params,
        grads,
    )
    assert max_difference(ours, theirs) < 2e-5


def test_normuon_polar_express_matches_pytorch_optimizer_given_the_rows(monkeypatch):
    params, grads = random_problem(SHAPES, 4, seed=1)
    rows = eqopt.contrib.polar_express_coefficients(5)
    ours = eqopt_steps(
        eqopt.contrib.normuon(
            2e-2,
            ns_coeffs="polar_express",
            eps=1e-10,
            normuon_weight_dimension_numbers=_rows,
        ),
        params,
        grads,
    )
    theirs = torch_steps(
        _oracle(monkeypatch, lr=2e-2, ns_coeffs=list(rows), nesterov=False, eps=1e-10),
        params,
        grads,
    )
    assert max_difference(ours, theirs) < 2e-5


def test_normuon_authors_mode_matches_pytorch_optimizers_default(monkeypatch):
    """pytorch-optimizer's default (`update_scale="preserve_norm"`) keeps ||O||_F and
    scales the learning rate by sqrt(max(1, out / in)): `consistent_rms=None`."""
    params, grads = random_problem(SHAPES, 6, seed=2)
    ours = eqopt_steps(
        eqopt.contrib.normuon(
            2e-2,
            weight_decay=0.1,
            nesterov=True,
            eps=1e-10,
            consistent_rms=None,
            normuon_weight_dimension_numbers=_rows,
        ),
        params,
        grads,
    )
    theirs = torch_steps(
        _oracle(
            monkeypatch,
            update_scale="preserve_norm",
            lr=2e-2,
            weight_decay=0.1,
            nesterov=True,
            eps=1e-10,
        ),
        params,
        grads,
    )
    assert max_difference(ours, theirs) < 2e-5


def _authors_normuon(weights, grads, lr, weight_decay, beta=0.95, beta2=0.95):
    """The authors' `normuon_update` and step (Li et al. 2025, their published code) in
    numpy float64, on PyTorch-layout (out, in) weights: Nesterov momentum, Jordan's
    quintic, per-row second moment, the Frobenius norm kept, then
    `update *= max(1, rows / cols) ** 0.5`; decoupled weight decay."""
    a, b, c = 3.4445, -4.7750, 2.0315

    def newton_schulz(g):
        x = g.T if g.shape[0] > g.shape[1] else g
        x = x / (np.linalg.norm(x) + 1e-7)
        for _ in range(5):
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        return x.T if g.shape[0] > g.shape[1] else x

    weights = [np.asarray(w, np.float64) for w in weights]
    momenta = [np.zeros_like(w) for w in weights]
    seconds = [np.zeros((w.shape[0], 1)) for w in weights]
    out = []
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            g = np.asarray(g, np.float64)
            momenta[i] = momenta[i] + (1 - beta) * (g - momenta[i])
            update = newton_schulz(g + beta * (momenta[i] - g))
            norm = np.linalg.norm(update)
            row_means = np.mean(update * update, axis=-1, keepdims=True)
            seconds[i] = seconds[i] + (1 - beta2) * (row_means - seconds[i])
            update = update / (np.sqrt(seconds[i]) + 1e-10)
            update = update * (norm / (np.linalg.norm(update) + 1e-10))
            update = update * max(1, g.shape[-2] / g.shape[-1]) ** 0.5
            weights[i] = weights[i] * (1 - lr * weight_decay) - lr * update
        out.append([w.copy() for w in weights])
    return out


def test_authors_mode_on_an_equinox_mlp_is_the_authors_update():
    """`consistent_rms=None, nesterov=True` on an `eqx.nn.MLP` (neurons read from each
    `Linear`: its rows) is the authors' update, the width factor of the tall first
    layer (24, 8) included: 10 steps, relative difference < 1e-5."""
    model = eqx.nn.MLP(8, 4, width_size=24, depth=2, key=jax.random.key(0))
    opt = eqopt.contrib.normuon(
        0.02, weight_decay=0.1, nesterov=True, eps=1e-10, consistent_rms=None
    )
    state = opt.init(model)
    start = [layer.weight for layer in model.layers]
    grads, ours = [], []
    for step in range(10):
        g = jax.tree.map(
            lambda x, step=step: (
                jax.random.normal(jax.random.key(step), x.shape)
                if eqx.is_inexact_array(x)
                else None
            ),
            model,
        )
        updates, state = opt.update(g, state, model)
        model = eqopt.apply_updates(model, updates)
        grads.append([layer.weight for layer in g.layers])
        ours.append([layer.weight for layer in model.layers])
    theirs = _authors_normuon(start, grads, lr=0.02, weight_decay=0.1)
    for our_step, their_step in zip(ours, theirs, strict=True):
        for our, their, first in zip(our_step, their_step, start, strict=True):
            moved = np.linalg.norm(their - np.asarray(first))
            assert np.linalg.norm(np.asarray(our) - their) / moved < 1e-5


def test_neurons_are_balanced_and_rms_is_the_papers():
    """Each neuron (row) of the update has about the same norm; the RMS is 0.2."""
    g = jax.random.normal(jax.random.key(0), (16, 8)) * jnp.arange(1.0, 17.0)[:, None]
    tx = eqopt.contrib.scale_by_normuon(b2=0.0, weight_dimension_numbers=ROWS)
    update, _ = tx.update({"w": g}, tx.init({"w": g}))
    rows = np.linalg.norm(np.asarray(update["w"]), axis=1)
    assert rows.max() / rows.min() < 1.01
    np.testing.assert_allclose(np.sqrt(np.mean(np.square(update["w"]))), 0.2, rtol=1e-4)
    muon, _ = eqopt.contrib.scale_by_muon(nesterov=False).update(
        {"w": g}, eqopt.contrib.scale_by_muon().init({"w": g})
    )
    muon_rows = np.linalg.norm(np.asarray(muon["w"]), axis=1)
    assert muon_rows.max() / muon_rows.min() > rows.max() / rows.min()


@pytest.mark.parametrize("shape", [(6, 10), (10, 6)])
def test_consistent_rms_none_keeps_the_orthogonal_norm(shape):
    """The authors' code (pytorch-optimizer's default "preserve_norm") keeps ||O||_F,
    times sqrt(max(1, neurons / inputs)), instead of the paper's RMS 0.2. A bare
    matrix is Optax's (in, out): neurons on the columns."""
    g = jax.random.normal(jax.random.key(1), shape)
    paper = eqopt.contrib.scale_by_normuon()
    code = eqopt.contrib.scale_by_normuon(consistent_rms=None)
    muon = eqopt.contrib.scale_by_muon(nesterov=False, beta=0.95)
    u_paper = paper.update({"w": g}, paper.init({"w": g}))[0]["w"]
    u_code = code.update({"w": g}, code.init({"w": g}))[0]["w"]
    o = muon.update({"w": g}, muon.init({"w": g}))[0]["w"]
    factor = np.sqrt(max(1, shape[1] / shape[0]))
    np.testing.assert_allclose(
        np.linalg.norm(u_code), factor * np.linalg.norm(o), rtol=1e-4
    )
    np.testing.assert_allclose(np.linalg.norm(u_paper), 0.2 * np.sqrt(60), rtol=1e-4)


def test_state_is_one_value_per_neuron_and_only_for_matrices():
    state = eqopt.contrib.normuon(1e-2).init(make_model())
    inner = state.inner_states["normuon"][0]
    assert inner.nu.w.shape == (1, 3)  # w is a bare (in, out) = (4, 3): 3 neurons
    assert inner.nu.b is None and inner.mu.b is None
    assert not eqopt.contrib.scale_by_normuon().elementwise


def test_bad_leaf_names_its_path():
    tx = eqopt.contrib.scale_by_normuon()
    with pytest.raises(ValueError, match=r"NorMuon.*\.b"):
        tx.init(make_model())


def test_state_of_a_model_holding_tuples():
    """An `eqx.nn.MLP` keeps its layers in a tuple: the state is shaped like it."""
    import equinox as eqx

    model = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))
    opt = eqopt.contrib.normuon(1e-2)
    state = opt.init(model)
    inner = state.inner_states["normuon"][0]
    assert isinstance(inner.mu.layers, tuple) and len(inner.mu.layers) == 3
    assert inner.nu.layers[1].weight.shape == (1, 8)
    # An `eqx.nn.Linear` weight is (out, in): its rows are the neurons.
    assert inner.nu.layers[0].weight.shape == (1, 8)  # weight (8, 3)
    assert inner.nu.layers[2].weight.shape == (1, 2)  # weight (2, 8)
    grads = jax.tree.map(jnp.ones_like, eqx.filter(model, eqx.is_inexact_array))
    updates, _ = opt.update(grads, state, model)
    assert updates.layers[1].weight.shape == (8, 8)
