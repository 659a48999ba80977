"""Gram Newton–Schulz (`orthogonalization="gram"` of Muon and NorMuon) against the
`gram-newton-schulz` package's CPU reference (`GramNewtonSchulz`,
`StandardNewtonSchulz` with `ns_use_kernels=False`), and Muon/NorMuon runs with the
Gram iteration against the standard one."""

import types

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _oracles import import_oracle
from helpers import Case

import eqopt
from eqopt.contrib import MuonDimensionNumbers
from eqopt.contrib._newton_schulz import _as_coefficients, orthogonalize

TRANSFORM_CASES = [
    Case(
        "contrib.muon-gram",
        lambda: eqopt.contrib.muon(1e-2, weight_decay=0.1, orthogonalization="gram"),
        None,
        no_parity_reason="gram-newton-schulz's reference, compared in this file",
    ),
    Case(
        "contrib.normuon-gram",
        lambda: eqopt.contrib.normuon(1e-2, orthogonalization="gram"),
        None,
        no_parity_reason="gram-newton-schulz's reference, compared in this file",
    ),
]

JORDAN = (3.4445, -4.7750, 2.0315)
SHAPES = {"square": (16, 16), "wide": (8, 32), "tall": (32, 8)}
PLAIN = MuonDimensionNumbers(reduction_axis=0, output_axis=1)


def _reference(precision):
    """The package's two orthogonalisers, uncompiled, on the CPU. With
    `precision="float64"` its internal float16 (and float32) casts become float64, so
    that the comparison sees the algorithm rather than half-precision rounding."""
    gns = import_oracle("gram_newton_schulz", "gram-newton-schulz")
    torch = import_oracle("torch")
    module = import_oracle("gram_newton_schulz.gram_newton_schulz")
    if precision == "float64":

        class _Torch(types.ModuleType):
            float16 = float32 = torch.float64

            def __getattr__(self, name):
                return getattr(torch, name)

        return gns, torch, module, _Torch("torch")
    return gns, torch, module, torch


@pytest.fixture
def reference(request, monkeypatch):
    gns, torch, module, patched = _reference(request.param)
    monkeypatch.setattr(module, "torch", patched)

    def run(x, rows, gram):
        kind = gns.GramNewtonSchulz if gram else gns.StandardNewtonSchulz
        ns = kind(ns_use_kernels=False, ns_coefficients=rows, compile_kwargs=None)
        dtype = torch.float64 if request.param == "float64" else torch.float32
        return ns(torch.tensor(np.asarray(x), dtype=dtype)).numpy()

    return run


def _rows(coeffs):
    gns = import_oracle("gram_newton_schulz", "gram-newton-schulz")
    if coeffs == "polar_express":
        return [list(row) for row in gns.POLAR_EXPRESS_COEFFICIENTS]
    return [list(JORDAN)] * 5


def _ours(x, rows, method):
    return np.asarray(
        orthogonalize(
            jnp.asarray(x), PLAIN, _as_coefficients(rows), 5, "frobenius", 1e-7, method
        )
    )


@pytest.mark.parametrize("reference", ["float64"], indirect=True)
@pytest.mark.parametrize("coeffs", ["jordan", "polar_express"])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_matches_the_reference(reference, coeffs, shape):
    """Gram and standard iterations (the reference's restart at the third step), in
    float32 against the reference in float64: max difference < 1e-5 (entries ~0.3)."""
    x = np.random.default_rng(sum(shape)).normal(size=shape).astype(np.float32)
    rows = _rows(coeffs)
    ours_gram, ours_standard = _ours(x, rows, "gram"), _ours(x, rows, "newton_schulz")
    np.testing.assert_allclose(ours_gram, reference(x, rows, True), atol=1e-5)
    np.testing.assert_allclose(ours_standard, reference(x, rows, False), atol=1e-5)
    np.testing.assert_allclose(ours_gram, ours_standard, atol=1e-5)


