"""Muon (`eqopt.contrib.muon`, `scale_by_muon`, `MuonDimensionNumbers`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _oracles import import_oracle
from _training import make_mlp, train
from helpers import Case, make_model, spec_like

import eqopt
from eqopt.contrib import MuonDimensionNumbers

ALL_DTYPES = ("float32", "bfloat16", "complex64")
REAL_DTYPES = ("float32", "bfloat16")


def _optax_dims(**values):
    return lambda p: {k: values.get(k) for k in p}


TRANSFORM_CASES = [
    Case(
        "contrib.muon",
        lambda: eqopt.contrib.muon(0.05),
        lambda: optax.contrib.muon(0.05),
        ALL_DTYPES,
    ),
    Case(
        "contrib.muon-aol-adaptive",
        lambda: eqopt.contrib.muon(0.05, preconditioning="aol", adaptive=True),
        lambda: optax.contrib.muon(0.05, preconditioning="aol", adaptive=True),
        ALL_DTYPES,
    ),
    Case(
        "contrib.muon-spectral-dion-consistent-rms",
        lambda: eqopt.contrib.muon(
            0.05,
            ns_coeffs="dion",
            preconditioning="spectral",
            consistent_rms=0.2,
            nesterov=False,
            weight_decay=0.1,
            adam_learning_rate=0.01,
            adam_weight_decay=0.05,
        ),
        lambda: optax.contrib.muon(
            0.05,
            ns_coeffs="dion",
            preconditioning="spectral",
            consistent_rms=0.2,
            nesterov=False,
            weight_decay=0.1,
            adam_learning_rate=0.01,
            adam_weight_decay=0.05,
        ),
        # Optax's spectral norm has no bfloat16 SVD on CPU; eqopt's runs in float32.
        ("float32", "complex64"),
    ),
    # Polar Express (Amsel et al. 2025) as a table of rows, which Optax also accepts.
    Case(
        "contrib.muon-polar-express",
        lambda: eqopt.contrib.muon(0.05, ns_coeffs="polar_express"),
        lambda: optax.contrib.muon(
            0.05, ns_coeffs=eqopt.contrib.polar_express_coefficients(5)
        ),
        ALL_DTYPES,
    ),
    # eqopt's Schatten-4 scaling uses X X^H; Optax uses X X^T, so complex differs.
    Case(
        "contrib.muon-schatten-3-steps",
        lambda: eqopt.contrib.muon(0.05, preconditioning="schatten", ns_steps=3),
        lambda: optax.contrib.muon(0.05, preconditioning="schatten", ns_steps=3),
        REAL_DTYPES,
    ),
    # Which leaves get Muon, as a prefix tree of bools (the Equinox way) ...
    Case(
        "contrib.muon-filter-spec-tree",
        lambda p: eqopt.contrib.muon(
            0.05, muon_weight_dimension_numbers=spec_like(p, w=True)
        ),
        lambda: optax.contrib.muon(
            0.05,
            muon_weight_dimension_numbers={
                "w": optax.contrib.MuonDimensionNumbers(),
                "b": None,
                "s": None,
            },
        ),
        ALL_DTYPES,
    ),
    # ... and as a per-leaf predicate returning dimension numbers (here transposed).
    Case(
        "contrib.muon-predicate-dimension-numbers",
        lambda: eqopt.contrib.muon(
            0.05,
            muon_weight_dimension_numbers=lambda x: (
                MuonDimensionNumbers(reduction_axis=1, output_axis=0)
                if x.ndim == 2
                else None
            ),
        ),
        lambda: optax.contrib.muon(
            0.05,
            muon_weight_dimension_numbers=_optax_dims(
                w=optax.contrib.MuonDimensionNumbers(1, 0)
            ),
        ),
        REAL_DTYPES,
    ),
    Case(
        "contrib.scale_by_muon",
        lambda: eqopt.contrib.scale_by_muon(
            weight_dimension_numbers=lambda x: x.ndim == 2
        ),
        lambda: optax.partition(
            {
                "muon": optax.contrib.scale_by_muon(
                    weight_dimension_numbers=lambda p: jax.tree.map(
                        lambda _: optax.contrib.MuonDimensionNumbers(), p
                    )
                ),
                "rest": optax.identity(),
            },
            {"w": "muon", "b": "rest", "s": "rest"},
        ),
        ALL_DTYPES,
        needs_params=False,
    ),
]


def _singular_values(x):
    return np.linalg.svd(np.asarray(x, np.float64), compute_uv=False)


@pytest.mark.parametrize("preconditioning", ["frobenius", "spectral", "aol"])
def test_update_of_matrix_is_approximately_orthogonal(preconditioning):
    """Muon's direction has all singular values near 1 and is close to U V^T."""
    gradient = jax.random.normal(jax.random.key(0), (12, 7))
    tx = eqopt.contrib.scale_by_muon(preconditioning=preconditioning, nesterov=False)
    update, _ = tx.update({"w": gradient}, tx.init({"w": gradient}))
    singular_values = _singular_values(update["w"])
    # Jordan's quintic does not converge to 1 exactly: it lands in about [0.7, 1.2].
    assert singular_values.min() > 0.6 and singular_values.max() < 1.25
    u, _, vt = np.linalg.svd(np.asarray(gradient), full_matrices=False)
    polar = u @ vt
    assert np.linalg.norm(update["w"] - polar) / np.linalg.norm(polar) < 0.3
    # Near-orthogonal columns: W^T W is close to the identity.
    gram = np.asarray(update["w"]).T @ np.asarray(update["w"])
    assert np.abs(gram - np.eye(7)).max() < 0.5


