"""Hyperparameters evaluated into the optimiser state: `inject_hyperparams`.

eqopt transforms already keep their numeric hyperparameters as leaves: read and
change them with attribute access and `eqx.tree_at` (see "Reading and changing
hyperparameters" in Getting started). These wrappers exist for code written
against Optax's `inject_hyperparams`, which keeps the current value of every
hyperparameter in the *state* instead.
"""

import abc
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Int, PyTree

from .._base import (
    AbstractGradientTransformation,
    Params,
    Updates,
    as_transform,
    is_trainable,
)
from .._hyper import as_number
from .._numerics import safe_int32_increment

# ---------------------------------------------------------------------------
# Stateful schedules
# ---------------------------------------------------------------------------


class AbstractStatefulSchedule(eqx.Module):
    """A schedule whose value comes from a state that it updates every step.

    A plain schedule is a function of the step count. A stateful schedule keeps
    its own state instead, and may use the extra arguments given to `update`
    (for example `loss=...`) to advance it: a learning rate that halves when
    the loss stops improving is one. It is used through
    [`eqopt.inject_stateful_hyperparams`][] (or [`eqopt.inject_hyperparams`][],
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
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
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


def _is_stateful_schedule(value: Any) -> bool:
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


class ScheduleCountState(eqx.Module):
    """The state kept for a plain schedule by [`eqopt.InjectStatefulHyperparams`][]."""

    count: Int[Array, ""]


class WrappedSchedule(AbstractStatefulSchedule):
    """Turns a plain schedule into a stateful one whose state is its step count.

    This is Optax's `WrappedSchedule`: `init()` starts the count at zero,
    `update(state)` adds one, and `__call__(state)` evaluates the schedule at
    the count. [`eqopt.inject_stateful_hyperparams`][] wraps plain schedules
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


def _as_stateful(schedule: Any) -> Any:
    return schedule if _is_stateful_schedule(schedule) else WrappedSchedule(schedule)


# ---------------------------------------------------------------------------
# Sorting the factory's arguments
# ---------------------------------------------------------------------------


def _factory_name(factory: Callable) -> str:
    return getattr(factory, "__qualname__", None) or type(factory).__name__


def _signature(factory: Callable) -> inspect.Signature:
    if not callable(factory):
        raise TypeError(
            f"`inner_factory` must be callable, got {type(factory).__name__}."
        )
    try:
        return inspect.signature(factory)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"Cannot read the signature of `inner_factory` {_factory_name(factory)}: {error}"
        ) from None


def _static_names(static_args: str | Iterable[str]) -> frozenset[str]:
    if isinstance(static_args, str):
        return frozenset({static_args})
    return frozenset(static_args)


def _check_static_names(
    factory: Callable, signature: inspect.Signature, names: frozenset[str]
) -> None:
    if any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
    ):
        return
    unknown = sorted(names - set(signature.parameters))
    if unknown:
        raise ValueError(
            f"`static_args` names {unknown}, which are not arguments of "
            f"{_factory_name(factory)}; its arguments are {list(signature.parameters)}."
        )


