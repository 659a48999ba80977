r"""Control variates for the Monte Carlo gradient estimators.

A control variate $h(x;\theta)$ whose expectation is known in closed form is
subtracted from $f$ and its expectation added back:

$$ \nabla_\theta\, \mathbb E_{p(x;\theta)} f(x)
   = \nabla_\theta\, \mathbb E_{p(x;\theta)}\big[f(x) - \beta h(x;\theta)\big]
     + \beta\, \nabla_\theta\, \mathbb E_{p(x;\theta)} h(x;\theta). $$

The first term is estimated by a stochastic gradient estimator, the second is
exact, and when $h$ is correlated with $f$ the variance drops.
"""

import abc
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .._hyper import Scalar, as_scalar, weakly_typed
from .._typecheck import checked
from ..second_order import hessian_diag
from ._estimators import DistBuilder, SampleFn

#: The state of a control variate: `None`, or `(value, count)` for the moving average.
CvState: TypeAlias = Any


class AbstractControlVariate(eqx.Module):
    r"""A control variate $h(x;\theta)$ for a function $f$: its value, its
    closed-form expectation, and how its state (if any) is updated.

    For compatibility with Optax's three-function tuples, a control variate
    unpacks as `control_variate, expected_value, update_state = cv`.
    """

    function: eqx.AbstractVar[SampleFn]

    @abc.abstractmethod
    def control_variate(
        self,
        params: Sequence[Float[Array, "..."]],
        sample: Float[Array, "..."],
        state: CvState = None,
    ) -> Float[ArrayLike, ""]:
        r"""The value $h(x;\theta)$ at one sample $x$.

        **Arguments:**

        - `params`: the distribution's parameters $\theta$.
        - `sample`: one sample $x$.
        - `state`: the control variate's state.

        **Returns:** a real scalar.
        """

    @abc.abstractmethod
    def expected_value(
        self, params: Sequence[Float[Array, "..."]], state: CvState
    ) -> Float[ArrayLike, ""]:
        r"""The expectation $\mathbb E_{p(x;\theta)} h(x;\theta)$, in closed form.

        **Arguments:**

        - `params`: the distribution's parameters $\theta$.
        - `state`: the control variate's state.

        **Returns:** a real scalar, differentiable in `params`.
        """

    @abc.abstractmethod
    def update_state(
        self,
        params: Sequence[Float[Array, "..."]],
        samples: Float[Array, "num_samples ..."],
        state: CvState = None,
    ) -> CvState:
        """The state after seeing a batch of samples.

        **Arguments:**

        - `params`: the distribution's parameters.
        - `samples`: the samples, stacked on the first axis.
        - `state`: the current state.

        **Returns:** the new state.
        """

    def __iter__(self) -> Iterator[Callable[..., Any]]:
        return iter((self.control_variate, self.expected_value, self.update_state))


@checked
class ControlDeltaMethod(AbstractControlVariate):
    r"""The delta-method control variate: the second-order Taylor expansion of $f$ at the mean of a Gaussian.

    $$ h(x) = f(\mu) + (x - \mu)^\top \nabla f(\mu)
              + \tfrac12 (x - \mu)^\top \nabla^2 f(\mu)\, (x - \mu), \qquad
       \mathbb E\, h(x) = f(\mu) + \tfrac12 \sum_d \sigma_d^2\, \partial^2_{dd} f(\mu). $$

    The quadratic term uses a Hessian-vector product and the expectation only the
    Hessian diagonal, so the Hessian of $f$ is never formed. Written for
    `params = [loc, log_scale]` of `eqopt.monte_carlo.multi_normal`. Keeps no
    state.

    **Arguments:**

    - `function`: $f$, taking one sample and returning a real scalar; twice
      differentiable.

    **References:** J. Paisley, D. Blei and M. Jordan, *Variational Bayesian
    Inference with Stochastic Search*, ICML 2012; S. Mohamed et al., *Monte
    Carlo Gradient Estimation in Machine Learning*, JMLR 2020, §7.
    """

    function: SampleFn

    def control_variate(
        self,
        params: Sequence[Float[Array, "..."]],
        sample: Float[Array, "..."],
        state: CvState = None,
    ) -> Float[ArrayLike, ""]:
        mean = params[0]
        centred = sample - mean
        gradient_fn = jax.grad(self.function)
        gradient, hessian_times_centred = jax.jvp(gradient_fn, (mean,), (centred,))
        value = self.function(mean)
        value = value + jnp.vdot(centred, gradient)
        return value + jnp.vdot(centred, hessian_times_centred) / 2

    def expected_value(
        self, params: Sequence[Float[Array, "..."]], state: CvState
    ) -> Float[ArrayLike, ""]:
        mean, log_scale = params[0], params[1]
        variance = jnp.broadcast_to(jnp.exp(2 * log_scale), mean.shape)
        curvature = hessian_diag(self._as_loss, mean, None, None)
        return self.function(mean) + jnp.sum(variance * curvature) / 2

    def _as_loss(
        self, x: Float[Array, "..."], inputs: None, targets: None
    ) -> Float[Array, ""]:
        # A bound method rather than a lambda: equal across calls, so the
        # compiled Hessian diagonal is reused.
        return jnp.asarray(self.function(x))

    def update_state(
        self,
        params: Sequence[Float[Array, "..."]],
        samples: Float[Array, "num_samples ..."],
        state: CvState = None,
    ) -> CvState:
        return state


