"""make_perturbed_fun, Normal and Gumbel: parity with optax.perturbations (same
random numbers for the same key), closed forms, and Equinox behaviour."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import optax
import pytest
from helpers import assert_tree_allclose

import eqopt
from eqopt import perturbations

NOISES = [
    (perturbations.Normal(), optax.perturbations.Normal()),
    (perturbations.Gumbel(), optax.perturbations.Gumbel()),
]


@pytest.mark.parametrize("ours, theirs", NOISES)
def test_noise_parity(ours, theirs):
    key = jax.random.PRNGKey(0)
    for dtype in (jnp.float32, jnp.bfloat16):
        sample = ours.sample(key, (4, 3), dtype)
        assert sample.dtype == dtype
        assert_tree_allclose(sample, theirs.sample(key, (4, 3), dtype))
    z = jnp.linspace(-2.0, 3.0, 7)
    assert_tree_allclose(ours.log_prob(z), theirs.log_prob(z))
    assert ours.sample(key).shape == ()


def _objective(x):
    # Piecewise linear in the inputs, with a non-differentiable argmax output.
    return {
        "relu": jnp.sum(jnp.maximum(x["a"], 0.0)) + x["b"],
        "argmax": jax.nn.one_hot(jnp.argmax(x["a"]), x["a"].shape[0]),
    }


def _value_and_jacobian(perturbed):
    return jax.jit(
        lambda key, x: (perturbed(key, x), jax.jacobian(perturbed, 1)(key, x))
    )


@pytest.mark.parametrize("index, use_baseline", [(0, False), (1, True)])
def test_make_perturbed_fun_parity(index, use_baseline):
    ours_noise, their_noise = NOISES[index]
    key = jax.random.PRNGKey(1)
    x = {"a": jnp.array([0.3, -0.2, 0.25]), "b": jnp.array(1.5)}
    ours = perturbations.make_perturbed_fun(
        _objective, 64, 0.5, ours_noise, use_baseline
    )
    theirs = optax.perturbations.make_perturbed_fun(
        _objective, 64, 0.5, their_noise, use_baseline
    )
    assert_tree_allclose(
        _value_and_jacobian(ours)(key, x),
        _value_and_jacobian(theirs)(key, x),
        atol=1e-5,
    )


def test_defaults_match_optax():
    key = jax.random.PRNGKey(2)
    x = jnp.array([0.0, 0.0, 0.0])
    f = lambda x: jnp.sum(jnp.maximum(x, 0.0))
    ours = perturbations.make_perturbed_fun(f)
    theirs = optax.perturbations.make_perturbed_fun(f)
    assert ours.num_samples == 1000 and ours.use_baseline
    assert isinstance(ours.noise, perturbations.Gumbel)
    grad = jax.jit(jax.grad(ours, argnums=1))(key, x)
    assert_tree_allclose(grad, jax.jit(jax.grad(theirs, argnums=1))(key, x), atol=1e-5)


def test_gumbel_argmax_is_softmax():
    # E[one_hot(argmax(x + sigma G))] = softmax(x / sigma) for Gumbel noise G.
    x = jnp.array([0.2, -0.1, 0.4, 0.0])
    sigma = 0.3
    num_samples = 4000
    argmax = lambda x: jax.nn.one_hot(jnp.argmax(x), x.shape[0])
    estimate = perturbations.make_perturbed_fun(argmax, num_samples, sigma)(
        jax.random.PRNGKey(3), x
    )
    truth = jax.nn.softmax(x / sigma)
    standard_error = np.sqrt(truth * (1 - truth) / num_samples)
    assert np.all(np.abs(estimate - truth) < 5 * standard_error)


def test_normal_smoothing_gradient_closed_form():
    # f(x) = sum(max(x, 0)): the Gaussian-smoothed gradient is Phi(x / sigma).
    x = jnp.array([-0.05, 0.0, 0.1])
    sigma, num_samples = 0.1, 4000
    relu_sum = lambda x: jnp.sum(jnp.maximum(x, 0.0))
    perturbed = perturbations.make_perturbed_fun(
        relu_sum, num_samples, sigma, perturbations.Normal()
    )
    keys = jax.random.split(jax.random.PRNGKey(4), 8)
    grads = jax.jit(jax.vmap(jax.grad(perturbed, argnums=1), in_axes=(0, None)))(
        keys, x
    )
    truth = jax.scipy.stats.norm.cdf(x / sigma)
    mean = jnp.mean(grads, axis=0)
    standard_error = jnp.std(grads, axis=0) / np.sqrt(len(keys))
    assert np.all(np.abs(mean - truth) < 5 * standard_error + 1e-3)


class _Scorer(eqx.Module):
    weight: jax.Array
    activation: object  # a non-array leaf
    name: str = eqx.field(static=True)

    def __call__(self, x):
        return self.activation(self.weight * x)


def test_sigma_is_a_dynamic_leaf_and_module_inputs():
    scorer = _Scorer(jnp.array([1.0, -0.5, 0.2]), jnp.tanh, "scorer")
    argmax = lambda model: jax.nn.one_hot(jnp.argmax(model(jnp.ones(3))), 3)
    perturbed = perturbations.make_perturbed_fun(argmax, 16, 0.1)
    traces = []

    @eqx.filter_jit
    @eqx.filter_grad
    def grads(perturbed_and_model, key):
        traces.append(None)
        perturbed, model = perturbed_and_model
        return perturbed(key, model)[0]

    key = jax.random.PRNGKey(6)
    d_perturbed, d_scorer = grads((perturbed, scorer), key)
    changed = eqx.tree_at(lambda p: p.sigma, perturbed, eqopt.as_scalar(0.2))
    grads((changed, scorer), key)
    assert len(traces) == 1  # a new sigma is a new leaf value, not a recompile
    assert jnp.isfinite(d_perturbed.sigma)
    assert d_scorer.activation is None
    assert jnp.all(jnp.isfinite(d_scorer.weight))


def test_errors():
    f = lambda x: x
    with pytest.raises(ValueError, match="num_samples"):
        perturbations.make_perturbed_fun(f, num_samples=0)
    with pytest.raises(TypeError, match="log_prob"):
        perturbations.make_perturbed_fun(f, noise="gumbel")
    with pytest.raises(ValueError, match="no inexact-array leaves"):
        perturbations.make_perturbed_fun(f)(jax.random.PRNGKey(0), {"n": 3})
    with pytest.raises(jaxtyping.TypeCheckError):
        perturbations.Normal().log_prob(jnp.arange(3))


def test_perturbed_function_jits_as_a_function():
    """`jax.jit(perturbations.make_perturbed_fun(...))`, as in Optax: the function hashes by
    identity (its `sigma` is an array), and gives the eager values."""
    perturbed = perturbations.make_perturbed_fun(
        lambda x: jnp.sum(x**2), num_samples=10, sigma=0.1
    )
    jitted = jax.jit(perturbed)
    key, x = jax.random.key(0), jnp.ones(3)
    np.testing.assert_allclose(jitted(key, x), perturbed(key, x), rtol=1e-6)
    assert hash(perturbed) == id(
        perturbed
    ) and perturbed != perturbations.make_perturbed_fun(
        lambda x: jnp.sum(x**2), num_samples=10, sigma=0.1
    )
