"""Hyperparameters evaluated into the optimiser state: `inject_hyperparams`.

eqopt transforms already keep their numeric hyperparameters as leaves (read and
change them with attribute access and `eqx.tree_at`). These wrappers
exist for code written against Optax's `inject_hyperparams`, which keeps the
current value of every hyperparameter in the *state* instead.
"""

import abc
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, Int

from .._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    OptState,
    Params,
    Updates,
    is_trainable,
)
from .._deprecation import deprecated
from .._entry import init_entry, update_entry
from .._hyper import Schedule, weakly_typed
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ..schedules._stateful import as_stateful, is_stateful_schedule
from ._arguments import (
    bind_arguments,
    call_factory,
    check_static_names,
    factory_name,
    factory_signature,
    is_numeric,
    sorted_arguments,
    static_names,
)


def _hyperparam_dtype(fixed: DTypeLike | None, reference: Any) -> DTypeLike:
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


def _state_value(name: str, value: Any, dtype: DTypeLike, source: str) -> Array:
    """A hyperparameter value as stored in the state.

    A floating value that is not already a strongly-typed JAX array (a Python
    float, a weakly-typed scalar, a NumPy value) is cast to `dtype`; every
    other numeric value is kept as it is.
    """
    if not is_numeric(value):
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


class _AbstractInjectHyperparams(AbstractWrapper):
    """What the two injection wrappers share: sorting the factory's arguments,
    building the inner transform from values, and reading values back from the
    state. They differ in how schedules are evaluated (and kept in the state)."""

    inner_factory: Callable[..., Any]
    hyperparams: dict[str, Array | np.ndarray]
    schedules: dict[str, Schedule]
    other_args: dict[str, Any]
    hyperparam_dtype: DTypeLike | None = eqx.field(static=True)
    # The dtype of each hyperparameter given as a strongly-typed JAX array, kept
    # in the state as it is (as in Optax); the others are cast to the params'.
    # Static, because `eqopt.on_host` makes every value NumPy, which has no weak
    # type to tell them apart.
    strong_dtypes: tuple[tuple[str, str], ...] = eqx.field(static=True)

    def _set_arguments(
        self,
        inner_factory: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any] | None,
        static_args: str | Iterable[str],
        hyperparam_dtype: DTypeLike | None,
        *,
        allow_stateful: bool,
    ) -> None:
        """The body of the subclasses' `__init__` (which differ in `allow_stateful`)."""
        self.inner_factory = inner_factory
        self.hyperparams, self.schedules, self.other_args, strong = sorted_arguments(
            inner_factory, args, kwargs, static_args, allow_stateful=allow_stateful
        )
        self.strong_dtypes = tuple(sorted(strong.items()))
        self.hyperparam_dtype = hyperparam_dtype

    def __check_init__(self):
        # Builds the inner transform once from the initial values, so that bad
        # input fails now rather than at the first `init`.
        try:
            self._build(self._initial_values(self._dtype(None))[0])
        except Exception as error:
            error.add_note(
                f"(Raised while building {factory_name(self.inner_factory)} from the "
                "arguments given to inject_hyperparams.)"
            )
            raise

    @abc.abstractmethod
    def _initial_values(
        self, dtype: DTypeLike
    ) -> tuple[dict[str, Array], dict[str, OptState] | None]:
        """The values at step 0, and the schedules' states if they keep any."""

    def _dtype(self, reference: Any) -> DTypeLike:
        return _hyperparam_dtype(self.hyperparam_dtype, reference)

    def _build(self, values: Mapping[str, Any]) -> AbstractGradientTransformation:
        """The inner transform built with the given hyperparameter values."""
        return call_factory(self.inner_factory, {**self.other_args, **values})

    def with_arguments(self, values: Mapping[str, Any]) -> "_AbstractInjectHyperparams":
        """This wrapper with the factory's arguments in `values` replaced (each a
        number or a schedule), sorted as the constructor sorts them: a group of
        `eqopt.param_groups` overriding an injected hyperparameter."""
        arguments = {**self.other_args, **self.hyperparams, **self.schedules}
        build: Any = type(self)  # both subclasses take these arguments
        return build(
            self.inner_factory,
            kwargs={**arguments, **values},
            static_args=tuple(k for k in self.other_args if k not in values),
            hyperparam_dtype=self.hyperparam_dtype,
        )

    def _unscheduled_values(
        self, hyperparams: Mapping[str, Any], dtype: DTypeLike
    ) -> dict[str, Array]:
        """The values in `state.hyperparams` that no schedule overrides, checked and cast."""
        expected = set(self.hyperparams) | set(self.schedules)
        given = set(hyperparams)
        if given != expected:
            factory = factory_name(self.inner_factory)
            unknown = sorted(given - expected)
            if unknown:
                verb = "is" if len(unknown) == 1 else "are"
                raise KeyError(
                    f"`state.hyperparams` has {unknown}, which {verb} not injected "
                    f"hyperparameters of {factory}; they are {sorted(expected)}."
                )
            raise KeyError(
                f"`state.hyperparams` is missing {sorted(expected - given)} "
                f"(hyperparameters of {factory})."
            )
        return {
            k: _state_value(k, v, dtype, "in `state.hyperparams`")
            for k, v in hyperparams.items()
            if k not in self.schedules
        }

    def _fixed_values(self, dtype: DTypeLike) -> dict[str, Array]:
        strong = dict(self.strong_dtypes)
        return {
            k: _state_value(
                k,
                jnp.asarray(v, strong[k]) if k in strong else weakly_typed(v),
                dtype,
                "initial value",
            )
            for k, v in self.hyperparams.items()
        }

    @property
    def inner(self) -> AbstractGradientTransformation:  # pyright: ignore[reportIncompatibleVariableOverride]
        """The inner transform built with the initial hyperparameters (its
        capabilities are this wrapper's)."""
        values, _ = self._initial_values(self._dtype(None))
        return self._build(values)


