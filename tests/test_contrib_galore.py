"""GaLore (`eqopt.contrib.galore`, `scale_by_galore`, `GaLoreDimensionNumbers`)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case, make_model

import eqopt
from eqopt.contrib import GaLoreDimensionNumbers

# Optax computes the SVD of a complex gradient's real part only, so no complex parity.
REAL_DTYPES = ("float32", "bfloat16")


TRANSFORM_CASES = [
    # Rank 2 on the 4x3 leaf, projector refreshed at steps 0 and 2 of the 4.
    Case(
        "contrib.galore",
        lambda: eqopt.contrib.galore(0.1, rank=2, update_proj_gap=2),
        lambda: optax.contrib.galore(0.1, rank=2, update_proj_gap=2),
        REAL_DTYPES,
    ),
    Case(
        "contrib.galore-weight-decay-scale",
        lambda: eqopt.contrib.galore(
            0.1, rank=1, update_proj_gap=3, scale=0.5, weight_decay=0.1
        ),
        lambda: optax.contrib.galore(
            0.1, rank=1, update_proj_gap=3, scale=0.5, weight_decay=0.1
        ),
        REAL_DTYPES,
    ),
    # One set of dimension numbers applies to every leaf of rank >= 2; here the
    # 4x3 leaf is viewed transposed (3x4), so the right side is projected.
    Case(
        "contrib.scale_by_galore-dimension-numbers-rms",
        lambda: eqopt.contrib.scale_by_galore(
            rank=2,
            update_proj_gap=2,
            base_optimizer=eqopt.scale_by_rms(),
            weight_dimension_numbers=GaLoreDimensionNumbers(1, 0),
        ),
        lambda: optax.contrib.scale_by_galore(
            rank=2,
            update_proj_gap=2,
            base_optimizer=optax.scale_by_rms(),
            weight_dimension_numbers=optax.contrib.GaLoreDimensionNumbers(1, 0),
        ),
        REAL_DTYPES,
        needs_params=False,
    ),
]


def test_moments_live_in_the_low_rank_space():
    model = make_model()
    tx = eqopt.contrib.scale_by_galore(rank=2)
    state = tx.init(model)
    adam_state = state.base_optimizer_state
    # w is 4x3 (taller than wide): projector 4x2, moments 2x3; b and s full size.
    assert state.projector.w.shape == (4, 2)
    assert state.projector.b is None and state.projector.s is None
    assert adam_state.mu.w.shape == (2, 3) and adam_state.nu.w.shape == (2, 3)
    assert adam_state.mu.b.shape == (3,)
    assert adam_state.mu.indices is None


def test_update_has_the_rank_and_projector_refreshes_on_schedule():
    params = {"w": jnp.zeros((6, 5))}
    tx = eqopt.contrib.scale_by_galore(
        rank=2, update_proj_gap=3, base_optimizer=eqopt.identity()
    )
    state = tx.init(params)
    projectors = []
    for step in range(4):
        grads = {"w": jax.random.normal(jax.random.key(step), (6, 5))}
        updates, state = tx.update(grads, state)
        projectors.append(np.asarray(state.projector["w"]))
        # With the identity as base optimiser, the update is P P^T G: rank <= 2.
        assert np.linalg.matrix_rank(np.asarray(updates["w"]), tol=1e-4) <= 2
        basis = projectors[-1]
        np.testing.assert_allclose(basis.T @ basis, np.eye(2), atol=1e-5)
        np.testing.assert_allclose(
            updates["w"], basis @ basis.T @ np.asarray(grads["w"]), atol=1e-5
        )
    # Refreshed at steps 0 and 3 only.
    np.testing.assert_array_equal(projectors[0], projectors[1])
    np.testing.assert_array_equal(projectors[1], projectors[2])
    assert not np.allclose(projectors[2], projectors[3])


def test_complex_leaf_is_projected_onto_its_singular_subspace():
    """eqopt's SVD keeps complex gradients complex (Optax drops the imaginary part)."""
    key_real, key_imag = jax.random.split(jax.random.key(0))
    gradient = jax.random.normal(key_real, (3, 5)) + 1j * jax.random.normal(
        key_imag, (3, 5)
    )
    grads = {"w": gradient.astype(jnp.complex64)}
    tx = eqopt.contrib.scale_by_galore(rank=2, base_optimizer=eqopt.identity())
    updates, state = tx.update(grads, tx.init(grads))
    projector = np.asarray(state.projector["w"])  # 5x2: the right side is projected
    expected = np.asarray(gradient) @ projector @ projector.conj().T
    np.testing.assert_allclose(updates["w"], expected, atol=1e-5)
    # It is the best rank-2 approximation of the gradient.
    u, s, vh = np.linalg.svd(np.asarray(gradient))
    np.testing.assert_allclose(updates["w"], (u[:, :2] * s[:2]) @ vh[:2], atol=1e-4)


