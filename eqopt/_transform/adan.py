"""Adan: adaptive Nesterov momentum from gradient differences."""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int

from .._base import AbstractGradientTransformation, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._filters import FilterSpec
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_decays,
    check_hyperparameter,
)
from .._leafwise import full_like_trainable_real, leafwise, zeros_like_trainable
from .._numerics import abs_squared, debias, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from .basic import ScaleByLearningRate
from .decay import AddDecayedWeights


@checked
class ScaleByAdanState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByAdan` (Optax's field names).

    `m`, `v`, `n` are the running averages of the gradient, of the gradient
    difference and of the squared Nesterov gradient; `g` is the previous
    gradient and `t` the step count.
    """

    m: Updates
    v: Updates
    n: Updates
    g: Updates
    t: Int[Array, ""]


@checked
class ScaleByAdan(AbstractGradientTransformation):
    r"""Rescales updates with Adan's Nesterov momentum estimate.

    Adan estimates the gradient at the Nesterov extrapolation point from the
    difference of successive gradients, $\Delta_t = g_t - g_{t-1}$ (zero at the
    first step), so it needs no second gradient evaluation. With the decays
    written as in Adam ($\beta$ close to 1; the paper's are $1 - \beta$):

    $$
    \begin{aligned}
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t \\
    v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, \Delta_t \\
    n_t &= \beta_3 n_{t-1} + (1 - \beta_3)\, |g_t + \beta_2 \Delta_t|^2 \\
    u_t &= \frac{\hat m_t + \beta_2 \hat v_t}{\sqrt{\hat n_t + \epsilon_{\text{root}}} + \epsilon}
    \end{aligned}
    $$

    where hats divide by $1 - \beta^t$, as in the authors' implementation.

    !!! note "Differs from Optax"
        Optax 0.2.8 weights the difference terms by $1 - \beta_2$ (0.08 by
        default) where the paper's Algorithm 1 and the authors' code weight
        them by $\beta_2$ (0.92; see optax pull request #1715). eqopt follows
        the paper. The two agree at the first step and whenever
        $\beta_2 = 0.5$.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `b1`, `b2`, `b3`: the decays $\beta_1, \beta_2, \beta_3 \in [0, 1)$.
    - `eps`: $\epsilon$, added to the denominator outside the square root.
    - `eps_root`: $\epsilon_{\text{root}}$, added inside the square root.

    **References:** Xie, Zhou, Li, Lin & Yan, *Adan: Adaptive Nesterov Momentum
    Algorithm for Faster Optimizing Deep Models*, arXiv:2208.06677, 2022
    (IEEE TPAMI 2024).
    """

    b1: Scalar = eqx.field(default=0.98, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.92, converter=as_scalar)
    b3: Scalar = eqx.field(default=0.99, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    eps_root: Scalar = eqx.field(default=0.0, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "b1", "b2", "b3")
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("eps_root", self.eps_root, low=0.0)

    @init_entry
    def init(self, params: Params) -> ScaleByAdanState:
        return ScaleByAdanState(
            m=zeros_like_trainable(params),
            v=zeros_like_trainable(params),
            n=full_like_trainable_real(params, 0.0),
            g=zeros_like_trainable(params),
            t=jnp.zeros([], jnp.int32),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByAdanState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByAdanState]:
        b1, b2, b3, eps, eps_root = self.b1, self.b2, self.b3, self.eps, self.eps_root
        count = safe_int32_increment(state.t)
        # At the first step there is no previous gradient: the difference is zero.
        not_first = count > 1
        corrections = 1 - b1**count, 1 - b2**count, 1 - b3**count

        @no_type_check
        def step(g, m, v, n, previous):
            difference = jnp.where(not_first, g - previous, jnp.zeros_like(g))
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * difference
            n = b3 * n + (1 - b3) * abs_squared(g + b2 * difference)
            m_hat, v_hat, n_hat = (
                debias(x, c) for x, c in zip((m, v, n), corrections, strict=True)
            )
            update = (m_hat + b2 * v_hat) / (eps + jnp.sqrt(eps_root + n_hat))
            return update, m, v, n, g

        updates, m, v, n, g = leafwise(
            step, updates, state.m, state.v, state.n, state.g, n_out=5
        )
        return updates, ScaleByAdanState(m=m, v=v, n=n, g=g, t=count)


@checked
def scale_by_adan(
    b1: ScalarLike = 0.98,
    b2: ScalarLike = 0.92,
    b3: ScalarLike = 0.99,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
) -> ScaleByAdan:
    """Optax spelling of `eqopt.ScaleByAdan`."""
    return ScaleByAdan(b1=b1, b2=b2, b3=b3, eps=eps, eps_root=eps_root)


@checked
def adan(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.98,
    b2: ScalarLike = 0.92,
    b3: ScalarLike = 0.99,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 1e-8,
    weight_decay: ScalarOrSchedule = 0.0,
    mask: FilterSpec | None = None,
) -> Chain:
    r"""Adan: adaptive Nesterov momentum, with decoupled weight decay.

    $$
    u_t = -\eta_t \left( \frac{\hat m_t + \beta_2 \hat v_t}
                              {\sqrt{\hat n_t + \epsilon_{\text{root}}} + \epsilon}
                         + \lambda\, \theta_{t-1} \right)
    $$

    with the moments of `eqopt.ScaleByAdan` (which follows the paper
    where Optax 0.2.8 does not; see there). The weight decay is AdamW's, as in
    Optax and the authors' `no_prox=True` option, not the paper's proximal
    $\theta / (1 + \lambda \eta)$. The chain is `eqopt.ScaleByAdan`,
    `eqopt.AddDecayedWeights`, `eqopt.ScaleByLearningRate`; `mask` is an
    Equinox filter spec as in `eqopt.adamw`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `b1`, `b2`, `b3`, `eps`, `eps_root`: as `eqopt.ScaleByAdan` (note
      `eps_root` defaults to `1e-8` here, as in Optax).
    - `weight_decay`: $\lambda$, a number or a schedule.
    - `mask`: the filter spec of the leaves to decay (default: all).

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        opt = eqopt.adan(learning_rate=1e-3, weight_decay=1e-2)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
        ```

    **References:** Xie, Zhou, Li, Lin & Yan, *Adan: Adaptive Nesterov Momentum
    Algorithm for Faster Optimizing Deep Models*, arXiv:2208.06677, 2022.
    """
    return Chain(
        ScaleByAdan(b1=b1, b2=b2, b3=b3, eps=eps, eps_root=eps_root),
        AddDecayedWeights(weight_decay=weight_decay, mask=mask),
        ScaleByLearningRate(learning_rate=learning_rate),
    )
