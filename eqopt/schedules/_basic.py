"""Polynomial and linear schedules, and linear warmup to a constant."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Real

from .._hyper import Scalar, as_scalar
from .._typecheck import checked
from ._base import AbstractSchedule, as_static_int, broadcast_to_count


def _polynomial(
    init_value, end_value, power, transition_steps, transition_begin, count
):
    # `power=None` is the linear case, kept free of a `pow`.
    if transition_steps <= 0:
        return broadcast_to_count(init_value, count)
    steps_done = jnp.clip(count - max(transition_begin, 0), 0, transition_steps)
    # Clipped because, under `jit`, XLA may round `1 - steps / steps` below zero,
    # and a fractional power of it would be NaN.
    remaining = jnp.maximum(1 - steps_done / transition_steps, 0)
    if power is not None:
        remaining = remaining**power
    return (init_value - end_value) * remaining + end_value


def _linear(init_value, end_value, transition_steps, transition_begin, count):
    return _polynomial(
        init_value, end_value, None, transition_steps, transition_begin, count
    )


@checked
class PolynomialSchedule(AbstractSchedule):
    r"""A polynomial transition from `init_value` to `end_value`.

    With $I$ = `init_value`, $E$ = `end_value`, $p$ = `power`,
    $B$ = `transition_begin` and $T$ = `transition_steps`:

    $$
    \eta_t = (I - E)\left(1 - \frac{\operatorname{clip}(t - B,\ 0,\ T)}{T}\right)^{p} + E
    $$

    so the value is $I$ until step $B$ and $E$ from step $B + T$ on.

    **Arguments:**

    - `init_value`: the value $I$ before and at the start of the transition.
    - `end_value`: the value $E$ at and after the end of the transition.
    - `power`: the exponent $p$ of the polynomial.
    - `transition_steps`: the length $T$ of the transition (static). If it is not
        positive the schedule is constant at `init_value`.
    - `transition_begin`: the step $B$ at which the transition starts (static). A
        negative value is treated as `0`.
    """

    init_value: Scalar = eqx.field(converter=as_scalar)
    end_value: Scalar = eqx.field(converter=as_scalar)
    power: Scalar = eqx.field(converter=as_scalar)
    transition_steps: int = eqx.field(static=True, converter=as_static_int)
    transition_begin: int = eqx.field(static=True, converter=as_static_int, default=0)

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        return jnp.asarray(
            _polynomial(
                self.init_value,
                self.end_value,
                self.power,
                self.transition_steps,
                self.transition_begin,
                count,
            )
        )


@checked
def polynomial_schedule(
    init_value: Real[ArrayLike, ""],
    end_value: Real[ArrayLike, ""],
    power: Real[ArrayLike, ""],
    transition_steps: int,
    transition_begin: int = 0,
) -> PolynomialSchedule:
    """A polynomial transition from `init_value` to `end_value` (Optax's spelling).

    Builds a `eqopt.schedules.PolynomialSchedule`; the arguments, their names
    and defaults are Optax's, and the class documents them.

    **Returns:**

    A `eqopt.schedules.PolynomialSchedule`.
    """
    return PolynomialSchedule(
        init_value=init_value,
        end_value=end_value,
        power=power,
        transition_steps=transition_steps,
        transition_begin=transition_begin,
    )


@checked
class LinearSchedule(AbstractSchedule):
    r"""A linear transition from `init_value` to `end_value`.

    With $I$ = `init_value`, $E$ = `end_value`, $B$ = `transition_begin` and
    $T$ = `transition_steps`:

    $$
    \eta_t = (I - E)\left(1 - \frac{\operatorname{clip}(t - B,\ 0,\ T)}{T}\right) + E
    $$

    the `eqopt.schedules.PolynomialSchedule` of power one.

    **Arguments:**

    - `init_value`: the value $I$ before and at the start of the transition.
    - `end_value`: the value $E$ at and after the end of the transition.
    - `transition_steps`: the length $T$ of the transition (static). If it is not
        positive the schedule is constant at `init_value`.
    - `transition_begin`: the step $B$ at which the transition starts (static). A
        negative value is treated as `0`.
    """

    init_value: Scalar = eqx.field(converter=as_scalar)
    end_value: Scalar = eqx.field(converter=as_scalar)
    transition_steps: int = eqx.field(static=True, converter=as_static_int)
    transition_begin: int = eqx.field(static=True, converter=as_static_int, default=0)

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        return _linear(
            self.init_value,
            self.end_value,
            self.transition_steps,
            self.transition_begin,
            count,
        )


@checked
def linear_schedule(
    init_value: Real[ArrayLike, ""],
    end_value: Real[ArrayLike, ""],
    transition_steps: int,
    transition_begin: int = 0,
) -> LinearSchedule:
    """A linear transition from `init_value` to `end_value` (Optax's spelling).

    Builds a `eqopt.schedules.LinearSchedule`; the arguments, their names and
    defaults are Optax's, and the class documents them.

    **Returns:**

    A `eqopt.schedules.LinearSchedule`.
    """
    return LinearSchedule(
        init_value=init_value,
        end_value=end_value,
        transition_steps=transition_steps,
        transition_begin=transition_begin,
    )


@checked
class WarmupConstantSchedule(AbstractSchedule):
    r"""A linear warmup from `init_value` to `peak_value`, then constant.

    With $I$ = `init_value`, $P$ = `peak_value` and $W$ = `warmup_steps`:

    $$ \eta_t = I + (P - I)\,\frac{\operatorname{clip}(t,\ 0,\ W)}{W} $$

    (computed as a `eqopt.schedules.LinearSchedule` from $I$ to $P$ over $W$
    steps).

    **Arguments:**

    - `init_value`: the value $I$ at step 0.
    - `peak_value`: the value $P$ reached at step $W$ and kept afterwards.
    - `warmup_steps`: the length $W$ of the warmup (static). If it is not positive
        the schedule is constant at `init_value`, as in Optax.

    **References:**

    Goyal et al., *Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour*,
    2017, [arXiv:1706.02677](https://arxiv.org/abs/1706.02677) (gradual warmup).
    """

    init_value: Scalar = eqx.field(converter=as_scalar)
    peak_value: Scalar = eqx.field(converter=as_scalar)
    warmup_steps: int = eqx.field(static=True, converter=as_static_int)

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        return _linear(self.init_value, self.peak_value, self.warmup_steps, 0, count)


@checked
def warmup_constant_schedule(
    init_value: Real[ArrayLike, ""],
    peak_value: Real[ArrayLike, ""],
    warmup_steps: int,
) -> WarmupConstantSchedule:
    """A linear warmup to `peak_value`, then constant (Optax's spelling).

    Builds a `eqopt.schedules.WarmupConstantSchedule`; the arguments, their
    names and defaults are Optax's, and the class documents them.

    **Returns:**

    A `eqopt.schedules.WarmupConstantSchedule`.
    """
    return WarmupConstantSchedule(
        init_value=init_value, peak_value=peak_value, warmup_steps=warmup_steps
    )
