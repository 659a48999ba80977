"""Muon on Equinox models: each weight's orientation read from its layer (an
`eqx.nn.Linear` weight is `(out, in)`), against Optax told that orientation and
against the authors' Muon written here from their published code."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import make_mlp

import eqopt
from eqopt.contrib import MuonDimensionNumbers


def _random_grads(model, step):
    return jax.tree.map(
        lambda x: (
            jax.random.normal(jax.random.key(step), x.shape)
            if eqx.is_inexact_array(x)
            else None
        ),
        model,
    )


def _optax_matrix_dims(dims):
    """Optax's dimension numbers for every 2-D leaf of its params, `None` elsewhere."""
    return lambda params: jax.tree.map(lambda x: dims if x.ndim == 2 else None, params)


@pytest.mark.parametrize("explicit", [False, True])
def test_muon_on_an_equinox_model_is_optax_told_the_layers_orientation(explicit):
    """On an `eqx.nn.MLP`, eqopt reads each `Linear` weight as `(out, in)`: the same
    numbers as Optax given `MuonDimensionNumbers(1, 0)`. Explicit dimension numbers
    win: with Optax's convention spelled out, eqopt gives Optax's default numbers."""
    model = make_mlp()
    params = eqx.filter(model, eqx.is_inexact_array)
    if explicit:
        opt = eqopt.contrib.muon(
            0.02,
            muon_weight_dimension_numbers=lambda x: (
                MuonDimensionNumbers(0, 1) if x.ndim == 2 else None
            ),
        )
        reference = optax.contrib.muon(0.02)
    else:
        opt = eqopt.contrib.muon(0.02)
        reference = optax.contrib.muon(
            0.02,
            muon_weight_dimension_numbers=_optax_matrix_dims(
                optax.contrib.MuonDimensionNumbers(1, 0)
            ),
        )
    state, reference_state = opt.init(model), reference.init(params)
    for step in range(3):
        grads = _random_grads(model, step)
        updates, state = opt.update(grads, state, model)
        reference_updates, reference_state = reference.update(
            grads, reference_state, params
        )
        for ours, theirs in zip(
            jax.tree.leaves(updates), jax.tree.leaves(reference_updates), strict=True
        ):
            np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)
        model = eqopt.apply_updates(model, updates)
        params = optax.apply_updates(params, reference_updates)


def test_bare_arrays_keep_optaxs_convention():
    """A bare matrix is a Flax `(in, out)` kernel; a `Linear` weight is `(out, in)`:
    the same (in, out) sizes give the same factor, whichever way it is stored."""
    shape = eqopt.contrib.ScaleByShape()
    bare = {"w": jnp.ones((16, 32))}  # in 16, out 32
    np.testing.assert_allclose(shape.update(bare, None)[0]["w"], np.sqrt(2.0))
    linear = eqx.nn.Linear(16, 32, key=jax.random.key(0))  # weight (32, 16)
    grads = eqx.filter(jax.tree.map(jnp.ones_like, linear), eqx.is_inexact_array)
    factors = shape.update(eqx.filter(grads, lambda x: x.ndim == 2), None)[0]
    np.testing.assert_allclose(factors.weight, np.sqrt(2.0))
    narrow = eqx.nn.Linear(32, 8, key=jax.random.key(0))  # weight (8, 32): factor 1
    grads = jax.tree.map(jnp.ones_like, eqx.filter(narrow, lambda x: x.ndim == 2))
    np.testing.assert_allclose(shape.update(grads, None)[0].weight, 1.0)


def test_convolutions_and_embeddings_are_read_from_the_layer():
    """`Conv2d` and `ConvTranspose2d` weights `(out, in, kh, kw)` are the matrix
    `(in * kh * kw, out)`; an `Embedding` `(tokens, dim)` has its tokens as input."""

    class Net(eqx.Module):
        conv: eqx.nn.Conv2d
        transposed: eqx.nn.ConvTranspose2d
        embedding: eqx.nn.Embedding

    key = jax.random.key(0)
    net = Net(
        eqx.nn.Conv2d(2, 40, 3, key=key),
        eqx.nn.ConvTranspose2d(2, 40, 3, key=key),
        eqx.nn.Embedding(4, 32, key=key),
    )
    grads = jax.tree.map(jnp.ones_like, eqx.filter(net, lambda x: x.ndim >= 2))
    factors = eqopt.contrib.ScaleByShape().update(grads, None)[0]
    np.testing.assert_allclose(factors.conv.weight, np.sqrt(40 / 18))
    np.testing.assert_allclose(factors.transposed.weight, np.sqrt(40 / 18))
    np.testing.assert_allclose(factors.embedding.weight, np.sqrt(32 / 4))
    # Each output channel is one column of the orthogonalised (in * kh * kw, out)
    # matrix: the 6 columns are (nearly) orthonormal.
    conv = eqx.nn.Conv2d(2, 6, 3, key=key)
    grads = jax.tree.map(
        lambda x: jax.random.normal(key, x.shape),
        eqx.filter(conv, lambda x: x.ndim == 4),
    )
    tx = eqopt.contrib.scale_by_muon(nesterov=False)
    updates, _ = tx.update(grads, tx.init(grads))
    matrix = np.asarray(updates.weight).reshape(6, 18)
    singular_values = np.linalg.svd(matrix, compute_uv=False)
    assert singular_values.min() > 0.6 and singular_values.max() < 1.25


