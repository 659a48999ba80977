"""SM3: registry cases and behaviour."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case, make_model, spec_like

import eqopt

REAL = ("float32", "bfloat16")  # Optax rejects complex parameters
SCALAR = (
    "Optax 0.2.8 raises an IndexError on a scalar leaf (the standard model has "
    "one); the sm3-tensors cases mask it out, test_sm3_matches_optax_on_tensors "
    "compares higher ranks"
)


def _tensors(x):
    return x.ndim > 0


TRANSFORM_CASES = [
    Case("sm3", lambda: eqopt.sm3(1e-2), None, no_parity_reason=SCALAR),
    Case(
        "sm3-tensors",
        lambda: eqopt.masked(eqopt.sm3(1e-2), _tensors),
        lambda p: optax.masked(optax.sm3(1e-2), spec_like(p, w=True, b=True)),
        REAL,
        needs_params=False,
    ),
    Case(
        "scale_by_sm3-tensors",
        lambda: eqopt.masked(eqopt.scale_by_sm3(b1=0.5, b2=0.75, eps=1e-6), _tensors),
        lambda p: optax.masked(
            optax.scale_by_sm3(b1=0.5, b2=0.75, eps=1e-6), spec_like(p, w=True, b=True)
        ),
        REAL,
        needs_params=False,
    ),
]


def _tensor_params():
    keys = jax.random.split(jax.random.key(0), 3)
    return {
        "a": jax.random.normal(keys[0], (3, 4, 5)),
        "b": jax.random.normal(keys[1], (6,)),
        "c": jax.random.normal(keys[2], (2, 3)),
    }


def _random_like(params, seed):
    key = jax.random.key(seed)
    return jax.tree.map(lambda x: jax.random.normal(key, x.shape), params)


@pytest.mark.parametrize(
    "make",
    [
        lambda lib: lib.sm3(1e-2),
        lambda lib: lib.sm3(1e-2, momentum=0.0),
        lambda lib: lib.scale_by_sm3(b1=0.5, b2=0.75, eps=1e-6),
    ],
    ids=["sm3", "no_momentum", "b2"],
)
def test_sm3_matches_optax_on_tensors(make):
    params = _tensor_params()
    tx, reference = make(eqopt), make(optax)
    state, reference_state = tx.init(params), reference.init(params)
    for step in range(4):
        grads = _random_like(params, 10 + step)
        updates, state = tx.update(grads, state, params)
        reference_updates, reference_state = reference.update(
            grads, reference_state, params
        )
        for key in params:
            np.testing.assert_allclose(
                updates[key], reference_updates[key], rtol=1e-5, atol=1e-7
            )


def test_sm3_state_shapes():
    model = make_model()
    state = eqopt.sm3(0.1).init(model)[0]
    assert [a.shape for a in state.mu.w] == [(4,), (3,)]
    assert [a.shape for a in state.mu.b] == [(3,)]
    assert state.mu.s == ()  # a scalar leaf has no accumulator
    assert state.mu.indices is None and state.nu.indices is None
    assert state.nu.w.shape == (4, 3)
    # Memory: one vector per axis, not one entry per element.
    params = _tensor_params()
    sizes = [x.size for x in jax.tree.leaves(eqopt.scale_by_sm3().init(params).mu)]
    assert sum(sizes) == (3 + 4 + 5) + 6 + (2 + 3)


def test_sm3_bounds_the_sum_of_squared_gradients():
    # SM3's nu is an upper bound on Adagrad's per-element sum, exact for vectors.
    params = {"m": jnp.zeros((4, 3)), "v": jnp.zeros(5)}
    tx = eqopt.scale_by_sm3(b1=0.0, eps=0.0)
    state = tx.init(params)
    total = jax.tree.map(jnp.zeros_like, params)
    for step in range(5):
        grads = _random_like(params, step)
        updates, state = tx.update(grads, state)
        total = jax.tree.map(lambda t, g: t + g**2, total, grads)
        nu = jax.tree.map(lambda g, u: (g / u) ** 2, grads, updates)
        assert np.all(np.asarray(nu["m"]) >= np.asarray(total["m"]) * (1 - 1e-5))
        np.testing.assert_allclose(nu["v"], total["v"], rtol=1e-5)


def test_sm3_zero_gradient_gives_zero_update():
    tx = eqopt.scale_by_sm3(b1=0.0, eps=0.0)
    params = {"w": jnp.zeros((2, 2))}
    updates, _ = tx.update({"w": jnp.zeros((2, 2))}, tx.init(params))
    np.testing.assert_array_equal(updates["w"], 0.0)


def test_sm3_momentum_none_means_no_momentum():
    params = _tensor_params()
    grads = jax.tree.map(jnp.ones_like, params)
    without = eqopt.sm3(0.1, momentum=None)
    zero = eqopt.sm3(0.1, momentum=0.0)
    updates, _ = without.update(grads, without.init(params))
    expected, _ = zero.update(grads, zero.init(params))
    np.testing.assert_array_equal(updates["a"], expected["a"])


def test_sm3_trains():
    first, last, _, _ = train(eqopt.sm3(0.1), problem="mlp-2-1")
    assert last < 0.2 * first


def test_sm3_scalar_leaf_where_optax_raises():
    params = {"s": jnp.asarray(1.0)}
    grads = {"s": jnp.asarray(-3.0)}
    reference = optax.sm3(0.1)
    with pytest.raises(IndexError):
        reference.update(grads, reference.init(params), params)
    # No accumulator: nu = g^2, so the scaled gradient is sign(g).
    tx = eqopt.scale_by_sm3(b1=0.5)
    updates, state = tx.update(grads, tx.init(params))
    np.testing.assert_allclose(updates["s"], -0.5)
    assert state.mu["s"] == ()
