"""D-Adaptation for AdamW: learning-rate-free Adam (Defazio & Mishchenko, 2023)."""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
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
    tree_abs_sum,
)


@checked
class DAdaptAdamWState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.DAdaptAdamW`.

    `estim_lr` is the current estimate $d_k$; `numerator_weighted` and
    `grad_sum` ($s_k$) are the weighted sums whose ratio gives the next one.
    """

    exp_avg: Updates
    exp_avg_sq: Updates
    grad_sum: Updates
    estim_lr: Float[Array, ""]
    numerator_weighted: Float[Array, ""]
    count: Int[Array, ""]


@checked
class DAdaptAdamW(AbstractGradientTransformation):
    r"""Learning-rate-free AdamW by D-Adaptation: the step size is estimated online.

    With $\gamma_k$ the learning rate (a multiplier, usually 1 or a schedule
    peaking at 1), $b_k = \sqrt{1 - \beta_2^{k+1}} / (1 - \beta_1^{k+1})$,
    $\lambda_k = d_k \gamma_k b_k$ and $\beta = \sqrt{\beta_2}$:

    $$
    \begin{aligned}
    \rho_{k+1} &= \beta \rho_k + (1 - \beta)\, \lambda_k
        \Big\langle g_k, \frac{s_k}{\sqrt{v_k} + \epsilon} \Big\rangle \\
    m_{k+1} &= \beta_1 m_k + (1 - \beta_1)\, \lambda_k g_k, \qquad
    v_{k+1} = \beta_2 v_k + (1 - \beta_2)\, |g_k|^2 \\
    s_{k+1} &= \beta s_k + (1 - \beta)\, \lambda_k g_k \\
    d_{k+1} &= \max\Big(d_k,\ \frac{\rho_{k+1}}{(1 - \beta) \|s_{k+1}\|_1}\Big) \\
    u_k &= -\frac{m_{k+1}}{\sqrt{v_{k+1}} + \epsilon} - \lambda_k \lambda x_k
    \end{aligned}
    $$

    ($\lambda$ alone is the weight decay.) The inner product and the norm are
    over the whole model, so $d$ is one scalar.

    !!! note "Differences from Optax"
        Complex parameters use $|g|^2$ in $v$ and
        $\operatorname{Re}\langle\cdot,\cdot\rangle$ in $\rho$; Optax squares the
        complex gradient ($g^2$), so on complex parameters the two differ. A
        step whose gradients are all zero leaves $d$ unchanged, where Optax's
        estimate becomes NaN.

    **Global**: one step size estimate over all the leaves, a stacked layer's slices
    included.

    **Arguments:**

    - `learning_rate`: $\gamma$, a number or a schedule; it multiplies the
      estimated step size.
    - `b1`, `b2`: Adam's decay rates (`dadapt_adamw` takes them as `betas`).
    - `eps`: added to $\sqrt{v}$.
    - `estim_lr0`: the initial estimate $d_0$ (an under-estimate).
    - `weight_decay`: decoupled (AdamW) weight decay, scaled by $\lambda_k$.

    **References:** Defazio & Mishchenko, *Learning-Rate-Free Learning by
    D-Adaptation*, ICML 2023 (arXiv:2301.07733).
    """

    learning_rate: Scalar | Schedule = eqx.field(
        default=1.0, converter=as_scalar_or_schedule
    )
    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    estim_lr0: Scalar = eqx.field(default=1e-6, converter=as_scalar)
    weight_decay: Scalar = eqx.field(default=0.0, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("learning_rate", self.learning_rate, low=0.0)
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("estim_lr0", self.estim_lr0, low=0.0, low_inclusive=False)
        check_hyperparameter("weight_decay", self.weight_decay, low=0.0)

    @init_entry
    def init(self, params: Params) -> DAdaptAdamWState:
        dtype = scalar_dtype(params)
        return DAdaptAdamWState(
            exp_avg=zeros_like_trainable(params),
            exp_avg_sq=full_like_trainable_real(params, 0.0),
            grad_sum=zeros_like_trainable(params),
            estim_lr=jnp.array(self.estim_lr0, dtype),
            numerator_weighted=jnp.zeros([], dtype),
            count=jnp.zeros([], jnp.int32),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: DAdaptAdamWState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, DAdaptAdamWState]:
        require_params(params, "dadapt_adamw")
        b1, b2, eps, weight_decay = self.b1, self.b2, self.eps, self.weight_decay
        beta = jnp.sqrt(b2)
        count = safe_int32_increment(state.count)
        learning_rate = evaluate(self.learning_rate, state.count)
        d = state.estim_lr
        d_lr = d * learning_rate * jnp.sqrt(1 - b2**count) / (1 - b1**count)
        one_minus_b1, one_minus_b2, one_minus_beta = 1 - b1, 1 - b2, 1 - beta

        @no_type_check
        def moments(g, m, v, s):
            # The progress term uses s and v from before this step.
            progress = real_inner(g, s / (jnp.sqrt(v) + eps))
            scaled = cast_to(d_lr * g, g.dtype)
            m = cast_to(b1 * m + one_minus_b1 * scaled, m.dtype)
            v = cast_to(b2 * v + one_minus_b2 * abs_squared(g), v.dtype)
            s = cast_to(beta * s + one_minus_beta * scaled, s.dtype)
            return progress, m, v, s

        progress, exp_avg, exp_avg_sq, grad_sum = leafwise(
            moments,
            updates,
            state.exp_avg,
            state.exp_avg_sq,
            state.grad_sum,
            n_out=4,
            per_layer=False,
        )
        total_progress = total(progress)
        numerator = (
            beta * state.numerator_weighted + one_minus_beta * d_lr * total_progress
        )
        denominator = one_minus_beta * tree_abs_sum(grad_sum)
        new_d = jnp.where(denominator > 0, jnp.maximum(d, numerator / denominator), d)

        @no_type_check
        def step(g, m, v, p):
            update = -m / (jnp.sqrt(v) + eps) - weight_decay * d_lr * p
            return cast_to(update, g.dtype)

        new_updates = leafwise(step, updates, exp_avg, exp_avg_sq, params)
        return new_updates, DAdaptAdamWState(
            exp_avg=exp_avg,
            exp_avg_sq=exp_avg_sq,
            grad_sum=grad_sum,
            estim_lr=new_d.astype(d.dtype),
            numerator_weighted=numerator.astype(d.dtype),
            count=count,
        )


@checked
def dadapt_adamw(
    learning_rate: ScalarOrSchedule = 1.0,
    betas: tuple[ScalarLike, ScalarLike] = (0.9, 0.999),
    eps: ScalarLike = 1e-8,
    estim_lr0: ScalarLike = 1e-6,
    weight_decay: ScalarLike = 0.0,
) -> DAdaptAdamW:
    """Optax spelling of `eqopt.contrib.DAdaptAdamW` (`betas` is `(b1, b2)`)."""
    b1, b2 = betas
    return DAdaptAdamW(
        learning_rate=learning_rate,
        b1=b1,
        b2=b2,
        eps=eps,
        estim_lr0=estim_lr0,
        weight_decay=weight_decay,
    )
