"""Differential privacy: per-example clipping, `differentially_private_aggregate`, `dpsgd`.

These have no registry case: their updates carry a batch axis (per-example
gradients) that the generic tests' gradients do not have. Parity with Optax,
noise included (the same key gives the same noise), is checked here.
"""

import io
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest
from helpers import assert_tree_allclose

import eqopt


def _per_example(batch=5, dtype=jnp.float32, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    return {
        "a": jax.random.normal(keys[0], (batch, 2, 3)).astype(dtype),
        "b": jax.random.normal(keys[1], (batch, 4)).astype(dtype),
        "c": jax.random.normal(keys[2], (batch,)).astype(dtype),
    }


def _params(dtype=jnp.float32):
    return {
        "a": jnp.ones((2, 3), dtype),
        "b": jnp.zeros(4, dtype),
        "c": jnp.zeros((), dtype),
    }


@pytest.mark.parametrize("clip", [0.0, 0.5, 2.0, jnp.inf])
def test_per_example_global_norm_clip_matches_optax(clip):
    grads = _per_example()
    summed, clipped = eqopt.per_example_global_norm_clip(grads, clip)
    leaves, treedef = jax.tree.flatten(grads)
    expected, expected_clipped = optax.per_example_global_norm_clip(leaves, clip)
    assert_tree_allclose(jax.tree.leaves(summed), expected, rtol=1e-6, atol=1e-6)
    assert int(clipped) == int(expected_clipped)


@pytest.mark.parametrize("uniform", [True, False])
@pytest.mark.parametrize("clip", [0.0, 0.7, jnp.inf])
def test_per_example_layer_norm_clip_matches_optax(uniform, clip):
    grads = _per_example()
    summed, clipped = eqopt.per_example_layer_norm_clip(grads, clip, uniform)
    leaves = jax.tree.leaves(grads)
    expected, expected_clipped = optax.per_example_layer_norm_clip(
        leaves, clip, uniform
    )
    assert_tree_allclose(jax.tree.leaves(summed), expected, rtol=1e-6, atol=1e-6)
    assert [int(c) for c in jax.tree.leaves(clipped)] == [
        int(c) for c in expected_clipped
    ]


def test_integer_gradients_are_clipped_in_floating_point():
    """An integer leaf's clipped sum is not a whole number: it is computed in
    the scale's floating dtype, as Optax does (it was truncated to integers)."""
    grads = [
        jnp.array([[0.0, -0.5], [3.0, 4.0], [5.0, 6.0], [0.0, 0.0]]),
        jnp.array([[0], [5], [-3], [0]]),
    ]
    for clip in (
        eqopt.per_example_global_norm_clip,
        optax.per_example_global_norm_clip,
    ):
        summed, clipped = clip(grads, 1.0)
        assert summed[1].dtype == jnp.float32 and int(clipped) == 2
        expected = 5 / np.sqrt(50) - 3 / np.sqrt(70)
        np.testing.assert_allclose(summed[1], [expected], rtol=1e-6)
    summed, _ = eqopt.per_example_layer_norm_clip(grads, 1.0)
    assert summed[1].dtype == jnp.float32


def test_clips_work_on_the_documented_example():
    grads = [jnp.array([[0, 0, 0], [0, 3, 4], [4, 0, 3], [3, 4, 0]], jnp.float32)]
    summed, clipped = eqopt.per_example_global_norm_clip(grads, 1.25)
    np.testing.assert_allclose(summed[0], [1.75, 1.75, 1.75])
    assert int(clipped) == 3


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_same_key_same_noise_as_optax(dtype):
    params = _params(dtype)
    tx = eqopt.contrib.differentially_private_aggregate(
        1.0, 1.1, key=jax.random.key(42)
    )
    reference = optax.contrib.differentially_private_aggregate(
        1.0, 1.1, key=jax.random.key(42)
    )
    state, reference_state = tx.init(params), reference.init(params)
    for step in range(3):
        grads = _per_example(dtype=dtype, seed=step)
        updates, state = tx.update(grads, state, params)
        expected, reference_state = reference.update(grads, reference_state, params)
        # bfloat16: the clipped sums may differ by a rounding (one ulp).
        tolerance = 1e-6 if dtype == jnp.float32 else 1e-2
        assert_tree_allclose(updates, expected, rtol=tolerance, atol=tolerance)
        np.testing.assert_array_equal(
            state.rng_key, jax.random.key_data(reference_state.rng_key)
        )
        assert state.key().dtype == reference_state.rng_key.dtype


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_noise_is_bit_identical_to_optax(dtype):
    params = _params(dtype)
    zeros = jax.tree.map(jnp.zeros_like, _per_example(dtype=dtype))
    tx = eqopt.contrib.differentially_private_aggregate(1.0, 1.1, key=jax.random.key(5))
    reference = optax.contrib.differentially_private_aggregate(
        1.0, 1.1, key=jax.random.key(5)
    )
    updates, _ = tx.update(zeros, tx.init(params), params)
    expected, _ = reference.update(zeros, reference.init(params), params)
    for ours, theirs in zip(
        jax.tree.leaves(updates), jax.tree.leaves(expected), strict=True
    ):
        assert ours.dtype == theirs.dtype
        np.testing.assert_array_equal(
            np.asarray(ours, np.float32), np.asarray(theirs, np.float32)
        )


def test_pure_noise_is_the_documented_gaussian():
    """With zero gradients the update is N(0, (sigma C / B)^2) noise."""
    params = {"w": jnp.zeros(20_000)}
    tx = eqopt.contrib.differentially_private_aggregate(2.0, 1.5, key=0)
    updates, _ = tx.update({"w": jnp.zeros((4, 20_000))}, tx.init(params), params)
    np.testing.assert_allclose(jnp.std(updates["w"]), 1.5 * 2.0 / 4, rtol=0.03)
    assert abs(float(jnp.mean(updates["w"]))) < 0.02


@pytest.mark.filterwarnings("ignore:.*seed.*:DeprecationWarning")
def test_dpsgd_matches_optax():
    for momentum in (None, 0.9):
        params = _params()
        tx = eqopt.contrib.dpsgd(
            0.1, 1.0, 0.5, seed=3, momentum=momentum, nesterov=True
        )
        reference = optax.contrib.dpsgd(
            0.1, 1.0, 0.5, seed=3, momentum=momentum, nesterov=True
        )
        assert isinstance(tx, eqopt.Chain)
        state, reference_state = tx.init(params), reference.init(params)
        for step in range(3):
            grads = _per_example(seed=step)
            updates, state = tx.update(grads, state, params)
            expected, reference_state = reference.update(grads, reference_state, params)
            assert_tree_allclose(updates, expected, rtol=1e-5, atol=1e-6)
            params = eqopt.apply_updates(params, updates)


def test_whole_model_per_example_gradients_under_jit():
    model = eqx.nn.MLP(3, 1, 4, 1, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (6, 3))
    y = jax.random.normal(jax.random.key(2), (6, 1))

    def loss(model, x, y):
        return jnp.sum((model(x) - y) ** 2)

    opt = eqopt.contrib.dpsgd(0.1, l2_norm_clip=1.0, noise_multiplier=0.3, seed=0)
    traces = []

    @eqx.filter_jit
    def step(opt, model, state):
        traces.append(None)
        grads = jax.vmap(eqx.filter_grad(loss), in_axes=(None, 0, 0))(model, x, y)
        updates, state = opt.update(grads, state, model)
        return eqopt.apply_updates(model, updates), state

    state = opt.init(model)
    new_model, state = step(opt, model, state)
    new_model, state = step(
        eqx.tree_at(lambda o: o[0].noise_multiplier, opt, eqopt.as_scalar(0.1)),
        new_model,
        state,
    )
    assert len(traces) == 1
    assert new_model.activation is model.activation
    assert new_model.layers[0].weight.shape == model.layers[0].weight.shape
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, state)
    buffer.seek(0)
    restored = eqx.tree_deserialise_leaves(buffer, opt.init(model))
    np.testing.assert_array_equal(restored[0].rng_key, state[0].rng_key)


