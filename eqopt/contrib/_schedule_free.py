"""Schedule-free optimisation: interpolation and averaging instead of a schedule."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Float, Int

from .._alias import sgd
from .._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    OptState,
    Params,
    Updates,
    is_none,
    is_trainable,
)
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
from .._interop import as_transform
from .._leafwise import leafwise, require_params
from .._numerics import safe_increment
from .._optax_tuple import OptaxTuple
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._transform.rms import ScaleByRms
from .._typecheck import checked
from ..schedules._basic import warmup_constant_schedule
from ..tree._casting import dtype as tree_dtype


@checked
class ScheduleFreeState(eqx.Module, OptaxTuple):
    r"""The state of `eqopt.contrib.ScheduleFree`.

    `z` is the base optimiser's iterate $z_t$ (`None` at leaves that are not
    trained); the params themselves hold $y_t$. `weight_sum` is
    $\sum_{i \le t} \eta_{\max,i}^{p}$, `max_lr` the largest learning rate so
    far, and `step_count` starts at 1. `b1` is kept (in the params' lowest
    dtype) for `eqopt.contrib.schedule_free_eval_params`.
    """

    b1: Float[Array, ""]
    weight_sum: Float[Array, ""]
    step_count: Int[Array, ""]
    max_lr: Float[Array, ""]
    base_optimizer_state: OptState
    z: Updates


@checked
class ScheduleFree(AbstractWrapper):
    r"""Makes a base optimiser schedule-free (Defazio et al., 2024).

    Three sequences are kept: $z_t$, the base optimiser's iterate; $x_t$, a
    weighted average of the $z$'s, which is what to evaluate; and $y_t$, an
    interpolation of the two, where gradients are taken (the params you train).
    With $\Delta_t$ the base optimiser's update at $y_t$:

    $$
    \begin{aligned}
    z_{t+1} &= z_t + \Delta_t, \qquad
    c_{t+1} = \frac{\eta_{\max,t}^{\,p}}{\sum_{i \le t} \eta_{\max,i}^{\,p}} \\
    x_{t+1} &= (1 - c_{t+1})\, x_t + c_{t+1}\, z_{t+1} \\
    y_{t+1} &= \beta_1 x_{t+1} + (1 - \beta_1)\, z_{t+1}
    \end{aligned}
    $$

    where $\eta_{\max,t}$ is the largest learning rate so far and $p$ the
    `weight_lr_power`. The update returned is $y_{t+1} - y_t$, so the params
    hold $y$; $x$ is recovered from $y$ and $z$ by
    `eqopt.contrib.schedule_free_eval_params`. Evaluate (and checkpoint
    for inference) $x$, not the params.

    The learning rate here only weights the average; the base optimiser must
    apply it itself (as `eqopt.contrib.schedule_free_adamw` and
    `eqopt.contrib.schedule_free_sgd` do). `update` needs `params` and
    forwards extra arguments to the base optimiser.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `base_optimizer`: the optimiser producing $\Delta_t$, including its
      learning rate.
    - `learning_rate`: $\eta_t$, a number or a schedule (called with the step
      count, which starts at 1).
    - `b1`: the interpolation $\beta_1$.
    - `weight_lr_power`: $p$.
    - `state_dtype`: dtype to keep $z$ in (default: the params').

    **References:** Defazio, Yang, Mehta, Mishchenko, Khaled & Cutkosky, *The
    Road Less Scheduled*, NeurIPS 2024.
    """

    base_optimizer: AbstractGradientTransformation = eqx.field(converter=as_transform)
    learning_rate: Scalar | Schedule = eqx.field(converter=as_scalar_or_schedule)
    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    weight_lr_power: Scalar = eqx.field(default=2.0, converter=as_scalar)
    state_dtype: DTypeLike | None = eqx.field(default=None, static=True)

    def __check_init__(self):
        check_hyperparameter(
            "b1", self.b1, low=0.0, high=1.0, low_inclusive=False, high_inclusive=True
        )
        check_hyperparameter("learning_rate", self.learning_rate, low=0.0)

    @property
    def inner(self) -> AbstractGradientTransformation:  # pyright: ignore[reportIncompatibleVariableOverride]
        """The base optimiser, whose capabilities (a `freeze` in it...) are these."""
        return self.base_optimizer

    @init_entry
    def init(self, params: Params) -> ScheduleFreeState:
        trainable = eqx.filter(params, is_trainable)
        # The scalars are real, in the params' lowest dtype (bfloat16 for bfloat16 params).
        low = jnp.finfo(tree_dtype(trainable, "lowest")).dtype

        def copy(p):
            if not is_trainable(p):
                return None
            return jnp.array(p, dtype=self.state_dtype or p.dtype, copy=True)

        return ScheduleFreeState(
            b1=jnp.asarray(self.b1, dtype=low),
            weight_sum=jnp.zeros([], dtype=low),
            step_count=jnp.ones([], dtype=jnp.int32),
            max_lr=jnp.zeros([], dtype=low),
            base_optimizer_state=self.base_optimizer.init(params),
            z=jax.tree.map(copy, params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScheduleFreeState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScheduleFreeState]:
        require_params(params, "schedule_free")
        learning_rate = self.learning_rate
        if callable(learning_rate):
            learning_rate = jnp.asarray(
                learning_rate(state.step_count), dtype=state.max_lr.dtype
            )
        max_lr = jnp.maximum(state.max_lr, learning_rate)
        weight = max_lr**self.weight_lr_power
        weight_sum = state.weight_sum + weight
        # c = weight / weight_sum, with 0/0 (a zero learning rate so far) read as 0.
        ratio = jnp.where(
            jnp.isnan(weight) | jnp.isnan(weight_sum),
            jnp.nan,
            jnp.nan_to_num(weight / weight_sum, nan=0.0, posinf=jnp.inf),
        )
        base_updates, base_state = self.base_optimizer.update(
            updates, state.base_optimizer_state, params, **extra_args
        )
        b1 = self.b1

        @no_type_check
        def step(delta, z, y):
            z_next = (z + delta).astype(z.dtype)
            x = (y - (1.0 - b1) * z) / b1
            x = (1.0 - ratio) * x + ratio * z_next
            y_next = b1 * x + (1.0 - b1) * z_next
            return y_next - y, z_next

        params_like = jax.tree.map(
            lambda u, p: p, base_updates, params, is_leaf=is_none
        )
        new_updates, z = leafwise(step, base_updates, state.z, params_like, n_out=2)
        return new_updates, ScheduleFreeState(
            b1=state.b1,
            weight_sum=weight_sum,
            step_count=safe_increment(state.step_count),
            max_lr=max_lr,
            base_optimizer_state=base_state,
            z=z,
        )


@checked
def schedule_free(
    base_optimizer: Any,
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    weight_lr_power: ScalarLike = 2.0,
    state_dtype: DTypeLike | None = None,
) -> ScheduleFree:
    """Optax spelling of `eqopt.contrib.ScheduleFree`."""
    return ScheduleFree(  # pyright: ignore[reportCallIssue] (`inner` is a property)
        base_optimizer=base_optimizer,
        learning_rate=learning_rate,
        b1=b1,
        weight_lr_power=weight_lr_power,
        state_dtype=state_dtype,
    )


def _find_state(state: Any) -> ScheduleFreeState:
    if isinstance(state, ScheduleFreeState):
        return state
    found = [
        x
        for x in jax.tree.leaves(
            state, is_leaf=lambda x: isinstance(x, ScheduleFreeState)
        )
        if isinstance(x, ScheduleFreeState)
    ]
    if len(found) != 1:
        raise ValueError(
            "schedule_free_eval_params needs the state of a schedule-free optimiser "
            f"(a ScheduleFreeState, alone or inside another state); found {len(found)} "
            "in the state given."
        )
    return found[0]


@checked
def schedule_free_eval_params(state: Any, params: Params) -> Params:
    r"""The parameters to evaluate a schedule-free model at: the average $x_t$.

    $$ x_t = \frac{y_t - (1 - \beta_1)\, z_t}{\beta_1} $$

    where $y_t$ are the params being trained and $z_t$ the base iterate in the
    state. The params are a whole model: leaves that are not trained are
    returned as they are, and each trained leaf keeps its dtype (Optax returns
    the dtype of the arithmetic, which differs when `state_dtype` is set).

    **Arguments:**

    - `state`: the optimiser state: a `eqopt.contrib.ScheduleFreeState`,
      or any state containing exactly one (for example a chain's). Optax
      accepts the former only.
    - `params`: the params being trained, $y_t$.

    **Returns:** the evaluation params $x_t$, shaped like `params`.

    **References:** Defazio et al., *The Road Less Scheduled*, NeurIPS 2024.
    """
    state = _find_state(state)
    b1 = state.b1

    def evaluate(z, y):
        if z is None:
            return y
        return ((y - (1.0 - b1) * z) / b1).astype(y.dtype)

    return jax.tree.map(evaluate, state.z, params, is_leaf=is_none)


def _warmup(learning_rate: Any, warmup_steps: int | None) -> Any:
    if warmup_steps is None:
        return learning_rate
    return warmup_constant_schedule(
        init_value=0.0, peak_value=learning_rate, warmup_steps=warmup_steps
    )


@checked
def schedule_free_sgd(
    learning_rate: ScalarLike = 1.0,
    warmup_steps: int | None = None,
    b1: ScalarLike = 0.9,
    weight_decay: ScalarLike | None = None,
    weight_lr_power: ScalarLike = 2.0,
    state_dtype: DTypeLike | None = None,
) -> ScheduleFree:
    r"""Schedule-free SGD: `eqopt.contrib.ScheduleFree` around SGD.

    $$ \Delta_t = -\eta_t \big(g(y_t) + \lambda\, y_t\big) $$

    with the $z, x, y$ recursion of `eqopt.contrib.ScheduleFree`. The base
    optimiser is `eqopt.sgd`, after `eqopt.add_decayed_weights` when
    `weight_decay` is given.

    **Arguments:**

    - `learning_rate`: $\eta$, the peak learning rate.
    - `warmup_steps`: if given, $\eta$ rises linearly from 0 over these steps.
    - `b1`: the interpolation $\beta_1$.
    - `weight_decay`: $\lambda$, or `None` for none.
    - `weight_lr_power`: $p$, the power of the learning rate in the averaging weights.
    - `state_dtype`: dtype to keep $z$ in.

    **Returns:** a `eqopt.contrib.ScheduleFree`.

    **References:** Defazio et al., *The Road Less Scheduled*, NeurIPS 2024.
    """
    learning_rate = _warmup(learning_rate, warmup_steps)
    optimizer = sgd(learning_rate)
    if weight_decay is not None:
        optimizer = Chain(AddDecayedWeights(weight_decay), optimizer)
    return ScheduleFree(  # pyright: ignore[reportCallIssue]
        base_optimizer=optimizer,
        learning_rate=learning_rate,
        b1=b1,
        weight_lr_power=weight_lr_power,
        state_dtype=state_dtype,
    )


@checked
def schedule_free_adamw(
    learning_rate: ScalarLike = 0.0025,
    warmup_steps: int | None = None,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    weight_decay: ScalarLike = 0.0,
    weight_lr_power: ScalarLike = 2.0,
    state_dtype: DTypeLike | None = None,
) -> ScheduleFree:
    r"""Schedule-free AdamW: `eqopt.contrib.ScheduleFree` around an RMS-scaled step.

    $$
    v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, g_t^2, \qquad
    \Delta_t = -\eta_t \Big( \frac{g_t}{\sqrt{v_t / (1 - \beta_2^t)} + \epsilon}
                + \lambda\, y_t \Big)
    $$

    with the $z, x, y$ recursion of `eqopt.contrib.ScheduleFree`: there is no
    first moment, because the interpolation plays its part. The base optimiser is
    the chain `eqopt.scale_by_rms` (bias-corrected, $\epsilon$ outside the
    root), `eqopt.add_decayed_weights`, `eqopt.scale_by_learning_rate`.

    **Arguments:**

    - `learning_rate`: $\eta$, the peak learning rate.
    - `warmup_steps`: if given, $\eta$ rises linearly from 0 over these steps
      (the paper recommends a warmup).
    - `b1`: the interpolation $\beta_1$.
    - `b2`: the second-moment decay $\beta_2$.
    - `eps`: added to the denominator.
    - `weight_decay`: $\lambda$, applied at $y_t$.
    - `weight_lr_power`: $p$, the power of the learning rate in the averaging weights.
    - `state_dtype`: dtype to keep $z$ in.

    **Returns:** a `eqopt.contrib.ScheduleFree`.

    **References:** Defazio et al., *The Road Less Scheduled*, NeurIPS 2024.
    """
    learning_rate = _warmup(learning_rate, warmup_steps)
    optimizer = Chain(
        ScaleByRms(decay=b2, eps=eps, eps_in_sqrt=False, bias_correction=True),
        AddDecayedWeights(weight_decay),
        ScaleByLearningRate(learning_rate),
    )
    return ScheduleFree(  # pyright: ignore[reportCallIssue]
        base_optimizer=optimizer,
        learning_rate=learning_rate,
        b1=b1,
        weight_lr_power=weight_lr_power,
        state_dtype=state_dtype,
    )
