"""A hyperparameter that may be a schedule of the step count: its state and its value.

A transform whose hyperparameter is a number keeps no state for it; when it is
a schedule (any callable of the step count), the transform counts steps. These
helpers are the one place that decides this, for every transform.
"""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int

from ._base import EmptyState
from ._numerics import safe_int32_increment
from ._optax_tuple import OptaxTuple
from ._typecheck import checked


@checked
class ScaleByScheduleState(eqx.Module, OptaxTuple):
    """The step count of a scheduled transform (`eqopt.ScaleBySchedule`, or a
    transform whose hyperparameter is a schedule)."""

    count: Int[Array, ""]


@checked
def init_count_if_scheduled(value: Any) -> ScaleByScheduleState | EmptyState:
    """The state a hyperparameter that may be a schedule needs: a step count if it is one.

    Returns a `eqopt.ScaleByScheduleState` (the count, starting at 0) for a
    schedule, and `eqopt.EmptyState` for a number. Call it in `init` and read
    the value in `update` with `eqopt.current_value`.
    """
    if callable(value):
        return ScaleByScheduleState(count=jnp.zeros([], jnp.int32))
    return EmptyState()


@checked
def current_value(value: Any, state: Any) -> tuple[Any, Any]:
    """A number as it is, or a schedule evaluated at the state's count.

    **Returns:** `(value, new_state)`: for a schedule, its value at `state.count`
    and the state with the count advanced by one; for a number, the number and
    `state` unchanged.
    """
    if callable(value):
        return jnp.asarray(value(state.count)), ScaleByScheduleState(
            count=safe_int32_increment(state.count)
        )
    return value, state
