"""NorMuon (`eqopt.contrib.normuon`, `scale_by_normuon`) against pytorch-optimizer's
NorMuon, and the paper's RMS scaling against the authors' norm-preserving one."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
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


def _oracle(monkeypatch, **kwargs):
    """pytorch-optimizer's NorMuon on every matrix, its Newton-Schulz in float64
    (its default is bfloat16, which would hide any difference under rounding)."""
    po = pytest.importorskip(
        "pytorch_optimizer", reason="the NorMuon oracle is pytorch-optimizer"
    )
    torch = pytest.importorskip("torch")
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
            update_scale="match_rms",
            **kwargs,
        )

    return make


@pytest.mark.parametrize("nesterov", [False, True])
def test_normuon_matches_pytorch_optimizer(monkeypatch, nesterov):
    params, grads = random_problem(SHAPES, 6)
    ours = eqopt_steps(
        eqopt.contrib.normuon(
            2e-2, beta=0.9, b2=0.95, weight_decay=0.1, nesterov=nesterov, eps=1e-10
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
        eqopt.contrib.normuon(2e-2, ns_coeffs="polar_express", eps=1e-10),
        params,
        grads,
    )
    theirs = torch_steps(
        _oracle(monkeypatch, lr=2e-2, ns_coeffs=list(rows), nesterov=False, eps=1e-10),
        params,
        grads,
    )
    assert max_difference(ours, theirs) < 2e-5


def test_neurons_are_balanced_and_rms_is_the_papers():
    """Each neuron (row) of the update has about the same norm; the RMS is 0.2."""
    g = jax.random.normal(jax.random.key(0), (16, 8)) * jnp.arange(1.0, 17.0)[:, None]
    tx = eqopt.contrib.scale_by_normuon(b2=0.0)
    update, _ = tx.update({"w": g}, tx.init({"w": g}))
    rows = np.linalg.norm(np.asarray(update["w"]), axis=1)
    assert rows.max() / rows.min() < 1.01
    np.testing.assert_allclose(np.sqrt(np.mean(np.square(update["w"]))), 0.2, rtol=1e-4)
    muon, _ = eqopt.contrib.scale_by_muon(nesterov=False).update(
        {"w": g}, eqopt.contrib.scale_by_muon().init({"w": g})
    )
    muon_rows = np.linalg.norm(np.asarray(muon["w"]), axis=1)
    assert muon_rows.max() / muon_rows.min() > rows.max() / rows.min()


def test_consistent_rms_none_keeps_the_orthogonal_norm():
    """The authors' code (pytorch-optimizer's default "preserve_norm") keeps ||O||_F
    instead of the paper's RMS 0.2."""
    g = jax.random.normal(jax.random.key(1), (6, 10))
    paper = eqopt.contrib.scale_by_normuon()
    code = eqopt.contrib.scale_by_normuon(consistent_rms=None)
    muon = eqopt.contrib.scale_by_muon(nesterov=False, beta=0.95)
    u_paper = paper.update({"w": g}, paper.init({"w": g}))[0]["w"]
    u_code = code.update({"w": g}, code.init({"w": g}))[0]["w"]
    o = muon.update({"w": g}, muon.init({"w": g}))[0]["w"]
    np.testing.assert_allclose(np.linalg.norm(u_code), np.linalg.norm(o), rtol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(u_paper), 0.2 * np.sqrt(60), rtol=1e-4)


def test_state_is_one_value_per_neuron_and_only_for_matrices():
    state = eqopt.contrib.normuon(1e-2).init(make_model())
    inner = state.inner_states["normuon"][0]
    assert inner.nu.w.shape == (1, 4)  # w is (4, 3): 4 rows, the neurons
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
    grads = jax.tree.map(jnp.ones_like, eqx.filter(model, eqx.is_inexact_array))
    updates, _ = opt.update(grads, state, model)
    assert updates.layers[1].weight.shape == (8, 8)