@pytest.mark.parametrize("reference", ["published"], indirect=True)
@pytest.mark.parametrize("shape", [SHAPES["wide"], SHAPES["tall"]])
def test_matches_the_reference_in_its_own_half_precision(reference, shape):
    """The reference as published iterates in float16: agreement to its rounding."""
    x = np.random.default_rng(3).normal(size=shape).astype(np.float32)
    rows = _rows("polar_express")
    np.testing.assert_allclose(
        _ours(x, rows, "gram"), reference(x, rows, True), atol=2e-2
    )


def _grads(model, step):
    return jax.tree.map(
        lambda x: jax.random.normal(jax.random.key(step), x.shape),
        eqx.filter(model, eqx.is_inexact_array),
    )


def _run(opt, model, steps=20):
    state = opt.init(eqx.filter(model, eqx.is_inexact_array))

    @eqx.filter_jit
    def step(model, state, index):
        grads = _grads(model, index)
        updates, state = opt.update(grads, state, model)
        return eqx.apply_updates(model, updates), state

    for index in range(steps):
        model, state = step(model, state, jnp.asarray(index))
    return model


@pytest.mark.parametrize("make", [eqopt.contrib.muon, eqopt.contrib.normuon])
def test_a_run_with_gram_agrees_with_standard(make):
    """20 steps on an `eqx.nn.MLP` with tall, wide and square weights: the parameters'
    change agrees to 1e-4 (relative, in the worst leaf)."""
    model = eqx.nn.MLP(8, 4, width_size=24, depth=2, key=jax.random.key(0))
    kwargs = dict(weight_decay=0.1, ns_coeffs="polar_express")
    standard = _run(make(1e-2, **kwargs), model)
    gram = _run(make(1e-2, orthogonalization="gram", **kwargs), model)
    leaves = lambda m: jax.tree.leaves(eqx.filter(m, eqx.is_inexact_array))  # noqa: E731
    for s, g, start in zip(leaves(standard), leaves(gram), leaves(model), strict=True):
        moved = np.max(np.abs(np.asarray(s) - np.asarray(start)))
        assert np.max(np.abs(np.asarray(s) - np.asarray(g))) < 1e-4 * moved


def test_default_is_the_standard_iteration_and_bad_values_are_refused():
    assert eqopt.contrib.ScaleByMuon().orthogonalization == "newton_schulz"
    assert eqopt.contrib.scale_by_normuon().orthogonalization == "newton_schulz"
    muon = eqopt.contrib.muon(1e-2, orthogonalization="gram")
    assert muon.transforms["muon"][0].orthogonalization == "gram"
    with pytest.raises(ValueError, match="orthogonalization"):
        eqopt.contrib.scale_by_muon(orthogonalization="svd")  # type: ignore[arg-type]


@pytest.mark.parametrize("preconditioning", ["spectral", "aol", "schatten"])
def test_other_preconditionings_agree_with_standard(preconditioning):
    x = jax.random.normal(jax.random.key(1), (6, 20))
    c = _as_coefficients(JORDAN)
    standard = orthogonalize(x, PLAIN, c, 5, preconditioning, 1e-7)
    gram = orthogonalize(x, PLAIN, c, 5, preconditioning, 1e-7, "gram")
    np.testing.assert_allclose(gram, standard, atol=2e-5)


def test_inside_param_groups():
    """A group's learning-rate multiplier halves its Muon update, gram included."""
    model = eqx.nn.MLP(8, 4, width_size=16, depth=1, key=jax.random.key(2))
    params = eqx.filter(model, eqx.is_inexact_array)
    grads = _grads(model, 0)
    plain = eqopt.contrib.muon(1e-2, orthogonalization="gram")
    grouped = eqopt.param_groups(
        plain, [eqopt.Group(r"^layers\[0\]\.", name="first", lr_mult=0.5)]
    )
    u_plain, _ = plain.update(grads, plain.init(params), params)
    u_grouped, _ = grouped.update(grads, grouped.init(params), params)
    np.testing.assert_allclose(
        u_grouped.layers[0].weight, 0.5 * u_plain.layers[0].weight, rtol=1e-6
    )
    np.testing.assert_allclose(u_grouped.layers[1].weight, u_plain.layers[1].weight)
