"""Gradient accumulation: `MultiSteps` and `apply_every`."""

import functools
import operator
from collections.abc import Callable
from typing import Any, Protocol, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, Bool, Int, PyTree

from .. import _sharding
from .._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    OptState,
    Params,
    Updates,
    is_none,
    is_trainable,
)
from .._entry import init_entry, update_entry
from .._hyper import (
    IntScalar,
    Schedule,
    as_int_scalar,
    check_hyperparameter,
    is_concrete,
)
from .._interop import as_transform
from .._leafwise import leafwise, zeros_like_trainable
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._control import cast_like, filter_cond, zeros_like_output
from .finite import skip_large_updates, skip_not_finite


class ShouldSkipUpdateFunction(Protocol):
    """The signature of `should_skip_update_fn` in `eqopt.MultiSteps`.

    Called as `should_skip_update_fn(updates, gradient_step, params)`; returns
    `(should_skip, skip_state)`: a boolean scalar, and a pytree of arrays kept
    in the state as `skip_state` (for monitoring). See `eqopt.skip_not_finite`
    and `eqopt.skip_large_updates`.
    """

    def __call__(
        self, updates: Updates, gradient_step: Any, params: Params | None
    ) -> tuple[Any, Any]: ...


@checked
class MultiStepsState(eqx.Module, OptaxTuple):
    """The state of `eqopt.MultiSteps`.

    - `mini_step`: mini-steps accumulated since the last inner update.
    - `gradient_step`: inner updates made so far.
    - `inner_opt_state`: the wrapped optimiser's state.
    - `acc_grads`: the accumulated gradients, shaped like the params (`None` at
      leaves that are not trained); `None` altogether when every update is
      applied (`every_k_schedule=1`), so no buffer is kept.
    - `skip_state`: what `should_skip_update_fn` returned last (`()` without one).
    """

    mini_step: Int[Array, ""]
    gradient_step: Int[Array, ""]
    inner_opt_state: Any
    acc_grads: Updates | None
    skip_state: PyTree[Any] = ()


def _every_k(every_k_schedule: Any) -> int | None:
    """The constant number of mini-steps, `None` for a schedule; one error for the rest."""
    if callable(every_k_schedule) and not eqx.is_array(every_k_schedule):
        return None
    value: Any = every_k_schedule
    if isinstance(value, (bool, np.bool_)) or not (
        isinstance(value, (int, np.integer))
        or (
            is_concrete(value)
            and value.ndim == 0
            and jnp.issubdtype(value.dtype, jnp.integer)
        )
        or (
            isinstance(value, np.ndarray)
            and value.ndim == 0
            and np.issubdtype(value.dtype, np.integer)
        )
    ):
        shown = repr(value) if not eqx.is_array(value) else f"an array {value}"
        raise TypeError(
            "MultiSteps: `every_k_schedule` must be a positive int (the number of "
            "mini-steps per update) or a schedule `gradient_step -> k`, got "
            f"{type(value).__name__} {shown}. Pass an int, e.g. `every_k_schedule=4`"
            " (it decides the control flow, so it cannot be a traced or float value)."
        )
    k = operator.index(value)
    if k < 1:
        raise ValueError(f"MultiSteps: `every_k_schedule` must be at least 1, got {k}.")
    return k


@no_type_check
def _concat_invariant(should_skip_update_fn) -> bool:
    # The built-in skip rules look at the whole tree at once (all finite, global
    # norm), so they do not depend on how leaves are split.
    if should_skip_update_fn is None or should_skip_update_fn is skip_not_finite:
        return True
    return (
        isinstance(should_skip_update_fn, functools.partial)
        and should_skip_update_fn.func is skip_large_updates
    )