def test_more_steps_get_closer_to_orthogonal():
    """With the Dion schedule of coefficients the singular values are tighter around 1."""
    gradient = jax.random.normal(jax.random.key(1), (9, 9))
    tx = eqopt.contrib.scale_by_muon(ns_coeffs="dion", nesterov=False)
    update, _ = tx.update({"w": gradient}, tx.init({"w": gradient}))
    singular_values = _singular_values(update["w"])
    assert np.all(np.abs(singular_values - 1) < 0.2)


def test_filter_spec_selects_which_leaves_get_muon():
    """Muon only on the hidden matrix chosen with eqx.tree_at; AdamW elsewhere."""
    model = make_mlp()
    hidden = jax.tree.map(lambda _: False, model)
    hidden = eqx.tree_at(lambda m: m.layers[1].weight, hidden, True)
    opt = eqopt.contrib.muon(0.1, muon_weight_dimension_numbers=hidden)
    state = opt.init(model)
    muon_mu = state.inner_states["muon"][0].mu
    adam_mu = state.inner_states["adam"][0].mu
    assert muon_mu.layers[1].weight is not None
    assert muon_mu.layers[0].weight is None and muon_mu.layers[2].weight is None
    assert adam_mu.layers[1].weight is None
    assert adam_mu.layers[0].weight is not None and adam_mu.layers[1].bias is not None

    grads = jax.tree.map(
        lambda x: jnp.ones_like(x) if eqx.is_inexact_array(x) else None, model
    )
    grads = eqx.tree_at(
        lambda g: g.layers[1].weight,
        grads,
        jax.random.normal(jax.random.key(2), (16, 16)),
    )
    updates, _ = opt.update(grads, state, model)
    # The Muon leaf: an orthogonalised step of size lr (square, so no shape factor).
    singular_values = _singular_values(updates.layers[1].weight)
    assert singular_values.min() > 0.06 and singular_values.max() < 0.125
    # An Adam leaf (Nesterov, as Muon's) with a constant gradient g: the first
    # step is -lr (b1 (1 - b1) g / (1 - b1^2) + g) / |g| per element.
    nadam_first_step = 0.9 * 0.1 / (1 - 0.9**2) + 1
    np.testing.assert_allclose(
        updates.layers[0].weight, -0.1 * nadam_first_step, rtol=1e-4
    )


def test_predicate_selects_which_leaves_get_muon():
    model = make_mlp()
    opt = eqopt.contrib.muon(
        0.1, muon_weight_dimension_numbers=lambda x: x.ndim == 2 and x.shape == (16, 16)
    )
    state = opt.init(model)
    muon_mu = state.inner_states["muon"][0].mu
    assert muon_mu.layers[1].weight is not None
    assert muon_mu.layers[0].weight is None and muon_mu.layers[2].weight is None
    # The default: every 2-D leaf.
    default_mu = eqopt.contrib.muon(0.1).init(model).inner_states["muon"][0].mu
    assert all(layer.weight is not None for layer in default_mu.layers)
    assert all(layer.bias is None for layer in default_mu.layers)


