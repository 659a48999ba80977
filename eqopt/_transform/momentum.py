"""Momentum and exponential moving averages."""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Int

from .._base import AbstractGradientTransformation, Params, Updates
from .._entry import init_entry, update_entry
from .._hyper import Scalar, ScalarLike, as_scalar, check_decays, check_hyperparameter
from .._leafwise import leafwise, zeros_like_trainable
from .._numerics import debias, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked


@checked
class TraceState(eqx.Module, OptaxTuple):
    """The state of `eqopt.Trace`: the momentum buffer."""

    trace: Updates


@checked
class Trace(AbstractGradientTransformation):
    r"""Heavy-ball momentum, optionally with Nesterov's look-ahead.

    $$ m_t = g_t + \mu\, m_{t-1}, \qquad
       u_t = \begin{cases} g_t + \mu\, m_t & \text{Nesterov} \\ m_t & \text{otherwise} \end{cases} $$

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `decay`: the momentum $\mu$.
    - `nesterov`: use Nesterov momentum.
    - `accumulator_dtype`: dtype to store the buffer in (default: the params').

    **References:** Polyak, *Some methods of speeding up the convergence of
    iteration methods*, 1964; Sutskever et al., *On the importance of
    initialization and momentum in deep learning*, ICML 2013.
    """

    decay: Scalar = eqx.field(converter=as_scalar)
    nesterov: bool = eqx.field(default=False, static=True)
    accumulator_dtype: DTypeLike | None = eqx.field(default=None, static=True)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_hyperparameter("decay", self.decay)

    @init_entry
    def init(self, params: Params) -> TraceState:
        return TraceState(trace=zeros_like_trainable(params, self.accumulator_dtype))

    @update_entry
    def update(
        self,
        updates: Updates,
        state: TraceState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, TraceState]:
        decay = self.decay

        @no_type_check
        def step(g, t):
            new_trace = g + decay * t
            update = g + decay * new_trace if self.nesterov else new_trace
            return update, new_trace.astype(t.dtype)

        updates, trace = leafwise(step, updates, state.trace, n_out=2)
        return updates, TraceState(trace=trace)


@checked
def trace(
    decay: ScalarLike,
    nesterov: bool = False,
    accumulator_dtype: DTypeLike | None = None,
) -> Trace:
    """Optax spelling of `eqopt.Trace`."""
    return Trace(decay=decay, nesterov=nesterov, accumulator_dtype=accumulator_dtype)


@checked
class EmaState(eqx.Module, OptaxTuple):
    """The state of `eqopt.Ema`: step count and the moving average."""

    count: Int[Array, ""]
    ema: Updates


@checked
class Ema(AbstractGradientTransformation):
    r"""Replaces the updates by their exponential moving average.

    $$ e_t = \beta\, e_{t-1} + (1 - \beta)\, g_t, \qquad
       u_t = \begin{cases} e_t / (1 - \beta^t) & \text{debias} \\ e_t & \text{otherwise} \end{cases} $$

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `decay`: $\beta \in [0, 1]$.
    - `debias`: divide by $1 - \beta^t$ (Kingma & Ba, 2015).
    - `accumulator_dtype`: dtype to store the average in (default: the params').
    """

    decay: Scalar = eqx.field(converter=as_scalar)
    debias: bool = eqx.field(default=True, static=True)
    accumulator_dtype: DTypeLike | None = eqx.field(default=None, static=True)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "decay", high_inclusive=True)

    @init_entry
    def init(self, params: Params) -> EmaState:
        return EmaState(
            count=jnp.zeros([], jnp.int32),
            ema=zeros_like_trainable(params, self.accumulator_dtype),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: EmaState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmaState]:
        decay = self.decay
        count = safe_int32_increment(state.count)

        one_minus_decay, correction = 1 - decay, 1 - decay**count

        @no_type_check
        def step(g, e):
            new = decay * e + one_minus_decay * g
            update = debias(new, correction) if self.debias else new
            return update, new.astype(e.dtype)

        updates, ema = leafwise(step, updates, state.ema, n_out=2)
        return updates, EmaState(count=count, ema=ema)


@checked
def ema(
    decay: ScalarLike, debias: bool = True, accumulator_dtype: DTypeLike | None = None
) -> Ema:
    """Optax spelling of `eqopt.Ema`."""
    return Ema(decay=decay, debias=debias, accumulator_dtype=accumulator_dtype)
