"""Adadelta: a step size from running averages of squared gradients and squared steps."""

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
    check_decays,
    check_hyperparameter,
)
from .._leafwise import full_like_trainable_real, leafwise
from .._numerics import abs_squared
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from .basic import ScaleByLearningRate
from .decay import AddDecayedWeights


@checked
class ScaleByAdadeltaState(eqx.Module, OptaxTuple):
    r"""The state of `eqopt.ScaleByAdadelta`.

    `e_g` is $E[g^2]$, the running average of squared gradients, and `e_x` is
    $E[\Delta x^2]$, the running average of squared steps (Optax's field names).
    """

    e_g: Updates
    e_x: Updates


@checked
class ScaleByAdadelta(AbstractGradientTransformation):
    r"""Rescales updates with Adadelta's ratio of root mean squares.

    $$
    \begin{aligned}
    E[g^2]_t &= \rho\, E[g^2]_{t-1} + (1 - \rho)\, |g_t|^2 \\
    \Delta_t &= \frac{\sqrt{E[\Delta^2]_{t-1} + \epsilon}}{\sqrt{E[g^2]_t + \epsilon}}\, g_t \\
    E[\Delta^2]_t &= \rho\, E[\Delta^2]_{t-1} + (1 - \rho)\, |\Delta_t|^2
    \end{aligned}
    $$

    The output is $\Delta_t$, in the direction of the gradient: follow it with
    a negative scaling (`eqopt.ScaleByLearningRate`) to descend, as
    `eqopt.adadelta` does. The running averages are real, also for complex
    updates.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `rho`: $\rho \in [0, 1)$, the decay of both running averages.
    - `eps`: $\epsilon > 0$, which also sets the size of the first steps.

    **References:** Zeiler, *ADADELTA: An Adaptive Learning Rate Method*,
    arXiv:1212.5701, 2012.
    """

    rho: Scalar = eqx.field(default=0.9, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-6, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "rho")
        check_hyperparameter("eps", self.eps, low=0.0)

    @init_entry
    def init(self, params: Params) -> ScaleByAdadeltaState:
        return ScaleByAdadeltaState(
            e_g=full_like_trainable_real(params, 0.0),
            e_x=full_like_trainable_real(params, 0.0),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByAdadeltaState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByAdadeltaState]:
        rho, eps = self.rho, self.eps
        one_minus_rho = 1 - rho

        @no_type_check
        def step(g, e_g, e_x):
            e_g = rho * e_g + one_minus_rho * abs_squared(g)
            delta = jnp.sqrt(e_x + eps) / jnp.sqrt(e_g + eps) * g
            e_x = rho * e_x + one_minus_rho * abs_squared(delta)
            return delta, e_g, e_x

        updates, e_g, e_x = leafwise(step, updates, state.e_g, state.e_x, n_out=3)
        return updates, ScaleByAdadeltaState(e_g=e_g, e_x=e_x)


@checked
def scale_by_adadelta(rho: ScalarLike = 0.9, eps: ScalarLike = 1e-6) -> ScaleByAdadelta:
    """Optax spelling of `eqopt.ScaleByAdadelta`."""
    return ScaleByAdadelta(rho=rho, eps=eps)


@checked
def adadelta(
    learning_rate: ScalarOrSchedule | None = None,
    rho: ScalarLike = 0.9,
    eps: ScalarLike = 1e-6,
    weight_decay: ScalarOrSchedule = 0.0,
    weight_decay_mask: FilterSpec | None = None,
) -> Chain:
    r"""Adadelta: gradient descent with a step size that needs no tuning.

    $$
    u_t = -\eta_t\, \frac{\sqrt{E[\Delta^2]_{t-1} + \epsilon}}{\sqrt{E[g^2]_t + \epsilon}}
          \big(g_t + \lambda\, \theta_{t-1}\big)
    $$

    with the running averages of `eqopt.ScaleByAdadelta`, which see the
    decayed gradient. The chain is `eqopt.AddDecayedWeights`,
    `eqopt.ScaleByAdadelta`, `eqopt.ScaleByLearningRate`;
    `weight_decay_mask` is an Equinox filter spec as in `eqopt.adamw` (a
    callable is a per-leaf predicate).

    !!! note "Differs from Optax"
        `learning_rate=None` (the default) is the paper's Adadelta, which has
        no learning rate: it descends with $\eta = 1$. Optax 0.2.8 then leaves
        the updates unscaled *and unnegated*, so `optax.adadelta()` climbs the
        loss. With a learning rate given the two agree.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count;
      `None` for the paper's $\eta = 1$.
    - `rho`, `eps`: as `eqopt.ScaleByAdadelta`.
    - `weight_decay`: $\lambda$, added to the gradient before the scaling.
    - `weight_decay_mask`: the filter spec of the leaves to decay (default: all).

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        opt = eqopt.adadelta()               # no learning rate needed (default 1.0)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
        ```

    **References:** Zeiler, *ADADELTA: An Adaptive Learning Rate Method*,
    arXiv:1212.5701, 2012.
    """
    return Chain(
        AddDecayedWeights(weight_decay=weight_decay, mask=weight_decay_mask),
        ScaleByAdadelta(rho=rho, eps=eps),
        ScaleByLearningRate(
            learning_rate=1.0 if learning_rate is None else learning_rate
        ),
    )
