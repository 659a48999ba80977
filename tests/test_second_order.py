"""hvp, hessian_diag and fisher_diag: parity with optax.second_order, closed
forms, and Equinox models with non-array leaves."""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from helpers import assert_tree_allclose
from jax.flatten_util import ravel_pytree

from eqopt import second_order


def _optax(name, loss, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optax.second_order is deprecated
        # Jitted: one compilation is cheaper than Optax's op-by-op dispatch.
        return jax.jit(getattr(optax.second_order, name), static_argnums=0)(loss, *args)


def _mlp_loss(params, inputs, targets):
    hidden = jnp.tanh(inputs @ params["w1"] + params["b1"][None])
    logits = hidden @ params["w2"]
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))


@pytest.fixture
def problem():
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {
        "w1": 0.5 * jax.random.normal(keys[0], (3, 4)),
        "b1": jnp.zeros(4),
        "w2": 0.5 * jax.random.normal(keys[1], (4, 2)),
    }
    inputs = jax.random.normal(keys[2], (8, 3))
    targets = jax.random.randint(keys[3], (8,), 0, 2)
    return params, inputs, targets


def test_hvp_parity(problem):
    params, inputs, targets = problem
    v = jax.random.normal(jax.random.PRNGKey(1), (ravel_pytree(params)[0].size,))
    expected = _optax("hvp", _mlp_loss, v, params, inputs, targets)
    ours = second_order.hvp(_mlp_loss, v, params, inputs, targets)
    assert_tree_allclose(ours, expected)
    # A pytree `v` gives the same product.
    v_tree = ravel_pytree(params)[1](v)
    assert_tree_allclose(
        second_order.hvp(_mlp_loss, v_tree, params, inputs, targets), expected
    )


@pytest.mark.parametrize("batch_size", [5, 128])
def test_hessian_diag_parity(problem, batch_size):
    params, inputs, targets = problem
    expected = _optax("hessian_diag", _mlp_loss, params, inputs, targets)
    ours = second_order.hessian_diag(
        _mlp_loss, params, inputs, targets, batch_size=batch_size
    )
    assert jax.tree.structure(ours) == jax.tree.structure(params)
    assert_tree_allclose(ravel_pytree(ours)[0], expected)


def test_fisher_diag_parity(problem):
    params, inputs, targets = problem
    expected = _optax("fisher_diag", _mlp_loss, params, inputs, targets)
    ours = second_order.fisher_diag(_mlp_loss, params, inputs, targets)
    assert_tree_allclose(ravel_pytree(ours)[0], expected)
    gradient = jax.grad(_mlp_loss)(params, inputs, targets)
    assert_tree_allclose(ours, jax.tree.map(jnp.square, gradient))


def test_closed_form_quadratic():
    # L(x) = 1/2 x^T A x + sum(x^3) / 3 has Hessian A + diag(2x).
    a = jnp.array([[2.0, 1.0, 0.0], [1.0, 3.0, -1.0], [0.0, -1.0, 4.0]])
    x = jnp.array([0.5, -1.0, 2.0])
    loss = lambda p, _, __: 0.5 * p @ a @ p + jnp.sum(p**3) / 3
    assert_tree_allclose(
        second_order.hessian_diag(loss, x, None, None), jnp.diag(a) + 2 * x
    )
    v = jnp.array([1.0, 0.0, -2.0])
    assert_tree_allclose(
        second_order.hvp(loss, v, x, None, None), (a + jnp.diag(2 * x)) @ v
    )
    assert_tree_allclose(
        second_order.fisher_diag(loss, x, None, None), (a @ x + x**2) ** 2
    )


def test_equinox_model():
    model = eqx.nn.MLP(
        3, 2, 4, 1, activation=jax.nn.softplus, key=jax.random.PRNGKey(2)
    )
    inputs = jax.random.normal(jax.random.PRNGKey(3), (5, 3))
    targets = jax.random.normal(jax.random.PRNGKey(4), (5, 2))

    def loss(model, inputs, targets):
        return jnp.mean((jax.vmap(model)(inputs) - targets) ** 2)

    params, static = eqx.partition(model, eqx.is_inexact_array)
    params_loss = lambda p, x, y: loss(eqx.combine(p, static), x, y)

    diag = eqx.filter_jit(second_order.hessian_diag)(loss, model, inputs, targets)
    # Shaped like the model, None at the activation functions.
    assert jax.tree.structure(diag) == jax.tree.structure(params)
    assert diag.activation is None and diag.final_activation is None
    expected = _optax("hessian_diag", params_loss, params, inputs, targets)
    assert_tree_allclose(ravel_pytree(diag)[0], expected)

    fisher = eqx.filter_jit(second_order.fisher_diag)(loss, model, inputs, targets)
    expected = _optax("fisher_diag", params_loss, params, inputs, targets)
    assert_tree_allclose(ravel_pytree(fisher)[0], expected)

    # `v` may be an eqx.filter_grad gradient (None at non-trainable leaves).
    v = eqx.filter_grad(loss)(model, inputs, targets)
    product = eqx.filter_jit(second_order.hvp)(loss, v, model, inputs, targets)
    flat_v = ravel_pytree(eqx.filter(v, eqx.is_inexact_array))[0]
    expected = _optax("hvp", params_loss, flat_v, params, inputs, targets)
    assert_tree_allclose(product, expected)


def test_errors(problem):
    params, inputs, targets = problem
    with pytest.raises(ValueError, match="no inexact-array leaves"):
        second_order.hessian_diag(_mlp_loss, {"n": 3, "f": jnp.tanh}, inputs, targets)
    with pytest.raises(ValueError, match="flat vector of size 5"):
        second_order.hvp(_mlp_loss, jnp.ones(5), params, inputs, targets)
    bad = dict(params, b1=jnp.zeros(3))
    with pytest.raises(ValueError, match=r"shape \(3,\) at \['b1'\]"):
        second_order.hvp(_mlp_loss, bad, params, inputs, targets)
    with pytest.raises(ValueError, match="structure"):
        second_order.hvp(_mlp_loss, {"w1": params["w1"]}, params, inputs, targets)
    with pytest.raises(ValueError, match="batch_size"):
        second_order.hessian_diag(_mlp_loss, params, inputs, targets, batch_size=0)