@checked
class InjectHyperparamsState(eqx.Module, OptaxTuple):
    """The state of `eqopt.InjectHyperparams`.

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
    inner_state: OptState


@checked
class InjectHyperparams(_AbstractInjectHyperparams):
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
      `eqopt.schedules.AbstractSchedule` or any function);
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

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `inner_factory`: a callable returning a transform, such as
      `eqopt.adam` or `eqopt.ScaleByAdam`.
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

    def __init__(
        self,
        inner_factory: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        static_args: str | Iterable[str] = (),
        hyperparam_dtype: DTypeLike | None = None,
    ):
        self._set_arguments(
            inner_factory,
            args,
            kwargs,
            static_args,
            hyperparam_dtype,
            allow_stateful=False,
        )

    def _scheduled_values(self, count: Int[Array, ""], dtype: DTypeLike) -> dict:
        return {
            name: _state_value(name, schedule(count), dtype, "value of its schedule")
            for name, schedule in self.schedules.items()
        }

    def _initial_values(self, dtype: DTypeLike) -> tuple[dict[str, Array], None]:
        count = jnp.zeros([], jnp.int32)
        return {
            **self._fixed_values(dtype),
            **self._scheduled_values(count, dtype),
        }, None

    @init_entry
    def init(self, params: Params) -> InjectHyperparamsState:
        values, _ = self._initial_values(self._dtype(params))
        return InjectHyperparamsState(
            count=jnp.zeros([], jnp.int32),
            hyperparams=values,
            inner_state=self._build(values).init(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: InjectHyperparamsState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, InjectHyperparamsState]:
        dtype = self._dtype(updates if params is None else params)
        values = self._unscheduled_values(state.hyperparams, dtype)
        values.update(self._scheduled_values(state.count, dtype))
        updates, inner_state = self._build(values).update(
            updates, state.inner_state, params, **extra_args
        )
        return updates, InjectHyperparamsState(
            count=safe_int32_increment(state.count),
            hyperparams=values,
            inner_state=inner_state,
        )


@checked
class InjectStatefulHyperparamsState(eqx.Module, OptaxTuple):
    """The state of `eqopt.InjectStatefulHyperparams`.

    As `eqopt.InjectHyperparamsState`, with `hyperparams_states`: the state
    of each schedule, by hyperparameter name (for a plain schedule, a
    `eqopt.ScheduleCountState` counting its steps).
    """

    count: Int[Array, ""]
    hyperparams: dict[str, Array]
    hyperparams_states: dict[str, OptState]
    inner_state: OptState


@checked
class InjectStatefulHyperparams(_AbstractInjectHyperparams):
    """Like `eqopt.InjectHyperparams`, with schedules that keep a state.

    A stateful schedule (`eqopt.AbstractStatefulSchedule`, or any object
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
      step count (an `eqopt.schedules.AbstractSchedule` or any function);
    - a number or array is a numeric hyperparameter;
    - anything else (`None`, a string, a dtype) is passed through unchanged.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:** as `eqopt.InjectHyperparams`.

    !!! note "Example, with a stateful schedule of your own"

        ```python
        opt = eqopt.inject_stateful_hyperparams(eqopt.scale_by_learning_rate)(
            learning_rate=HalveOnIncrease(0.1)  # see eqopt.AbstractStatefulSchedule
        )
        state = opt.init(model)
        updates, state = opt.update(grads, state, model, loss=loss)
        ```
    """

    def __init__(
        self,
        inner_factory: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        static_args: str | Iterable[str] = (),
        hyperparam_dtype: DTypeLike | None = None,
    ):
        self._set_arguments(
            inner_factory,
            args,
            kwargs,
            static_args,
            hyperparam_dtype,
            allow_stateful=True,
        )

    def _initial_values(
        self, dtype: DTypeLike
    ) -> tuple[dict[str, Array], dict[str, OptState]]:
        values = self._fixed_values(dtype)
        schedule_states = {}
        for name, schedule in self.schedules.items():
            schedule = as_stateful(schedule)
            schedule_states[name] = schedule.init()
            values[name] = _state_value(
                name, schedule(schedule_states[name]), dtype, "value of its schedule"
            )
        return values, schedule_states

    @init_entry
    def init(self, params: Params) -> InjectStatefulHyperparamsState:
        values, schedule_states = self._initial_values(self._dtype(params))
        return InjectStatefulHyperparamsState(
            count=jnp.zeros([], jnp.int32),
            hyperparams=values,
            hyperparams_states=schedule_states,
            inner_state=self._build(values).init(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: InjectStatefulHyperparamsState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, InjectStatefulHyperparamsState]:
        dtype = self._dtype(updates if params is None else params)
        values = self._unscheduled_values(state.hyperparams, dtype)
        schedule_states = {}
        for name, schedule in self.schedules.items():
            schedule = as_stateful(schedule)
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


@checked
def inject_hyperparams(
    inner_factory: Callable[..., Any],
    static_args: str | Iterable[str] = (),
    hyperparam_dtype: DTypeLike | None = None,
) -> Callable[..., InjectHyperparams | InjectStatefulHyperparams]:
    """Optax spelling of `eqopt.InjectHyperparams`: keeps hyperparameters in the state.

    **Arguments:**

    - `inner_factory`: a callable returning a transform, such as `eqopt.adam`.
    - `static_args`: a name or names of arguments to pass through unchanged.
    - `hyperparam_dtype`: the dtype of floating hyperparameters in the state.

    **Returns:** a function taking `inner_factory`'s arguments (numbers may be
    replaced by schedules) and returning an `eqopt.InjectHyperparams`, or an
    `eqopt.InjectStatefulHyperparams` if any argument is a stateful schedule.

    !!! example

        ```python
        opt = eqopt.inject_hyperparams(eqopt.sgd)(learning_rate=0.1, momentum=0.9)
        state = opt.init(model)
        state.hyperparams["learning_rate"] = jnp.float32(0.01)  # as in Optax
        ```
    """
    signature = factory_signature(inner_factory)
    static = static_names(static_args)
    check_static_names(inner_factory, signature, static)

    def make(
        *args: Any, **kwargs: Any
    ) -> InjectHyperparams | InjectStatefulHyperparams:
        arguments = bind_arguments(inner_factory, signature, args, kwargs)
        stateful = any(
            name not in static and is_stateful_schedule(value)
            for name, value in arguments.items()
        )
        cls = InjectStatefulHyperparams if stateful else InjectHyperparams
        return cls(
            inner_factory,
            args=args,
            kwargs=kwargs,
            static_args=static_args,
            hyperparam_dtype=hyperparam_dtype,
        )

    return functools.wraps(inner_factory, updated=())(make)


@deprecated("`eqopt.inject_hyperparams` (it takes stateful schedules too)")
@checked
def inject_stateful_hyperparams(
    inner_factory: Callable[..., Any],
    static_args: str | Iterable[str] = (),
    hyperparam_dtype: DTypeLike | None = None,
) -> Callable[..., InjectStatefulHyperparams]:
    """Optax spelling of `eqopt.InjectStatefulHyperparams`: stateful schedules in the state.

    **Arguments:** as `eqopt.inject_hyperparams`.

    **Returns:** a function taking `inner_factory`'s arguments and returning an
    `eqopt.InjectStatefulHyperparams` (whose state always has
    `hyperparams_states`).
    """
    signature = factory_signature(inner_factory)
    check_static_names(inner_factory, signature, static_names(static_args))

    def make(*args: Any, **kwargs: Any) -> InjectStatefulHyperparams:
        return InjectStatefulHyperparams(
            inner_factory,
            args=args,
            kwargs=kwargs,
            static_args=static_args,
            hyperparam_dtype=hyperparam_dtype,
        )

    return functools.wraps(inner_factory, updated=())(make)
