r"""Monte Carlo estimators of $\nabla_\theta\, \mathbb E_{x \sim p(x;\theta)} f(x)$.

Each estimator returns, for every parameter, one gradient estimate per sample
(a "Jacobian" of shape `(num_samples,) + param.shape`): its mean over the first
axis is the gradient estimate, and its spread measures the estimator's variance.
$f$ must not depend on $\theta$ except through the samples: if it does, pass it
with `jax.lax.stop_gradient` on $\theta$ and add the direct term yourself.
"""

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._typecheck import checked
from ._distributions import MultiNormalDiagFromLogScale

#: The function $f$ of one sample, returning a real scalar.
SampleFn: TypeAlias = Callable[[Float[Array, "..."]], Float[ArrayLike, ""]]
#: Builds a distribution from the parameters: `dist_builder(*params)`.
DistBuilder: TypeAlias = Callable[..., Any]


def _check(params: Sequence[Any], num_samples: int) -> list[Array]:
    if num_samples < 1:
        raise ValueError(f"`num_samples` must be positive, got {num_samples}.")
    params = list(params)
    if not params:
        raise ValueError("`params` must hold at least one array.")
    return params


def _per_sample(values: Array, like: Array) -> Array:
    """Reshapes a `(N,)` vector to broadcast against a `(N, *shape)` array."""
    return values.reshape(values.shape + (1,) * (like.ndim - 1))


@checked
def score_function_jacobians(
    function: SampleFn,
    params: Sequence[Float[Array, "..."]],
    dist_builder: DistBuilder,
    rng: PRNGKeyArray,
    num_samples: int,
) -> list[Float[Array, "num_samples ..."]]:
    r"""Estimates the gradient of an expectation with the score function (REINFORCE) estimator.

    $$ \nabla_\theta\, \mathbb E_{p(x;\theta)} f(x)
       = \mathbb E_{p(x;\theta)}\big[f(x)\, \nabla_\theta \log p(x;\theta)\big]
       \approx \frac1N \sum_{n=1}^N f(x_n)\, \nabla_\theta \log p(x_n;\theta) $$

    It needs only values of $f$ (which may be discontinuous, and $x$ may be
    discrete) and a differentiable log-density; its variance is often high, see
    `eqopt.monte_carlo.control_variates_jacobians`.

    **Arguments:**

    - `function`: $f$, taking one sample and returning a real scalar. It is
      `vmap`ped over samples, so it need not be vectorised.
    - `params`: a sequence of arrays, the parameters $\theta$.
    - `dist_builder`: builds the distribution, `dist_builder(*params)`, with
      `sample(shape, seed)` and `log_prob(x)` methods, such as
      `eqopt.monte_carlo.multi_normal`.
    - `rng`: the random key for the samples.
    - `num_samples`: the number of samples $N$.

    **Returns:** a list with one array per parameter, of shape
    `(num_samples,) + param.shape`: the per-sample estimates.

    **References:** R. J. Williams, *Simple statistical gradient-following
    algorithms for connectionist reinforcement learning*, Machine Learning 8,
    1992; S. Mohamed, M. Rosca, M. Figurnov and A. Mnih, *Monte Carlo Gradient
    Estimation in Machine Learning*, JMLR 21(132), 2020, §4.
    """
    params = _check(params, num_samples)
    samples = jax.lax.stop_gradient(
        dist_builder(*params).sample((num_samples,), seed=rng)
    )
    values = jnp.asarray(jax.vmap(function)(samples))

    def log_prob(params, sample):
        return dist_builder(*params).log_prob(sample)

    scores = jax.vmap(jax.grad(log_prob), in_axes=(None, 0))(params, samples)
    return [_per_sample(values, score) * score for score in scores]


@checked
def pathwise_jacobians(
    function: SampleFn,
    params: Sequence[Float[Array, "..."]],
    dist_builder: DistBuilder,
    rng: PRNGKeyArray,
    num_samples: int,
) -> list[Float[Array, "num_samples ..."]]:
    r"""Estimates the gradient of an expectation with the pathwise (reparameterisation) estimator.

    With samples written as $x = g(\varepsilon;\theta)$, $\varepsilon \sim p(\varepsilon)$,

    $$ \nabla_\theta\, \mathbb E_{p(x;\theta)} f(x)
       = \mathbb E_{p(\varepsilon)}\big[\nabla_x f(x)\big|_{x = g(\varepsilon;\theta)}\,
         \nabla_\theta g(\varepsilon;\theta)\big]. $$

    It needs $f$ to be differentiable and the distribution's `sample` to be
    differentiable with respect to its parameters; its variance is usually low.

    **Arguments:**

    - `function`: $f$, taking one sample and returning a real scalar.
    - `params`: a sequence of arrays, the parameters $\theta$.
    - `dist_builder`: builds the distribution, `dist_builder(*params)`, whose
      `sample(shape, seed)` is differentiable in the parameters.
    - `rng`: the random key for the samples.
    - `num_samples`: the number of samples.

    **Returns:** a list with one array per parameter, of shape
    `(num_samples,) + param.shape`: the per-sample estimates.

    **References:** D. P. Kingma and M. Welling, *Auto-Encoding Variational
    Bayes*, ICLR 2014; S. Mohamed et al., *Monte Carlo Gradient Estimation in
    Machine Learning*, JMLR 2020, §5.
    """
    params = _check(params, num_samples)

    def sampled_values(params):
        samples = dist_builder(*params).sample((num_samples,), seed=rng)
        return jax.vmap(function)(samples)

    # Forward mode: one pass per parameter entry, each giving all samples at once.
    return list(jax.jacfwd(sampled_values)(params))


