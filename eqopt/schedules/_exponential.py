"""Exponential decay, with and without a linear warmup."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Real

from .._hyper import Scalar, as_optional_scalar, as_scalar
from .._typecheck import checked
from ._base import AbstractSchedule, as_static_int, broadcast_to_count
from ._basic import _linear


def _exponential_decay(
    init_value,
    transition_steps,
    decay_rate,
    transition_begin,
    staircase,
    end_value,
    count,
):
    if transition_steps <= 0:
        return broadcast_to_count(init_value, count)
    steps_done = count - max(transition_begin, 0)
    exponent = steps_done / transition_steps
    if staircase:
        exponent = jnp.floor(exponent)
    # `decay_rate` is a dynamic leaf: its special cases are selected with `where`,
    # and a zero rate is kept out of `pow` so that gradients stay finite.
    is_zero_rate = decay_rate == 0
    safe_rate = jnp.where(is_zero_rate, 1, decay_rate)
    decayed = jnp.where(
        steps_done <= 0, init_value, init_value * jnp.power(safe_rate, exponent)
    )
    if end_value is not None:
        decayed = jnp.where(
            decay_rate < 1,
            jnp.maximum(decayed, end_value),
            jnp.minimum(decayed, end_value),
        )
    return jnp.where(is_zero_rate, init_value, decayed)


@checked
class ExponentialDecaySchedule(AbstractSchedule):
    r"""Exponential decay of `init_value` by `decay_rate` every `transition_steps`.

    With $I$ = `init_value`, $r$ = `decay_rate`, $B$ = `transition_begin` and
    $T$ = `transition_steps`:

    $$
    \eta_t = \begin{cases}
        I & t \le B \\
        I\, r^{(t - B)/T} & t > B
    \end{cases}
    $$

    With `staircase=True` the exponent is rounded down, $r^{\lfloor (t - B)/T
    \rfloor}$, so the value drops once every $T$ steps. If `end_value` $E$ is
    given the value is clipped there: $\max(\eta_t, E)$ when $r < 1$ (decay),
    $\min(\eta_t, E)$ when $r \ge 1$ (growth).

    **Arguments:**

    - `init_value`: the value $I$ until step $B$.
    - `transition_steps`: the number of steps $T$ over which the value is
        multiplied by $r$ (static). If it is not positive the schedule is constant
        at `init_value`.
    - `decay_rate`: the factor $r$. A rate of exactly `0` gives a schedule
        constant at `init_value`, as in Optax. A dynamic leaf: decay rates can be
        swept with `vmap`.
    - `transition_begin`: the step $B$ at which the decay starts (static). A
        negative value is treated as `0`.
    - `staircase`: whether to decay in discrete steps (static).
    - `end_value`: an optional bound $E$ on the value, a lower bound when $r < 1$
        and an upper bound otherwise. No effect when $r = 0$.
    """

    init_value: Scalar = eqx.field(converter=as_scalar)
    transition_steps: int = eqx.field(static=True, converter=as_static_int)
    decay_rate: Scalar = eqx.field(converter=as_scalar)
    transition_begin: int = eqx.field(static=True, converter=as_static_int, default=0)
    staircase: bool = eqx.field(static=True, default=False)
    end_value: Scalar | None = eqx.field(default=None, converter=as_optional_scalar)

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        return _exponential_decay(
            self.init_value,
            self.transition_steps,
            self.decay_rate,
            self.transition_begin,
            self.staircase,
            self.end_value,
            count,
        )


@checked
def exponential_decay(
    init_value: Real[ArrayLike, ""],
    transition_steps: int,
    decay_rate: Real[ArrayLike, ""],
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: Real[ArrayLike, ""] | None = None,
) -> ExponentialDecaySchedule:
    """Exponential decay of `init_value` by `decay_rate` (Optax's spelling).

    Builds a `eqopt.schedules.ExponentialDecaySchedule`; the arguments, their
    names and defaults are Optax's, and the class documents them.

    **Returns:**

    A `eqopt.schedules.ExponentialDecaySchedule`.
    """
    return ExponentialDecaySchedule(
        init_value=init_value,
        transition_steps=transition_steps,
        decay_rate=decay_rate,
        transition_begin=transition_begin,
        staircase=staircase,
        end_value=end_value,
    )


@checked
class WarmupExponentialDecaySchedule(AbstractSchedule):
    r"""A linear warmup from `init_value` to `peak_value`, then exponential decay.

    With $W$ = `warmup_steps`, the first $W$ steps are a
    `eqopt.schedules.LinearSchedule` from `init_value` $I$ to `peak_value`
    $P$; from step $W$ on, the value is an
    `eqopt.schedules.ExponentialDecaySchedule` starting at $P$, evaluated on
    the steps since the end of the warmup:

    $$
    \eta_t = \begin{cases}
        I + (P - I)\,\frac{\max(t, 0)}{W} & t < W \\
        \operatorname{ExponentialDecay}(P, T, r, B, \text{staircase}, E)(t - W) & t \ge W
    \end{cases}
    $$

    **Arguments:**

    - `init_value`: the value $I$ at step 0.
    - `peak_value`: the value $P$ at the end of the warmup.
    - `warmup_steps`: the length $W$ of the warmup (static).
    - `transition_steps`, `decay_rate`, `transition_begin`, `staircase`,
        `end_value`: as for `eqopt.schedules.ExponentialDecaySchedule`, with
        `transition_begin` counted from the end of the warmup.

    **References:**

    Goyal et al., *Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour*,
    2017, [arXiv:1706.02677](https://arxiv.org/abs/1706.02677) (gradual warmup).
    """

    init_value: Scalar = eqx.field(converter=as_scalar)
    peak_value: Scalar = eqx.field(converter=as_scalar)
    warmup_steps: int = eqx.field(static=True, converter=as_static_int)
    transition_steps: int = eqx.field(static=True, converter=as_static_int)
    decay_rate: Scalar = eqx.field(converter=as_scalar)
    transition_begin: int = eqx.field(static=True, converter=as_static_int, default=0)
    staircase: bool = eqx.field(static=True, default=False)
    end_value: Scalar | None = eqx.field(default=None, converter=as_optional_scalar)

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        warmup = _linear(self.init_value, self.peak_value, self.warmup_steps, 0, count)
        decay = _exponential_decay(
            self.peak_value,
            self.transition_steps,
            self.decay_rate,
            self.transition_begin,
            self.staircase,
            self.end_value,
            count - self.warmup_steps,
        )
        return jnp.where(jnp.asarray(count) < self.warmup_steps, warmup, decay)


@checked
def warmup_exponential_decay_schedule(
    init_value: Real[ArrayLike, ""],
    peak_value: Real[ArrayLike, ""],
    warmup_steps: int,
    transition_steps: int,
    decay_rate: Real[ArrayLike, ""],
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: Real[ArrayLike, ""] | None = None,
) -> WarmupExponentialDecaySchedule:
    """A linear warmup, then exponential decay (Optax's spelling).

    Builds a `eqopt.schedules.WarmupExponentialDecaySchedule`; the arguments,
    their names and defaults are Optax's, and the class documents them.

    **Returns:**

    A `eqopt.schedules.WarmupExponentialDecaySchedule`.
    """
    return WarmupExponentialDecaySchedule(
        init_value=init_value,
        peak_value=peak_value,
        warmup_steps=warmup_steps,
        transition_steps=transition_steps,
        decay_rate=decay_rate,
        transition_begin=transition_begin,
        staircase=staircase,
        end_value=end_value,
    )