def _baseline_state(
    state: tuple[Float[ArrayLike, ""], Int[ArrayLike, ""]] | None,
) -> tuple[Float[ArrayLike, ""], Int[ArrayLike, ""]]:
    if state is None:
        raise ValueError(
            "MovingAvgBaseline needs its state `(baseline, count)`, for example "
            "`(jnp.array(0.0), 0)`."
        )
    return state


@checked
class MovingAvgBaseline(AbstractControlVariate):
    r"""A baseline: the exponential moving average of $f$ over past batches of samples.

    The control variate is the constant $h = b$ held in the state `(b, count)`,
    so $\mathbb E\, h = b$ and it has no effect on the pathwise or
    measure-valued estimators; with the score function it subtracts
    $b\,\nabla_\theta \log p$. After each batch $x_{1..N}$,

    $$ b \leftarrow \beta_t\, b + (1 - \beta_t)\, \tfrac1N \textstyle\sum_n f(x_n),
       \qquad \beta_t = \min\!\big(\beta, \tfrac{1 + t}{10 + t}\big)
       \text{ with the early-training heuristic, else } \beta, $$

    and, with `zero_debias`, the stored value is divided by $1 - \beta_t^{\,t+1}$
    (left undivided where that is zero). The initial state is `(b0, 0)`, for
    example `(jnp.array(0.0), 0)`.

    **Arguments:**

    - `function`: $f$, taking one sample and returning a real scalar.
    - `decay`: the decay $\beta$.
    - `zero_debias`: whether to correct the average's bias towards its initial
      value.
    - `use_decay_early_training_heuristic`: whether to use the smaller decay
      $\min(\beta, (1 + t)/(10 + t))$ early on.

    **References:** R. J. Williams, *Simple statistical gradient-following
    algorithms for connectionist reinforcement learning*, Machine Learning 8,
    1992; S. Mohamed et al., *Monte Carlo Gradient Estimation in Machine
    Learning*, JMLR 2020, §7.
    """

    function: SampleFn
    decay: Scalar = eqx.field(converter=as_scalar)
    zero_debias: bool = eqx.field(static=True)
    use_decay_early_training_heuristic: bool = eqx.field(static=True)

    def control_variate(
        self,
        params: Sequence[Float[Array, "..."]],
        sample: Float[Array, "..."],
        state: tuple[Float[ArrayLike, ""], Int[ArrayLike, ""]] | None = None,
    ) -> Float[ArrayLike, ""]:
        return _baseline_state(state)[0]

    def expected_value(
        self,
        params: Sequence[Float[Array, "..."]],
        state: tuple[Float[ArrayLike, ""], Int[ArrayLike, ""]],
    ) -> Float[ArrayLike, ""]:
        return state[0]

    def update_state(
        self,
        params: Sequence[Float[Array, "..."]],
        samples: Float[Array, "num_samples ..."],
        state: tuple[Float[ArrayLike, ""], Int[ArrayLike, ""]] | None = None,
    ) -> tuple[Float[Array, ""], Int[ArrayLike, ""]]:
        value, count = _baseline_state(state)
        decay = weakly_typed(self.decay)
        if self.use_decay_early_training_heuristic:
            decay = jnp.minimum(decay, (1.0 + count) / (10.0 + count))
        new_value = decay * value + (1 - decay) * jnp.mean(
            jax.vmap(self.function)(samples)
        )
        if self.zero_debias:
            correction = 1 - decay ** (count + 1)
            new_value = new_value / jnp.where(correction == 0, 1, correction)
        return jax.lax.stop_gradient(new_value), count + 1


@checked
def control_delta_method(function: SampleFn) -> ControlDeltaMethod:
    r"""Builds the delta-method control variate for `function` (a second-order Taylor expansion at the mean).

    $$ h(x) = f(\mu) + (x - \mu)^\top \nabla f(\mu)
              + \tfrac12 (x - \mu)^\top \nabla^2 f(\mu)\, (x - \mu) $$

    **Arguments:**

    - `function`: $f$, taking one sample and returning a real scalar.

    **Returns:** a `eqopt.monte_carlo.ControlDeltaMethod`, which unpacks into
    Optax's three functions `(control_variate, expected_value, update_state)`.

    **References:** J. Paisley, D. Blei and M. Jordan, *Variational Bayesian
    Inference with Stochastic Search*, ICML 2012.
    """
    return ControlDeltaMethod(function)


