"""Monte Carlo gradient estimators and control variates, against the closed-form
gradients of Gaussian expectations (there is no Optax oracle: optax.monte_carlo
was removed).

For x ~ N(mu, diag(sigma^2)), sigma = exp(s):
  E[a . x]       = a . mu,                  d/dmu = a,     d/ds = 0;
  E[sum x^2]     = sum(mu^2 + sigma^2),     d/dmu = 2 mu,  d/ds = 2 sigma^2.
Each estimate must be within 5 standard errors of the truth.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest
from helpers import assert_tree_allclose

from eqopt import monte_carlo as mc

MEAN = jnp.array([1.0, -0.5, 0.3])
LOG_SCALE = jnp.array([0.0, -0.5, 0.2])
SCALE = jnp.exp(LOG_SCALE)
WEIGHTS = jnp.array([1.0, 2.0, 3.0])
NUM_SAMPLES = 2000


def linear(x):
    return jnp.sum(WEIGHTS * x)


def quadratic(x):
    return jnp.sum(x**2)


TRUTH = {
    "linear": [WEIGHTS, jnp.zeros(3)],
    "quadratic": [2 * MEAN, 2 * SCALE**2],
}


def assert_unbiased(jacobians, truth, num_sigmas=5.0):
    assert len(jacobians) == len(truth)
    for jacobian, expected in zip(jacobians, truth, strict=True):
        assert jacobian.shape == (NUM_SAMPLES,) + expected.shape
        mean = np.asarray(jnp.mean(jacobian, axis=0))
        standard_error = np.asarray(jnp.std(jacobian, axis=0)) / np.sqrt(NUM_SAMPLES)
        bound = num_sigmas * standard_error + 1e-4  # exact estimators have zero SE
        assert np.all(np.abs(mean - np.asarray(expected)) < bound), (
            mean,
            expected,
            bound,
        )


def total_variance(jacobians):
    return sum(float(jnp.sum(jnp.var(j, axis=0))) for j in jacobians)


def test_multi_normal():
    dist = mc.multi_normal(MEAN, LOG_SCALE)
    assert dist.params[0] is MEAN and dist.params[1] is LOG_SCALE
    assert_tree_allclose(dist.scale, SCALE)
    samples = dist.sample((NUM_SAMPLES,), jax.random.PRNGKey(0))
    assert samples.shape == (NUM_SAMPLES, 3)
    standard_error = SCALE / np.sqrt(NUM_SAMPLES)
    assert np.all(np.abs(samples.mean(0) - MEAN) < 5 * standard_error)
    x = jnp.array([[0.1, 0.2, 0.3], [1.0, -1.0, 0.0]])
    expected = jnp.sum(
        -0.5 * ((x - MEAN[None]) / SCALE[None]) ** 2
        - LOG_SCALE[None]
        - 0.5 * np.log(2 * np.pi),
        axis=-1,
    )
    assert_tree_allclose(dist.log_prob(x), expected)
    assert dist.log_prob(x[0]).shape == ()
    # log_scale broadcasts against loc.
    shared = mc.multi_normal(MEAN, jnp.array(0.5))
    assert shared.sample((2,), jax.random.PRNGKey(1)).shape == (2, 3)
    with pytest.raises(ValueError, match="Incompatible shapes for broadcasting"):
        mc.multi_normal(MEAN, jnp.zeros(2))
    with pytest.raises(ValueError, match="event shape"):
        dist.log_prob(jnp.zeros((2, 4)))


ESTIMATORS = {
    "score_function": mc.score_function_jacobians,
    "pathwise": mc.pathwise_jacobians,
    "measure_valued": mc.measure_valued_jacobians,
}


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_estimators_are_unbiased(name):
    estimator = ESTIMATORS[name]

    @eqx.filter_jit
    def both(params, key):
        return {
            f.__name__: estimator(f, params, mc.multi_normal, key, NUM_SAMPLES)
            for f in (linear, quadratic)
        }

    results = both([MEAN, LOG_SCALE], jax.random.PRNGKey(2))
    for function_name, jacobians in results.items():
        assert isinstance(jacobians, list)
        assert_unbiased(jacobians, TRUTH[function_name])


@pytest.mark.parametrize("coupling", [True, False])
def test_measure_valued_components(coupling):
    # Per coordinate, with respect to the mean and to sigma itself.
    dist = mc.multi_normal(MEAN, LOG_SCALE)
    key = jax.random.PRNGKey(3)
    run = eqx.filter_jit(
        lambda dist, key: (
            mc.measure_valued_estimation_mean(
                quadratic, dist, key, NUM_SAMPLES, coupling
            ),
            mc.measure_valued_estimation_std(
                quadratic, dist, key, NUM_SAMPLES, coupling
            ),
        )
    )
    mean_grads, std_grads = run(dist, key)
    # With respect to sigma itself: d/dsigma E[sum x^2] = 2 sigma.
    assert_unbiased([mean_grads, std_grads], [2 * MEAN, 2 * SCALE])
    with pytest.raises(jaxtyping.TypeCheckError):
        mc.measure_valued_estimation_mean(quadratic, object(), key, 10)


def test_coupling_reduces_variance():
    dist = mc.multi_normal(MEAN, LOG_SCALE)
    key = jax.random.PRNGKey(4)
    estimate = eqx.filter_jit(mc.measure_valued_estimation_mean)
    coupled = estimate(quadratic, dist, key, NUM_SAMPLES, True)
    independent = estimate(quadratic, dist, key, NUM_SAMPLES, False)
    assert total_variance([coupled]) < total_variance([independent])


def test_measure_valued_needs_a_gaussian():
    def not_gaussian(loc, log_scale):
        return object()

    with pytest.raises(ValueError, match="diagonal Gaussian"):
        mc.measure_valued_jacobians(
            quadratic, [MEAN, LOG_SCALE], not_gaussian, jax.random.PRNGKey(0), 10
        )


def test_delta_method_reduces_score_function_variance():
    params = [MEAN, LOG_SCALE]
    key = jax.random.PRNGKey(5)
    # A quartic: the quadratic Taylor control variate helps but is not exact.
    quartic = lambda x: jnp.sum(x**2) + 0.1 * jnp.sum(x**4)
    run = eqx.filter_jit(
        lambda params, key: (
            mc.score_function_jacobians(
                quartic, params, mc.multi_normal, key, NUM_SAMPLES
            ),
            mc.control_variates_jacobians(
                quartic,
                mc.control_delta_method,
                mc.score_function_jacobians,
                params,
                mc.multi_normal,
                key,
                NUM_SAMPLES,
            ),
        )
    )
    plain, (controlled, state) = run(params, key)
    assert state is None
    # E x^4 = mu^4 + 6 mu^2 s^2 + 3 s^4, so:
    truth = [
        2 * MEAN + 0.1 * (4 * MEAN**3 + 12 * MEAN * SCALE**2),
        2 * SCALE**2 + 0.1 * (12 * MEAN**2 * SCALE**2 + 12 * SCALE**4),
    ]
    assert_unbiased(plain, truth)
    assert_unbiased(controlled, truth)
    assert total_variance(controlled) < 0.2 * total_variance(plain)


def test_delta_method_values():
    cv, expected_value, update_state = mc.control_delta_method(quadratic)
    params = [MEAN, LOG_SCALE]
    x = jnp.array([0.5, 0.5, -1.0])
    # The Taylor expansion of a quadratic is the quadratic itself.
    assert_tree_allclose(cv(params, x), quadratic(x))
    assert_tree_allclose(expected_value(params, None), jnp.sum(MEAN**2 + SCALE**2))
    assert update_state(params, x[None], "state") == "state"


def test_moving_average_baseline():
    samples = jnp.array([[1.0, 0.0, 0.0], [3.0, 0.0, 0.0]])  # mean of linear: 2.0
    params = [MEAN, LOG_SCALE]
    plain = mc.moving_avg_baseline(
        linear, decay=0.9, zero_debias=False, use_decay_early_training_heuristic=False
    )
    cv, expected_value, update_state = plain
    value, count = update_state(params, samples, (jnp.array(1.0), 0))
    assert_tree_allclose(value, 0.9 * 1.0 + 0.1 * 2.0)
    assert count == 1
    assert_tree_allclose(cv(params, samples[0], (value, count)), value)
    assert_tree_allclose(expected_value(params, (value, count)), value)
    # With the early-training heuristic the decay at step 0 is 1/10.
    early = mc.moving_avg_baseline(linear, decay=0.9, zero_debias=False)
    value, _ = early.update_state(params, samples, (jnp.array(1.0), 0))
    assert_tree_allclose(value, 0.1 * 1.0 + 0.9 * 2.0)
    # Zero-debiasing divides by 1 - decay^(t + 1), and stays finite at decay 1.
    debiased = mc.moving_avg_baseline(
        linear, decay=0.5, use_decay_early_training_heuristic=False
    )
    value, _ = debiased.update_state(params, samples, (jnp.array(0.0), 0))
    assert_tree_allclose(value, 2.0)
    frozen = mc.moving_avg_baseline(
        linear, decay=1.0, use_decay_early_training_heuristic=False
    )
    value, _ = frozen.update_state(params, samples, (jnp.array(3.0), 0))
    assert_tree_allclose(value, 3.0)
    # The decay is an array leaf (a weakly-typed JAX scalar).
    assert eqx.is_array(plain.decay) and plain.decay.weak_type


def test_moving_average_baseline_with_score_function():
    params = [MEAN, LOG_SCALE]
    builder = functools.partial(mc.moving_avg_baseline, decay=0.5)
    state = (jnp.array(0.0), 0)

    @eqx.filter_jit
    def step(params, key, state):
        return mc.control_variates_jacobians(
            quadratic,
            builder,
            mc.score_function_jacobians,
            params,
            mc.multi_normal,
            key,
            NUM_SAMPLES,
            state,
        )

    keys = jax.random.split(jax.random.PRNGKey(6), 3)
    for key in keys:
        jacobians, state = step(params, key, state)
        assert_unbiased(jacobians, TRUTH["quadratic"])
    # The baseline has learnt E f = sum(mu^2 + sigma^2) and reduces the variance.
    np.testing.assert_allclose(state[0], jnp.sum(MEAN**2 + SCALE**2), rtol=0.1)
    plain = mc.score_function_jacobians(
        quadratic, params, mc.multi_normal, keys[-1], NUM_SAMPLES
    )
    assert total_variance(jacobians) < total_variance(plain)


def test_control_variate_coefficients():
    params = [MEAN, LOG_SCALE]
    key = jax.random.PRNGKey(7)
    # The delta method is exact for a quadratic: the best coefficient is one.
    coefficients = eqx.filter_jit(mc.estimate_control_variate_coefficients)(
        quadratic,
        mc.control_delta_method,
        mc.pathwise_jacobians,
        params,
        mc.multi_normal,
        key,
        50,
    )
    assert len(coefficients) == 2
    np.testing.assert_allclose(coefficients, [1.0, 1.0], rtol=1e-2)
    jacobians, _ = eqx.filter_jit(mc.control_variates_jacobians)(
        linear,
        mc.control_delta_method,
        mc.pathwise_jacobians,
        params,
        mc.multi_normal,
        key,
        NUM_SAMPLES,
        None,
        True,
        50,
    )
    assert_unbiased(jacobians, TRUTH["linear"])


def test_optax_style_control_variate_tuple():
    # A control variate given as Optax's tuple of three functions: a constant
    # baseline b, with E b = b.
    def constant_baseline(function):
        del function
        return (lambda p, x, s: 4.0, lambda p, s: 4.0, lambda p, xs, s: s)

    params = [MEAN, LOG_SCALE]
    key = jax.random.PRNGKey(8)
    jacobians, state = mc.control_variates_jacobians(
        quadratic,
        constant_baseline,
        mc.score_function_jacobians,
        params,
        mc.multi_normal,
        key,
        NUM_SAMPLES,
        "unchanged",
    )
    assert state == "unchanged"
    plain = mc.score_function_jacobians(
        quadratic, params, mc.multi_normal, key, NUM_SAMPLES
    )
    # Score function with a constant baseline: (f - b) grad log p, exactly.
    for with_cv, without in zip(jacobians, plain, strict=True):
        score = (
            without
            / jax.vmap(quadratic)(mc.multi_normal(*params).sample((NUM_SAMPLES,), key))[
                :, None
            ]
        )
        assert_tree_allclose(with_cv, without - 4.0 * score, rtol=1e-3, atol=1e-3)


def test_errors():
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="num_samples"):
        mc.score_function_jacobians(
            quadratic, [MEAN, LOG_SCALE], mc.multi_normal, key, 0
        )
    with pytest.raises(ValueError, match="at least one"):
        mc.pathwise_jacobians(quadratic, [], mc.multi_normal, key, 10)
    with pytest.raises(jaxtyping.TypeCheckError):
        mc.pathwise_jacobians(quadratic, [MEAN, LOG_SCALE], mc.multi_normal, key, 2.5)


def test_top_level_multi_normal_is_optax():
    """`eqopt.multi_normal` is Optax 0.2.8's `optax.multi_normal`: same samples
    for the same key (given as `key`, Optax's name), same log-density."""
    import optax

    import eqopt

    loc, log_scale = jnp.array([0.0, 1.0, 2.0]), jnp.array([0.1, 0.2, -0.3])
    ours, theirs = (
        eqopt.multi_normal(loc, log_scale),
        optax.multi_normal(loc, log_scale),
    )
    key = jax.random.key(0)
    x = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
    with jax.numpy_rank_promotion("allow"):  # Optax broadcasts implicitly
        their_samples = theirs.sample((4,), key=key)
        their_log_prob = theirs.log_prob(x)
    np.testing.assert_allclose(ours.sample((4,), key=key), their_samples, rtol=1e-6)
    np.testing.assert_allclose(ours.sample((4,), key), ours.sample((4,), seed=key))
    np.testing.assert_allclose(ours.log_prob(x), their_log_prob, rtol=1e-6)
    np.testing.assert_allclose(ours.params[1], theirs.params[1])
    assert eqopt.multi_normal is mc.multi_normal
    with pytest.raises(TypeError, match="give the random key once"):
        ours.sample((4,))


@pytest.mark.parametrize(
    "loc_shape, scale_shape", [(2, 3), ((2, 3), (3, 2)), ((1, 2, 1, 3), (2, 1, 4, 4))]
)
def test_multi_normal_refuses_shapes_that_do_not_broadcast(loc_shape, scale_shape):
    """A `ValueError` saying so, as Optax raises (and a `TypeError`)."""
    loc, log_scale = jnp.zeros(loc_shape), jnp.zeros(scale_shape)
    for error in (ValueError, TypeError):
        with pytest.raises(error, match="Incompatible shapes for broadcasting"):
            mc.multi_normal(loc, log_scale)
    assert mc.multi_normal(jnp.zeros((2, 3)), jnp.zeros(3)).param_shape == (2, 3)
