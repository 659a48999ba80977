"""The schedule protocol, wrapping plain callables, hyperparameters that may be schedules."""

import abc
import functools
import operator
from collections.abc import Callable
from typing import Any, SupportsIndex, cast, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int, Real

from .._hyper import Scalar, as_scalar, check_fields, is_concrete, weak_hyperparameters
from .._typecheck import checked


def as_static_int(value: int | Int[ArrayLike, ""]) -> int:
    # Step counts are static: a concrete 0-d array becomes the Python int it holds
    # (an integer array supports `__index__`; anything else raises a TypeError).
    return operator.index(cast(SupportsIndex, value))


def _as_static_ints(values) -> tuple[int, ...]:
    return tuple(operator.index(value) for value in values)


class _Number:
    # Shown in place of a concrete scalar leaf by `AbstractSchedule.__repr__`.
    def __init__(self, value: Array | np.ndarray):
        self.value = value

    def __repr__(self) -> str:
        number = str(np.asarray(self.value)[()])
        if isinstance(self.value, np.ndarray) or getattr(
            self.value, "weak_type", False
        ):
            return number
        return f"{self.value.dtype.name}({number})"


def _show_number(leaf):
    if is_concrete(leaf) and leaf.ndim == 0:
        return _Number(leaf)
    return leaf


def broadcast_to_count(value: Any, count: Any) -> Array:
    """`value` broadcast to the shape of the step `count` (a schedule's output shape).

    For the parts of a schedule that do not depend on the step (a constant, or a
    transition of zero length), so that an array of steps gets an array back.
    """
    value = jnp.asarray(value)
    shape = jnp.shape(count)
    return value if value.shape == shape else jnp.broadcast_to(value, shape)


class AbstractSchedule(eqx.Module):
    """Base class for schedules: modules mapping a step count to a scalar.

    A schedule is an `equinox.Module`, so its numeric hyperparameters (initial,
    peak and end values, decay rates...) are array leaves: they can be changed
    with `eqx.tree_at` without recompiling a `filter_jit`-ed function,
    `vmap`-ped over for a sweep, and differentiated. Step counts that decide the
    shape of the schedule (`transition_steps`, `boundaries`...) are static.

    Subclasses implement `__call__`. A plain Python callable is turned into a
    schedule by `eqopt.schedules.FunctionSchedule` (or
    `eqopt.schedules.as_schedule`).

    !!! example

        ```python
        schedule = eqopt.schedules.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=1e-3, warmup_steps=100, decay_steps=10_000
        )
        print(schedule)  # WarmupCosineDecaySchedule(init_value=0.0, ...)

        @eqx.filter_jit
        def value_at(schedule, count):
            return schedule(count)

        value_at(schedule, jnp.array(500))
        # A new peak is a new leaf value, not a recompile. Convert it as the
        # constructor does (a weakly-typed scalar, like the original): a Python
        # float leaf would be static under `filter_jit`.
        schedule = eqx.tree_at(lambda s: s.peak_value, schedule, eqopt.as_scalar(2e-3))
        value_at(schedule, jnp.array(500))
        ```
    """

    @no_type_check
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # A schedule computes with its hyperparameters weakly typed, as with
        # Python numbers, also where they are strongly typed or NumPy
        # (`eqopt.on_host`).
        call = cls.__dict__.get("__call__")
        if callable(call) and not getattr(call, "__isabstractmethod__", False):

            @functools.wraps(call)
            def __call__(self, count):
                return call(weak_hyperparameters(self), count)

            cls.__call__ = __call__

    def __check_init__(self):
        check_fields(self)

    # Identity, so that `jax.jit(schedule)` works (it hashes the callable).
    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    @abc.abstractmethod
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        """Evaluates the schedule at step `count`, or at every step of an array.

        **Arguments:**

        - `count`: the step count: a Python `int` or `float`, or an integer or
            floating-point array of any shape (possibly traced, for example the
            `count` field of an optimiser state). Counts before the start (even
            negative ones) and after the end of the schedule are valid. An array
            of steps evaluates the schedule at each, for example to plot it:
            `schedule(jnp.arange(num_steps))`.

        **Returns:**

        The value of the schedule at `count`, a floating-point array of the shape
        of `count` (a scalar for a scalar count). Its dtype follows JAX's
        promotion rules between the hyperparameters and the count: with
        Python-number hyperparameters (weakly typed) and a Python `int` count it
        is a weakly-typed default float, so it does not promote a `bfloat16`
        computation that it scales.
        """

    def __repr__(self) -> str:
        # Concrete scalar hyperparameters print as numbers instead of `weak_f32[]`.
        return eqx.tree_pformat(jax.tree.map(_show_number, self))