def test_dimension_numbers_reshape_higher_rank_leaves():
    """A 3-D leaf with a batch axis: each slice is orthogonalised on its own (as Optax)."""
    kernel = jax.random.normal(jax.random.key(3), (2, 5, 3))
    grads = {"k": kernel}
    dims = MuonDimensionNumbers(reduction_axis=1, output_axis=2)
    tx = eqopt.contrib.scale_by_muon(weight_dimension_numbers={"k": dims})
    updates, _ = tx.update(grads, tx.init(grads))
    single = eqopt.contrib.scale_by_muon()
    for i in range(2):
        slice_update, _ = single.update({"k": kernel[i]}, single.init({"k": kernel[i]}))
        np.testing.assert_allclose(
            updates["k"][i], slice_update["k"], rtol=1e-5, atol=1e-6
        )
    reference = optax.contrib.scale_by_muon(
        weight_dimension_numbers={"k": optax.contrib.MuonDimensionNumbers(1, 2)}
    )
    reference_updates, _ = reference.update(grads, reference.init(grads))
    np.testing.assert_allclose(
        updates["k"], reference_updates["k"], rtol=1e-5, atol=1e-6
    )
    # Several reduction axes are flattened into one (a convolution kernel).
    conv = {"k": jax.random.normal(jax.random.key(4), (4, 3, 2, 2))}
    conv_dims = MuonDimensionNumbers(reduction_axis=(1, 2, 3), output_axis=0)
    tx = eqopt.contrib.scale_by_muon(weight_dimension_numbers=conv_dims)
    reference = optax.contrib.scale_by_muon(
        weight_dimension_numbers={"k": optax.contrib.MuonDimensionNumbers((1, 2, 3), 0)}
    )
    updates, _ = tx.update(conv, tx.init(conv))
    reference_updates, _ = reference.update(conv, reference.init(conv))
    np.testing.assert_allclose(
        updates["k"], reference_updates["k"], rtol=1e-5, atol=1e-6
    )


def test_muon_trains_small_model():
    first, last, _, _ = train(eqopt.contrib.muon(0.02, adam_learning_rate=3e-3), 150)
    assert last < 0.3 * first


def test_scale_by_muon_default_rejects_a_vector_naming_it():
    model = make_model()
    with pytest.raises(ValueError, match=r"Muon.*\.b.*rank >= 2"):
        eqopt.contrib.scale_by_muon().init(model)


def test_bad_specs_are_clear_errors():
    model = make_model()
    with pytest.raises(ValueError, match="applied to each leaf"):
        eqopt.contrib.muon(0.1, muon_weight_dimension_numbers=lambda x: "yes").init(
            model
        )
    with pytest.raises(ValueError, match="distinct"):
        eqopt.contrib.scale_by_muon(
            weight_dimension_numbers=lambda x: (
                MuonDimensionNumbers(0, 0) if x.ndim == 2 else None
            )
        ).init(model)
    with pytest.raises(ValueError, match="preset"):
        eqopt.contrib.muon(0.1, ns_coeffs="fast")
    with pytest.raises(ValueError, match="ns_coeffs"):
        eqopt.contrib.scale_by_muon(ns_coeffs=(1.0, 2.0))
    with pytest.raises(ValueError, match="preconditioning"):
        eqopt.contrib.scale_by_muon(preconditioning="polar")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reduction_axis"):
        MuonDimensionNumbers(reduction_axis="rows")  # type: ignore[arg-type]


def test_muon_is_a_partition_readable_by_group():
    opt = eqopt.contrib.muon(0.1)
    assert isinstance(opt, eqopt.Partition)
    assert not opt.elementwise
    muon_chain = opt.transforms["muon"]
    assert muon_chain.names == (
        "scale_by_muon",
        "scale_by_shape",
        "add_decayed_weights",
        "scale_by_learning_rate",
    )
    assert float(muon_chain.scale_by_muon.beta) == pytest.approx(0.95)
    assert MuonDimensionNumbers() == MuonDimensionNumbers(0, 1)
    assert MuonDimensionNumbers([1, 2], 0).reduction_axis == (1, 2)


