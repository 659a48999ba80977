"""Optimistic gradient methods: a step against the change of the gradient, for games."""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool

from .._base import AbstractGradientTransformation, Params, Updates
from .._combine import Chain
from .._deprecation import deprecated
from .._entry import init_entry, update_entry
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_hyperparameter,
)
from .._leafwise import leafwise, zeros_like_trainable
from .._optax_tuple import OptaxTuple
from .._quantize import MomentDType
from .._typecheck import checked
from .adam import ScaleByAdam
from .basic import Scale, ScaleByLearningRate


@checked
class ScaleByOptimisticGradientState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByOptimisticGradient` (Optax's field names).

    `previous_gradient` is $g_{t-1}$; `is_initial_step` is true until the first
    update, which has no previous gradient.
    """

    is_initial_step: Bool[Array, ""]
    previous_gradient: Updates


@checked
class ScaleByOptimisticGradient(AbstractGradientTransformation):
    r"""Makes the updates optimistic: a step along the gradient and against its change.

    $$ u_t = (\alpha + \beta)\, g_t - \beta\, g_{t-1} = \alpha g_t + \beta (g_t - g_{t-1}) $$

    At the first step $g_0 = g_1$, so $u_1 = \alpha g_1$. Anticipating the next
    gradient this way damps the rotation that makes plain gradient descent
    cycle or diverge in min-max games. $\alpha = \beta = 1$ is the optimistic
    gradient descent of Daskalakis et al.; other values are the generalised
    form analysed by Mokhtari et al. Follow with a negative scaling to descend.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `alpha`: $\alpha$, the weight of the current gradient.
    - `beta`: $\beta$, the weight of the change in the gradient.

    **References:** Daskalakis, Ilyas, Syrgkanis & Zeng, *Training GANs with
    Optimism*, ICLR 2018; Mokhtari, Ozdaglar & Pattathil, *A Unified Analysis
    of Extra-gradient and Optimistic Gradient Methods for Saddle Point
    Problems: Proximal Point Approach*, AISTATS 2020.
    """

    alpha: Scalar = eqx.field(default=1.0, converter=as_scalar)
    beta: Scalar = eqx.field(default=1.0, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_hyperparameter("alpha", self.alpha)
        check_hyperparameter("beta", self.beta)

    @init_entry
    def init(self, params: Params) -> ScaleByOptimisticGradientState:
        return ScaleByOptimisticGradientState(
            is_initial_step=jnp.array(True),
            previous_gradient=zeros_like_trainable(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByOptimisticGradientState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByOptimisticGradientState]:
        alpha, beta = self.alpha, self.beta
        initial = state.is_initial_step

        @no_type_check
        def step(g, previous):
            previous = jnp.where(initial, g, previous)
            return (alpha + beta) * g - beta * previous, g

        updates, previous_gradient = leafwise(
            step, updates, state.previous_gradient, n_out=2
        )
        return updates, ScaleByOptimisticGradientState(
            is_initial_step=jnp.array(False), previous_gradient=previous_gradient
        )


@checked
def scale_by_optimistic_gradient(
    alpha: ScalarLike = 1.0, beta: ScalarLike = 1.0
) -> ScaleByOptimisticGradient:
    """Optax spelling of `eqopt.ScaleByOptimisticGradient`."""
    return ScaleByOptimisticGradient(alpha=alpha, beta=beta)


@checked
def optimistic_gradient_descent(
    learning_rate: ScalarOrSchedule,
    alpha: ScalarLike = 1.0,
    beta: ScalarLike = 1.0,
) -> Chain:
    r"""Optimistic gradient descent, for min-max games.

    $$ u_t = -\eta_t \big( (\alpha + \beta)\, g_t - \beta\, g_{t-1} \big) $$

    The chain is `eqopt.ScaleByOptimisticGradient`, then
    `eqopt.ScaleByLearningRate`. Optax's signature allows a schedule for
    `alpha` and `beta` but its update fails with one; here they are numbers
    (leaves, so they can still be changed without recompiling).

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `alpha`, `beta`: as `eqopt.ScaleByOptimisticGradient`.

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        # For min-max games: each player's update uses its gradient's change.
        opt = eqopt.optimistic_gradient_descent(learning_rate=1e-2, alpha=1.0, beta=1.0)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
        ```

    **References:** Mokhtari, Ozdaglar & Pattathil, *A Unified Analysis of
    Extra-gradient and Optimistic Gradient Methods for Saddle Point Problems:
    Proximal Point Approach*, AISTATS 2020.
    """
    return Chain(
        ScaleByOptimisticGradient(alpha=alpha, beta=beta),
        ScaleByLearningRate(learning_rate=learning_rate),
    )


@deprecated("`eqopt.optimistic_adam_v2`", optax_says="`optimistic_adam_v2`")
@checked
def optimistic_adam(
    learning_rate: ScalarLike,
    optimism: ScalarLike | None = None,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    mu_dtype: MomentDType = None,
    *,
    nesterov: bool = True,
    nu_dtype: MomentDType = None,
) -> Chain:
    r"""Optimistic Adam: Adam's step made optimistic, for GANs and other games.

    $$
    r_t = \frac{\hat m_t}{\sqrt{\hat v_t + \epsilon_{\text{root}}} + \epsilon}, \qquad
    u_t = -\eta\, r_t - o\, (r_t - r_{t-1})
    $$

    with $\hat m_t$, $\hat v_t$ Adam's bias-corrected moments (Nesterov's by
    default, as in Optax) and $r_0 = r_1$. The chain is
    `eqopt.ScaleByAdam`, `eqopt.ScaleByOptimisticGradient` with
    $\alpha = \eta$ and $\beta = o$, then `eqopt.Scale` by $-1$. Prefer
    `eqopt.optimistic_adam_v2`, whose learning rate may be scheduled.

    **Arguments:**

    - `learning_rate`: $\eta$.
    - `optimism`: $o$; `None` means $o = \eta$, as in the paper.
    - `b1`, `b2`, `eps`, `eps_root`, `mu_dtype`, `nesterov`: as
      `eqopt.ScaleByAdam`.

    **Returns:** an `eqopt.Chain`.

    **References:** Daskalakis, Ilyas, Syrgkanis & Zeng, *Training GANs with
    Optimism*, ICLR 2018.
    """
    return Chain(
        ScaleByAdam(
            b1=b1,
            b2=b2,
            eps=eps,
            eps_root=eps_root,
            mu_dtype=mu_dtype,
            nu_dtype=nu_dtype,
            nesterov=nesterov,
        ),
        ScaleByOptimisticGradient(
            alpha=learning_rate,
            beta=learning_rate if optimism is None else optimism,
        ),
        Scale(step_size=-1.0),
    )


@checked
def optimistic_adam_v2(
    learning_rate: ScalarOrSchedule,
    *,
    alpha: ScalarLike = 1.0,
    beta: ScalarLike = 1.0,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    mu_dtype: MomentDType = None,
    nesterov: bool = True,
    nu_dtype: MomentDType = None,
) -> Chain:
    r"""Optimistic Adam, with the learning rate separate from the optimism.

    $$
    u_t = -\eta_t \big( (\alpha + \beta)\, r_t - \beta\, r_{t-1} \big), \qquad
    r_t = \frac{\hat m_t}{\sqrt{\hat v_t + \epsilon_{\text{root}}} + \epsilon}
    $$

    The chain is `eqopt.ScaleByAdam` (Nesterov's by default),
    `eqopt.ScaleByOptimisticGradient`, `eqopt.ScaleByLearningRate`.
    `optimistic_adam_v2(1.0, alpha=lr, beta=o)` is `optimistic_adam(lr, o)`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `alpha`, `beta`: as `eqopt.ScaleByOptimisticGradient`.
    - `b1`, `b2`, `eps`, `eps_root`, `mu_dtype`, `nesterov`: as
      `eqopt.ScaleByAdam`.

    **Returns:** an `eqopt.Chain`.

    **References:** Daskalakis, Ilyas, Syrgkanis & Zeng, *Training GANs with
    Optimism*, ICLR 2018.
    """
    return Chain(
        ScaleByAdam(
            b1=b1,
            b2=b2,
            eps=eps,
            eps_root=eps_root,
            mu_dtype=mu_dtype,
            nu_dtype=nu_dtype,
            nesterov=nesterov,
        ),
        ScaleByOptimisticGradient(alpha=alpha, beta=beta),
        ScaleByLearningRate(learning_rate=learning_rate),
    )
