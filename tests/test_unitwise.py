"""`eqopt.transforms.unitwise_norm` and `unitwise_clip` against Optax's."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqopt


@pytest.mark.parametrize(
    "shape", [(), (3,), (1, 3), (2, 3), (2, 3, 4), (2, 3, 4, 5), (2, 2, 2, 2, 3)]
)
def test_unitwise_norm_matches_optax(shape):
    x = jax.random.normal(jax.random.key(0), shape)
    np.testing.assert_allclose(
        eqopt.transforms.unitwise_norm(x), optax.transforms.unitwise_norm(x), rtol=1e-6
    )


def test_unitwise_norm_axis_and_error():
    x = jax.random.normal(jax.random.key(1), (2, 3))
    np.testing.assert_allclose(
        eqopt.transforms.unitwise_norm(x, axis=1),
        optax.transforms.unitwise_norm(x, axis=1),
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match="pass `axis=`"):
        eqopt.transforms.unitwise_norm(jnp.ones((2,) * 6))


def test_unitwise_clip_matches_optax_and_adaptive_grad_clip():
    key1, key2 = jax.random.split(jax.random.key(2))
    grad = 3 * jax.random.normal(key1, (4, 3))
    param = jax.random.normal(key2, (4, 3))
    g_norm = eqopt.transforms.unitwise_norm(grad)
    max_norm = 0.5 * jnp.maximum(eqopt.transforms.unitwise_norm(param), 1e-3)
    ours = eqopt.transforms.unitwise_clip(g_norm, max_norm, grad)
    np.testing.assert_allclose(
        ours, optax.transforms.unitwise_clip(g_norm, max_norm, grad), rtol=1e-6
    )
    # The blocks compose into adaptive gradient clipping.
    clipped, _ = eqopt.adaptive_grad_clip(0.5).update(
        {"w": grad}, eqopt.EmptyState(), {"w": param}
    )
    np.testing.assert_allclose(clipped["w"], ours, rtol=1e-6)
    with pytest.raises(ValueError, match="one shape"):
        eqopt.transforms.unitwise_clip(g_norm, max_norm[:2], grad)
