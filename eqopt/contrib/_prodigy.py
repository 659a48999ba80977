"""Prodigy: learning-rate-free AdamW (Mishchenko & Defazio, 2023)."""

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
    as_optional_scalar,
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
    copy_trainable,
    evaluate,
    require_params,
    scalar_dtype,
    tree_abs_sum,
    tree_real_inner,
)


@checked
class ProdigyState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.Prodigy`.

    `estim_lr` is the current estimate $d_k$ of the distance to the solution,
    `numerator_weighted` the weighted sum $r_k$ and `grad_sum` the weighted sum
    of gradients $s_k$ whose ratio $r_k / \\|s_k\\|_1$ estimates it.
    """

    exp_avg: Updates
    exp_avg_sq: Updates
    grad_sum: Updates
    params0: Updates
    estim_lr: Float[Array, ""]
    numerator_weighted: Float[Array, ""]
    count: Int[Array, ""]


@checked
class Prodigy(AbstractGradientTransformation):
    r"""Learning-rate-free AdamW: Adam whose step size $d_k$ is estimated online.

    With $\gamma_k$ the learning rate (a multiplier, usually 1 or a schedule
    peaking at 1), $b_k = \sqrt{1 - \beta_2^{k+1}} / (1 - \beta_1^{k+1})$ Adam's
    bias correction and $x_0$ the initial parameters:

    $$
    \begin{aligned}
    m_{k+1} &= \beta_1 m_k + (1 - \beta_1)\, d_k g_k, \qquad
    v_{k+1} = \beta_2 v_k + (1 - \beta_2)\, d_k^2 |g_k|^2 \\
    r_{k+1} &= \beta_3 r_k + \tfrac{d_k}{d_0}\, \gamma_k b_k d_k\,
        \langle g_k, x_0 - x_k \rangle \\
    s_{k+1} &= \beta_3 s_k + \tfrac{d_k}{d_0}\, \gamma_k b_k d_k\, g_k \\
    d_{k+1} &= \max\big(d_k,\ c\, r_{k+1} / \|s_{k+1}\|_1\big) \\
    u_k &= -\gamma_k b_k d_k \left( \frac{m_{k+1}}{\sqrt{v_{k+1}} + d_k \epsilon}
        + \lambda x_k \right)
    \end{aligned}
    $$

    with $\beta_3 = \sqrt{\beta_2}$ unless given. With `safeguard_warmup` the
    factor $\gamma_k b_k$ is left out of $s$, which keeps $d$ from growing
    during a learning-rate warm-up. The inner product and the $\ell_1$ norm are
    over the whole model, so $d$ is one scalar (and the update is the same
    whether the leaves are kept apart or concatenated: it is `elementwise`).

    !!! note "Differences from Optax"
        Complex parameters use $|g|^2$ in $v$ and
        $\operatorname{Re}\langle\cdot,\cdot\rangle$ in $r$, as Adam does;
        Optax squares the complex gradient ($g^2$), so on complex parameters
        the two differ. A step whose gradients are all zero leaves $d$
        unchanged, where Optax's estimate becomes NaN.

    **Global**: one step size estimate over all the leaves, a stacked layer's slices
    included.

    **Arguments:**

    - `learning_rate`: $\gamma$, a number or a schedule; it multiplies the
      estimated step size.
    - `b1`, `b2`: Adam's decay rates ($\beta_1, \beta_2$; `prodigy` takes them as
      `betas`).
    - `beta3`: the decay of $r$ and $s$; `None` means $\sqrt{\beta_2}$.
    - `eps`: added to $\sqrt{v}$ (scaled by $d_k$).
    - `estim_lr0`: the initial estimate $d_0$ (an under-estimate).
    - `estim_lr_coef`: $c$, multiplies the estimate.
    - `weight_decay`: $\lambda$, decoupled (AdamW) weight decay.
    - `safeguard_warmup`: leave the learning rate out of $s$.

    **References:** Mishchenko & Defazio, *Prodigy: An Expeditiously Adaptive
    Parameter-Free Learner*, ICML 2024 (arXiv:2306.06101).
    """

    learning_rate: Scalar | Schedule = eqx.field(
        default=1.0, converter=as_scalar_or_schedule
    )
    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    beta3: Scalar | None = eqx.field(default=None, converter=as_optional_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    estim_lr0: Scalar = eqx.field(default=1e-6, converter=as_scalar)
    estim_lr_coef: Scalar = eqx.field(default=1.0, converter=as_scalar)
    weight_decay: Scalar = eqx.field(default=0.0, converter=as_scalar)
    safeguard_warmup: bool = eqx.field(default=False, static=True)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        if self.beta3 is not None:
            check_decays(self, "beta3")
        check_hyperparameter("learning_rate", self.learning_rate, low=0.0)
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("estim_lr0", self.estim_lr0, low=0.0, low_inclusive=False)
        check_hyperparameter("estim_lr_coef", self.estim_lr_coef, low=0.0)
        check_hyperparameter("weight_decay", self.weight_decay, low=0.0)

    @init_entry
    def init(self, params: Params) -> ProdigyState:
        dtype = scalar_dtype(params)
        return ProdigyState(
            exp_avg=zeros_like_trainable(params),
            exp_avg_sq=full_like_trainable_real(params, 0.0),
            grad_sum=zeros_like_trainable(params),
            params0=copy_trainable(params),
            estim_lr=jnp.array(self.estim_lr0, dtype),
            numerator_weighted=jnp.zeros([], dtype),
            count=jnp.zeros([], jnp.int32),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ProdigyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ProdigyState]:
        require_params(params, "prodigy")
        b1, b2, eps, weight_decay = self.b1, self.b2, self.eps, self.weight_decay
        beta3 = jnp.sqrt(b2) if self.beta3 is None else self.beta3
        count = safe_int32_increment(state.count)
        learning_rate = evaluate(self.learning_rate, state.count)
        d = state.estim_lr
        bias_correction = jnp.sqrt(1 - b2**count) / (1 - b1**count)
        d_lr = d * learning_rate * bias_correction
        # The estimate grows from d0: scaling by d / d0 keeps r and s away from
        # underflow while d is tiny (the reference implementation does the same).
        weight = (d / self.estim_lr0) * d_lr
        s_weight = (d / self.estim_lr0) * d if self.safeguard_warmup else weight
        one_minus_b1, one_minus_b2 = 1 - b1, 1 - b2

        progress = tree_real_inner(
            updates,
            leafwise(lambda p0, p: p0 - p, state.params0, params),
        )
        numerator = beta3 * state.numerator_weighted + weight * progress

        @no_type_check
        def moments(g, m, v, s):
            m = cast_to(b1 * m + one_minus_b1 * cast_to(d * g, g.dtype), m.dtype)
            v = cast_to(b2 * v + one_minus_b2 * (d * d) * abs_squared(g), v.dtype)
            s = cast_to(beta3 * s + s_weight * g, s.dtype)
            return g, m, v, s

        # (leafwise keeps the state where an update is None: the first output
        # stands for the update.)
        _, exp_avg, exp_avg_sq, grad_sum = leafwise(
            moments,
            updates,
            state.exp_avg,
            state.exp_avg_sq,
            state.grad_sum,
            n_out=4,
        )
        denominator = tree_abs_sum(grad_sum)
        estimate = self.estim_lr_coef * numerator / denominator
        new_d = jnp.where(denominator > 0, jnp.maximum(d, estimate), d)

        @no_type_check
        def step(g, m, v, p):
            direction = m / (jnp.sqrt(v) + d * eps) + weight_decay * p
            return cast_to(-d_lr * direction, g.dtype)

        new_updates = leafwise(step, updates, exp_avg, exp_avg_sq, params)
        return new_updates, ProdigyState(
            exp_avg=exp_avg,
            exp_avg_sq=exp_avg_sq,
            grad_sum=grad_sum,
            params0=state.params0,
            estim_lr=new_d.astype(d.dtype),
            numerator_weighted=jnp.asarray(numerator, d.dtype),
            count=count,
        )


@checked
def prodigy(
    learning_rate: ScalarOrSchedule = 1.0,
    betas: tuple[ScalarLike, ScalarLike] = (0.9, 0.999),
    beta3: ScalarLike | None = None,
    eps: ScalarLike = 1e-8,
    estim_lr0: ScalarLike = 1e-6,
    estim_lr_coef: ScalarLike = 1.0,
    weight_decay: ScalarLike = 0.0,
    safeguard_warmup: bool = False,
) -> Prodigy:
    """Optax spelling of `eqopt.contrib.Prodigy` (`betas` is `(b1, b2)`)."""
    b1, b2 = betas
    return Prodigy(
        learning_rate=learning_rate,
        b1=b1,
        b2=b2,
        beta3=beta3,
        eps=eps,
        estim_lr0=estim_lr0,
        estim_lr_coef=estim_lr_coef,
        weight_decay=weight_decay,
        safeguard_warmup=safeguard_warmup,
    )
