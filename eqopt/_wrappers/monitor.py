"""Recording measurements of the updates in the state: `snapshot`, `monitor`, `measure_with_ema`."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Int, PyTree

from .._base import (
    AbstractGradientTransformation,
    EmptyState,
    Params,
    Updates,
    is_trainable,
)
from .._entry import init_entry, update_entry
from .._hyper import Scalar, ScalarLike, as_scalar, check_decays
from .._interop import as_transform
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._control import zeros_like_output


def _updates_like(params: Params) -> Updates:
    # What `update` will receive: the params' trainable leaves, None elsewhere.
    return jax.tree.map(lambda p: p if is_trainable(p) else None, params)


def _as_measure(measure: Any) -> Any:
    """A transform stays one (an Optax pair is wrapped); any other callable is a function."""
    if isinstance(measure, AbstractGradientTransformation):
        return measure
    if callable(getattr(measure, "init", None)) and callable(
        getattr(measure, "update", None)
    ):
        return as_transform(measure)
    if callable(measure):
        return measure
    raise TypeError(
        "monitor: each measure must be a callable of the updates or a transform "
        f"(such as `measure_with_ema(...)`), got {type(measure).__name__}."
    )


def _measure_init(measure: Any, params: Params) -> tuple[Any, Any]:
    """The measure's initial state and zeros shaped like its measurement."""
    updates = _updates_like(params)
    if isinstance(measure, AbstractGradientTransformation):
        state = measure.init(params)
        shape = eqx.filter_eval_shape(lambda: measure.update(updates, state, params)[0])
        return state, zeros_like_output(shape)
    return EmptyState(), zeros_like_output(eqx.filter_eval_shape(measure, updates))


def _measure_update(measure, updates, state, params, extra_args) -> tuple[Any, Any]:
    if isinstance(measure, AbstractGradientTransformation):
        return measure.update(updates, state, params, **extra_args)
    return measure(updates), state


@checked
class SnapshotState(eqx.Module, OptaxTuple):
    """The state of `eqopt.Snapshot`: `{measure_name: measurement}`."""

    measurement: dict[str, PyTree[Any]]


@checked
class Snapshot(AbstractGradientTransformation):
    r"""Stores a measurement of the updates in the state; the updates pass through unchanged.

    $$ u_t = g_t, \qquad s_t = \{\text{name}: m(g_t)\} $$

    Placed in a chain, it sees the updates as transformed by the parts before
    it. Read the value back with `eqopt.tree.get(state, measure_name)`.

    Unlike Optax, whose initial state holds the measure of the params, the
    state starts with zeros shaped like the measurement.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `measure_name`: the key under which the measurement is stored.
    - `measure`: a callable of the updates (`None` at untrained leaves), e.g.
      `eqopt.tree.norm`.

    !!! example

        ```python
        opt = eqopt.chain(
            eqopt.sgd(0.1, momentum=0.9),
            eqopt.snapshot("norm_before_clip", eqopt.tree.norm),
            eqopt.clip_by_global_norm(1.0),
        )
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        eqopt.tree.get(state, "norm_before_clip")
        ```
    """

    measure_name: str = eqx.field(static=True)
    measure: Callable[..., Any]

    @property
    def elementwise(self) -> bool:
        return True

    @init_entry
    def init(self, params: Params) -> SnapshotState:
        _, zeros = _measure_init(self.measure, params)
        return SnapshotState(measurement={self.measure_name: zeros})

    @update_entry
    def update(
        self,
        updates: Updates,
        state: SnapshotState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, SnapshotState]:
        return updates, SnapshotState(
            measurement={self.measure_name: self.measure(updates)}
        )


@checked
def snapshot(measure_name: str, measure: Callable[..., Any]) -> Snapshot:
    """Optax spelling of `eqopt.Snapshot`."""
    return Snapshot(measure_name=measure_name, measure=measure)


@checked
class MonitorState(eqx.Module, OptaxTuple):
    """The state of `eqopt.Monitor`.

    - `measurements`: `{name: latest measurement}`, read with
      `eqopt.tree.get(state, name)`.
    - `measure_states`: the states of the measures, in the sorted order of
      their names (`EmptyState()` for a plain callable).
    """

    measurements: dict[str, PyTree[Any]]
    measure_states: tuple[Any, ...]