def test_spectral_preconditioning_runs_in_bfloat16():
    """The spectral norm's SVD runs in float32 (Optax has no bfloat16 SVD on CPU)."""
    gradient = jax.random.normal(jax.random.key(5), (8, 6))
    tx = eqopt.contrib.scale_by_muon(preconditioning="spectral", nesterov=False)
    low_grads = {"w": gradient.astype(jnp.bfloat16)}
    low, _ = tx.update(low_grads, tx.init(low_grads))
    high, _ = tx.update({"w": gradient}, tx.init({"w": gradient}))
    assert low["w"].dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(low["w"], np.float32), high["w"], rtol=0.1, atol=0.05
    )


def test_muon_on_a_bare_array_model():
    # A model that is one scalar: nothing for Muon, an empty Muon group whose
    # weight decay sees no params (found by the hypothesis property test).
    model, grad = jnp.asarray(1.6226422), jnp.asarray(-0.13210486)
    ours, theirs = eqopt.contrib.muon(0.1), optax.contrib.muon(0.1)
    state, their_state = ours.init(model), theirs.init(model)
    for _ in range(3):
        update, state = ours.update(grad, state, model)
        their_update, their_state = theirs.update(grad, their_state, model)
        assert jnp.allclose(update, their_update, rtol=1e-5)


# ---------------------------------------------------------------------------
# Polar Express (Amsel, Persson, Musco & Gower, 2025)
# ---------------------------------------------------------------------------

# The paper's table (Amsel et al., arXiv:2505.16932, Algorithm 1's code), written
# out here independently of eqopt's copy.
PAPER_TABLE = [
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
]


def _paper_polar_express(g, steps):
    """The paper's iteration in float64: X_0 = G / (1.01 ||G||_F + 1e-7), quintics
    made safe by p(x / 1.01), the last one repeated."""
    rows = [(a / 1.01, b / 1.01**3, c / 1.01**5) for a, b, c in PAPER_TABLE[:-1]]
    rows = rows + [PAPER_TABLE[-1]]
    rows = rows[:steps] + [rows[-1]] * max(0, steps - len(rows))
    x = np.asarray(g, np.float64)
    transposed = x.shape[0] > x.shape[1]
    x = x.T if transposed else x
    x = x / (np.linalg.norm(x) * 1.01 + 1e-7)
    for a, b, c in rows:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if transposed else x


def _orthogonalised(g, ns_coeffs, ns_steps=5):
    tx = eqopt.contrib.scale_by_muon(
        ns_coeffs=ns_coeffs, ns_steps=ns_steps, beta=0.0, nesterov=False
    )
    return np.asarray(tx.update({"w": g}, tx.init({"w": g}))[0]["w"])


@pytest.mark.parametrize("shape", [(12, 7), (6, 10)])
@pytest.mark.parametrize("steps", [5, 10])
def test_polar_express_is_the_papers_iteration(shape, steps):
    g = jax.random.normal(jax.random.key(3), shape)
    coefficients = (
        "polar_express"
        if steps == 5
        else eqopt.contrib.polar_express_coefficients(steps)
    )
    ours = _orthogonalised(g, coefficients)
    np.testing.assert_allclose(ours, _paper_polar_express(g, steps), atol=2e-5)


def test_polar_express_against_heavyball():
    """heavyball's msign iterates the paper's safe table but normalises by ||G||_F
    without the paper's factor 1.01; with the same normalisation they agree."""
    torch = import_oracle("torch")
    utils = import_oracle("heavyball.utils", "heavyball")
    g = np.asarray(jax.random.normal(jax.random.key(4), (9, 14)), np.float64)
    theirs = utils.msign(torch.tensor(g), steps=5).numpy()
    same_start = _orthogonalised(jnp.asarray(g), utils.ABC_LIST_STABLE[:5])
    np.testing.assert_allclose(same_start, theirs, atol=2e-5)
    ours = _orthogonalised(jnp.asarray(g), "polar_express")
    assert np.max(np.abs(ours - theirs)) > 1e-3  # the 1.01 on the first step


def test_pytorch_optimizer_polar_express_table_differs_from_the_paper():
    """pytorch-optimizer's "polar_express" rows are another fit (safety 1e-2 in the
    fitting), not the paper's published table; eqopt uses the paper's."""
    matrix = import_oracle(
        "pytorch_optimizer.optimizer.utils.matrix", "pytorch-optimizer"
    )
    theirs = np.asarray(matrix.NS_COEFFICIENTS["polar_express"][:5])
    paper = np.asarray(PAPER_TABLE[:5]) / np.array([1.01, 1.01**3, 1.01**5])
    assert np.max(np.abs(theirs - paper) / np.abs(paper)) > 1e-3
    ours = np.asarray(eqopt.contrib.polar_express_coefficients(5))
    np.testing.assert_allclose(ours[1:], paper[1:], rtol=1e-12)


