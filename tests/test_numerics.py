"""Numerics shared by the transforms (`eqopt/_numerics.py`): safe norms, counters,
moments, bias correction."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import assert_tree_allclose

import eqopt

TREE = {
    "a": jnp.array([1.0, -2.0, 3.0]),
    "b": jnp.array([[0.5, 0.0], [-1.5, 2.0]]),
}

OTHER = {"a": jnp.array([0.1, 0.2, -0.3]), "b": jnp.array([[1.0, -1.0], [0.0, 0.25]])}


def test_numerics_match_optax():
    assert_tree_allclose(eqopt.global_norm(TREE), optax.global_norm(TREE))
    x = TREE["b"]
    for min_norm in (0.0, 1.0, 10.0):
        assert_tree_allclose(eqopt.safe_norm(x, min_norm), optax.safe_norm(x, min_norm))
        assert_tree_allclose(
            eqopt.safe_norm(x, min_norm, axis=1), optax.safe_norm(x, min_norm, axis=1)
        )
        assert_tree_allclose(
            eqopt.safe_root_mean_squares(x, min_norm),
            optax.safe_root_mean_squares(x, min_norm),
        )
    for count in (jnp.asarray(3, jnp.int32), jnp.asarray(2**31 - 1, jnp.int32)):
        assert eqopt.safe_int32_increment(count) == optax.safe_int32_increment(count)
        assert eqopt.safe_increment(count) == optax.safe_increment(count)
    assert eqopt.safe_increment(jnp.asarray(2.0)) == 3.0
    count = jnp.asarray(4, jnp.int32)
    assert_tree_allclose(
        eqopt.bias_correction(TREE, 0.9, count), optax.bias_correction(TREE, 0.9, count)
    )
    for order in (1, 2, 3):
        assert_tree_allclose(
            eqopt.update_moment(OTHER, TREE, 0.9, order),
            optax.update_moment(OTHER, TREE, 0.9, order),
        )
        assert_tree_allclose(
            eqopt.update_moment_per_elem_norm(OTHER, TREE, 0.9, order),
            optax.update_moment_per_elem_norm(OTHER, TREE, 0.9, order),
        )
    assert_tree_allclose(
        eqopt.update_infinity_moment(OTHER, TREE, 0.9, 1e-3),
        optax.update_infinity_moment(OTHER, TREE, 0.9, 1e-3),
    )


def test_safe_norm_gradient_is_finite_at_zero():
    grad = jax.grad(lambda x: eqopt.safe_norm(x, 1e-6))(jnp.zeros(3))
    assert np.all(np.isfinite(grad)) and np.all(grad == 0)


def test_global_norm_of_whole_model_ignores_non_arrays():
    model = eqx.nn.MLP(2, 2, 3, 1, key=jax.random.key(0))
    expected = optax.global_norm(eqx.filter(model, eqx.is_array))
    assert_tree_allclose(eqopt.global_norm(model), expected)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "int8", "float16"])
def test_safe_increment_saturates_every_counter_dtype(dtype):
    """Unsigned counters too: the maximum of `uint32` is compared in the
    counter's dtype (as a Python int it overflowed `int32` under `jit`)."""
    increment = jax.jit(eqopt.safe_increment)
    assert int(increment(jnp.asarray(3, dtype))) == 4
    info = jnp.iinfo(dtype) if "int" in dtype else jnp.finfo(dtype)
    top = jnp.asarray(info.max, dtype)
    assert increment(top) == top and increment(top).dtype == jnp.dtype(dtype)


@pytest.mark.parametrize("dtype", ["bool", "complex64"])
def test_safe_increment_refuses_what_is_no_counter(dtype):
    with pytest.raises(ValueError, match="safe_increment"):
        eqopt.safe_increment(jnp.asarray(1, dtype))


def test_moment_updates_take_integer_decays():
    """`decay=1` and `eps=0` as Python ints, as Optax's tests pass them."""
    g, m = {"a": jnp.array([2.0, -3.0])}, {"a": jnp.array([1.0, 1.0])}
    for ours, theirs in (
        (eqopt.update_moment(g, m, 1, 2), optax.tree.update_moment(g, m, 1, 2)),
        (
            eqopt.update_infinity_moment(g, m, 1, 0),
            optax.tree.update_infinity_moment(g, m, 1, 0),
        ),
    ):
        assert_tree_allclose(ours, theirs)