# ---------------------------------------------------------------------------
# The authors' Muon (Jordan et al. 2024), written here from their published code
# in numpy float64: PyTorch-layout (out, in) weights, Newton-Schulz with their
# quintic, the factor sqrt(max(1, out / in)), and a plain Adam for the rest.
# ---------------------------------------------------------------------------


def _authors_newton_schulz(g, steps=5):
    a, b, c = 3.4445, -4.7750, 2.0315
    x = np.asarray(g, np.float64)
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    x = x / (np.linalg.norm(x) + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if transposed else x


def _authors_muon(
    weights,
    biases,
    grads,
    lr,
    adam_lr,
    beta=0.95,
    nesterov=True,
    debiased=False,
    adam_betas=(0.9, 0.95),
    adam_eps=1e-10,
):
    """`MuonWithAuxAdam` on lists of (out, in) weights and biases; returns both after
    each step. `debiased=True` takes Optax's bias-corrected Nesterov momentum, the
    one reviewed difference of eqopt's Muon (documented on `ScaleByMuon`)."""
    weights = [np.asarray(w, np.float64) for w in weights]
    biases = [np.asarray(b, np.float64) for b in biases]
    momenta = [np.zeros_like(w) for w in weights]
    firsts = [np.zeros_like(b) for b in biases]
    seconds = [np.zeros_like(b) for b in biases]
    out = []
    for t, (g_weights, g_biases) in enumerate(grads, start=1):
        for i, g in enumerate(g_weights):
            g = np.asarray(g, np.float64)
            momenta[i] = beta * momenta[i] + (1 - beta) * g  # momentum.lerp_
            if nesterov and debiased:
                update = beta * momenta[i] / (1 - beta ** (t + 1)) + (1 - beta) * g / (
                    1 - beta**t
                )
            elif nesterov:
                update = (1 - beta) * g + beta * momenta[i]  # grad.lerp_(momentum)
            else:
                update = momenta[i]
            update = _authors_newton_schulz(update)
            update = update * max(1, g.shape[-2] / g.shape[-1]) ** 0.5
            weights[i] = weights[i] - lr * update
        b1, b2 = adam_betas
        for i, g in enumerate(g_biases):
            g = np.asarray(g, np.float64)
            firsts[i] = b1 * firsts[i] + (1 - b1) * g
            seconds[i] = b2 * seconds[i] + (1 - b2) * g**2
            update = (firsts[i] / (1 - b1**t)) / (
                np.sqrt(seconds[i] / (1 - b2**t)) + adam_eps
            )
            biases[i] = biases[i] - adam_lr * update
        out.append(([w.copy() for w in weights], [b.copy() for b in biases]))
    return out


def _relative_distance(ours, theirs, start):
    """||ours - theirs|| / ||theirs - start|| over all leaves."""
    difference = sum(
        np.sum((np.asarray(a) - b) ** 2) for a, b in zip(ours, theirs, strict=True)
    )
    moved = sum(
        np.sum((b - np.asarray(s)) ** 2) for b, s in zip(theirs, start, strict=True)
    )
    return float(np.sqrt(difference / moved))


def _run_on_mlp(opt, steps=20):
    """eqopt and the authors' Muon from the same MLP 16 -> 32 -> 32 -> 8 (layers of
    factor sqrt(2), 1 and 1 in the authors' Muon) and the same gradients."""
    model = eqx.nn.MLP(16, 8, width_size=32, depth=2, key=jax.random.key(0))
    start = [layer.weight for layer in model.layers]
    state = opt.init(model)
    grads = [_random_grads(model, step) for step in range(steps)]
    ours = []
    for g in grads:
        updates, state = opt.update(g, state, model)
        model = eqopt.apply_updates(model, updates)
        ours.append(
            (
                [layer.weight for layer in model.layers],
                [layer.bias for layer in model.layers],
            )
        )
    as_lists = [
        ([layer.weight for layer in g.layers], [layer.bias for layer in g.layers])
        for g in grads
    ]
    return start, ours, as_lists


@pytest.mark.parametrize("nesterov", [False, True])
def test_muon_on_an_equinox_mlp_is_the_authors_muon(nesterov):
    """Default orientation, 20 steps, against the authors' Muon: the weights agree
    (relative distance 4e-7, relative to the distance moved). Optax's (in, out)
    convention on the same model ends 42% away (the last layer, factor 2 for 1,
    100%; the first, 1 for sqrt(2), 29%). With Nesterov the reference takes
    Optax's bias correction (the authors' own is 2% away: a reviewed choice)."""
    opt = eqopt.contrib.muon(
        0.02,
        nesterov=nesterov,
        adam_learning_rate=3e-3,
        adam_b2=0.95,
        adam_eps=1e-10,
        adam_nesterov=False,
    )
    start, ours, grads = _run_on_mlp(opt)
    model = eqx.nn.MLP(16, 8, width_size=32, depth=2, key=jax.random.key(0))
    theirs = _authors_muon(
        start,
        [layer.bias for layer in model.layers],
        grads,
        lr=0.02,
        adam_lr=3e-3,
        nesterov=nesterov,
        debiased=True,
    )
    for (our_w, our_b), (their_w, their_b) in zip(ours, theirs, strict=True):
        assert _relative_distance(our_w, their_w, start) < 2e-5
        np.testing.assert_allclose(
            np.concatenate([np.ravel(b) for b in our_b]),
            np.concatenate([np.ravel(b) for b in their_b]),
            rtol=2e-5,
            atol=2e-6,
        )
    if not nesterov:  # plain momentum has nothing to debias: the authors' exactly
        exact = _authors_muon(
            start,
            [layer.bias for layer in model.layers],
            grads,
            0.02,
            3e-3,
            nesterov=False,
        )
        assert _relative_distance(ours[-1][0], exact[-1][0], start) < 2e-5
    # Before: Optax's convention on the same model (transposed shape factors).
    optax_way = eqopt.contrib.muon(
        0.02,
        nesterov=nesterov,
        adam_learning_rate=3e-3,
        muon_weight_dimension_numbers=lambda x: (
            MuonDimensionNumbers(0, 1) if x.ndim == 2 else None
        ),
    )
    _, transposed, _ = _run_on_mlp(optax_way)
    assert _relative_distance(transposed[-1][0], theirs[-1][0], start) > 0.3


def test_muons_adam_part_has_its_own_eps_and_nesterov():
    """By default the Adam part takes Muon's `eps` and `nesterov` (Optax's coupling);
    `adam_eps` and `adam_nesterov` set them apart."""
    coupled = eqopt.contrib.muon(0.1, eps=1e-3, nesterov=True)
    adam = coupled.transforms["adam"]
    assert adam.scale_by_adam.nesterov
    assert float(adam.scale_by_adam.eps) == pytest.approx(1e-3)
    apart = eqopt.contrib.muon(0.1, eps=1e-3, adam_eps=1e-10, adam_nesterov=False)
    adam = apart.transforms["adam"]
    assert not adam.scale_by_adam.nesterov
    assert float(adam.scale_by_adam.eps) == pytest.approx(1e-10)
    assert apart.transforms["muon"].scale_by_muon.nesterov
    assert float(apart.transforms["muon"].scale_by_muon.eps) == pytest.approx(1e-3)
    # A constant gradient g on an Adam leaf: the first step is -lr sign(g) with
    # plain Adam, -lr (1 + b1 (1 - b1) / (1 - b1^2)) sign(g) with NAdam.
    model = make_mlp()
    grads = jax.tree.map(
        lambda x: jnp.ones_like(x) if eqx.is_inexact_array(x) else None, model
    )
    plain, _ = apart.update(grads, apart.init(model), model)
    nadam, _ = coupled.update(grads, coupled.init(model), model)
    np.testing.assert_allclose(plain.layers[0].bias, -0.1, rtol=1e-5)
    nadam_first_step = 0.9 * 0.1 / (1 - 0.9**2) + 1
    np.testing.assert_allclose(nadam.layers[0].bias, -0.1 * nadam_first_step, rtol=1e-2)
