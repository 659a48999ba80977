"""Scaling by root mean squares: RMSProp (plain and centred) and Adagrad."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from .._base import AbstractGradientTransformation, Params, Updates
from .._entry import init_entry, update_entry
from .._hyper import Scalar, ScalarLike, as_scalar, check_decays, check_hyperparameter
from .._leafwise import full_like_trainable_real, leafwise, zeros_like_trainable
from .._numerics import abs_squared, debias, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._quantize import MomentDType, any_quantized, moment_like, quantized_on_buffers
from .._typecheck import checked

Moments = Updates


@no_type_check
def _inverse_root(x, eps, eps_in_sqrt):
    if eps_in_sqrt:
        return jax.lax.rsqrt(eps + x)
    return 1 / (eps + jnp.sqrt(x))


def _check_rms_hyperparameters(module: "ScaleByRms | ScaleByStddev") -> None:
    check_decays(module, "decay", high_inclusive=True)
    check_hyperparameter("eps", module.eps, low=0.0)
    check_hyperparameter("initial_scale", module.initial_scale, low=0.0)


@checked
class ScaleByRmsState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByRms`: the step count and $v$, the mean square."""

    count: Int[Array, ""]
    nu: Moments


@checked
class ScaleByRms(AbstractGradientTransformation):
    r"""Divides the updates by the root of an exponential moving average of their squares.

    $$
    \begin{aligned}
    v_t &= \rho\, v_{t-1} + (1 - \rho)\, |g_t|^2, \qquad v_0 = v_{\text{init}} \\
    \hat v_t &= \begin{cases} v_t / (1 - \rho^t) & \text{bias correction} \\
                              v_t & \text{otherwise} \end{cases} \\
    u_t &= \begin{cases} g_t / \sqrt{\hat v_t + \epsilon} & \text{`eps_in_sqrt`} \\
                         g_t / (\sqrt{\hat v_t} + \epsilon) & \text{otherwise} \end{cases}
    \end{aligned}
    $$

    This is the scaling of RMSProp. With `eps_in_sqrt=False` it matches PyTorch's
    RMSprop; with `eps_in_sqrt=False, bias_correction=True` and $\rho = \beta_2$
    it equals Adam with $\beta_1 = 0$ without storing a first moment. For
    complex updates $|g|^2 = g \bar g$ and $v$ is stored as a real array.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `decay`: $\rho \in [0, 1]$.
    - `eps`: $\epsilon \ge 0$, keeping the denominator away from zero.
    - `initial_scale`: $v_{\text{init}}$, the initial mean square.
    - `eps_in_sqrt`: add $\epsilon$ inside the square root (default) or outside.
    - `bias_correction`: divide $v_t$ by $1 - \rho^t$.
    - `nu_dtype`: dtype or `eqopt.Quantized` format to store $v$ in
      (default: the params' real dtype). Optax has no such option.

    **References:** Tieleman & Hinton, *Lecture 6.5 — RMSProp: Divide the
    gradient by a running average of its recent magnitude*, COURSERA: Neural
    Networks for Machine Learning, 2012.
    """

    decay: Scalar = eqx.field(default=0.9, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    initial_scale: Scalar = eqx.field(default=0.0, converter=as_scalar)
    eps_in_sqrt: bool = eqx.field(default=True, static=True)
    bias_correction: bool = eqx.field(default=False, static=True)
    nu_dtype: MomentDType = eqx.field(default=None, static=True)

    @property
    def elementwise(self) -> bool:
        return not any_quantized(self.nu_dtype)

    @property
    def runs_on_buffers(self) -> bool:
        # A packed buffer's quantised moments are quantised as one array.
        return quantized_on_buffers(self.nu_dtype)

    def __check_init__(self):
        _check_rms_hyperparameters(self)

    @init_entry
    def init(self, params: Params) -> ScaleByRmsState:
        if self.nu_dtype is None:
            nu = full_like_trainable_real(params, self.initial_scale)
        else:
            nu = moment_like(
                params, self.nu_dtype, second=True, value=self.initial_scale
            )
        return ScaleByRmsState(count=jnp.zeros([], jnp.int32), nu=nu)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByRmsState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByRmsState]:
        decay, eps = self.decay, self.eps
        count = safe_int32_increment(state.count)

        one_minus_decay, correction = 1 - decay, 1 - decay**count

        @no_type_check
        def step(g, nu):
            new_nu = decay * nu + one_minus_decay * abs_squared(g)
            nu_hat = debias(new_nu, correction) if self.bias_correction else new_nu
            return _inverse_root(nu_hat, eps, self.eps_in_sqrt) * g, new_nu.astype(
                nu.dtype
            )

        updates, nu = leafwise(step, updates, state.nu, n_out=2, elementwise=True)
        return updates, ScaleByRmsState(count=count, nu=nu)


