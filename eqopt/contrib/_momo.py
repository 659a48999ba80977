"""MoMo and MoMo-Adam: Polyak-type step sizes from a model of the loss (Schaipp et al., 2023).

Both need the current (mini-batch) loss, passed to `update` as `value=loss`.
"""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._base import AbstractGradientTransformation, Params, Updates
from .._entry import init_entry, update_entry
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    Schedule,
    as_scalar,
    as_scalar_or_schedule,
    check_decays,
    check_hyperparameter,
)
from .._leafwise import full_like_trainable_real, leafwise, zeros_like_trainable
from .._numerics import abs_squared, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._reductions import (
    cast_to,
    evaluate,
    real_inner,
    require_params,
    scalar_dtype,
    total,
)


def _loss_value(extra_args: dict, owner: str, dtype: Any) -> Array:
    if "value" not in extra_args or extra_args["value"] is None:
        raise ValueError(
            f"{owner} needs the current loss: call "
            "`update(grads, state, params, value=loss)`, for example with the loss "
            "from `eqx.filter_value_and_grad`."
        )
    value = extra_args["value"]
    shape = np.shape(value)
    if shape != () or not jnp.issubdtype(jnp.result_type(value), jnp.number):
        raise ValueError(
            f"{owner}: `value` must be the loss, a real scalar; got "
            f"{type(value).__name__} of shape {shape}."
        )
    if jnp.iscomplexobj(value):
        raise ValueError(
            f"{owner}: `value` must be a real scalar loss, got a complex one."
        )
    return jnp.asarray(value).astype(dtype)


@no_type_check
def _inner_over_updates(updates, tree, params):
    """$\\sum \\operatorname{Re}\\langle t, x \\rangle$ over the leaves with an update."""
    return total(
        leafwise(
            lambda g, t, p: real_inner(t, p), updates, tree, params, per_layer=False
        )
    )


@no_type_check
def _safe_ratio(numerator, denominator, fallback):
    positive = denominator > 0
    return jnp.where(
        positive, numerator / jnp.where(positive, denominator, 1), fallback
    )


