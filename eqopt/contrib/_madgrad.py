"""MADGRAD: momentumized, adaptive, dual-averaged gradients (Defazio & Jelassi, 2021)."""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int

from .._base import AbstractGradientTransformation, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    Schedule,
    as_scalar,
    as_scalar_or_schedule,
    check_hyperparameter,
)
from .._leafwise import leafwise, zeros_like_trainable
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._reductions import (
    cast_to,
    copy_trainable,
    evaluate,
    refuse_complex,
    require_params,
)


@checked
class MadgradState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByMadgrad`: the step count, the
    weighted sums of squared gradients $v$ and of gradients $s$, and the initial
    parameters $x_0$."""

    count: Int[Array, ""]
    grad_sum_sq: Updates
    s: Updates
    x0: Updates


@checked
class ScaleByMadgrad(AbstractGradientTransformation):
    r"""Returns MADGRAD's step: dual averaging with a cube-root adaptive scale.

    With $\lambda_k = (\eta_k + \epsilon) \sqrt{k + 1}$ (the authors' code adds
    $\epsilon$ to the learning rate), $c = 1 -$ `momentum` and $x_0$ the
    initial parameters:

    $$
    \begin{aligned}
    s_{k+1} &= s_k + \lambda_k g_k, \qquad v_{k+1} = v_k + \lambda_k g_k^2 \\
    z_{k+1} &= x_0 - \frac{s_{k+1}}{\sqrt[3]{v_{k+1}} + \epsilon} \\
    u_k &= c\, (z_{k+1} - x_k)
    \end{aligned}
    $$

    so $x_{k+1} = (1 - c) x_k + c z_{k+1}$. The learning rate is inside the
    transform (it weights the dual average), and the update is already a
    descent step: do not negate it. `update` needs the parameters. Complex
    parameters are refused with a clear error (as in Optax, which fails on the
    cube root); use `eqopt.contrib.split_real_and_imaginary`.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `momentum`: the momentum $1 - c$, in $[0, 1)$.
    - `eps`: added to the cube root.

    **References:** Defazio & Jelassi, *Adaptivity without Compromise: A
    Momentumized, Adaptive, Dual Averaged Gradient Method for Stochastic
    Optimization*, JMLR 2022 (arXiv:2101.11075).
    """

    learning_rate: Scalar | Schedule = eqx.field(converter=as_scalar_or_schedule)
    momentum: Scalar = eqx.field(default=0.9, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-6, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_hyperparameter("learning_rate", self.learning_rate, low=0.0)
        check_hyperparameter("momentum", self.momentum, low=0.0, high=1.0)
        check_hyperparameter("eps", self.eps, low=0.0)

    @init_entry
    def init(self, params: Params) -> MadgradState:
        refuse_complex(params, "madgrad")
        return MadgradState(
            count=jnp.zeros([], jnp.int32),
            grad_sum_sq=zeros_like_trainable(params),
            s=zeros_like_trainable(params),
            x0=copy_trainable(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: MadgradState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, MadgradState]:
        require_params(params, "madgrad")
        learning_rate = evaluate(self.learning_rate, state.count)
        # The reference implementation adds eps to the learning rate, so that a
        # zero learning rate still moves the dual average.
        weight = (learning_rate + self.eps) * jnp.sqrt(state.count + 1.0)
        averaging, eps = 1 - self.momentum, self.eps

        @no_type_check
        def step(g, v, s, x0, p):
            s = cast_to(s + weight * g, s.dtype)
            v = cast_to(v + weight * jnp.square(g), v.dtype)
            z = x0 - s / (jnp.cbrt(v) + eps)
            return cast_to(averaging * (z - p), g.dtype), v, s

        new_updates, grad_sum_sq, s = leafwise(
            step, updates, state.grad_sum_sq, state.s, state.x0, params, n_out=3
        )
        return new_updates, MadgradState(
            count=safe_int32_increment(state.count),
            grad_sum_sq=grad_sum_sq,
            s=s,
            x0=state.x0,
        )


@checked
def scale_by_madgrad(
    learning_rate: ScalarOrSchedule,
    momentum: ScalarLike = 0.9,
    eps: ScalarLike = 1e-6,
) -> ScaleByMadgrad:
    """Optax spelling of `eqopt.contrib.ScaleByMadgrad`."""
    return ScaleByMadgrad(learning_rate=learning_rate, momentum=momentum, eps=eps)


@checked
def madgrad(
    learning_rate: ScalarOrSchedule,
    momentum: ScalarLike = 0.9,
    weight_decay: ScalarLike = 0.0,
    eps: ScalarLike = 1e-6,
) -> Chain:
    r"""MADGRAD, with an optional $\ell_2$ penalty added to the gradients.

    The chain is `eqopt.AddDecayedWeights` then
    `eqopt.contrib.ScaleByMadgrad` (which holds the learning rate).

    **Arguments:**

    - `learning_rate`: a number or a schedule.
    - `momentum`: the momentum, in $[0, 1)$.
    - `weight_decay`: the $\ell_2$ penalty, added to the gradients.
    - `eps`: added to the cube root.

    **Returns:** an `eqopt.Chain`.

    **References:** Defazio & Jelassi, *Adaptivity without Compromise: A
    Momentumized, Adaptive, Dual Averaged Gradient Method for Stochastic
    Optimization*, JMLR 2022.
    """
    return Chain(
        AddDecayedWeights(weight_decay),
        ScaleByMadgrad(learning_rate=learning_rate, momentum=momentum, eps=eps),
    )
