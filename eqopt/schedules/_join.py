"""Schedules run one after another."""

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Real

from .._typecheck import checked
from ._base import AbstractSchedule, _as_static_ints, as_schedule


def _as_schedules(schedules) -> tuple[AbstractSchedule, ...]:
    return tuple(as_schedule(schedule) for schedule in schedules)


@checked
class JoinSchedules(AbstractSchedule):
    r"""Runs several schedules one after another.

    With boundaries $b_1, \dots, b_{n-1}$ and schedules $s_0, \dots, s_{n-1}$,
    the last boundary reached decides which schedule runs, and it is evaluated
    on the number of steps since that boundary:

    $$ \eta_t = s_k(t - b_k), \qquad k = \max\{i : b_i \le t\},\ b_0 = 0 $$

    (with $s_0(t)$ used for every $t < b_1$, negative counts included). Boundaries
    are applied in the order given, each overriding the earlier ones once
    reached, as in Optax.

    **Arguments:**

    - `schedules`: a sequence of $n \ge 1$ schedules. Plain callables and numbers
        are accepted and wrapped with `eqopt.schedules.as_schedule`.
    - `boundaries`: a sequence of $n - 1$ integer steps (static) at which to
        switch to the next schedule.
    """

    schedules: tuple[AbstractSchedule, ...] = eqx.field(converter=_as_schedules)
    boundaries: tuple[int, ...] = eqx.field(static=True, converter=_as_static_ints)

    def __check_init__(self):
        if len(self.schedules) == 0:
            raise ValueError("`JoinSchedules` needs at least one schedule.")
        if len(self.boundaries) != len(self.schedules) - 1:
            raise ValueError(
                "`boundaries` must have one element fewer than `schedules`, got "
                f"{len(self.boundaries)} boundaries for {len(self.schedules)} schedules."
            )

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        value = self.schedules[0](count)
        for boundary, schedule in zip(self.boundaries, self.schedules[1:], strict=True):
            value = jnp.where(
                jnp.asarray(count) < boundary, value, schedule(count - boundary)
            )
        return value


@checked
def join_schedules(
    schedules: Sequence[Callable[..., Any]], boundaries: Sequence[int]
) -> JoinSchedules:
    """Runs `schedules` one after another (Optax's spelling).

    Builds a `eqopt.schedules.JoinSchedules`. Each schedule receives the
    number of steps since the boundary at which it starts. Unlike Optax, a
    number of `boundaries` other than `len(schedules) - 1` is an error rather
    than silently truncated.

    **Arguments:**

    - `schedules`: the schedules (or plain callables, or numbers), in order.
    - `boundaries`: the `len(schedules) - 1` steps at which to switch.

    **Returns:**

    A `eqopt.schedules.JoinSchedules`.
    """
    return JoinSchedules(schedules=schedules, boundaries=boundaries)
