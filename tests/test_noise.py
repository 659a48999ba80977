"""add_noise and noisy_sgd: Optax's random stream on equal trees, and the noise's statistics.

The generic parity test skips these cases: it compares an Equinox model with
Optax's dict of the same arrays, whose leaves come in another order, so each
leaf would get another key. Here both libraries see the same tree.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import ALL_DTYPES, Case

import eqopt

# The generic parity test compares an Equinox model with Optax's dict, whose
# leaves are in another order, so each leaf gets another key.
TRANSFORM_CASES = [
    # noise.py: the generic parity test compares an Equinox model with Optax's
    # dict, whose leaves are in another order, so each leaf gets another key.
    Case(
        "add_noise",
        lambda: eqopt.add_noise(0.1, 0.55, jax.random.key(0)),
        lambda: optax.add_noise(0.1, 0.55, jax.random.key(0)),
        ALL_DTYPES,
        needs_params=False,
        random=True,
        no_parity_reason="random; bit-exact parity on equal trees in test_noise.py",
    ),
]


def _is_none(x):
    return x is None


def _tree(dtype):
    params = {
        "a": jnp.ones((3, 4), dtype),
        "b": jnp.zeros(5, dtype),
        "c": jnp.ones((), dtype),
    }
    grads = {"a": jnp.full((3, 4), 0.5, dtype), "b": None, "c": jnp.ones((), dtype)}
    return params, grads


def _assert_same(x, y):
    x_leaves = jax.tree.leaves(x, is_leaf=_is_none)
    y_leaves = jax.tree.leaves(y, is_leaf=_is_none)
    assert len(x_leaves) == len(y_leaves)
    for a, b in zip(x_leaves, y_leaves, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(
                np.asarray(a.astype(jnp.complex64)), np.asarray(b.astype(jnp.complex64))
            )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "complex64"])
def test_add_noise_is_optax_bit_for_bit(dtype):
    params, grads = _tree(jnp.dtype(dtype))
    tx, reference = (
        eqopt.add_noise(0.1, 0.55, jax.random.key(3)),
        optax.add_noise(0.1, 0.55, jax.random.key(3)),
    )
    state, reference_state = tx.init(params), reference.init(params)
    for _ in range(3):
        updates, state = tx.update(grads, state)
        reference_updates, reference_state = reference.update(grads, reference_state)
        _assert_same(updates, reference_updates)
    np.testing.assert_array_equal(
        state.rng_key, jax.random.key_data(reference_state.rng_key)
    )
    assert int(state.count) == int(reference_state.count) == 3


@pytest.mark.parametrize(
    "key",
    [7, jax.random.key(7), jax.random.PRNGKey(7), jax.random.key(7, impl="rbg")],
    ids=["seed", "typed", "raw", "rbg"],
)
def test_noisy_sgd_is_optax_for_every_kind_of_key(key):
    params, grads = _tree(jnp.float32)
    # Optax takes a seed or a typed key: a raw key is the data of a default-impl key.
    reference_key = (
        jax.random.wrap_key_data(key)
        if isinstance(key, jax.Array) and key.dtype == jnp.uint32
        else key
    )
    tx = eqopt.noisy_sgd(0.1, eta=0.2, key=key)
    reference = optax.noisy_sgd(0.1, eta=0.2, key=reference_key)
    state, reference_state = tx.init(params), reference.init(params)
    for _ in range(2):
        updates, state = tx.update(grads, state, params)
        reference_updates, reference_state = reference.update(
            grads, reference_state, params
        )
        _assert_same(updates, reference_updates)


def test_seed_is_the_older_name_of_key():
    params, grads = _tree(jnp.float32)
    by_seed, by_key = (
        eqopt.add_noise(0.1, 0.5, seed=4),
        eqopt.add_noise(0.1, 0.5, key=4),
    )
    _assert_same(
        by_seed.update(grads, by_seed.init(params))[0],
        by_key.update(grads, by_key.init(params))[0],
    )
    assert by_seed.key_impl == by_key.key_impl
    with pytest.raises(ValueError, match="key.*seed"):
        eqopt.add_noise(0.1, 0.5, key=1, seed=1)
    with pytest.raises(ValueError, match="key.*seed"):
        eqopt.noisy_sgd(0.1, key=1, seed=1)
    # Default: seed 0, as in Optax.
    _assert_same(eqopt.add_noise(0.1, 0.5).key, jax.random.key_data(jax.random.key(0)))


def test_noise_statistics():
    """Mean zero, variance eta / t**gamma, fresh noise every step and every leaf."""
    eta, gamma, n = 0.5, 0.55, 200_000
    params = {"x": jnp.zeros(n), "y": jnp.zeros(n)}
    tx = eqopt.add_noise(eta, gamma, jax.random.key(11))
    state = tx.init(params)
    previous = None
    for t in range(1, 4):
        noise, state = tx.update(params, state)
        x, y = np.asarray(noise["x"]), np.asarray(noise["y"])
        variance = eta / t**gamma
        # Standard errors: sqrt(var / n) for the mean, var * sqrt(2 / n) for the variance.
        assert abs(x.mean()) < 5 * np.sqrt(variance / n)
        assert abs(x.var() - variance) < 5 * variance * np.sqrt(2 / n)
        assert abs(np.corrcoef(x, y)[0, 1]) < 5 / np.sqrt(n)
        if previous is not None:
            assert abs(np.corrcoef(x, previous)[0, 1]) < 5 / np.sqrt(n)
        previous = x


def test_complex_noise_has_unit_total_variance():
    n = 100_000
    params = {"z": jnp.zeros(n, jnp.complex64)}
    tx = eqopt.add_noise(1.0, 0.0, jax.random.key(0))
    noise, _ = tx.update(params, tx.init(params))
    z = np.asarray(noise["z"])
    np.testing.assert_allclose(np.mean(np.abs(z) ** 2), 1.0, rtol=0.03)
    np.testing.assert_allclose(np.var(z.real), 0.5, rtol=0.03)


def test_jit_and_new_key_without_retrace():
    params, grads = _tree(jnp.float32)
    traces = []

    @eqx.filter_jit
    def step(tx, state):
        traces.append(None)
        return tx.update(grads, state)

    tx = eqopt.add_noise(0.1, 0.55, jax.random.key(1))
    eager, _ = tx.update(grads, tx.init(params))
    jitted, state = step(tx, tx.init(params))
    np.testing.assert_allclose(jitted["a"], eager["a"], rtol=1e-6)
    # A new key is a new array leaf of the same shape: no retrace, other noise.
    other = eqx.tree_at(lambda t: t.key, tx, jax.random.key_data(jax.random.key(2)))
    different, _ = step(other, other.init(params))
    assert len(traces) == 1
    assert not np.allclose(different["a"], jitted["a"])


def test_vmap_over_keys():
    params, grads = _tree(jnp.float32)

    def noise(key):
        tx = eqopt.add_noise(0.1, 0.55, key)
        return tx.update(grads, tx.init(params))[0]["a"]

    keys = jax.random.split(jax.random.key(0), 3)
    batched = jax.vmap(noise)(keys)
    for i in range(3):
        np.testing.assert_allclose(batched[i], noise(keys[i]), rtol=1e-6)


def test_bad_noise_arguments_name_the_argument():
    with pytest.raises(ValueError, match="eta"):
        eqopt.add_noise(-0.1, 0.55, 0)
    with pytest.raises(ValueError, match="gamma"):
        eqopt.noisy_sgd(0.1, gamma=float("nan"))
    with pytest.raises(TypeError, match="key"):
        eqopt.AddNoise(0.1, 0.55, "not a key")
