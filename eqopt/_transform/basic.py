"""Stateless building blocks and scaling: identity, set_to_zero, stateless, scale..."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .._base import (
    AbstractGradientTransformation,
    EmptyState,
    OptState,
    Params,
    Updates,
    is_none,
)
from .._checks import check_updates
from .._entry import init_entry, update_entry
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    Schedule,
    as_optional_scalar_or_schedule,
    as_scalar,
    check_hyperparameter,
)
from .._interop import as_transform
from .._leaf_scales import LeafScales, scale_updates
from .._leafwise import leafwise
from .._numerics import safe_int32_increment
from .._scheduled import (
    ScaleByScheduleState,
    current_value,
    init_count_if_scheduled,
)
from .._typecheck import checked


@checked
class Identity(AbstractGradientTransformation):
    """Returns the updates unchanged.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.
    """

    @property
    def elementwise(self) -> bool:
        return True

    @init_entry
    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    @update_entry
    def update(
        self,
        updates: Updates,
        state: EmptyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmptyState]:
        return updates, state


@checked
def identity() -> Identity:
    """Optax spelling of `eqopt.Identity`."""
    return Identity()


@checked
class SetToZero(AbstractGradientTransformation):
    """Replaces every update with zeros (of the same shape and dtype).

    Used to freeze parameters: see `eqopt.freeze`.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.
    """

    @property
    def elementwise(self) -> bool:
        return True

    @init_entry
    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    @update_entry
    def update(
        self,
        updates: Updates,
        state: EmptyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmptyState]:
        return leafwise(jnp.zeros_like, updates), state


@checked
def set_to_zero() -> SetToZero:
    """Optax spelling of `eqopt.SetToZero`."""
    return SetToZero()


@checked
def init_empty_state(params: Params) -> EmptyState:
    """An `init` function for stateless transforms: returns `EmptyState()`."""
    del params
    return EmptyState()


def _params_like(updates: Updates, params: Params | None) -> Params | None:
    """The params with `None` where the update is `None` (where a leaf is not trained)."""
    if params is None:
        return None
    check_updates(updates, params)
    return jax.tree.map(
        lambda u, p: None if u is None else p, updates, params, is_leaf=is_none
    )


@checked
class Stateless(AbstractGradientTransformation):
    """A stateless transform from a function `f(updates, params) -> updates`.

    `params` is `None` when `update` is called without params. The function sees
    the whole trees, both with `None` at the leaves that are not trained (an
    activation function, an integer), so an Optax-style
    `jax.tree.map(fn, updates, params)` works on a whole Equinox model.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `f`: the function.
    """

    f: Callable[[Updates, Params | None], Updates]

    @property
    def elementwise(self) -> bool:
        return False

    @init_entry
    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    @update_entry
    def update(
        self,
        updates: Updates,
        state: EmptyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmptyState]:
        return self.f(updates, _params_like(updates, params)), state


@checked
def stateless(f: Callable[[Updates, Params | None], Updates]) -> Stateless:
    """Optax spelling of `eqopt.Stateless`."""
    return Stateless(f=f)


@checked
class StatelessWithTreeMap(AbstractGradientTransformation):
    """A stateless transform applying `f(update, param) -> update` to each leaf.

    `param` is `None` when `update` is called without params. Leaves whose update
    is `None` are skipped.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each slice,
    batched, as on the list of those layers.

    **Arguments:**

    - `f`: the per-leaf function.
    """

    f: Callable[[Array, Any], Array]

    @property
    def elementwise(self) -> bool:
        return False

    @init_entry
    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    @update_entry
    def update(
        self,
        updates: Updates,
        state: EmptyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmptyState]:
        if params is None:
            return leafwise(lambda g: self.f(g, None), updates), state
        return leafwise(self.f, updates, _params_like(updates, params)), state


@checked
def stateless_with_tree_map(f: Callable[[Array, Any], Array]) -> StatelessWithTreeMap:
    """Optax spelling of `eqopt.StatelessWithTreeMap`."""
    return StatelessWithTreeMap(f=f)


@checked
def with_extra_args_support(tx: Any) -> AbstractGradientTransformation:
    """Makes a transform accept extra keyword arguments in `update`.

    Every eqopt transform already does, so eqopt transforms are returned
    unchanged; an Optax-style `(init, update)` pair is wrapped in
    `eqopt.GradientTransformation`, which drops extra arguments that its
    `update` function does not take.
    """
    return as_transform(tx)


# ---------------------------------------------------------------------------
# Scaling
# ---------------------------------------------------------------------------


@checked
class Scale(AbstractGradientTransformation):
    r"""Multiplies the updates by a fixed factor.

    $$ u \mapsto \alpha\, u $$

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `step_size`: $\alpha$, a number (a dynamic leaf).
    """

    step_size: Scalar = eqx.field(converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_hyperparameter("step_size", self.step_size)

    @init_entry
    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    @update_entry
    def update(
        self,
        updates: Updates,
        state: EmptyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmptyState]:
        return scale_updates(updates, self.step_size), state


@checked
def scale(step_size: ScalarLike) -> Scale:
    """Optax spelling of `eqopt.Scale`."""
    return Scale(step_size=step_size)


@checked
class ScaleBySchedule(AbstractGradientTransformation):
    r"""Multiplies the updates by a schedule evaluated at the step count.

    $$ u_t \mapsto \eta(t)\, u_t $$

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `step_size_fn`: a schedule, or any callable from the step count to a number.
    """

    step_size_fn: Schedule

    @property
    def elementwise(self) -> bool:
        return True

    @init_entry
    def init(self, params: Params) -> ScaleByScheduleState:
        return ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByScheduleState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByScheduleState]:
        updates = scale_updates(updates, self.step_size_fn(state.count))
        return updates, ScaleByScheduleState(count=safe_int32_increment(state.count))


@checked
def scale_by_schedule(step_size_fn: Schedule) -> ScaleBySchedule:
    """Optax spelling of `eqopt.ScaleBySchedule`."""
    return ScaleBySchedule(step_size_fn=step_size_fn)


@checked
class ScaleByLearningRate(AbstractGradientTransformation):
    r"""Multiplies the updates by the learning rate, negated by default.

    $$ u_t \mapsto -\eta_t\, u_t $$

    The learning rate is a number (a dynamic leaf: change it with `eqx.tree_at`
    without recompiling) or a schedule of the step count, in which case the
    state counts steps.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule. `None` (as in Optax)
      makes the transform the identity: updates pass through unscaled and
      unflipped, for optimisers whose step size comes from elsewhere.
    - `flip_sign`: negate, so that adding the updates descends (default `True`).
    """

    learning_rate: Scalar | Schedule | None = eqx.field(
        default=None, converter=as_optional_scalar_or_schedule
    )
    flip_sign: bool = eqx.field(default=True, static=True)
    #: Per-leaf multipliers of the rate (arrays from the groups' state), set by
    #: `eqopt.param_groups` for its call (`eqopt._leaf_scales`); `None` otherwise.
    scales: LeafScales | None = None

    @property
    def elementwise(self) -> bool:
        return self.scales is None

    @property
    def runs_on_buffers(self) -> bool:
        # Per-leaf multipliers are one value per segment of a buffer.
        return True

    def __check_init__(self):
        check_hyperparameter("learning_rate", self.learning_rate)

    @init_entry
    def init(self, params: Params) -> OptState:
        return init_count_if_scheduled(self.learning_rate)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: OptState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, OptState]:
        if self.learning_rate is None:
            return updates, state
        sign = -1 if self.flip_sign else 1
        learning_rate, new_state = current_value(self.learning_rate, state)
        return scale_updates(updates, sign * learning_rate, self.scales), new_state


@checked
def scale_by_learning_rate(
    learning_rate: ScalarOrSchedule | None = None, *, flip_sign: bool = True
) -> ScaleByLearningRate:
    """Optax spelling of `eqopt.ScaleByLearningRate`."""
    return ScaleByLearningRate(learning_rate=learning_rate, flip_sign=flip_sign)
