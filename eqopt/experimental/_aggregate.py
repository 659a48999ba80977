"""Aggregators of per-element updates: `Aggregator`, `process`, averaging and accumulation."""

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, TypeAlias, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int, PyTree

from .._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    EmptyState,
    GradientTransformation,
    OptState,
    Params,
    Updates,
    is_none,
)
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._interop import as_transform
from .._leafwise import leafwise, zeros_like_trainable
from .._leaves import InputError, path_str
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._transform.basic import Identity
from .._typecheck import checked
from .._wrappers._control import filter_cond, zeros_like_output
from ..tree._state import get

#: Updates with a per-element (batch) axis: one update per example, stacked.
PerElementUpdates: TypeAlias = Updates
#: The updates an aggregator returns, shaped like the params (with
#: `aggregator_has_aux`, a pair of them and a dict of extra arguments).
AggregatedUpdates: TypeAlias = PyTree[Any]
#: The per-element axis, several of them, or `None` for updates without one.
MaybeAxis: TypeAlias = int | Sequence[int] | None


class AggregatorUpdateFn(Protocol):
    """The signature of an aggregator's `update`, as given to `Aggregator`.

    Called as `update(per_elt_updates, state, params=None, **extra_args)`; returns
    `(aggregated_updates, state)`, the updates without the per-element axis.
    """

    def __call__(
        self,
        per_elt_updates: PerElementUpdates,
        state: OptState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[AggregatedUpdates, OptState]: ...


def _axes(per_elt_axis: int | Sequence[int]) -> int | tuple[int, ...]:
    """A static per-element axis: an int, or a tuple of ints for several."""
    if isinstance(per_elt_axis, (bool, np.bool_)):
        raise TypeError(f"`per_elt_axis` must be an int or ints, got {per_elt_axis!r}.")
    if isinstance(per_elt_axis, (int, np.integer)):
        return operator.index(per_elt_axis)
    return tuple(operator.index(axis) for axis in per_elt_axis)


@checked
def get_batch_size_from_per_elt_updates(
    per_elt_updates: PyTree[Any], per_elt_axis: int | Sequence[int]
) -> int:
    """The number of elements in per-element updates, the same at every leaf.

    **Arguments:**

    - `per_elt_updates`: updates with a per-element axis (`None` at leaves
      without an update).
    - `per_elt_axis`: that axis, or several, whose sizes multiply.

    **Returns:** the number of elements, a Python `int` (`0` for a tree without
    arrays).

    **Raises:** `ValueError` naming the first leaf without the axis, or whose
    number of elements differs from the first leaf's.
    """
    axes = _axes(per_elt_axis)
    axes = (axes,) if isinstance(axes, int) else axes
    found: tuple[str, int] | None = None
    for path, leaf in jax.tree_util.tree_flatten_with_path(
        per_elt_updates, is_leaf=is_none
    )[0]:
        if leaf is None:
            continue
        shape = jnp.shape(leaf)
        if any(not -len(shape) <= axis < len(shape) for axis in axes):
            raise InputError(
                f"The per-element update at {path_str(path)} has shape "
                f"{tuple(shape)}, without the per-element axis {per_elt_axis!r}: pass "
                "updates with one element per entry of that axis, such as "
                "`jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)`."
            )
        size = math.prod(shape[axis] for axis in axes)
        if found is None:
            found = (path_str(path), size)
        elif size != found[1]:
            raise InputError(
                f"The per-element updates have {found[1]} elements at {found[0]} but "
                f"{size} at {path_str(path)} (on axis {per_elt_axis!r}): every leaf "
                "needs the same number of elements."
            )
    return 0 if found is None else found[1]


def _per_element(fn: Callable, updates: Any) -> Any:
    """`fn` at every leaf of per-element updates; `None` stays `None`."""
    return jax.tree.map(
        lambda x: None if x is None else fn(x), updates, is_leaf=is_none
    )


# ---------------------------------------------------------------------------
# Aggregator: a pair of functions taking per-element updates
# ---------------------------------------------------------------------------


class _AggregatorMeta(type(eqx.Module)):
    # Optax's `Aggregator` is the type of a transformation that takes per-element
    # updates. In eqopt that is the capability `per_example_updates`, which every
    # transform states (a chain starting with an aggregator has it), so the check
    # means "an eqopt transform taking per-element updates".
    # (Read from the MRO: `issubclass` would recurse through ABCMeta's checks.)
    @no_type_check
    def __instancecheck__(cls, obj: Any) -> bool:
        return (
            AbstractGradientTransformation in type(obj).__mro__
            and obj.per_example_updates
        )


@checked
class Aggregator(AbstractWrapper, metaclass=_AggregatorMeta):
    """A transform from an `(init, update)` pair whose `update` takes per-element updates.

    Where a transform takes updates shaped like the params, an aggregator
    takes one update per element of a batch, stacked on a per-element axis
    (`jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)` gives them),
    and returns updates shaped like the params. It states
    `per_example_updates`, so a chain it starts checks only the structure of
    the updates against the params, not their shapes.

    `isinstance(tx, Aggregator)` is true for every eqopt transform taking
    per-element updates: this class, a `process` or chain whose aggregator is
    one, `average_per_element_updates`,
    `eqopt.contrib.differentially_private_aggregate`.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `init`: builds the state from the params.
    - `update`: maps `(per_elt_updates, state, params)` to `(updates, state)`;
      extra keyword arguments are forwarded if it takes `**kwargs`.
    """

    transform: GradientTransformation

    def __init__(self, init: Callable, update: Callable):
        self.transform = GradientTransformation(init, update)

    @property
    def inner(self) -> AbstractGradientTransformation:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.transform

    @property
    def per_example_updates(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        """Always: an aggregator takes per-element updates."""
        return True

    @init_entry
    def init(self, params: Params) -> OptState:
        return self.transform.init(params)

    @update_entry
    def update(
        self,
        updates: PerElementUpdates,
        state: OptState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[AggregatedUpdates, OptState]:
        return self.transform.update(updates, state, params, **extra_args)


# ---------------------------------------------------------------------------
# process: preprocess, aggregate, postprocess
# ---------------------------------------------------------------------------


@checked
class ProcessState(eqx.Module, OptaxTuple):
    """The state of `process`: its three parts' states, in order.

    It unpacks as Optax's tuple does: `pre, aggregate, post = state`.
    """

    preprocess_state: OptState
    aggregate_state: OptState
    postprocess_state: OptState


@checked
class Process(AbstractGradientTransformation):
    r"""Preprocesses per-element updates, aggregates them, and postprocesses the result.

    $$
    (v_i)_i = P\big((g_i)_i\big), \qquad \bar v = A\big((v_i)_i\big), \qquad
    u = \begin{cases} Q(\bar v) & \text{if the aggregator is ready} \\
    0 & \text{otherwise} \end{cases}
    $$

    The aggregator is ready unless its state has a field `ready` that is false
    (an accumulating aggregator, such as `accumulate_avg_updates`, is ready
    once every `accumulation_steps` calls): until then the updates are zeros
    and the postprocessor's state is unchanged. The choice is a `lax.cond`, so
    the postprocessor runs only when the aggregator is ready. With
    `aggregator_has_aux`, the aggregator returns `(updates, aux)` and the dict
    `aux` is passed to the postprocessor as extra keyword arguments.

    It takes per-element updates (it is an `Aggregator`) when its
    preprocessor or aggregator does.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `preprocessor`: maps per-element gradients to per-element updates
      (`eqopt.identity()` for none).
    - `aggregator`: aggregates the per-element updates into one update (an
      `Aggregator`), or accumulates updates over calls.
    - `postprocessor`: the optimiser applied to the aggregated updates.
    - `aggregator_has_aux`: whether the aggregator returns `(updates, aux)`.
    """

    preprocessor: AbstractGradientTransformation
    aggregator: AbstractGradientTransformation
    postprocessor: AbstractGradientTransformation
    aggregator_has_aux: bool = eqx.field(default=False, static=True)

    def __init__(
        self,
        preprocessor: Any,
        aggregator: Any,
        postprocessor: Any,
        aggregator_has_aux: bool = False,
    ):
        self.preprocessor = as_transform(preprocessor)
        self.aggregator = as_transform(aggregator)
        self.postprocessor = as_transform(postprocessor)
        self.aggregator_has_aux = aggregator_has_aux

    @property
    def elementwise(self) -> bool:
        parts = (self.preprocessor, self.aggregator, self.postprocessor)
        return all(part.elementwise for part in parts)

    @property
    def per_example_updates(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        """Whether it takes per-element updates: its preprocessor or aggregator does."""
        return (
            self.preprocessor.per_example_updates or self.aggregator.per_example_updates
        )

    @init_entry
    def init(self, params: Params) -> ProcessState:
        return ProcessState(
            self.preprocessor.init(params),
            self.aggregator.init(params),
            self.postprocessor.init(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ProcessState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ProcessState]:
        per_element, preprocess_state = self.preprocessor.update(
            updates, state.preprocess_state, params, **extra_args
        )
        aggregated, aggregate_state = self.aggregator.update(
            per_element, state.aggregate_state, params, **extra_args
        )
        if self.aggregator_has_aux:
            if not (
                isinstance(aggregated, tuple)
                and len(aggregated) == 2
                and isinstance(aggregated[1], dict)
            ):
                raise TypeError(
                    "process: with `aggregator_has_aux=True` the aggregator must "
                    "return `((updates, aux), state)` with `aux` a dict of extra "
                    f"arguments, got {type(aggregated).__name__}."
                )
            aggregated, aux = aggregated
            extra_args = {**extra_args, **aux}
        ready = get(aggregate_state, "ready", True)

        def postprocess() -> tuple[Updates, OptState]:
            return self.postprocessor.update(
                aggregated, state.postprocess_state, params, **extra_args
            )

        def hold() -> tuple[Updates, OptState]:
            shapes = eqx.filter_eval_shape(postprocess)[0]
            return zeros_like_output(shapes), state.postprocess_state

        updates, postprocess_state = filter_cond(ready, postprocess, hold)
        return updates, ProcessState(
            preprocess_state, aggregate_state, postprocess_state
        )


@checked
def process(
    preprocessor: Any,
    aggregator: Any,
    postprocessor: Any,
    aggregator_has_aux: bool = False,
) -> Process:
    """Optax spelling of `eqopt.experimental.aggregating.Process`.

    !!! example

        ```python
        from eqopt.experimental import aggregating


        def example_loss(model, x, y):  # one example: a batch of one inside
            return loss_fn(model, x[None], y[None])


        per_example_grad = jax.vmap(eqx.filter_grad(example_loss), in_axes=(None, 0, 0))
        opt = aggregating.process(
            eqopt.identity(),  # or a per-example clip
            aggregating.average_per_element_updates(),
            eqopt.adam(1e-3),
        )
        state = opt.init(model)
        updates, state = opt.update(per_example_grad(model, x, y), state, model)
        model = eqopt.apply_updates(model, updates)
        ```
    """
    return Process(
        preprocessor=preprocessor,
        aggregator=aggregator,
        postprocessor=postprocessor,
        aggregator_has_aux=aggregator_has_aux,
    )


# ---------------------------------------------------------------------------
# Averaging over the elements, accumulating over calls
# ---------------------------------------------------------------------------


@checked
class AveragePerElementUpdates(AbstractGradientTransformation):
    r"""Averages per-element updates over their per-element axis.

    $$ \bar g = \frac{1}{B} \sum_{i=1}^{B} g_i $$

    An `Aggregator`: it takes updates with a per-element axis and returns
    updates shaped like the params. Stateless.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `per_elt_axis`: the per-element axis, or several (static).
    """

    per_elt_axis: int | tuple[int, ...] = eqx.field(
        default=0, static=True, converter=_axes
    )

    @property
    def elementwise(self) -> bool:
        # Its updates have a per-element axis: never packed into flat buffers.
        return False

    #: It averages per-element updates.
    per_example_updates: ClassVar[bool] = True

    @init_entry
    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    @update_entry
    def update(
        self,
        updates: PerElementUpdates,
        state: EmptyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmptyState]:
        get_batch_size_from_per_elt_updates(updates, self.per_elt_axis)
        axis = self.per_elt_axis
        return _per_element(lambda x: jnp.mean(x, axis=axis), updates), state


@checked
def average_per_element_updates(
    per_elt_axis: int | Sequence[int] = 0,
) -> AveragePerElementUpdates:
    """Optax spelling of `eqopt.experimental.aggregating.AveragePerElementUpdates`."""
    return AveragePerElementUpdates(per_elt_axis=per_elt_axis)


@checked
class AccumulateAvgUpdatesState(eqx.Module, OptaxTuple):
    """The state of `AccumulateAvgUpdates`.

    - `micro_step`: the calls averaged since the last emitted update.
    - `ready`: whether the last call emitted the average.
    - `avg_grad`: the running average, shaped like the params (`None` at
      leaves that are not trained), in each parameter's dtype.
    """

    micro_step: Int[Array, ""]
    ready: Bool[Array, ""]
    avg_grad: Updates


@checked
class AccumulateAvgUpdates(AbstractGradientTransformation):
    r"""Averages the updates of `accumulation_steps` calls, emitted at the last one.

    With the updates $g_1, \dots, g_k$ of $k$ consecutive calls, kept as a
    running mean $\bar g_j = \bar g_{j-1} + (g_j - \bar g_{j-1}) / j$,

    $$ u_j = \begin{cases} \bar g_k = \frac1k \sum_{i=1}^{k} g_i & j = k \\
    0 & j < k \end{cases} $$

    and the state's `ready` is true at the $k$-th call, which `process` reads
    to run its postprocessor then only. $k$ micro-batches of size $B$ give
    the update of one batch of size $kB$. The average is kept in each
    parameter's dtype (Optax's state turns to the gradients' dtype after the
    first call) and emitted in the updates' dtype.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `accumulation_steps`: $k$, the number of calls averaged (static, at least 1).
    """

    accumulation_steps: int = eqx.field(static=True)

    def __check_init__(self):
        super().__check_init__()
        if self.accumulation_steps < 1:
            raise ValueError(
                "accumulate_avg_updates: `accumulation_steps` must be at least 1, "
                f"got {self.accumulation_steps}."
            )

    @property
    def elementwise(self) -> bool:
        return True

    @init_entry
    def init(self, params: Params) -> AccumulateAvgUpdatesState:
        return AccumulateAvgUpdatesState(
            micro_step=jnp.zeros([], jnp.int32),
            ready=jnp.asarray(False),
            avg_grad=zeros_like_trainable(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: AccumulateAvgUpdatesState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, AccumulateAvgUpdatesState]:
        micro_step = safe_int32_increment(state.micro_step)
        ready = micro_step == self.accumulation_steps

        @no_type_check
        def step(g, average):
            average = average + (g.astype(average.dtype) - average) / micro_step
            emitted = jnp.where(ready, average, jnp.zeros_like(average))
            return emitted.astype(g.dtype), average

        updates, average = leafwise(
            step, updates, state.avg_grad, n_out=2, elementwise=True
        )
        average = jax.tree.map(
            lambda a: None if a is None else jnp.where(ready, jnp.zeros_like(a), a),
            average,
            is_leaf=is_none,
        )
        return updates, AccumulateAvgUpdatesState(
            micro_step=jnp.where(ready, jnp.zeros_like(micro_step), micro_step),
            ready=ready,
            avg_grad=average,
        )


@checked
def accumulate_avg_updates(
    accumulation_steps: int,
) -> AccumulateAvgUpdates | Identity:
    """Optax spelling of `eqopt.experimental.aggregating.AccumulateAvgUpdates`.

    With `accumulation_steps=1` there is nothing to accumulate: it returns
    `eqopt.identity()`, which keeps no state, as Optax does.
    """
    if accumulation_steps == 1:
        return Identity()
    return AccumulateAvgUpdates(accumulation_steps=accumulation_steps)


@checked
def average_incrementally_updates(
    per_elt_axis: int | Sequence[int] | None, accumulation_steps: int
) -> AbstractGradientTransformation:
    """Averages per-element updates (unless `per_elt_axis` is `None`), then accumulates.

    **Arguments:**

    - `per_elt_axis`: the per-element axis to average over, or `None` for
      updates without one.
    - `accumulation_steps`: the number of calls to accumulate over.

    **Returns:** `accumulate_avg_updates(accumulation_steps)` when
    `per_elt_axis` is `None`; otherwise a chain of
    `average_per_element_updates(per_elt_axis)` and it, an `Aggregator`.
    """
    accumulate = accumulate_avg_updates(accumulation_steps)
    if per_elt_axis is None:
        return accumulate
    return Chain(AveragePerElementUpdates(per_elt_axis=per_elt_axis), accumulate)