def _coordinatewise_values(
    function: SampleFn, samples: Array, replacements: Array
) -> Array:
    """`out[n, d] = f(samples[n] with entry d replaced by replacements[n, d])`."""
    num_samples = samples.shape[0]
    event_shape = samples.shape[1:]
    size = int(np.prod(event_shape))
    base = samples.reshape(num_samples, 1, size)
    diagonal = replacements.reshape(num_samples, size, 1)
    eye = jnp.eye(size, dtype=bool).reshape(1, size, size)
    points = jnp.where(eye, diagonal, base)  # (N, D, D): row d replaces entry d
    one_point = lambda x: function(x.reshape(event_shape))
    values = jnp.asarray(jax.vmap(jax.vmap(one_point))(points))
    return values.reshape(samples.shape)


def _check_gaussian(dist: Any) -> None:
    if not isinstance(dist, MultiNormalDiagFromLogScale):
        raise ValueError(
            "Measure-valued gradients are implemented for the diagonal Gaussian of "
            "`eqopt.monte_carlo.multi_normal` only, got "
            f"{type(dist).__name__}."
        )


@checked
def measure_valued_estimation_mean(
    function: SampleFn,
    dist: MultiNormalDiagFromLogScale,
    rng: PRNGKeyArray,
    num_samples: int,
    coupling: bool = True,
) -> Float[Array, " num_samples *shape"]:
    r"""Estimates the gradient of a Gaussian expectation with respect to the mean, by measure-valued derivatives.

    The derivative of $\mathcal N(x_d;\mu_d,\sigma_d^2)$ in $\mu_d$ is a
    difference of two Weibull-shifted measures, so

    $$ \frac{\partial}{\partial \mu_d} \mathbb E f(x) = \frac{1}{\sqrt{2\pi}\,\sigma_d}
       \Big(\mathbb E f\big(x^{(d)}_{\mu_d + \sigma_d w}\big) -
            \mathbb E f\big(x^{(d)}_{\mu_d - \sigma_d w'}\big)\Big),
       \quad w, w' \sim \operatorname{Weibull}(\sqrt2, 2), $$

    where $x^{(d)}_{y}$ is a sample $x$ with its entry $d$ replaced by $y$.
    It evaluates $f$ $2ND$ times for an event of size $D$.

    **Arguments:**

    - `function`: $f$, taking one sample and returning a real scalar.
    - `dist`: the Gaussian, from `eqopt.monte_carlo.multi_normal`.
    - `rng`: the random key.
    - `num_samples`: the number of samples $N$.
    - `coupling`: whether to use the same Weibull draw for the positive and
      negative parts ($w' = w$), which reduces the variance.

    **Returns:** the per-sample estimates, of shape `(num_samples,) + event_shape`.

    **References:** S. Mohamed et al., *Monte Carlo Gradient Estimation in
    Machine Learning*, JMLR 2020, §6 and Table 1; G. Pflug, *Sampling
    derivatives of probabilities*, Computing 42, 1989.
    """
    _check_gaussian(dist)
    _check([dist.loc], num_samples)
    loc, _ = dist.params
    scale = dist.scale
    samples = dist.sample((num_samples,), seed=rng)
    positive_key, negative_key = jax.random.split(rng)
    weibull = lambda key: jax.random.weibull_min(
        key,
        scale=jnp.sqrt(2.0),
        concentration=2.0,
        shape=samples.shape,
        dtype=samples.dtype,
    )
    positive_draw = weibull(positive_key)
    negative_draw = positive_draw if coupling else weibull(negative_key)
    loc = jnp.broadcast_to(loc, samples.shape)
    scale_n = jnp.broadcast_to(scale, samples.shape)
    positive = _coordinatewise_values(function, samples, loc + scale_n * positive_draw)
    negative = _coordinatewise_values(function, samples, loc - scale_n * negative_draw)
    constant = np.sqrt(2 * np.pi) * scale_n
    return (positive - negative) / constant