def test_polar_express_is_closer_to_orthogonal_than_jordans():
    g = jax.random.normal(jax.random.key(5), (32, 16))
    u, _, vt = np.linalg.svd(np.asarray(g, np.float64), full_matrices=False)
    polar = u @ vt
    errors = {
        name: np.linalg.norm(_orthogonalised(g, name) - polar)
        for name in ("standard", "polar_express")
    }
    assert errors["polar_express"] < 0.5 * errors["standard"]
    with pytest.raises(ValueError, match="steps"):
        eqopt.contrib.polar_express_coefficients(0)


def test_a_whole_params_dimension_numbers_function_is_refused_with_the_fix():
    """Optax calls the function on the whole params; here it is per leaf, as a
    mask is, and the error shows the call that works."""
    params = {"w1": jnp.ones((10, 10)), "w2": jnp.ones((2, 10))}

    def dims_fn(_):
        return {"w1": MuonDimensionNumbers(), "w2": None}

    with pytest.raises(ValueError, match=r"\['w1'\].*dims_fn\(params\)"):
        eqopt.contrib.muon(1e-3, muon_weight_dimension_numbers=dims_fn).init(params)
    opt = eqopt.contrib.muon(1e-3, muon_weight_dimension_numbers=dims_fn(params))
    state = opt.init(params)
    updates, _ = opt.update(params, state, params)
    assert updates["w1"].shape == (10, 10) and updates["w2"].shape == (2, 10)


@pytest.mark.parametrize("preconditioning", ["frobenius", "aol", "schatten"])
def test_dimension_numbers_choose_the_muon_leaves_as_optax_does(preconditioning):
    """Optax's combinations of dimension numbers, read through eqopt's partition
    state (the group's chain state directly; `None` where Optax has `MaskedNode`)."""

    def muon_mu(params, dims=None):
        opt = eqopt.contrib.muon(
            1e-3, muon_weight_dimension_numbers=dims, preconditioning=preconditioning
        )
        _, state = opt.update(params, opt.init(params), params)
        return state.inner_states["muon"][0].mu

    dims = MuonDimensionNumbers(reduction_axis=(1,), output_axis=(2,))
    mu = muon_mu(
        {"w1": jnp.ones((1, 2, 3)), "w2": jnp.ones((2, 3, 4))}, {"w1": dims, "w2": dims}
    )
    assert mu["w1"] is not None and mu["w2"] is not None
    mu = muon_mu({"w1": jnp.ones((1, 2, 3)), "w2": jnp.ones((3, 4))})
    assert mu["w1"] is None and mu["w2"] is not None  # by default, matrices only
    mu = muon_mu(
        {"w1": jnp.ones((1, 2, 3)), "w2": jnp.ones((2, 3, 4))}, {"w1": None, "w2": dims}
    )
    assert mu["w1"] is None and mu["w2"] is not None
    pair = {"a": jnp.ones((2, 3)), "b": jnp.ones((2, 3))}
    params = {"w1": pair, "w2": pair}
    mu = muon_mu(params, {"w1": None, "w2": {"a": MuonDimensionNumbers(), "b": None}})
    assert jax.tree.structure(mu, is_leaf=lambda x: x is None) == jax.tree.structure(
        params
    )
    assert [mu["w1"]["a"], mu["w1"]["b"], mu["w2"]["b"]] == [None, None, None]
    assert mu["w2"]["a"] is not None
    mu = muon_mu(params, {"w1": MuonDimensionNumbers(), "w2": None})
    assert mu["w1"]["a"] is not None and mu["w1"]["b"] is not None
    assert mu["w2"]["a"] is None and mu["w2"]["b"] is None


def test_matrices_alone_do_not_warn():
    # Muon's AdamW group is empty on a model of matrices alone: that is not the
    # user's mistake, so `init` says nothing (a user's own empty partition group
    # still warns: tests/test_masked.py).
    import warnings

    params = {"a": jnp.ones((4, 3)), "b": jnp.ones((2, 4))}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = eqopt.contrib.muon(1e-3).init(params)
    assert state is not None
