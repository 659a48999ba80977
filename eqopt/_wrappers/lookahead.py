"""The Lookahead optimiser: `lookahead`, `LookaheadParams`."""

import operator
from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from .._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    Params,
    Updates,
    is_none,
    is_trainable,
)
from .._checks import check_updates
from .._entry import init_entry, update_entry
from .._hyper import Scalar, ScalarLike, as_scalar, check_hyperparameter, is_concrete
from .._interop import as_transform
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ..tree._state import _is_placeholder
from ._control import select


@checked
class LookaheadParams(eqx.Module, OptaxTuple):
    """The fast and slow weights of `eqopt.Lookahead`, as one pytree.

    Compute gradients with the fast weights (`params.fast`); evaluate with the
    slow ones (`params.slow`), which generalise better. Both are whole models
    of the same structure; `eqopt.apply_updates(params, updates)` updates both.

    **Arguments:**

    - `fast`: the fast weights.
    - `slow`: the slow weights.

    **References:** Zhang, Lucas, Hinton & Ba, *Lookahead Optimizer: k steps
    forward, 1 step back*, NeurIPS 2019.
    """

    fast: Params
    slow: Params

    @classmethod
    def init_synced(cls, params: Params) -> "LookaheadParams":
        """Fast and slow weights both equal to `params` (the usual start).

        **Arguments:**

        - `params`: the parameters, any pytree (a whole Equinox model is fine).

        **Returns:** `LookaheadParams(fast=params, slow=params)`.
        """
        return cls(fast=params, slow=params)


@checked
class LookaheadState(eqx.Module, OptaxTuple):
    """The state of `eqopt.Lookahead`.

    - `fast_state`: the fast optimiser's state.
    - `steps_since_sync`: fast steps taken since the slow weights were last synced.
    """

    fast_state: Any
    steps_since_sync: Int[Array, ""]


def _sync_period(value: Any) -> int:
    integer = isinstance(value, (int, np.integer)) or (
        (is_concrete(value) or isinstance(value, np.ndarray))
        and value.ndim == 0
        and jnp.issubdtype(value.dtype, jnp.integer)
    )
    if isinstance(value, (bool, np.bool_)) or not integer:
        raise TypeError(
            "lookahead: `sync_period` must be a positive int (the number of fast "
            f"steps between syncs), got {type(value).__name__} {value!r}."
        )
    period = operator.index(value)
    if period < 1:
        raise ValueError(f"lookahead: `sync_period` must be >= 1, got {period}.")
    return period


_FIX = (
    "Build them with `eqopt.LookaheadParams.init_synced(model)`, compute the "
    "gradients with `params.fast`, and pass the whole `LookaheadParams` as `params`."
)


def _check_params(params: Any, where: str) -> LookaheadParams:
    if not isinstance(params, LookaheadParams):
        raise TypeError(
            f"lookahead.{where}: `params` must be an eqopt.LookaheadParams holding "
            f"the fast and slow weights, got {type(params).__name__}. {_FIX}"
        )
    try:
        check_updates(
            eqx.filter(params.slow, is_trainable),
            params.fast,
            name="params.slow",
            reference_name="params.fast",
        )
    except ValueError as error:
        raise ValueError(
            f"lookahead.{where}: the fast and slow weights do not match: {error}"
        ) from None
    return params