@checked
def scale_by_rms(
    decay: ScalarLike = 0.9,
    eps: ScalarLike = 1e-8,
    initial_scale: ScalarLike = 0.0,
    eps_in_sqrt: bool = True,
    bias_correction: bool = False,
    *,
    nu_dtype: MomentDType = None,
) -> ScaleByRms:
    """Optax spelling of `eqopt.ScaleByRms` (`nu_dtype` is eqopt's addition)."""
    return ScaleByRms(
        decay=decay,
        eps=eps,
        initial_scale=initial_scale,
        eps_in_sqrt=eps_in_sqrt,
        bias_correction=bias_correction,
        nu_dtype=nu_dtype,
    )


@checked
class ScaleByStddevState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByStddev`: the step count, the mean $m$ and mean square $v$."""

    count: Int[Array, ""]
    mu: Moments
    nu: Moments


@checked
class ScaleByStddev(AbstractGradientTransformation):
    r"""Divides the updates by a running estimate of their standard deviation (centred RMSProp).

    $$
    \begin{aligned}
    m_t &= \rho\, m_{t-1} + (1 - \rho)\, g_t, \qquad m_0 = 0 \\
    v_t &= \rho\, v_{t-1} + (1 - \rho)\, |g_t|^2, \qquad v_0 = v_{\text{init}} \\
    u_t &= g_t \,/\, \sqrt{\max(\hat v_t - |\hat m_t|^2,\ 0) + \epsilon}
    \end{aligned}
    $$

    with $\hat m_t, \hat v_t$ the moments divided by $1 - \rho^t$ when
    `bias_correction` is set, and $\epsilon$ outside the square root when
    `eps_in_sqrt=False`. Complex updates are supported; $v$ is stored as a real
    array.

    The variance is floored at zero. With bias correction it is exactly zero
    at the first step ($\hat v_1 = |g_1|^2 = |\hat m_1|^2$), and rounding can
    make the computed difference negative; Optax then returns NaN for those
    elements (or not, depending on how $1 - \rho$ rounds), eqopt returns
    $g_1 / \sqrt{\epsilon}$.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `decay`: $\rho \in [0, 1]$.
    - `eps`: $\epsilon \ge 0$.
    - `initial_scale`: $v_{\text{init}}$, the initial mean square.
    - `eps_in_sqrt`: add $\epsilon$ inside the square root (default) or outside.
    - `bias_correction`: divide both moments by $1 - \rho^t$.

    **References:** Graves, *Generating Sequences With Recurrent Neural
    Networks*, arXiv:1308.0850, 2013 (eq. 38-41), centring Tieleman & Hinton's
    RMSProp (2012).
    """

    decay: Scalar = eqx.field(default=0.9, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    initial_scale: Scalar = eqx.field(default=0.0, converter=as_scalar)
    eps_in_sqrt: bool = eqx.field(default=True, static=True)
    bias_correction: bool = eqx.field(default=False, static=True)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        _check_rms_hyperparameters(self)

    @init_entry
    def init(self, params: Params) -> ScaleByStddevState:
        return ScaleByStddevState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params),
            nu=full_like_trainable_real(params, self.initial_scale),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByStddevState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByStddevState]:
        decay, eps = self.decay, self.eps
        count = safe_int32_increment(state.count)

        one_minus_decay, correction = 1 - decay, 1 - decay**count

        @no_type_check
        def step(g, mu, nu):
            new_mu = decay * mu + one_minus_decay * g
            new_nu = decay * nu + one_minus_decay * abs_squared(g)
            if self.bias_correction:
                mu_hat, nu_hat = debias(new_mu, correction), debias(new_nu, correction)
            else:
                mu_hat, nu_hat = new_mu, new_nu
            # Zero in exact arithmetic at the first step with bias correction:
            # rounding must not make it negative (a NaN under the root).
            variance = jnp.maximum(nu_hat - abs_squared(mu_hat), 0)
            update = _inverse_root(variance, eps, self.eps_in_sqrt) * g
            return update, new_mu.astype(mu.dtype), new_nu.astype(nu.dtype)

        updates, mu, nu = leafwise(step, updates, state.mu, state.nu, n_out=3)
        return updates, ScaleByStddevState(count=count, mu=mu, nu=nu)


@checked
def scale_by_stddev(
    decay: ScalarLike = 0.9,
    eps: ScalarLike = 1e-8,
    initial_scale: ScalarLike = 0.0,
    eps_in_sqrt: bool = True,
    bias_correction: bool = False,
) -> ScaleByStddev:
    """Optax spelling of `eqopt.ScaleByStddev`."""
    return ScaleByStddev(
        decay=decay,
        eps=eps,
        initial_scale=initial_scale,
        eps_in_sqrt=eps_in_sqrt,
        bias_correction=bias_correction,
    )


@checked
class ScaleByRssState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByRss`: the running sum of squared updates."""

    sum_of_squares: Moments


@checked
class ScaleByRss(AbstractGradientTransformation):
    r"""Divides the updates by the root of the sum of all their squares so far (Adagrad).

    $$
    s_t = s_{t-1} + |g_t|^2, \quad s_0 = s_{\text{init}}, \qquad
    u_t = \begin{cases} g_t / \sqrt{s_t + \epsilon} & s_t > 0 \\ 0 & s_t = 0 \end{cases}
    $$

    Complex updates are supported ($|g|^2 = g \bar g$); $s$ is stored as a real
    array.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `initial_accumulator_value`: $s_{\text{init}} \ge 0$.
    - `eps`: $\epsilon \ge 0$.

    **References:** Duchi, Hazan & Singer, *Adaptive Subgradient Methods for
    Online Learning and Stochastic Optimization*, JMLR 12, 2011.
    """

    initial_accumulator_value: Scalar = eqx.field(default=0.1, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-7, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_hyperparameter(
            "initial_accumulator_value", self.initial_accumulator_value, low=0.0
        )
        check_hyperparameter("eps", self.eps, low=0.0)

    @init_entry
    def init(self, params: Params) -> ScaleByRssState:
        return ScaleByRssState(
            sum_of_squares=full_like_trainable_real(
                params, self.initial_accumulator_value
            )
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByRssState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByRssState]:
        eps = self.eps

        @no_type_check
        def step(g, total):
            new_total = abs_squared(g) + total
            scaling = jnp.where(new_total > 0, jax.lax.rsqrt(new_total + eps), 0.0)
            return scaling * g, new_total.astype(total.dtype)

        updates, total = leafwise(step, updates, state.sum_of_squares, n_out=2)
        return updates, ScaleByRssState(sum_of_squares=total)


@checked
def scale_by_rss(
    initial_accumulator_value: ScalarLike = 0.1, eps: ScalarLike = 1e-7
) -> ScaleByRss:
    """Optax spelling of `eqopt.ScaleByRss`."""
    return ScaleByRss(initial_accumulator_value=initial_accumulator_value, eps=eps)
