"""COCOB-Backprop: training without learning rates by coin betting (Orabona & Tommasi, 2017)."""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp

from .._base import AbstractGradientTransformation, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._filters import FilterSpec
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_hyperparameter,
)
from .._leafwise import leafwise, zeros_like_trainable
from .._optax_tuple import OptaxTuple
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._reductions import copy_trainable, refuse_complex, require_params


@checked
class COCOBState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByCocob`, per coordinate: the initial
    parameters $w_1$, the sum of gradients $\\theta$, the largest gradient seen
    $L$, the sum of absolute gradients $G$ and the reward."""

    init_particles: Updates
    cumulative_gradients: Updates
    scale: Updates
    subgradients: Updates
    reward: Updates


@checked
class ScaleByCocob(AbstractGradientTransformation):
    r"""Replaces the updates by the coin-betting step of COCOB-Backprop.

    Each coordinate bets a fraction of its accumulated reward on the sign of the
    negative gradient. With $w_1$ the initial parameters and, per coordinate,

    $$
    \begin{aligned}
    L_t &= \max(L_{t-1}, |g_t|), \qquad G_t = G_{t-1} + |g_t|, \qquad
    \theta_t = \theta_{t-1} + g_t \\
    R_t &= \max\big(R_{t-1} - (w_t - w_1)\, g_t,\ 0\big) \\
    w_{t+1} &= w_1 - \frac{\theta_t}{L_t \max(G_t + L_t,\ \alpha L_t)}\, (L_t + R_t)
    \end{aligned}
    $$

    the update is $w_{t+1} - w_t$ ($L_0 = \epsilon$). It is already a descent
    step: do not negate it.

    Complex parameters are refused with a clear error (the betting compares
    gradients with zero); Optax runs on them with JAX's ordering of complex
    numbers. Optimise complex parameters through
    `eqopt.contrib.split_real_and_imaginary`.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `alpha`: bounds the fraction bet while $G_t$ is small.
    - `eps`: the initial $L_0$, avoiding a division by zero.

    **References:** Orabona & Tommasi, *Training Deep Networks without Learning
    Rates Through Coin Betting*, NeurIPS 2017 (arXiv:1705.07795), Algorithm 2.
    """

    alpha: Scalar = eqx.field(default=100.0, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_hyperparameter("alpha", self.alpha, low=0.0, low_inclusive=False)
        check_hyperparameter("eps", self.eps, low=0.0)

    @init_entry
    def init(self, params: Params) -> COCOBState:
        refuse_complex(params, "cocob")
        # Separate buffers for each field, so the state can be donated.
        return COCOBState(
            init_particles=copy_trainable(params),
            cumulative_gradients=zeros_like_trainable(params),
            scale=leafwise(
                lambda p: jnp.full_like(p, self.eps), zeros_like_trainable(params)
            ),
            subgradients=zeros_like_trainable(params),
            reward=zeros_like_trainable(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: COCOBState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, COCOBState]:
        require_params(params, "cocob")
        alpha = self.alpha

        @no_type_check
        def step(g, theta, scale, subgradients, reward, p, w1):
            scale = jnp.maximum(scale, jnp.abs(g))
            subgradients = subgradients + jnp.abs(g)
            reward = jnp.maximum(reward - (p - w1) * g, 0)
            theta = theta + g
            bet = theta / (scale * jnp.maximum(subgradients + scale, alpha * scale))
            new_p = w1 - bet * (scale + reward)
            return (new_p - p).astype(g.dtype), theta, scale, subgradients, reward

        new_updates, theta, scale, subgradients, reward = leafwise(
            step,
            updates,
            # The state trees first: leafwise keeps them where an update is None.
            state.cumulative_gradients,
            state.scale,
            state.subgradients,
            state.reward,
            params,
            state.init_particles,
            n_out=5,
        )
        return new_updates, COCOBState(
            init_particles=state.init_particles,
            cumulative_gradients=theta,
            scale=scale,
            subgradients=subgradients,
            reward=reward,
        )


@checked
def scale_by_cocob(alpha: ScalarLike = 100.0, eps: ScalarLike = 1e-8) -> ScaleByCocob:
    """Optax spelling of `eqopt.contrib.ScaleByCocob`."""
    return ScaleByCocob(alpha=alpha, eps=eps)


@checked
def cocob(
    learning_rate: ScalarOrSchedule = 1.0,
    alpha: ScalarLike = 100.0,
    eps: ScalarLike = 1e-8,
    weight_decay: ScalarLike = 0.0,
    mask: FilterSpec | None = None,
) -> Chain:
    r"""COCOB-Backprop: learning-rate-free training by coin betting.

    The gradient (plus $\lambda x$) is scaled by `learning_rate`, then
    `eqopt.contrib.ScaleByCocob` turns it into a step. The chain is
    `eqopt.AddDecayedWeights`, `eqopt.ScaleByLearningRate` (without
    negation), `eqopt.contrib.ScaleByCocob`. `mask` is an Equinox filter
    spec of the leaves to decay.

    **Arguments:**

    - `learning_rate`: an optional scale (or schedule) on the gradients.
    - `alpha`, `eps`: as `eqopt.contrib.ScaleByCocob`.
    - `weight_decay`: $\lambda$, an $\ell_2$ penalty added to the gradients.
    - `mask`: the filter spec of the leaves to decay.

    **Returns:** an `eqopt.Chain`.

    **References:** Orabona & Tommasi, *Training Deep Networks without Learning
    Rates Through Coin Betting*, NeurIPS 2017.
    """
    return Chain(
        AddDecayedWeights(weight_decay, mask),
        ScaleByLearningRate(learning_rate, flip_sign=False),
        ScaleByCocob(alpha=alpha, eps=eps),
    )