def test_key_spellings():
    params = _params()
    by_int = eqopt.contrib.differentially_private_aggregate(1.0, 1.0, key=7).init(
        params
    )
    by_key = eqopt.contrib.differentially_private_aggregate(
        1.0, 1.0, key=jax.random.key(7)
    ).init(params)
    np.testing.assert_array_equal(by_int.rng_key, by_key.rng_key)
    raw = eqopt.contrib.differentially_private_aggregate(
        1.0, 1.0, key=jax.random.PRNGKey(7)
    )
    np.testing.assert_array_equal(raw.init(params).rng_key, by_key.rng_key)
    with pytest.warns(DeprecationWarning, match="seed"):
        by_seed = eqopt.contrib.differentially_private_aggregate(1.0, 1.0, seed=7)
    np.testing.assert_array_equal(by_seed.init(params).rng_key, by_key.rng_key)


def test_missing_key_is_an_error():
    """A deliberate difference: Optax warns and picks a seed; eqopt asks for one."""
    with pytest.raises(ValueError, match="a `key` is required"):
        eqopt.contrib.differentially_private_aggregate(1.0, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optax.contrib.differentially_private_aggregate(1.0, 1.0)
    with pytest.raises(ValueError, match="not both"):
        eqopt.contrib.differentially_private_aggregate(1.0, 1.0, key=1, seed=1)


def test_gradients_without_a_batch_axis_are_a_clear_error():
    params = _params()
    tx = eqopt.contrib.differentially_private_aggregate(1.0, 1.0, key=0)
    with pytest.raises(ValueError, match=r"\['c'\] has no batch axis"):
        tx.update(params, tx.init(params), params)
    with pytest.raises(ValueError, match=r"\['b'\] has shape \(5, 4\)"):
        tx.update(_per_example(), tx.init(params), {**params, "b": jnp.zeros(3)})
    with pytest.raises(ValueError, match="different batch sizes"):
        eqopt.per_example_global_norm_clip(
            {"a": jnp.ones((2, 3)), "b": jnp.ones((3, 3))}, 1.0
        )