@checked
def moving_avg_baseline(
    function: SampleFn,
    decay: Float[ArrayLike, ""] = 0.99,
    zero_debias: bool = True,
    use_decay_early_training_heuristic: bool = True,
) -> MovingAvgBaseline:
    r"""Builds a moving-average baseline for `function`.

    $$ b \leftarrow \beta_t\, b + (1 - \beta_t)\, \tfrac1N \textstyle\sum_n f(x_n) $$

    See `eqopt.monte_carlo.MovingAvgBaseline` for the details.

    **Arguments:**

    - `function`: $f$, taking one sample and returning a real scalar.
    - `decay`: the decay $\beta$.
    - `zero_debias`: whether to correct the bias towards the initial value.
    - `use_decay_early_training_heuristic`: whether to use
      $\min(\beta, (1 + t)/(10 + t))$ as the decay at step $t$.

    **Returns:** a `eqopt.monte_carlo.MovingAvgBaseline`, which unpacks into
    Optax's three functions `(control_variate, expected_value, update_state)`.

    **References:** R. J. Williams, *Simple statistical gradient-following
    algorithms for connectionist reinforcement learning*, Machine Learning 8, 1992.
    """
    return MovingAvgBaseline(
        function, decay, zero_debias, use_decay_early_training_heuristic
    )


#: Builds a control variate from $f$, such as `control_delta_method`.
ControlVariateBuilder: TypeAlias = Callable[[SampleFn], Any]
#: A gradient estimator such as `score_function_jacobians`.
GradEstimator: TypeAlias = Callable[..., Sequence[Array]]


@checked
def estimate_control_variate_coefficients(
    function: SampleFn,
    control_variate_from_function: ControlVariateBuilder,
    grad_estimator: GradEstimator,
    params: Sequence[Float[Array, "..."]],
    dist_builder: DistBuilder,
    rng: PRNGKeyArray,
    num_samples: int,
    control_variate_state: CvState = None,
    eps: Float[ArrayLike, ""] = 1e-3,
) -> list[Float[Array, ""]]:
    r"""Estimates, for each parameter, the control-variate coefficient that minimises the estimator's variance.

    With $g_f$ and $g_h$ the per-sample gradient estimates for $f$ and for the
    control variate $h$ (from the same samples), the coefficient for a
    parameter is

    $$ \beta = \frac{\sum_k \operatorname{Cov}(g_{f,k},\, g_{h,k})}
                    {\sum_k \operatorname{Var}(g_{h,k}) + \epsilon}, $$

    summing over the parameter's entries $k$. Fresh samples are drawn (from a key
    split off `rng`) so that using $\beta$ does not bias the gradient. The state
    is not updated.

    **Arguments:**

    - `function`: $f$, taking one sample and returning a real scalar.
    - `control_variate_from_function`: builds the control variate from $f$, for
      example `eqopt.monte_carlo.control_delta_method`.
    - `grad_estimator`: the gradient estimator, for example
      `eqopt.monte_carlo.score_function_jacobians`.
    - `params`: the distribution's parameters.
    - `dist_builder`: builds the distribution, `dist_builder(*params)`.
    - `rng`: the random key.
    - `num_samples`: the number of samples used for the estimate.
    - `control_variate_state`: the control variate's state.
    - `eps`: $\epsilon$, keeping the division finite.

    **Returns:** a list of scalar coefficients, one per parameter, with no
    gradient.

    **References:** S. Mohamed et al., *Monte Carlo Gradient Estimation in
    Machine Learning*, JMLR 2020, §7.4.
    """
    params = list(params)
    coefficient_key, _ = jax.random.split(rng)
    control_variate, _, _ = control_variate_from_function(function)

    def cv_function(x):
        return control_variate(params, x, control_variate_state)

    cv_jacobians = grad_estimator(
        cv_function, params, dist_builder, coefficient_key, num_samples
    )
    function_jacobians = grad_estimator(
        function, params, dist_builder, coefficient_key, num_samples
    )

    def coefficient(cv_jacobian, function_jacobian):
        cv_centred = cv_jacobian - jnp.mean(cv_jacobian, axis=0, keepdims=True)
        f_centred = function_jacobian - jnp.mean(
            function_jacobian, axis=0, keepdims=True
        )
        covariance = jnp.mean(f_centred * cv_centred, axis=0)
        variance = jnp.var(cv_jacobian, axis=0)
        return jax.lax.stop_gradient(jnp.sum(covariance) / (jnp.sum(variance) + eps))

    return [
        coefficient(c, f) for c, f in zip(cv_jacobians, function_jacobians, strict=True)
    ]