def _is_numeric(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    return isinstance(value, (int, float, np.number, np.ndarray, jax.Array))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bind(
    factory: Callable,
    signature: inspect.Signature,
    args: tuple,
    kwargs: Mapping[str, Any],
) -> dict[str, Any]:
    """Every argument of the factory by name, defaults included; `**kwargs` entries spread out."""
    parameters = signature.parameters
    var_keyword = next(
        (
            p.name
            for p in parameters.values()
            if p.kind is inspect.Parameter.VAR_KEYWORD
        ),
        None,
    )
    if var_keyword is None:
        for name in kwargs:
            if name not in parameters:
                raise TypeError(
                    f"{name!r} is not an argument of {_factory_name(factory)}; its "
                    f"arguments are {list(parameters)}."
                )
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:
        raise TypeError(
            f"Cannot call {_factory_name(factory)} with these arguments: {error}."
        ) from None
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    if var_keyword is not None:
        arguments.update(arguments.pop(var_keyword))
    return arguments


def _sort_arguments(factory, signature, arguments, static_names, *, allow_stateful):
    """Splits the arguments into numeric hyperparameters, schedules and the rest."""
    hyperparams, schedules, other_args = {}, {}, {}
    parameters = signature.parameters
    for name, value in arguments.items():
        if name in static_names or isinstance(value, (bool, np.bool_)):
            other_args[name] = value
        elif _is_stateful_schedule(value):
            if not allow_stateful:
                raise TypeError(
                    f"`{name}` is a stateful schedule; use `eqopt.inject_stateful_hyperparams` "
                    "(or `eqopt.inject_hyperparams`, which switches to it) instead of "
                    "`InjectHyperparams`."
                )
            schedules[name] = value
        elif callable(value):
            schedules[name] = value
        elif _is_numeric(value):
            hyperparams[name] = as_number(value)
        else:
            default = (
                parameters[name].default
                if name in parameters
                else inspect.Parameter.empty
            )
            if value is not None and _is_number(default):
                raise TypeError(
                    f"Hyperparameter `{name}` of {_factory_name(factory)} must be a number, an "
                    f"array or a schedule, got {type(value).__name__} {value!r}. (List it in "
                    "`static_args` if it is meant to be passed through unchanged.)"
                )
            other_args[name] = value
    return hyperparams, schedules, other_args


def _call_factory(
    factory: Callable, arguments: Mapping[str, Any]
) -> AbstractGradientTransformation:
    """Calls the factory with arguments given by name (positional-only and `*args` included)."""
    signature = inspect.signature(factory)
    parameters = signature.parameters
    bound = signature.bind_partial()
    spread = {}
    var_keyword = None
    for parameter in parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            var_keyword = parameter.name
    for name, value in arguments.items():
        if name in parameters and name != var_keyword:
            bound.arguments[name] = value
        else:
            spread[name] = value
    if var_keyword is not None:
        bound.arguments[var_keyword] = spread
    return as_transform(factory(*bound.args, **bound.kwargs))


# ---------------------------------------------------------------------------
# Hyperparameter values in the state
# ---------------------------------------------------------------------------


def _hyperparam_dtype(fixed: Any, reference: Any) -> Any:
    """`hyperparam_dtype` if given, else the highest real dtype of the trainable leaves."""
    if fixed is not None:
        return fixed
    dtypes = [
        jnp.finfo(leaf.dtype).dtype
        for leaf in jax.tree.leaves(reference)
        if is_trainable(leaf)
    ]
    if not dtypes:
        return jnp.result_type(float)
    dtype = dtypes[0]
    for other in dtypes[1:]:
        dtype = jnp.promote_types(dtype, other)
    return dtype


def _state_value(name: str, value: Any, dtype: Any, source: str) -> Array:
    """A hyperparameter value as stored in the state.

    A floating value that is not already a strongly-typed JAX array (a Python
    float, a weakly-typed scalar, a NumPy value) is cast to `dtype`; every
    other numeric value is kept as it is.
    """
    if not _is_numeric(value):
        raise TypeError(
            f"Hyperparameter `{name}` ({source}) must be a number or a JAX array, got "
            f"{type(value).__name__} {value!r}."
        )
    if isinstance(value, jax.Array) and not value.weak_type:
        return value
    array = jnp.asarray(value)
    if jnp.issubdtype(array.dtype, jnp.floating):
        return array.astype(dtype)
    return array


def _check_state_names(transform: Any, hyperparams: Mapping[str, Any]) -> None:
    expected = set(transform.hyperparams) | set(transform.schedules)
    given = set(hyperparams)
    if given == expected:
        return
    factory = _factory_name(transform.inner_factory)
    unknown = sorted(given - expected)
    if unknown:
        raise KeyError(
            f"`state.hyperparams` has {unknown}, which {'is' if len(unknown) == 1 else 'are'} "
            f"not injected hyperparameters of {factory}; they are {sorted(expected)}."
        )
    raise KeyError(
        f"`state.hyperparams` is missing {sorted(expected - given)} (hyperparameters of {factory})."
    )


def _check_builds(transform: Any) -> None:
    """Builds the inner transform once from the initial values, so bad input fails now."""
    dtype = _hyperparam_dtype(transform.hyperparam_dtype, None)
    try:
        transform._build(transform._initial_values(dtype)[0])
    except Exception as error:
        error.add_note(
            f"(Raised while building {_factory_name(transform.inner_factory)} from the "
            "arguments given to inject_hyperparams.)"
        )
        raise


# ---------------------------------------------------------------------------
# inject_hyperparams
# ---------------------------------------------------------------------------


def _sorted_arguments(
    inner_factory: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None,
    static_args: str | Iterable[str],
    *,
    allow_stateful: bool,
) -> tuple[dict[str, Array], dict[str, Callable[..., Any]], dict[str, Any]]:
    """Binds the factory's arguments and sorts them into hyperparameters, schedules and the rest."""
    signature = _signature(inner_factory)
    static_names = _static_names(static_args)
    _check_static_names(inner_factory, signature, static_names)
    arguments = _bind(inner_factory, signature, tuple(args), dict(kwargs or {}))
    return _sort_arguments(
        inner_factory, signature, arguments, static_names, allow_stateful=allow_stateful
    )


def _build_inner(
    transform: Any, values: Mapping[str, Any]
) -> AbstractGradientTransformation:
    """The inner transform built with the current hyperparameter values."""
    return _call_factory(transform.inner_factory, {**transform.other_args, **values})


def _unscheduled_values(
    transform: Any, hyperparams: Mapping[str, Any], dtype: Any
) -> dict:
    """The values in `state.hyperparams` that no schedule overrides, checked and cast."""
    _check_state_names(transform, hyperparams)
    return {
        k: _state_value(k, v, dtype, "in `state.hyperparams`")
        for k, v in hyperparams.items()
        if k not in transform.schedules
    }


class InjectHyperparamsState(eqx.Module):
    """The state of [`eqopt.InjectHyperparams`][].

    - `count`: the number of updates so far.
    - `hyperparams`: the value of every numeric hyperparameter, scheduled ones
      included, as used by the latest update (after `init`: at step 0). Replace
      an entry to change the hyperparameter from the next update on, either in
      place as in Optax (`state.hyperparams["learning_rate"] = jnp.float32(1e-4)`)
      or with `eqx.tree_at`. Give a JAX array of the same dtype: a Python float
      is a static value to `eqx.filter_jit`, so it recompiles once.
    - `inner_state`: the state of the inner transform.
    """

    count: Int[Array, ""]
    hyperparams: dict[str, Array]
    inner_state: Any


class InjectHyperparams(AbstractGradientTransformation):
    """Keeps the current value of every numeric hyperparameter in the optimiser state.

    Optax's `inject_hyperparams`, for code that reads hyperparameters from the
    state. Every step, schedules are evaluated at the step count and the inner
    transform is built by calling `inner_factory` with the values; the values
    are stored in `state.hyperparams`, where they can be read
    (`state.hyperparams["learning_rate"]`) and replaced. A replaced value is
    used from the next update on; replacing a scheduled one has no effect,
    since the schedule overwrites it.

    In eqopt the hyperparameters of a transform are already leaves of it (read
    them as attributes and change them with `eqx.tree_at`); prefer that in new
    code. After `init` the state, not this transform, holds the values:
    changing `self.hyperparams` then has no effect (as in Optax).

    The arguments for `inner_factory` (its defaults included) are sorted as
    Optax sorts them:

    - a name in `static_args`, or a `bool`, is passed through unchanged;
    - a callable is a schedule of the step count (an
      [`eqopt.schedules.AbstractSchedule`][] or any function);
    - a number or array is a numeric hyperparameter;
    - anything else (`None`, a string, a dtype) is passed through unchanged.

    Floating hyperparameters are stored in the state in `hyperparam_dtype`, by
    default the highest floating dtype of the trainable leaves of the params
    (the real one for complex params), except values that are already
    strongly-typed JAX arrays, which are kept as they are.

    !!! warning "Low precision"

        With `bfloat16` params the hyperparameters are rounded to `bfloat16`
        as in Optax: Adam's `b2=0.999` becomes `1.0`, and the update is `nan`.
        Pass `hyperparam_dtype=jnp.float32`.

    **Arguments:**

    - `inner_factory`: a callable returning a transform, such as
      [`eqopt.adam`][] or [`eqopt.ScaleByAdam`][].
    - `args`, `kwargs`: the arguments for `inner_factory`; numbers may be
      replaced by schedules.
    - `static_args`: a name or names of arguments to pass through unchanged
      (a callable that is not a schedule, a number that decides a shape).
    - `hyperparam_dtype`: the dtype of floating hyperparameters in the state.

    !!! example

        ```python
        opt = eqopt.inject_hyperparams(eqopt.adam)(
            learning_rate=eqopt.schedules.cosine_decay_schedule(1e-3, 1000), b1=0.9
        )
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        state.hyperparams["learning_rate"]  # the rate used by this update
        state = eqx.tree_at(lambda s: s.hyperparams["b1"], state, jnp.float32(0.8))
        ```
    """

    inner_factory: Callable[..., Any]
    hyperparams: dict[str, Array]
    schedules: dict[str, Callable[..., Any]]
    other_args: dict[str, Any]
    hyperparam_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        inner_factory: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        static_args: str | Iterable[str] = (),
        hyperparam_dtype: Any = None,
    ):
        self.inner_factory = inner_factory
        self.hyperparams, self.schedules, self.other_args = _sorted_arguments(
            inner_factory, args, kwargs, static_args, allow_stateful=False
        )
        self.hyperparam_dtype = hyperparam_dtype

    def __check_init__(self):
        _check_builds(self)

    def _build(self, values: Mapping[str, Any]) -> AbstractGradientTransformation:
        return _build_inner(self, values)

    def _initial_values(self, dtype: Any) -> tuple[dict[str, Array], None]:
        count = jnp.zeros([], jnp.int32)
        values = {
            k: _state_value(k, v, dtype, "initial value")
            for k, v in self.hyperparams.items()
        }
        for name, schedule in self.schedules.items():
            values[name] = _state_value(
                name, schedule(count), dtype, "value of its schedule"
            )
        return values, None

    @property
    def elementwise(self) -> bool:
        values, _ = self._initial_values(_hyperparam_dtype(self.hyperparam_dtype, None))
        return bool(self._build(values).elementwise)

    def init(self, params: Params) -> InjectHyperparamsState:
        values, _ = self._initial_values(
            _hyperparam_dtype(self.hyperparam_dtype, params)
        )
        return InjectHyperparamsState(
            count=jnp.zeros([], jnp.int32),
            hyperparams=values,
            inner_state=self._build(values).init(params),
        )

    def update(
        self,
        updates: Updates,
        state: InjectHyperparamsState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, InjectHyperparamsState]:
        dtype = _hyperparam_dtype(
            self.hyperparam_dtype, updates if params is None else params
        )
        values = _unscheduled_values(self, state.hyperparams, dtype)
        for name, schedule in self.schedules.items():
            values[name] = _state_value(
                name, schedule(state.count), dtype, "value of its schedule"
            )
        updates, inner_state = self._build(values).update(
            updates, state.inner_state, params, **extra_args
        )
        return updates, InjectHyperparamsState(
            count=safe_int32_increment(state.count),
            hyperparams=values,
            inner_state=inner_state,
        )