@checked
class ConstantSchedule(AbstractSchedule):
    r"""A schedule that always returns the same value.

    $$ \eta_t = v $$

    **Arguments:**

    - `value`: the value $v$ returned at every step.
    """

    value: Scalar = eqx.field(converter=as_scalar)

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        return broadcast_to_count(self.value, count)


@checked
def constant_schedule(value: Real[ArrayLike, ""]) -> ConstantSchedule:
    """A schedule holding `value` at every step (Optax's spelling).

    Builds a `eqopt.schedules.ConstantSchedule`. Unlike Optax's, it returns
    the value as a floating-point array (Optax returns `value` itself).

    **Returns:**

    A `eqopt.schedules.ConstantSchedule`.
    """
    return ConstantSchedule(value=value)


@checked
class FunctionSchedule(AbstractSchedule):
    """A schedule that calls a plain function of the step count.

    This is how any callable `count -> value` (an Optax schedule, a `lambda`)
    becomes an eqopt schedule. The result is converted to a floating-point
    array. If the callable is itself a pytree (an `eqx.Module`, a
    `jax.tree_util.Partial`), its array leaves are leaves of this schedule; a
    plain function is a static part of it.

    Optax's `FunctionSchedule` turns a schedule into a stateful one for
    `inject_stateful_hyperparams`; here every schedule is a function of the
    step count, so this class only adapts the calling convention.

    **Arguments:**

    - `schedule_fn`: a callable taking the step count and returning a scalar.

    !!! example

        ```python
        schedule = eqopt.schedules.FunctionSchedule(lambda count: 0.1 / (1 + count))
        schedule(9)  # Array(0.01, dtype=float32, weak_type=True)
        ```
    """

    schedule_fn: Callable[..., Any]

    def __check_init__(self):
        if not callable(self.schedule_fn):
            raise TypeError(
                f"`schedule_fn` must be callable, got {type(self.schedule_fn).__name__}."
            )

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        value = self.schedule_fn(count)
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            value = float(value)
        value = jnp.asarray(value)
        if not jnp.issubdtype(value.dtype, jnp.inexact):
            value = value.astype(jnp.result_type(float))
        # A function that ignores the step gives a scalar for an array of steps.
        return broadcast_to_count(value, count)


@checked
def as_schedule(value: Any) -> AbstractSchedule:
    """Turns a number or any callable into an eqopt schedule.

    A schedule is returned unchanged, another callable is wrapped in a
    `eqopt.schedules.FunctionSchedule`, and a number in a
    `eqopt.schedules.ConstantSchedule`. Use it wherever a hyperparameter
    may be given as a number, a schedule or a plain function.

    **Arguments:**

    - `value`: an `AbstractSchedule`, a callable `count -> value`, or a scalar.

    **Returns:**

    An `eqopt.schedules.AbstractSchedule`.
    """
    if isinstance(value, AbstractSchedule):
        return value
    if callable(value):
        return FunctionSchedule(value)
    return ConstantSchedule(value)


# The state and helpers of a hyperparameter that may be a schedule live with the
# transforms that use them; re-exported here for the schedules namespace.
from .._scheduled import (  # noqa: E402
    ScaleByScheduleState as ScaleByScheduleState,
    current_value as current_value,
    init_count_if_scheduled as init_count_if_scheduled,
)
