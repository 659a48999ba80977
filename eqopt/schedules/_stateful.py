"""Stateful schedules: a value computed from a state that the schedule advances each step.

Used by `eqopt.inject_stateful_hyperparams` (and `eqopt.inject_hyperparams`,
which switches to it when given one).
"""

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Int, PyTree

from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked


class AbstractStatefulSchedule(eqx.Module):
    """A schedule whose value comes from a state that it updates every step.

    A plain schedule is a function of the step count. A stateful schedule keeps
    its own state instead, and may use the extra arguments given to `update`
    (for example `loss=...`) to advance it: a learning rate that halves when
    the loss stops improving is one. It is used through
    `eqopt.inject_stateful_hyperparams` (or `eqopt.inject_hyperparams`,
    which switches to it when given one).

    Any object with the three methods below is accepted as a stateful
    schedule, so one written for Optax's `StatefulSchedule` protocol works
    unchanged; subclassing this class makes it a Module, with its numeric
    settings as leaves.

    !!! example

        ```python
        class HalveOnIncrease(eqopt.AbstractStatefulSchedule):
            init_value: float

            def init(self):
                return {"scale": jnp.array(1.0), "best": jnp.array(jnp.inf)}

            def update(self, state, *, loss, **extra_args):
                worse = loss > state["best"]
                return {"scale": jnp.where(worse, state["scale"] / 2, state["scale"]),
                        "best": jnp.minimum(loss, state["best"])}

            def __call__(self, state, **extra_args):
                return self.init_value * state["scale"]

        opt = eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(
            learning_rate=HalveOnIncrease(0.1)
        )
        state = opt.init(model)
        loss = loss_fn(model, x, y)
        updates, state = opt.update(grads, state, model, loss=loss)
        ```
    """

    @abc.abstractmethod
    def init(self) -> PyTree[Any]:
        """Builds the schedule's initial state.

        **Returns:** the state, any pytree of arrays.
        """

    @abc.abstractmethod
    def update(self, state: PyTree[Any], **extra_args: Any) -> PyTree[Any]:
        """Advances the state by one step.

        **Arguments:**

        - `state`: the current state.
        - `**extra_args`: the extra keyword arguments given to the optimiser's
          `update` (`loss`, `value`...); accept `**extra_args` to ignore them.

        **Returns:** the next state.
        """

    @abc.abstractmethod
    def __call__(self, state: PyTree[Any], **extra_args: Any) -> ArrayLike:
        """The value of the hyperparameter in the given state.

        **Arguments:** as `update`.

        **Returns:** a scalar.
        """


def is_stateful_schedule(value: Any) -> bool:
    """Whether `value` is a stateful schedule: an `AbstractStatefulSchedule`, or any
    callable object with Optax's `init` and `update` methods."""
    if isinstance(value, AbstractStatefulSchedule):
        return True
    # Optax's protocol, duck-typed. A class (an eqopt transform class as an
    # argument, say) has these attributes too but is not a schedule.
    return (
        callable(value)
        and not isinstance(value, type)
        and callable(getattr(value, "init", None))
        and callable(getattr(value, "update", None))
    )


@checked
class ScheduleCountState(eqx.Module, OptaxTuple):
    """The state of a `eqopt.WrappedSchedule`: the step count of a plain schedule."""

    count: Int[Array, ""]


@checked
class WrappedSchedule(AbstractStatefulSchedule):
    """Turns a plain schedule into a stateful one whose state is its step count.

    This is Optax's `WrappedSchedule`: `init()` starts the count at zero,
    `update(state)` adds one, and `__call__(state)` evaluates the schedule at
    the count. `eqopt.inject_stateful_hyperparams` wraps plain schedules
    this way itself; use it directly to mix plain and stateful schedules by hand.

    **Arguments:**

    - `schedule_fn`: a schedule, or any callable of the step count.
    """

    schedule_fn: Callable[..., Any]

    def init(self) -> ScheduleCountState:
        return ScheduleCountState(count=jnp.zeros([], jnp.int32))

    def update(
        self, state: ScheduleCountState, **extra_args: Any
    ) -> ScheduleCountState:
        return ScheduleCountState(count=safe_int32_increment(state.count))

    def __call__(self, state: ScheduleCountState, **extra_args: Any) -> Any:
        return self.schedule_fn(state.count)


def as_stateful(schedule: Any) -> Any:
    """A stateful schedule as it is; a plain one wrapped in a `WrappedSchedule`."""
    return (
        schedule
        if is_stateful_schedule(schedule)
        else WrappedSchedule(schedule_fn=schedule)
    )