@checked
def measure_valued_estimation_std(
    function: SampleFn,
    dist: MultiNormalDiagFromLogScale,
    rng: PRNGKeyArray,
    num_samples: int,
    coupling: bool = True,
) -> Float[Array, " num_samples *shape"]:
    r"""Estimates the gradient of a Gaussian expectation with respect to the standard deviation, by measure-valued derivatives.

    The derivative of $\mathcal N(x_d;\mu_d,\sigma_d^2)$ in $\sigma_d$ is
    $\tfrac1{\sigma_d}$ times the difference of a double-sided Maxwell and a
    Gaussian measure, so

    $$ \frac{\partial}{\partial \sigma_d} \mathbb E f(x) = \frac{1}{\sigma_d}
       \Big(\mathbb E f\big(x^{(d)}_{\mu_d + \sigma_d m}\big) -
            \mathbb E f\big(x^{(d)}_{\mu_d + \sigma_d \varepsilon}\big)\Big),
       \quad m \sim \operatorname{DSMaxwell}(0, 1),\ \varepsilon \sim \mathcal N(0,1), $$

    where $x^{(d)}_{y}$ is a sample $x$ with its entry $d$ replaced by $y$. With
    coupling, $\varepsilon = u\,m$ with $u \sim U(0, 1)$, which is standard
    normal and correlated with $m$.

    **Arguments:**

    - `function`: $f$, taking one sample and returning a real scalar.
    - `dist`: the Gaussian, from `eqopt.monte_carlo.multi_normal`.
    - `rng`: the random key.
    - `num_samples`: the number of samples $N$.
    - `coupling`: whether to couple the positive and negative parts as above.

    **Returns:** the per-sample estimates with respect to $\sigma$ (not
    $\log\sigma$), of shape `(num_samples,) + event_shape`.

    **References:** S. Mohamed et al., *Monte Carlo Gradient Estimation in
    Machine Learning*, JMLR 2020, §6 and Table 1.
    """
    _check_gaussian(dist)
    _check([dist.loc], num_samples)
    loc, _ = dist.params
    scale = dist.scale
    samples = dist.sample((num_samples,), seed=rng)
    positive_key, negative_key = jax.random.split(rng)
    positive_draw = jax.random.double_sided_maxwell(
        positive_key, loc=0.0, scale=1.0, shape=samples.shape, dtype=samples.dtype
    )
    if coupling:
        uniform = jax.random.uniform(negative_key, samples.shape, samples.dtype)
        negative_draw = uniform * positive_draw
    else:
        negative_draw = jax.random.normal(negative_key, samples.shape, samples.dtype)
    loc = jnp.broadcast_to(loc, samples.shape)
    scale_n = jnp.broadcast_to(scale, samples.shape)
    positive = _coordinatewise_values(function, samples, loc + scale_n * positive_draw)
    negative = _coordinatewise_values(function, samples, loc + scale_n * negative_draw)
    return (positive - negative) / scale_n


@checked
def measure_valued_jacobians(
    function: SampleFn,
    params: Sequence[Float[Array, "..."]],
    dist_builder: DistBuilder,
    rng: PRNGKeyArray,
    num_samples: int,
    coupling: bool = True,
) -> list[Float[Array, "num_samples ..."]]:
    r"""Estimates the gradient of a Gaussian expectation with respect to `[loc, log_scale]` by measure-valued derivatives.

    Combines `eqopt.monte_carlo.measure_valued_estimation_mean` and
    `eqopt.monte_carlo.measure_valued_estimation_std`, the latter turned into
    a derivative in $\log\sigma$ by the chain rule:

    $$ \frac{\partial}{\partial \log\sigma_d} = \sigma_d \frac{\partial}{\partial \sigma_d}. $$

    Needs only values of $f$, like the score function, and usually has much
    lower variance, at the price of $4ND$ evaluations of $f$.

    **Arguments:**

    - `function`: $f$, taking one sample and returning a real scalar.
    - `params`: `[loc, log_scale]`.
    - `dist_builder`: must build a diagonal Gaussian
      (`eqopt.monte_carlo.multi_normal`); anything else is an error.
    - `rng`: the random key.
    - `num_samples`: the number of samples $N$.
    - `coupling`: whether to couple the positive and negative samples.

    **Returns:** a list `[loc_jacobian, log_scale_jacobian]` of per-sample
    estimates, each of shape `(num_samples,) + event_shape`.

    **References:** S. Mohamed et al., *Monte Carlo Gradient Estimation in
    Machine Learning*, JMLR 2020, §6.
    """
    params = _check(params, num_samples)
    dist = dist_builder(*params)
    _check_gaussian(dist)
    mean_jacobian = measure_valued_estimation_mean(
        function, dist, rng, num_samples, coupling=coupling
    )
    std_jacobian = measure_valued_estimation_std(
        function, dist, rng, num_samples, coupling=coupling
    )
    scale = jnp.broadcast_to(dist.scale, std_jacobian.shape)
    return [mean_jacobian, scale * std_jacobian]