def test_predicate_selects_projected_leaves():
    model = make_model()
    tx = eqopt.contrib.scale_by_galore(rank=1, weight_dimension_numbers=lambda x: False)
    state = tx.init(model)
    assert state.projector.w is None
    assert state.base_optimizer_state.mu.w.shape == (4, 3)


def test_galore_trains_small_model():
    opt = eqopt.contrib.galore(1e-2, rank=4, update_proj_gap=20)
    first, last, _, _ = train(opt, 150)
    assert last < 0.3 * first


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="rank"):
        eqopt.contrib.scale_by_galore(rank=0)
    with pytest.raises(ValueError, match="every axis"):
        eqopt.contrib.scale_by_galore(
            weight_dimension_numbers={"w": GaLoreDimensionNumbers(0, 1)}
        ).init({"w": jnp.zeros((2, 3, 4))})


@pytest.mark.parametrize("explicit", [False, True])
def test_galore_on_an_equinox_model_reads_each_linear_as_out_in(explicit):
    """On an `eqx.nn.MLP` each `Linear` weight is viewed as (in, out): the numbers of
    Optax given `GaLoreDimensionNumbers(1, 0)`. Explicit dimension numbers win:
    spelled as Optax's convention they give Optax's default. The square hidden
    layer is where the two differ (which side is projected)."""
    import equinox as eqx

    model = eqx.nn.MLP(4, 2, width_size=6, depth=2, key=jax.random.key(0))
    params = eqx.filter(model, eqx.is_inexact_array)
    as_list = lambda tree: [(layer.weight, layer.bias) for layer in tree.layers]  # noqa: E731
    optax_dims = optax.contrib.GaLoreDimensionNumbers(*((0, 1) if explicit else (1, 0)))
    opt = eqopt.contrib.galore(
        0.1,
        rank=2,
        update_proj_gap=2,
        weight_dimension_numbers=(
            (lambda x: GaLoreDimensionNumbers(0, 1) if x.ndim == 2 else None)
            if explicit
            else None
        ),
    )
    reference = optax.contrib.galore(
        0.1,
        rank=2,
        update_proj_gap=2,
        weight_dimension_numbers=lambda p: jax.tree.map(
            lambda x: optax_dims if x.ndim == 2 else None, p
        ),
    )
    state, reference_state = opt.init(model), reference.init(as_list(params))
    for step in range(3):
        grads = jax.tree.map(
            lambda x, step=step: jax.random.normal(jax.random.key(step), x.shape),
            params,
        )
        updates, state = opt.update(grads, state, model)
        theirs, reference_state = reference.update(
            as_list(grads), reference_state, as_list(params)
        )
        for ours, their in zip(
            jax.tree.leaves(updates), jax.tree.leaves(theirs), strict=True
        ):
            np.testing.assert_allclose(ours, their, rtol=2e-4, atol=1e-6)
    hidden = state[0].projector.layers[1].weight  # (6, 6): the input side, (in, r)
    assert hidden.shape == (6, 2)