@checked
class Lookahead(AbstractWrapper):
    r"""Lookahead: $k$ steps of a fast optimiser, then one step of the slow weights towards them.

    With fast weights $\phi$, slow weights $\theta$, $k$ = `sync_period` and
    $\alpha$ = `slow_step_size`:

    $$
    \phi_{t} = \phi_{t-1} + \texttt{fast\_optimizer}(g_t), \qquad
    \text{every } k \text{ steps:}\quad
    \theta \leftarrow \theta + \alpha(\phi_t - \theta), \quad \phi_t \leftarrow \theta
    $$

    The parameters are a `eqopt.LookaheadParams` (`fast`, `slow`), the
    gradients are taken with respect to `params.fast`, and the updates returned
    are a `LookaheadParams` of updates for both: apply them unchanged with
    `eqopt.apply_updates(params, updates)` (modifying them would break the sync).

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `fast_optimizer`: the inner optimiser run on the fast weights.
    - `sync_period`: $k \ge 1$, the fast steps between syncs (static).
    - `slow_step_size`: $\alpha$, how far the slow weights move towards the fast.
    - `reset_state`: re-initialise the fast optimiser's state at each sync.

    !!! example

        ```python
        opt = eqopt.lookahead(eqopt.adam(1e-3), sync_period=5, slow_step_size=0.5)
        params = eqopt.LookaheadParams.init_synced(model)
        state = opt.init(params)
        grads = eqx.filter_grad(loss_fn)(params.fast, x, y)
        updates, state = opt.update(grads, state, params)
        params = eqopt.apply_updates(params, updates)   # evaluate with params.slow
        ```

    **References:** Zhang, Lucas, Hinton & Ba, *Lookahead Optimizer: k steps
    forward, 1 step back*, NeurIPS 2019.
    """

    # The params are a `LookaheadParams`, the updates are shaped like its `fast`
    # weights: `_check_params` and the fast optimiser check them.
    @property
    def params_like_updates(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return False

    fast_optimizer: AbstractGradientTransformation
    sync_period: int = eqx.field(static=True)
    slow_step_size: Scalar = eqx.field(converter=as_scalar)
    reset_state: bool = eqx.field(static=True)

    # `sync_period` is checked by `_sync_period`, whose error says what to pass.
    @no_type_check
    def __init__(
        self,
        fast_optimizer: Any,
        sync_period: int | Int[Array, ""],
        slow_step_size: ScalarLike,
        reset_state: bool = False,
    ):
        self.fast_optimizer = as_transform(fast_optimizer)
        self.sync_period = _sync_period(sync_period)
        self.slow_step_size = slow_step_size  # pyright: ignore[reportAttributeAccessIssue]
        self.reset_state = reset_state

    def __check_init__(self):
        super().__check_init__()
        check_hyperparameter("slow_step_size", self.slow_step_size, low=0.0)

    # A chain around it sees pairs of params, which no frozen selection of the
    # fast optimiser's is shaped like; freezing inside it still works.
    @property
    def freezes(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return False

    @property
    def inner(self) -> AbstractGradientTransformation:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.fast_optimizer

    @init_entry
    def init(self, params: Params) -> LookaheadState:
        # `eqopt.tree.map_params` builds the state on a stand-in for the whole
        # params, which the fast optimiser's state is shaped like.
        fast = params if _is_placeholder(params) else _check_params(params, "init").fast
        return LookaheadState(
            fast_state=self.fast_optimizer.init(fast),
            steps_since_sync=jnp.zeros([], jnp.int32),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: LookaheadState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Any, LookaheadState]:
        pair = _check_params(params, "update")
        if isinstance(updates, LookaheadParams):
            raise TypeError(
                "lookahead.update: `updates` must be the gradients with respect to "
                "`params.fast` (a tree shaped like the fast weights), got a "
                "LookaheadParams. Differentiate the loss at `params.fast`."
            )
        fast_updates, fast_state = self.fast_optimizer.update(
            updates, state.fast_state, pair.fast, **extra_args
        )
        check_updates(fast_updates, pair.fast, reference_name="params.fast")
        steps_since_sync = (state.steps_since_sync + 1) % self.sync_period
        sync = steps_since_sync == 0
        alpha = self.slow_step_size

        @no_type_check
        def target(u, fast, slow):
            return slow + alpha.astype(slow.dtype) * (fast + u - slow)

        @no_type_check
        def fast_step(u, fast, slow):
            if u is None:
                return None
            return jnp.where(sync, target(u, fast, slow) - fast, u).astype(u.dtype)

        @no_type_check
        def slow_step(u, fast, slow):
            if u is None:
                return None
            moved = target(u, fast, slow) - slow
            return jnp.where(sync, moved, jnp.zeros_like(moved)).astype(u.dtype)

        trees = (fast_updates, pair.fast, pair.slow)
        fast_out = jax.tree.map(fast_step, *trees, is_leaf=is_none)
        slow_out = jax.tree.map(slow_step, *trees, is_leaf=is_none)
        if self.reset_state:
            synced = jax.tree.map(
                lambda p, u: p if u is None else p + u,
                pair.fast,
                fast_out,
                is_leaf=is_none,
            )
            fast_state = select(sync, self.fast_optimizer.init(synced), fast_state)
        return LookaheadParams(fast=fast_out, slow=slow_out), LookaheadState(
            fast_state=fast_state, steps_since_sync=steps_since_sync
        )


@no_type_check
@checked
def lookahead(
    fast_optimizer: Any,
    sync_period: int | Int[Array, ""],
    slow_step_size: ScalarLike,
    reset_state: bool = False,
) -> Lookahead:
    """Optax spelling of `eqopt.Lookahead`."""
    return Lookahead(fast_optimizer, sync_period, slow_step_size, reset_state)