@checked
def control_variates_jacobians(
    function: SampleFn,
    control_variate_from_function: ControlVariateBuilder,
    grad_estimator: GradEstimator,
    params: Sequence[Float[Array, "..."]],
    dist_builder: DistBuilder,
    rng: PRNGKeyArray,
    num_samples: int,
    control_variate_state: CvState = None,
    estimate_cv_coeffs: bool = False,
    estimate_cv_coeffs_num_samples: int = 20,
) -> tuple[list[Float[Array, "num_samples ..."]], CvState]:
    r"""Estimates the gradient of an expectation with a stochastic estimator and a control variate.

    $$ \nabla_\theta \mathbb E f
       = \underbrace{\nabla_\theta \mathbb E\big[f(x) - \beta h(x;\bar\theta)\big]}_{\text{estimator}}
       \;-\; \beta\, \underbrace{\mathbb E\big[\nabla_\theta h(x;\theta)\big]}_{\text{samples fixed}}
       \;+\; \beta\, \underbrace{\nabla_\theta \mathbb E\, h(x;\theta)}_{\text{closed form}} $$

    where $\bar\theta$ means $\theta$ held constant. The same key is used for
    $f$ and $h$, so both see the same samples, which is what makes them
    cancel. The control variate's state is updated once, with those samples,
    before it is used.

    **Arguments:**

    - `function`: $f$, taking one sample and returning a real scalar.
    - `control_variate_from_function`: builds the control variate from $f$, for
      example `eqopt.monte_carlo.control_delta_method` or
      `functools.partial(eqopt.monte_carlo.moving_avg_baseline, decay=0.9)`.
      It may return an `eqopt.monte_carlo.AbstractControlVariate` or Optax's
      tuple of three functions.
    - `grad_estimator`: the gradient estimator, for example
      `eqopt.monte_carlo.score_function_jacobians`.
    - `params`: the distribution's parameters.
    - `dist_builder`: builds the distribution, `dist_builder(*params)`.
    - `rng`: the random key.
    - `num_samples`: the number of samples.
    - `control_variate_state`: the control variate's state, if it has one.
    - `estimate_cv_coeffs`: whether to estimate $\beta$ per parameter with
      `eqopt.monte_carlo.estimate_control_variate_coefficients`; otherwise
      $\beta = 1$.
    - `estimate_cv_coeffs_num_samples`: the number of fresh samples for that
      estimate.

    **Returns:** a pair: the list of per-sample estimates, one array of shape
    `(num_samples,) + param.shape` per parameter, and the updated control
    variate state.

    **References:** S. Mohamed et al., *Monte Carlo Gradient Estimation in
    Machine Learning*, JMLR 2020, §7.
    """
    params = list(params)
    control_variate, expected_value, update_state = control_variate_from_function(
        function
    )
    if estimate_cv_coeffs:
        coefficients = estimate_control_variate_coefficients(
            function,
            control_variate_from_function,
            grad_estimator,
            params,
            dist_builder,
            rng,
            estimate_cv_coeffs_num_samples,
            control_variate_state,
        )
    else:
        coefficients = [1.0] * len(params)

    function_jacobians = grad_estimator(
        function, params, dist_builder, rng, num_samples
    )

    # The same key as the estimator, hence the same samples.
    samples = dist_builder(*params).sample((num_samples,), seed=rng)
    state = update_state(params, samples, control_variate_state)

    constant_params = jax.lax.stop_gradient(params)
    cv_jacobians = grad_estimator(
        lambda x: control_variate(constant_params, x, state),
        params,
        dist_builder,
        rng,
        num_samples,
    )

    constant_samples = jax.lax.stop_gradient(samples)

    def mean_control_variate(params):
        values = jax.vmap(lambda x: control_variate(params, x, state))(constant_samples)
        return jnp.mean(values)

    direct_gradients = jax.grad(mean_control_variate)(params)
    expected_value_gradients = jax.grad(lambda p: expected_value(p, state))(params)

    jacobians = []
    for param, coefficient, f_jac, cv_jac, direct, expected in zip(
        params,
        coefficients,
        function_jacobians,
        cv_jacobians,
        direct_gradients,
        expected_value_gradients,
        strict=True,
    ):
        shape = (num_samples,) + param.shape
        if f_jac.shape != shape or cv_jac.shape != shape:
            raise ValueError(
                f"`grad_estimator` returned Jacobians of shapes {f_jac.shape} and "
                f"{cv_jac.shape}, expected {shape}."
            )
        jacobian = f_jac - coefficient * cv_jac
        jacobian = jacobian - coefficient * direct[None]
        jacobian = jacobian + coefficient * expected[None]
        jacobians.append(jacobian)
    return jacobians, state