class InjectStatefulHyperparamsState(eqx.Module):
    """The state of [`eqopt.InjectStatefulHyperparams`][].

    As [`eqopt.InjectHyperparamsState`][], with `hyperparams_states`: the state
    of each schedule, by hyperparameter name (for a plain schedule, a
    [`eqopt.ScheduleCountState`][] counting its steps).
    """

    count: Int[Array, ""]
    hyperparams: dict[str, Array]
    hyperparams_states: dict[str, Any]
    inner_state: Any


class InjectStatefulHyperparams(AbstractGradientTransformation):
    """Like [`eqopt.InjectHyperparams`][], with schedules that keep a state.

    A stateful schedule ([`eqopt.AbstractStatefulSchedule`][], or any object
    with Optax's `init()`, `update(state, **extra_args)` and
    `__call__(state, **extra_args)`) has its state in
    `state.hyperparams_states`. Each update evaluates it on its current state
    with the update's extra arguments, uses that value, then advances its
    state with the same extra arguments. A plain schedule gets its own step
    count as its state.

    The arguments for `inner_factory` (its defaults included) are sorted as
    Optax sorts them:

    - a name in `static_args`, or a `bool`, is passed through unchanged;
    - a callable is a schedule: a stateful one as above, or a schedule of the
      step count (an [`eqopt.schedules.AbstractSchedule`][] or any function);
    - a number or array is a numeric hyperparameter;
    - anything else (`None`, a string, a dtype) is passed through unchanged.

    **Arguments:** as [`eqopt.InjectHyperparams`][].

    !!! example

        ```python
        # A stateful schedule (see eqopt.AbstractStatefulSchedule); a plain
        # schedule becomes one with eqopt.WrappedSchedule.
        schedule = eqopt.WrappedSchedule(
            eqopt.schedules.cosine_decay_schedule(0.1, 100)
        )
        opt = eqopt.inject_stateful_hyperparams(eqopt.scale_by_learning_rate)(
            learning_rate=schedule
        )
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        ```
    """

    inner_factory: Callable[..., Any]
    hyperparams: dict[str, Array]
    schedules: dict[str, Callable[..., Any]]
    other_args: dict[str, Any]
    hyperparam_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        inner_factory: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        static_args: str | Iterable[str] = (),
        hyperparam_dtype: Any = None,
    ):
        self.inner_factory = inner_factory
        self.hyperparams, self.schedules, self.other_args = _sorted_arguments(
            inner_factory, args, kwargs, static_args, allow_stateful=True
        )
        self.hyperparam_dtype = hyperparam_dtype

    def __check_init__(self):
        _check_builds(self)

    def _build(self, values: Mapping[str, Any]) -> AbstractGradientTransformation:
        return _build_inner(self, values)

    def _initial_values(self, dtype: Any) -> tuple[dict[str, Array], dict[str, Any]]:
        values = {
            k: _state_value(k, v, dtype, "initial value")
            for k, v in self.hyperparams.items()
        }
        schedule_states = {}
        for name, schedule in self.schedules.items():
            schedule = _as_stateful(schedule)
            schedule_states[name] = schedule.init()
            values[name] = _state_value(
                name, schedule(schedule_states[name]), dtype, "value of its schedule"
            )
        return values, schedule_states

    @property
    def elementwise(self) -> bool:
        values, _ = self._initial_values(_hyperparam_dtype(self.hyperparam_dtype, None))
        return bool(self._build(values).elementwise)

    def init(self, params: Params) -> InjectStatefulHyperparamsState:
        values, schedule_states = self._initial_values(
            _hyperparam_dtype(self.hyperparam_dtype, params)
        )
        return InjectStatefulHyperparamsState(
            count=jnp.zeros([], jnp.int32),
            hyperparams=values,
            hyperparams_states=schedule_states,
            inner_state=self._build(values).init(params),
        )

    def update(
        self,
        updates: Updates,
        state: InjectStatefulHyperparamsState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, InjectStatefulHyperparamsState]:
        dtype = _hyperparam_dtype(
            self.hyperparam_dtype, updates if params is None else params
        )
        values = _unscheduled_values(self, state.hyperparams, dtype)
        schedule_states = {}
        for name, schedule in self.schedules.items():
            schedule = _as_stateful(schedule)
            schedule_state = state.hyperparams_states[name]
            values[name] = _state_value(
                name,
                schedule(schedule_state, **extra_args),
                dtype,
                "value of its schedule",
            )
            schedule_states[name] = schedule.update(schedule_state, **extra_args)
        updates, inner_state = self._build(values).update(
            updates, state.inner_state, params, **extra_args
        )
        return updates, InjectStatefulHyperparamsState(
            count=safe_int32_increment(state.count),
            hyperparams=values,
            hyperparams_states=schedule_states,
            inner_state=inner_state,
        )


