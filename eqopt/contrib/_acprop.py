"""ACProp: centred second moment with an asynchronous update (Zhuang et al., 2021)."""

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
from .._numerics import abs_squared, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._reductions import cast_to


@checked
class ScaleByAcpropState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByAcprop`: the step count, the first
    moment $m$ and the centred second moment $s$."""

    count: Int[Array, ""]
    mu: Updates
    nu: Updates


@checked
class ScaleByAcprop(AbstractGradientTransformation):
    r"""Rescales updates with ACProp: the gradient over the *previous* centred RMS.

    $$
    \begin{aligned}
    u_t &= \frac{g_t}{\sqrt{s_{t-1} / (1 - \beta_2^{t-1})} + \epsilon}
        \quad (u_1 = g_1) \\
    s_t &= \beta_2 s_{t-1} + (1 - \beta_2)\, |g_t - m_{t-1}|^2 + \bar\epsilon, \qquad
    m_t = \beta_1 m_{t-1} + (1 - \beta_1)\, g_t
    \end{aligned}
    $$

    The denominator only uses gradients up to step $t - 1$, so it is
    independent of $g_t$ (the asynchronous update); the second moment is
    centred on the momentum, as in AdaBelief. The first step returns the
    gradient unscaled.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `b1`: the decay of the momentum used to centre $s$.
    - `b2`: the decay of the centred second moment.
    - `eps`: added to the denominator.
    - `eps_root`: added to $s$ at every step (needed to differentiate through
      the update).

    **References:** Zhuang, Ding, Tang, Dvornek, Tatikonda & Duncan, *Momentum
    Centering and Asynchronous Update for Adaptive Gradient Methods*, NeurIPS
    2021 (arXiv:2110.05454).
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-16, converter=as_scalar)
    eps_root: Scalar = eqx.field(default=1e-16, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("eps_root", self.eps_root, low=0.0)

    @init_entry
    def init(self, params: Params) -> ScaleByAcpropState:
        return ScaleByAcpropState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params),
            nu=full_like_trainable_real(params, 0.0),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByAcpropState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByAcpropState]:
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        first = state.count == 0
        # 1 - b2^0 = 0 on the first step, where the update is the gradient.
        previous_correction = jnp.where(first, 1.0, 1 - b2**state.count)
        one_minus_b1, one_minus_b2 = 1 - b1, 1 - b2

        @no_type_check
        def step(g, mu, nu):
            denominator = jnp.sqrt(nu / previous_correction.astype(nu.dtype)) + eps
            update = jnp.where(first, g, g / denominator)
            new_nu = b2 * nu + one_minus_b2 * abs_squared(g - mu) + eps_root
            new_mu = b1 * mu + one_minus_b1 * g
            return (
                cast_to(update, g.dtype),
                cast_to(new_mu, mu.dtype),
                cast_to(new_nu, nu.dtype),
            )

        new_updates, mu, nu = leafwise(step, updates, state.mu, state.nu, n_out=3)
        return new_updates, ScaleByAcpropState(
            count=safe_int32_increment(state.count), mu=mu, nu=nu
        )


@checked
def scale_by_acprop(
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-16,
    eps_root: ScalarLike = 1e-16,
) -> ScaleByAcprop:
    """Optax spelling of `eqopt.contrib.ScaleByAcprop`."""
    return ScaleByAcprop(b1=b1, b2=b2, eps=eps, eps_root=eps_root)


@checked
def acprop(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-16,
    eps_root: ScalarLike = 1e-16,
    weight_decay: ScalarLike = 0.0,
    mask: FilterSpec | None = None,
) -> Chain:
    r"""ACProp with decoupled weight decay.

    $$ x_t = x_{t-1} - \eta_t \left( \frac{g_t}{\sqrt{\hat s_{t-1}} + \epsilon}
       + \lambda x_{t-1} \right) $$

    The chain is `eqopt.contrib.ScaleByAcprop`, `eqopt.AddDecayedWeights`,
    `eqopt.ScaleByLearningRate`. `mask` is an Equinox filter spec of the
    leaves to decay (a callable is a per-leaf predicate).

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - `b1`, `b2`, `eps`, `eps_root`: as `eqopt.contrib.ScaleByAcprop`.
    - `weight_decay`: $\lambda$, decoupled, multiplied by the learning rate.
    - `mask`: the filter spec of the leaves to decay.

    **Returns:** an `eqopt.Chain`.

    **References:** Zhuang et al., *Momentum Centering and Asynchronous Update
    for Adaptive Gradient Methods*, NeurIPS 2021.
    """
    return Chain(
        ScaleByAcprop(b1=b1, b2=b2, eps=eps, eps_root=eps_root),
        AddDecayedWeights(weight_decay, mask),
        ScaleByLearningRate(learning_rate),
    )