@checked
class Monitor(AbstractGradientTransformation):
    r"""Records several measurements of the updates, some of them stateful; updates pass through.

    $$ u_t = g_t, \qquad s_t = \{\text{name}_j: m_j(g_t, s^{(j)}_{t-1})\}_j $$

    Each measure is a callable of the updates (stored as it is), or a
    transform whose `update` returns the measurement and its new state, such
    as `eqopt.measure_with_ema`. Read a value with
    `eqopt.tree.get(state, name)`.

    Unlike Optax, whose state starts with no measurement and gains them at the
    first update, the state starts with zeros shaped like each measurement, so
    its structure never changes (it can be carried through `lax.scan`).

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `measures`: a dict from names to measures.

    !!! example

        ```python
        opt = eqopt.chain(
            eqopt.sgd(0.1, momentum=0.9),
            eqopt.monitor({
                "norm_before_clip": eqopt.tree.norm,
                "is_clipped_ema": eqopt.measure_with_ema(
                    lambda u: eqopt.tree.norm(u) > 1.0, decay=0.9
                ),
            }),
            eqopt.clip_by_global_norm(1.0),
        )
        ```
    """

    measures: dict[str, Any]

    def __init__(self, measures: dict[str, Any]):
        if not isinstance(measures, dict):
            raise TypeError(
                "monitor: `measures` must be a dict from names to measures, got "
                f"{type(measures).__name__}."
            )
        # In sorted order, as JAX flattens a dict: the order of `measure_states`
        # then survives a flatten/unflatten of the transform (under `filter_jit`).
        self.measures = {name: _as_measure(measures[name]) for name in sorted(measures)}

    @property
    def elementwise(self) -> bool:
        return True

    @init_entry
    def init(self, params: Params) -> MonitorState:
        states, measurements = [], {}
        for name, measure in self.measures.items():
            state, zeros = _measure_init(measure, params)
            states.append(state)
            measurements[name] = zeros
        return MonitorState(measurements=measurements, measure_states=tuple(states))

    @update_entry
    def update(
        self,
        updates: Updates,
        state: MonitorState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, MonitorState]:
        states, measurements = [], {}
        for (name, measure), measure_state in zip(
            self.measures.items(), state.measure_states, strict=True
        ):
            value, measure_state = _measure_update(
                measure, updates, measure_state, params, extra_args
            )
            states.append(measure_state)
            measurements[name] = value
        return updates, MonitorState(
            measurements=measurements, measure_states=tuple(states)
        )


@checked
def monitor(measures: dict[str, Any]) -> Monitor:
    """Optax spelling of `eqopt.Monitor`."""
    return Monitor(measures)


@checked
class MeasureWithEmaState(eqx.Module, OptaxTuple):
    """The state of `eqopt.MeasureWithEma`: the step count and the moving average."""

    count: Int[Array, ""]
    ema: PyTree[Any]


@checked
class MeasureWithEma(AbstractGradientTransformation):
    r"""A measure for `eqopt.monitor`: the exponential moving average of a measurement.

    $$
    e_t = \beta e_{t-1} + (1 - \beta)\, m(g_t), \qquad
    \text{returns } \begin{cases} e_t / (1 - \beta^t) & \text{debias} \\ e_t &
    \text{otherwise} \end{cases}
    $$

    Its `update` returns the (debiased) average, not updates: use it as a
    value of the `measures` dict of `eqopt.monitor`. A boolean or integer
    measurement (`norm > threshold`) is averaged as a float, so the average
    of an indicator is a frequency.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `measure`: a callable of the updates.
    - `decay`: $\beta \in [0, 1]$.
    - `debias`: divide by $1 - \beta^t$.
    - `accumulator_dtype`: the dtype of the average (default: the
      measurement's, or the default float for a boolean or integer one).
    """

    measure: Callable[..., Any]
    decay: Scalar = eqx.field(converter=as_scalar)
    debias: bool = eqx.field(default=True, static=True)
    accumulator_dtype: DTypeLike | None = eqx.field(default=None, static=True)

    def __check_init__(self):
        super().__check_init__()
        check_decays(self, "decay", high_inclusive=True)

    @property
    def elementwise(self) -> bool:
        return False

    def _dtype(self, measurement: Any) -> Any:
        if self.accumulator_dtype is not None:
            return self.accumulator_dtype
        if jnp.issubdtype(measurement.dtype, jnp.inexact):
            return measurement.dtype
        return jnp.result_type(float)

    @init_entry
    def init(self, params: Params) -> MeasureWithEmaState:
        shape = eqx.filter_eval_shape(self.measure, _updates_like(params))
        return MeasureWithEmaState(
            count=jnp.zeros([], jnp.int32),
            ema=jax.tree.map(lambda s: jnp.zeros(s.shape, self._dtype(s)), shape),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: MeasureWithEmaState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[PyTree[Any], MeasureWithEmaState]:
        count = safe_int32_increment(state.count)
        decay = self.decay
        correction = 1 - decay**count

        def average(m, e):
            m = jnp.asarray(m).astype(e.dtype)
            e = ((1 - decay) * m + decay * e).astype(e.dtype)
            return e

        ema = jax.tree.map(average, self.measure(updates), state.ema)
        value = (
            jax.tree.map(lambda e: (e / correction).astype(e.dtype), ema)
            if self.debias
            else ema
        )
        return value, MeasureWithEmaState(count=count, ema=ema)


@checked
def measure_with_ema(
    measure: Callable[..., Any],
    decay: ScalarLike,
    debias: bool = True,
    accumulator_dtype: DTypeLike | None = None,
) -> MeasureWithEma:
    """Optax spelling of `eqopt.MeasureWithEma`."""
    return MeasureWithEma(
        measure=measure,
        decay=decay,
        debias=debias,
        accumulator_dtype=accumulator_dtype,
    )
