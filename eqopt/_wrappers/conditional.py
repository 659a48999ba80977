"""Applying a transform only at some steps: `conditionally_transform`, `conditionally_mask`."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int

from .._base import AbstractGradientTransformation, AbstractWrapper, Params, Updates
from .._entry import init_entry, update_entry
from .._interop import as_transform
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._control import cast_like, filter_cond, zeros_like_output


def _should_transform(fn, step, forward_extra_args, extra_args):
    if forward_extra_args:
        return fn(step, **extra_args)
    return fn(step)


def _conditional_update(
    wrapper, updates, inner_state, step, params, extra_args, otherwise
) -> tuple[Updates, Any]:
    def apply():
        return wrapper.inner.update(updates, inner_state, params, **extra_args)

    def skip():
        # The inner transform's output dtypes, so both branches agree.
        structure = eqx.filter_eval_shape(apply)[0]
        return otherwise(updates, structure), inner_state

    predicate = _should_transform(
        wrapper.should_transform_fn, step, wrapper.forward_extra_args, extra_args
    )
    return filter_cond(predicate, apply, skip)


@checked
class ConditionallyTransformState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ConditionallyTransform`: the inner state and the call count."""

    inner_state: Any
    step: Int[Array, ""]


@checked
class ConditionallyTransform(AbstractWrapper):
    r"""Applies `inner` at the steps chosen by `should_transform_fn`; passes updates through otherwise.

    With $t$ the number of earlier calls to `update`,

    $$
    (u_t, s_t) = \begin{cases} \texttt{inner.update}(g_t, s_{t-1}) & f(t) \\
    (g_t, s_{t-1}) & \text{otherwise} \end{cases}
    $$

    The choice is a `lax.cond`, so `inner` runs only when chosen. To return
    zeros instead of the updates, use `eqopt.ConditionallyMask`.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `inner`: the transform to apply.
    - `should_transform_fn`: $f$, mapping the step count (an `int32` scalar) to
      a boolean scalar.
    - `forward_extra_args`: also pass the extra arguments of `update` to
      `should_transform_fn` as keywords.

    !!! example

        ```python
        # Clip only during the first 100 steps.
        opt = eqopt.chain(
            eqopt.conditionally_transform(
                eqopt.clip_by_global_norm(1.0),
                should_transform_fn=lambda step: step < 100,
            ),
            eqopt.adam(1e-3),
        )
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        ```
    """

    inner: AbstractGradientTransformation
    should_transform_fn: Callable[..., Any]
    forward_extra_args: bool = eqx.field(static=True)

    def __init__(
        self,
        inner: Any,
        should_transform_fn: Callable[..., Any],
        forward_extra_args: bool = False,
    ):
        self.inner = as_transform(inner)
        self.should_transform_fn = should_transform_fn
        self.forward_extra_args = forward_extra_args

    @init_entry
    def init(self, params: Params) -> ConditionallyTransformState:
        return ConditionallyTransformState(
            inner_state=self.inner.init(params), step=jnp.zeros([], jnp.int32)
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ConditionallyTransformState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ConditionallyTransformState]:
        updates, inner_state = _conditional_update(
            self,
            updates,
            state.inner_state,
            state.step,
            params,
            extra_args,
            otherwise=cast_like,
        )
        return updates, ConditionallyTransformState(
            inner_state=inner_state, step=safe_int32_increment(state.step)
        )


@checked
def conditionally_transform(
    inner: Any,
    should_transform_fn: Callable[..., Any],
    forward_extra_args: bool = False,
) -> ConditionallyTransform:
    """Optax spelling of `eqopt.ConditionallyTransform`."""
    return ConditionallyTransform(inner, should_transform_fn, forward_extra_args)


@checked
class ConditionallyMaskState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ConditionallyMask`: the call count and the inner state."""

    step: Int[Array, ""]
    inner_state: Any


@checked
class ConditionallyMask(AbstractWrapper):
    r"""Applies `inner` at the steps chosen by `should_transform_fn`; returns zeros otherwise.

    With $t$ the number of earlier calls to `update`,

    $$
    (u_t, s_t) = \begin{cases} \texttt{inner.update}(g_t, s_{t-1}) & f(t) \\
    (0, s_{t-1}) & \text{otherwise} \end{cases}
    $$

    The choice is a `lax.cond`, so `inner` runs only when chosen. To pass the
    updates through instead of zeros, use `eqopt.ConditionallyTransform`.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `inner`: the transform to apply.
    - `should_transform_fn`: $f$, mapping the step count (an `int32` scalar) to
      a boolean scalar.
    - `forward_extra_args`: also pass the extra arguments of `update` to
      `should_transform_fn` as keywords.
    """

    inner: AbstractGradientTransformation
    should_transform_fn: Callable[..., Any]
    forward_extra_args: bool = eqx.field(static=True)

    def __init__(
        self,
        inner: Any,
        should_transform_fn: Callable[..., Any],
        forward_extra_args: bool = False,
    ):
        self.inner = as_transform(inner)
        self.should_transform_fn = should_transform_fn
        self.forward_extra_args = forward_extra_args

    @init_entry
    def init(self, params: Params) -> ConditionallyMaskState:
        return ConditionallyMaskState(
            step=jnp.zeros([], jnp.int32), inner_state=self.inner.init(params)
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ConditionallyMaskState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ConditionallyMaskState]:
        updates, inner_state = _conditional_update(
            self,
            updates,
            state.inner_state,
            state.step,
            params,
            extra_args,
            otherwise=lambda updates, structure: zeros_like_output(structure),
        )
        return updates, ConditionallyMaskState(
            step=safe_int32_increment(state.step), inner_state=inner_state
        )


@checked
def conditionally_mask(
    inner: Any,
    should_transform_fn: Callable[..., Any],
    forward_extra_args: bool = False,
) -> ConditionallyMask:
    """Optax spelling of `eqopt.ConditionallyMask`."""
    return ConditionallyMask(inner, should_transform_fn, forward_extra_args)