@checked
class MultiSteps(AbstractWrapper):
    r"""Accumulates gradients over $k$ mini-steps, then applies the wrapped optimiser once.

    With mini-batch gradients $g_1, \dots, g_k$,

    $$
    \bar g = \frac{1}{k} \sum_{i=1}^{k} g_i \quad (\text{or } \textstyle\sum_i g_i
    \text{ with } \texttt{use\_grad\_mean=False}), \qquad
    (u, s) = \texttt{opt.update}(\bar g, s, \theta)
    $$

    On the $k$-th mini-step the accumulated $\bar g$ goes through `opt` and its
    update is returned; on the others the updates are zeros and `opt`'s state
    is unchanged. So $k$ steps on batches of size $B$ equal one step on a batch
    of size $kB$. The mean is kept as a running mean,
    $\bar g_i = \bar g_{i-1} + (g_i - \bar g_{i-1}) / i$. $k$ may change over
    training: a schedule is evaluated at the number of inner updates made.

    The choice between accumulating and applying is a `lax.cond`, so the wrapped
    optimiser runs only on the $k$-th mini-step, and the state keeps the same
    structure every step: the update runs under `eqx.filter_jit` and inside
    `lax.scan` without retracing.

    Differences from Optax, on purpose:

    - with `every_k_schedule=1` no accumulation buffer is kept
      (`state.acc_grads is None`): the wrapper costs no memory;
    - the accumulator's dtype is `accumulator_dtype` promoted with each
      parameter's dtype, so complex gradients keep their imaginary part and
      float64 ones their precision (Optax casts to `accumulator_dtype`);
    - an `every_k_schedule` that is not a positive int or a schedule (a float,
      a bool, a traced value) is an error when the wrapper is built.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `opt`: the optimiser to apply every $k$ mini-steps (an eqopt transform, or
      an Optax-style pair).
    - `every_k_schedule`: $k$, a positive int, or a schedule mapping the number
      of inner updates made (`gradient_step`) to $k$.
    - `use_grad_mean`: average the accumulated gradients (default) or sum them.
    - `should_skip_update_fn`: optional `(updates, gradient_step, params) ->
      (should_skip, skip_state)`; a mini-step it rejects is ignored (zeros are
      returned and the state is unchanged but for `skip_state`). See
      `eqopt.skip_not_finite` and `eqopt.skip_large_updates`.
    - `accumulator_dtype`: the dtype to accumulate in (default `float32`;
      `None` for the parameters' own).

    !!! example

        ```python
        opt = eqopt.MultiSteps(eqopt.adam(1e-3), every_k_schedule=4)
        state = opt.init(model)
        micro_batches = [(x, y)] * 4
        for x, y in micro_batches:            # four micro-batches per update
            grads = eqx.filter_grad(loss_fn)(model, x, y)
            updates, state = opt.update(grads, state, model)
            model = eqopt.apply_updates(model, updates)   # zeros 3 times in 4
        ```

    **References:** the gradient accumulation of Ott et al., *Scaling Neural
    Machine Translation*, WMT 2018 (large effective batches from small ones).
    """

    opt: AbstractGradientTransformation
    schedule: Schedule | None
    every_k: int | None = eqx.field(static=True)
    use_grad_mean: bool = eqx.field(static=True)
    should_skip_update_fn: Callable[..., Any] | None
    accumulator_dtype: DTypeLike | None = eqx.field(static=True)

    # Checked by `_every_k`, whose error says what to pass, not by the type checker.
    @no_type_check
    def __init__(
        self,
        opt: Any,
        every_k_schedule: int | Schedule,
        use_grad_mean: bool = True,
        should_skip_update_fn: Callable[..., Any] | None = None,
        accumulator_dtype: DTypeLike | None = jnp.float32,
    ):
        self.opt = as_transform(opt)
        self.every_k = _every_k(every_k_schedule)
        self.schedule = every_k_schedule if self.every_k is None else None
        self.use_grad_mean = use_grad_mean
        self.should_skip_update_fn = should_skip_update_fn
        self.accumulator_dtype = accumulator_dtype

    @property
    def every_k_schedule(self) -> int | Schedule:
        """$k$ as it was given: an int or a schedule."""
        return self.every_k if self.schedule is None else self.schedule  # pyright: ignore[reportReturnType]

    @property
    def inner(self) -> AbstractGradientTransformation:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.opt

    @property
    def elementwise(self) -> bool:
        return self.opt.elementwise and _concat_invariant(self.should_skip_update_fn)

    @property
    def runs_on_buffers(self) -> bool:
        return self.opt.runs_on_buffers and _concat_invariant(
            self.should_skip_update_fn
        )

    @property
    def _keeps_buffer(self) -> bool:
        return self.every_k != 1

    def _accumulator_zeros(self, params: Params) -> Updates:
        def zeros(p):
            if not is_trainable(p):
                return None
            dtype = (
                p.dtype
                if self.accumulator_dtype is None
                else jnp.promote_types(self.accumulator_dtype, p.dtype)
            )
            return jnp.zeros_like(p, dtype)  # keeps the parameter's sharding

        return jax.tree.map(zeros, params)

    def _skip_state_zeros(self, params: Params) -> PyTree[Any]:
        if self.should_skip_update_fn is None:
            return ()
        updates = jax.tree.map(lambda p: p if is_trainable(p) else None, params)
        _, skip_state = eqx.filter_eval_shape(
            self.should_skip_update_fn, updates, jnp.zeros([], jnp.int32), params
        )
        return zeros_like_output(skip_state)

    @init_entry
    def init(self, params: Params) -> MultiStepsState:
        return MultiStepsState(
            mini_step=jnp.zeros([], jnp.int32),
            gradient_step=jnp.zeros([], jnp.int32),
            inner_opt_state=self.opt.init(params),
            acc_grads=self._accumulator_zeros(params) if self._keeps_buffer else None,
            skip_state=self._skip_state_zeros(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: MultiStepsState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, MultiStepsState]:
        if not isinstance(state, MultiStepsState):
            raise TypeError(
                f"MultiSteps.update: expected a MultiStepsState, got "
                f"{type(state).__name__}. Pass the state from `init` (not the inner "
                "optimiser's)."
            )
        if self._keeps_buffer and state.acc_grads is None:
            raise ValueError(
                "MultiSteps.update: the state has no accumulation buffer; it was made "
                "by a MultiSteps with `every_k_schedule=1`."
            )
        skip_state = state.skip_state
        if self.should_skip_update_fn is not None:
            should_skip, skip_state = self.should_skip_update_fn(
                updates, state.gradient_step, params
            )
        else:
            should_skip = False

        if self._keeps_buffer:
            accumulated = self._accumulate(updates, state)
            grads = cast_like(accumulated, updates)
        else:
            accumulated, grads = None, updates

        def apply() -> tuple[Updates, MultiStepsState]:
            inner_updates, inner_state = self.opt.update(
                grads, state.inner_opt_state, params, **extra_args
            )
            return inner_updates, MultiStepsState(
                mini_step=jnp.zeros([], jnp.int32),
                gradient_step=safe_int32_increment(state.gradient_step),
                inner_opt_state=inner_state,
                acc_grads=None
                if accumulated is None
                else jax.tree.map(_sharding.zeros_like, accumulated),
                skip_state=skip_state,
            )

        def zeros() -> Updates:
            return zeros_like_output(eqx.filter_eval_shape(apply)[0])

        def accumulate() -> tuple[Updates, MultiStepsState]:
            return zeros(), MultiStepsState(
                mini_step=safe_int32_increment(state.mini_step),
                gradient_step=state.gradient_step,
                inner_opt_state=state.inner_opt_state,
                acc_grads=accumulated,
                skip_state=skip_state,
            )

        def skip() -> tuple[Updates, MultiStepsState]:
            return zeros(), MultiStepsState(
                mini_step=state.mini_step,
                gradient_step=state.gradient_step,
                inner_opt_state=state.inner_opt_state,
                acc_grads=state.acc_grads,
                skip_state=skip_state,
            )

        if self.every_k is None:
            k = self.schedule(state.gradient_step)  # pyright: ignore[reportOptionalCall]
            emit = state.mini_step >= k - 1
            step = lambda: filter_cond(emit, apply, accumulate)  # noqa: E731
        elif self.every_k == 1:
            step = apply
        else:
            emit = state.mini_step >= self.every_k - 1
            step = lambda: filter_cond(emit, apply, accumulate)  # noqa: E731
        return filter_cond(should_skip, skip, step)

    def _accumulate(self, updates: Updates, state: MultiStepsState) -> Updates:
        if self.use_grad_mean:
            # A running mean: the number of mini-steps need not be known in advance.
            weight = 1 / (state.mini_step + 1)

            @no_type_check
            def add(g, acc):
                g = g.astype(acc.dtype)
                return acc + (g - acc) * weight.astype(jnp.finfo(acc.dtype).dtype)

        else:

            @no_type_check
            def add(g, acc):
                return acc + g.astype(acc.dtype)

        # A leaf without a gradient this mini-step (`None`, where the buffer holds
        # an array) adds a zero gradient: the buffer keeps its structure, which
        # the branches of `update` must share.
        # (Only where the trees match: otherwise `leafwise` names the place.)
        if jax.tree.structure(updates, is_leaf=is_none) == jax.tree.structure(
            state.acc_grads, is_leaf=is_none
        ):
            updates = jax.tree.map(
                lambda g, acc: (
                    jnp.zeros_like(acc) if g is None and acc is not None else g
                ),
                updates,
                state.acc_grads,
                is_leaf=is_none,
            )
        return leafwise(add, updates, state.acc_grads)

    def has_updated(self, state: MultiStepsState) -> Bool[Array, ""]:
        """Whether the last `update` applied the wrapped optimiser.

        **Arguments:**

        - `state`: the state returned by the last `update`.

        **Returns:** a boolean scalar, `True` right after an inner update.
        """
        return jnp.logical_and(state.mini_step == 0, state.gradient_step > 0)

    def gradient_transformation(self) -> "MultiSteps":
        """This wrapper itself: it is already an eqopt transform.

        Optax's `MultiSteps` is a class whose `gradient_transformation()` builds
        the transform; code that calls it keeps working.
        """
        return self


@checked
class ApplyEveryState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ApplyEvery`: the step count and the running sum."""

    count: Int[Array, ""]
    grad_acc: Updates


@checked
class ApplyEvery(AbstractGradientTransformation):
    r"""Sums the updates over $k$ steps and emits the sum every $k$-th step, zeros otherwise.

    $$
    a_t = g_t + [t \bmod k \ne 0]\, a_{t-1}, \qquad
    u_t = [t \bmod k = k - 1]\, a_t
    $$

    Transforms before it in a chain still update their state every step; to
    apply a whole optimiser once per $k$ mini-steps use `eqopt.MultiSteps`.

    In Optax `ApplyEvery` is the name of this transform's state; here it is the
    transform, and the state is `eqopt.ApplyEveryState`.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `k`: emit the sum every `k` steps (a positive int, a dynamic leaf).

    !!! example

        ```python
        # Sum the updates of four steps and apply them at the fourth (Optax's older way;
        # eqopt.MultiSteps averages gradients before the optimiser instead).
        opt = eqopt.chain(eqopt.sgd(1e-2), eqopt.apply_every(k=4))
        state = opt.init(model)
        for _ in range(4):
            updates, state = opt.update(grads, state, model)   # zero for three steps
            model = eqopt.apply_updates(model, updates)
        ```
    """

    k: IntScalar = eqx.field(default=1, converter=as_int_scalar)

    def __check_init__(self):
        check_hyperparameter("k", self.k, low=1)

    @property
    def elementwise(self) -> bool:
        return True

    @init_entry
    def init(self, params: Params) -> ApplyEveryState:
        return ApplyEveryState(
            count=jnp.zeros([], jnp.int32), grad_acc=zeros_like_trainable(params)
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ApplyEveryState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, OptState]:
        phase = state.count % self.k
        keep = phase != 0
        emit = phase == self.k - 1

        @no_type_check
        def step(g, acc):
            acc = g + jnp.where(keep, acc, jnp.zeros_like(acc)).astype(g.dtype)
            return jnp.where(emit, acc, jnp.zeros_like(acc)), acc

        updates, grad_acc = leafwise(step, updates, state.grad_acc, n_out=2)
        return updates, ApplyEveryState(
            count=(state.count + 1) % self.k, grad_acc=grad_acc
        )


@checked
def apply_every(k: int | Int[Array, ""] = 1) -> ApplyEvery:
    """Optax spelling of `eqopt.ApplyEvery`."""
    return ApplyEvery(k=k)