@checked
class MomoState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.Momo`: the momentum $d_k$, the averaged
    loss $\\bar f_k$, the averaged $\\langle g, x\\rangle$ ($\\gamma_k$), the
    lower bound estimate and the step count."""

    exp_avg: Updates
    barf: Float[Array, ""]
    gamma: Float[Array, ""]
    lb: Float[Array, ""]
    count: Int[Array, ""]


@checked
class Momo(AbstractGradientTransformation):
    r"""SGD with momentum and MoMo's adaptive (Polyak-type) step size.

    MoMo averages the gradients, the losses and the linearisations of past
    steps into a model of the loss, and steps to where that model meets the
    lower bound $f_*$, capped by the learning rate $\alpha_k$. With $f_k$ the
    loss (`value`), $\beta$ the momentum ($\beta = 0$ on the first step) and
    $\delta = 1 + \alpha_k \lambda$:

    $$
    \begin{aligned}
    d_k &= \beta d_{k-1} + (1 - \beta) g_k, \qquad
    \bar f_k = \beta \bar f_{k-1} + (1 - \beta) f_k, \qquad
    \gamma_k = \beta \gamma_{k-1} + (1 - \beta) \langle g_k, x_k \rangle \\
    \tau_k &= \min\Big(\alpha_k,\ \frac{\big(\delta (\bar f_k - f_*) + \langle d_k, x_k\rangle
        - \delta \gamma_k\big)_+}{\|d_k\|^2}\Big) \\
    x_{k+1} &= x_k / \delta - \tau_k d_k
    \end{aligned}
    $$

    With `adapt_lower_bound`, $f_*$ is estimated online (MoMo*): it is reset
    down when the model falls below it, and after each step set to
    $\bar f_k + \langle d_k, x_k\rangle - \gamma_k - \tfrac12 \tau_k \|d_k\|^2$,
    never below `lower_bound`. The inner products and norms are over the whole
    model. `update` needs the parameters and `value=loss`.

    **Global**: one step size over all the leaves, a stacked layer's slices included.

    **Arguments:**

    - `learning_rate`: $\alpha$, the cap on the step size (a number or a
      schedule); it can be large.
    - `beta`: the momentum $\beta$.
    - `lower_bound`: $f_*$, a lower bound of the loss (0 for most losses).
    - `weight_decay`: $\lambda$.
    - `adapt_lower_bound`: estimate $f_*$ online (static).

    **References:** Schaipp, Ohana, Eickenberg, Defazio & Gower, *MoMo:
    Momentum Models for Adaptive Learning Rates*, ICML 2024 (arXiv:2305.07583).
    """

    learning_rate: Scalar | Schedule = eqx.field(
        default=1.0, converter=as_scalar_or_schedule
    )
    beta: Scalar = eqx.field(default=0.9, converter=as_scalar)
    lower_bound: Scalar = eqx.field(default=0.0, converter=as_scalar)
    weight_decay: Scalar = eqx.field(default=0.0, converter=as_scalar)
    adapt_lower_bound: bool = eqx.field(default=False, static=True)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "beta")
        check_hyperparameter("learning_rate", self.learning_rate, low=0.0)
        check_hyperparameter("weight_decay", self.weight_decay, low=0.0)

    @init_entry
    def init(self, params: Params) -> MomoState:
        dtype = scalar_dtype(params)
        return MomoState(
            exp_avg=zeros_like_trainable(params),
            barf=jnp.zeros([], dtype),
            gamma=jnp.zeros([], dtype),
            lb=jnp.array(self.lower_bound, dtype),
            count=jnp.zeros([], jnp.int32),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: MomoState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, MomoState]:
        require_params(params, "momo")
        dtype = state.barf.dtype
        value = _loss_value(extra_args, "momo", dtype)
        learning_rate = evaluate(self.learning_rate, state.count)
        # The first step starts the averages at the current values.
        beta = jnp.where(state.count == 0, 0.0, self.beta).astype(dtype)
        one_minus_beta = 1 - beta

        @no_type_check
        def average(g, d):
            return cast_to(beta * d + one_minus_beta * g, d.dtype)

        exp_avg = leafwise(average, updates, state.exp_avg)
        barf = beta * state.barf + one_minus_beta * value
        gamma = beta * state.gamma + one_minus_beta * _inner_over_updates(
            updates, updates, params
        )
        dot = _inner_over_updates(updates, exp_avg, params)
        norm = total(
            leafwise(lambda g, d: real_inner(d, d), updates, exp_avg, per_layer=False)
        )
        decay = 1 + learning_rate * self.weight_decay
        lb = state.lb
        if self.adapt_lower_bound:
            cap = decay * barf + dot - decay * gamma
            lb = jnp.where(
                cap < decay * lb, jnp.maximum(cap / (2 * decay), self.lower_bound), lb
            )
        numerator = jnp.maximum(decay * (barf - lb) + dot - decay * gamma, 0)
        step_size = jnp.minimum(
            learning_rate, _safe_ratio(numerator, norm, learning_rate)
        )
        if self.adapt_lower_bound:
            model = barf + dot - gamma
            lb = jnp.maximum(model - 0.5 * step_size * norm, self.lower_bound)

        @no_type_check
        def step(g, d, p):
            return cast_to(p / decay - step_size * d - p, g.dtype)

        new_updates = leafwise(step, updates, exp_avg, params)
        return new_updates, MomoState(
            exp_avg=exp_avg,
            barf=barf.astype(dtype),
            gamma=gamma.astype(dtype),
            lb=jnp.asarray(lb).astype(dtype),
            count=safe_int32_increment(state.count),
        )


@checked
def momo(
    learning_rate: ScalarOrSchedule = 1.0,
    beta: ScalarLike = 0.9,
    lower_bound: ScalarLike = 0.0,
    weight_decay: ScalarLike = 0.0,
    adapt_lower_bound: bool = False,
) -> Momo:
    """Optax spelling of `eqopt.contrib.Momo`."""
    return Momo(
        learning_rate=learning_rate,
        beta=beta,
        lower_bound=lower_bound,
        weight_decay=weight_decay,
        adapt_lower_bound=adapt_lower_bound,
    )


@checked
class MomoAdamState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.MomoAdam`: Adam's two moments, the
    averaged loss, the averaged $\\langle g, x\\rangle$, the lower bound
    estimate and the step count."""

    exp_avg: Updates
    exp_avg_sq: Updates
    barf: Float[Array, ""]
    gamma: Float[Array, ""]
    lb: Float[Array, ""]
    count: Int[Array, ""]


@checked
class MomoAdam(AbstractGradientTransformation):
    r"""Adam(W) with MoMo's adaptive (Polyak-type) step size.

    As `eqopt.contrib.Momo`, in Adam's preconditioned geometry. With
    $\rho_k = 1 - \beta_1^k$, $D_k = \sqrt{v_k / (1 - \beta_2^k)} + \epsilon$ and
    $\delta = 1 + \alpha_k \lambda$ (averages start at zero):

    $$
    \begin{aligned}
    m_k &= \beta_1 m_{k-1} + (1 - \beta_1) g_k, \qquad
    v_k = \beta_2 v_{k-1} + (1 - \beta_2) |g_k|^2 \\
    \bar f_k &= \beta_1 \bar f_{k-1} + (1 - \beta_1) f_k, \qquad
    \gamma_k = \beta_1 \gamma_{k-1} + (1 - \beta_1) \langle g_k, x_k \rangle \\
    \tau_k &= \min\Big(\frac{\alpha_k}{\rho_k},\ \frac{\big(\delta (\bar f_k - \rho_k f_*)
        + \langle m_k, x_k\rangle - \delta \gamma_k\big)_+}{\langle m_k, m_k / D_k\rangle}\Big) \\
    x_{k+1} &= x_k / \delta - \tau_k\, m_k / D_k
    \end{aligned}
    $$

    `adapt_lower_bound` estimates $f_*$ online as in `eqopt.contrib.Momo`
    (divided by $\rho_k$). `update` needs the parameters and `value=loss`.

    !!! note "Differences from Optax"
        Complex parameters use $|g|^2$ in $v$, as Adam does; Optax squares the
        complex gradient ($g^2$), so on complex parameters the two differ.

    **Global**: one step size over all the leaves, a stacked layer's slices included.

    **Arguments:**

    - `learning_rate`: $\alpha$, the cap on the step size (a number or a schedule).
    - `b1`, `b2`: Adam's decay rates ($\beta_1$ also averages the losses).
    - `eps`: added to $\sqrt{\hat v}$.
    - `lower_bound`: $f_*$, a lower bound of the loss.
    - `weight_decay`: $\lambda$.
    - `adapt_lower_bound`: estimate $f_*$ online (static).

    **References:** Schaipp, Ohana, Eickenberg, Defazio & Gower, *MoMo:
    Momentum Models for Adaptive Learning Rates*, ICML 2024 (arXiv:2305.07583).
    """

    learning_rate: Scalar | Schedule = eqx.field(
        default=1e-2, converter=as_scalar_or_schedule
    )
    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    lower_bound: Scalar = eqx.field(default=0.0, converter=as_scalar)
    weight_decay: Scalar = eqx.field(default=0.0, converter=as_scalar)
    adapt_lower_bound: bool = eqx.field(default=False, static=True)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("learning_rate", self.learning_rate, low=0.0)
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("weight_decay", self.weight_decay, low=0.0)

    @init_entry
    def init(self, params: Params) -> MomoAdamState:
        dtype = scalar_dtype(params)
        return MomoAdamState(
            exp_avg=zeros_like_trainable(params),
            exp_avg_sq=full_like_trainable_real(params, 0.0),
            barf=jnp.zeros([], dtype),
            gamma=jnp.zeros([], dtype),
            lb=jnp.array(self.lower_bound, dtype),
            count=jnp.zeros([], jnp.int32),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: MomoAdamState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, MomoAdamState]:
        require_params(params, "momo_adam")
        dtype = state.barf.dtype
        value = _loss_value(extra_args, "momo_adam", dtype)
        learning_rate = evaluate(self.learning_rate, state.count)
        b1, b2, eps = self.b1, self.b2, self.eps
        count = safe_int32_increment(state.count)
        correction1, correction2 = 1 - b1**count, 1 - b2**count
        one_minus_b1, one_minus_b2 = 1 - b1, 1 - b2

        @no_type_check
        def moments(g, m, v):
            m = cast_to(b1 * m + one_minus_b1 * g, m.dtype)
            v = cast_to(b2 * v + one_minus_b2 * abs_squared(g), v.dtype)
            return g, m, v

        # (The first output stands for the update, so that leafwise keeps the
        # moments where an update is None.)
        _, exp_avg, exp_avg_sq = leafwise(
            moments, updates, state.exp_avg, state.exp_avg_sq, n_out=3
        )

        @no_type_check
        def preconditioner(v):
            return jnp.sqrt(v / correction2.astype(v.dtype)) + eps

        gamma = b1 * state.gamma + one_minus_b1 * _inner_over_updates(
            updates, updates, params
        )
        barf = b1 * state.barf + one_minus_b1 * value
        dot = _inner_over_updates(updates, exp_avg, params)
        norm = total(
            leafwise(
                lambda g, m, v: real_inner(m, m / preconditioner(v)),
                updates,
                exp_avg,
                exp_avg_sq,
                per_layer=False,
            )
        )
        decay = 1 + learning_rate * self.weight_decay
        lb = state.lb
        if self.adapt_lower_bound:
            cap = decay * barf + dot - decay * gamma
            lb = jnp.where(
                cap < decay * correction1 * lb,
                jnp.maximum(cap / (2 * decay * correction1), self.lower_bound),
                lb,
            )
        numerator = jnp.maximum(
            decay * (barf - correction1 * lb) + dot - decay * gamma, 0
        )
        cap_step = learning_rate / correction1
        step_size = jnp.minimum(cap_step, _safe_ratio(numerator, norm, cap_step))
        if self.adapt_lower_bound:
            model = barf + dot - gamma
            lb = jnp.maximum(
                (model - 0.5 * step_size * norm) / correction1, self.lower_bound
            )

        @no_type_check
        def step(g, m, v, p):
            direction = m / preconditioner(v)
            return cast_to(p / decay - step_size * direction - p, g.dtype)

        new_updates = leafwise(step, updates, exp_avg, exp_avg_sq, params)
        return new_updates, MomoAdamState(
            exp_avg=exp_avg,
            exp_avg_sq=exp_avg_sq,
            barf=jnp.asarray(barf, dtype),
            gamma=jnp.asarray(gamma, dtype),
            lb=jnp.asarray(lb).astype(dtype),
            count=count,
        )


@checked
def momo_adam(
    learning_rate: ScalarOrSchedule = 1e-2,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    lower_bound: ScalarLike = 0.0,
    weight_decay: ScalarLike = 0.0,
    adapt_lower_bound: bool = False,
) -> MomoAdam:
    """Optax spelling of `eqopt.contrib.MomoAdam`."""
    return MomoAdam(
        learning_rate=learning_rate,
        b1=b1,
        b2=b2,
        eps=eps,
        lower_bound=lower_bound,
        weight_decay=weight_decay,
        adapt_lower_bound=adapt_lower_bound,
    )