def inject_hyperparams(
    inner_factory: Callable[..., Any],
    static_args: str | Iterable[str] = (),
    hyperparam_dtype: Any = None,
) -> Callable[..., InjectHyperparams | InjectStatefulHyperparams]:
    """Optax spelling of [`eqopt.InjectHyperparams`][]: keeps hyperparameters in the state.

    **Arguments:**

    - `inner_factory`: a callable returning a transform, such as [`eqopt.adam`][].
    - `static_args`: a name or names of arguments to pass through unchanged.
    - `hyperparam_dtype`: the dtype of floating hyperparameters in the state.

    **Returns:** a function taking `inner_factory`'s arguments (numbers may be
    replaced by schedules) and returning an [`eqopt.InjectHyperparams`][], or an
    [`eqopt.InjectStatefulHyperparams`][] if any argument is a stateful schedule.

    !!! example

        ```python
        opt = eqopt.inject_hyperparams(eqopt.sgd)(learning_rate=0.1, momentum=0.9)
        state = opt.init(model)
        state.hyperparams["learning_rate"] = jnp.float32(0.01)  # as in Optax
        ```
    """
    signature = _signature(inner_factory)
    _check_static_names(inner_factory, signature, _static_names(static_args))

    def make(
        *args: Any, **kwargs: Any
    ) -> InjectHyperparams | InjectStatefulHyperparams:
        arguments = _bind(inner_factory, signature, args, kwargs)
        static_names = _static_names(static_args)
        stateful = any(
            name not in static_names and _is_stateful_schedule(value)
            for name, value in arguments.items()
        )
        cls = InjectStatefulHyperparams if stateful else InjectHyperparams
        return cls(inner_factory, args, kwargs, static_args, hyperparam_dtype)

    return functools.wraps(inner_factory, updated=())(make)


def inject_stateful_hyperparams(
    inner_factory: Callable[..., Any],
    static_args: str | Iterable[str] = (),
    hyperparam_dtype: Any = None,
) -> Callable[..., InjectStatefulHyperparams]:
    """Optax spelling of [`eqopt.InjectStatefulHyperparams`][]: stateful schedules in the state.

    **Arguments:** as [`eqopt.inject_hyperparams`][].

    **Returns:** a function taking `inner_factory`'s arguments and returning an
    [`eqopt.InjectStatefulHyperparams`][] (whose state always has
    `hyperparams_states`).
    """
    signature = _signature(inner_factory)
    _check_static_names(inner_factory, signature, _static_names(static_args))

    def make(*args: Any, **kwargs: Any) -> InjectStatefulHyperparams:
        return InjectStatefulHyperparams(
            inner_factory, args, kwargs, static_args, hyperparam_dtype
        )

    return functools.wraps(inner_factory, updated=())(make)
