"""NovoGrad: registry cases and behaviour."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case, make_model

import eqopt

ALL = ("float32", "bfloat16", "complex64")

TRANSFORM_CASES = [
    Case(
        "novograd",
        lambda: eqopt.novograd(1e-2),
        lambda: optax.novograd(1e-2),
        ALL,
    ),
    Case(
        "novograd-weight_decay",
        lambda: eqopt.novograd(1e-2, b1=0.8, weight_decay=0.1, eps_root=1e-6),
        lambda: optax.novograd(1e-2, b1=0.8, weight_decay=0.1, eps_root=1e-6),
        ALL,
    ),
    Case(
        "scale_by_novograd-mu_dtype",
        lambda: eqopt.scale_by_novograd(b1=0.5, b2=0.5, mu_dtype=jnp.bfloat16),
        lambda: optax.scale_by_novograd(b1=0.5, b2=0.5, mu_dtype=jnp.bfloat16),
        ("float32",),
        rtol=1e-2,
        atol=1e-2,
    ),
]


def test_novograd_second_moment_is_one_scalar_per_leaf():
    model = make_model()
    state = eqopt.scale_by_novograd().init(model)
    assert state.nu.w.shape == () and state.nu.b.shape == ()
    assert state.mu.w.shape == (4, 3) and state.nu.indices is None
    assert not eqopt.scale_by_novograd().elementwise


def test_novograd_normalises_each_layer_separately():
    # Scaling one leaf's gradient leaves its first update unchanged (it is
    # normalised by its own norm) and the other leaves' updates too.
    grads = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([1.0, -1.0, 2.0])}
    scaled = {"a": 100 * grads["a"], "b": grads["b"]}
    tx = eqopt.scale_by_novograd(eps=0.0)
    updates, state = tx.update(grads, tx.init(grads))
    scaled_updates, _ = tx.update(scaled, tx.init(grads))
    np.testing.assert_allclose(updates["a"], [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(scaled_updates["a"], updates["a"], rtol=1e-6)
    np.testing.assert_allclose(scaled_updates["b"], updates["b"], rtol=1e-6)
    np.testing.assert_allclose(state.nu["a"], 25.0)


def test_novograd_needs_params_only_for_weight_decay():
    grads = {"a": jnp.ones(3)}
    tx = eqopt.scale_by_novograd()
    tx.update(grads, tx.init(grads))  # no decay: no params needed
    decaying = eqopt.scale_by_novograd(weight_decay=0.1)
    with pytest.raises(ValueError, match="needs `params`"):
        decaying.update(grads, decaying.init(grads))
    # Under jit the decay is a traced leaf: checked when the step runs.
    update = eqx.filter_jit(lambda tx, g, state: tx.update(g, state))
    update(tx, grads, tx.init(grads))
    with pytest.raises(Exception, match="needs `params`"):
        update(decaying, grads, decaying.init(grads))


def test_novograd_trains():
    first, last, _, _ = train(eqopt.novograd(1e-2), problem="mlp-2-1")
    assert last < 0.1 * first
