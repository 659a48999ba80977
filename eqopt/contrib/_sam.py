"""Sharpness-aware minimisation (SAM)."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from .._apply import apply_updates
from .._base import (
    AbstractGradientTransformation,
    OptState,
    Params,
    Updates,
    is_none,
    is_trainable,
)
from .._entry import init_entry, update_entry
from .._interop import as_transform
from .._leafwise import require_params
from .._optax_tuple import OptaxTuple
from .._typecheck import checked


@checked
class SAMState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.SAM`.

    `steps_since_sync` counts the calls since the last outer step; `opt_state`
    and `adv_state` are the outer and adversarial optimisers' states; `cache`
    holds the outer params (the trainable leaves, `None` elsewhere) while the
    adversarial steps move the params away from them, and is `None` in opaque
    mode.
    """

    steps_since_sync: Int[Array, ""]
    opt_state: OptState
    adv_state: OptState
    cache: Updates | None


def _select(condition: Any, if_true: Any, if_false: Any) -> Any:
    """`if_true` where the scalar condition holds, else `if_false`, leaf by leaf."""

    def pick(a, b):
        if eqx.is_array(a):
            return jnp.where(condition, a, b)
        return a

    return jax.tree.map(pick, if_true, if_false, is_leaf=is_none)


def _negate(tree: Any) -> Any:
    return jax.tree.map(lambda x: None if x is None else -x, tree, is_leaf=is_none)


@checked
class SAM(AbstractGradientTransformation):
    r"""Sharpness-aware minimisation: step at the worst nearby point, move the true params.

    SAM minimises $\max_{\|\epsilon\| \le \rho} L(\theta + \epsilon)$. With
    the usual adversarial optimiser (normalise, then `sgd(rho)`) and
    `sync_period=2`:

    $$
    \begin{aligned}
    \tilde\theta_t &= \theta_t + \rho\, \frac{\nabla L(\theta_t)}{\|\nabla L(\theta_t)\|} \\
    \theta_{t+1} &= \theta_t + \operatorname{opt}\big(\nabla L(\tilde\theta_t)\big)
    \end{aligned}
    $$

    In general, `sync_period - 1` adversarial steps (the negated updates of
    `adv_optimizer`, an ascent) are followed by one outer step of `optimizer`,
    taken from the cached outer params with the last adversarial gradient.

    **Transparent mode** (default): each call of `update` is one of these
    steps, so the params you hold are the adversarial point on adversarial
    steps; the outer params are cached in the state, and the outer step's
    update also undoes the adversarial moves. `update` needs `params`.

    **Opaque mode** (`opaque_mode=True`): each call runs the whole cycle inside
    `update` and returns the outer update, so the params you hold are always
    the outer ones. `update` then needs `grad_fn=`, a function
    `grad_fn(params, i)` returning the gradients at `params` for adversarial
    step `i` (for a whole Equinox model, e.g. built with `eqx.filter_grad`).
    Use it when a step has side effects, e.g. batch-norm statistics.

    Extra keyword arguments (other than `grad_fn`) are forwarded to both
    optimisers (Optax accepts none).

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `optimizer`: the outer optimiser.
    - `adv_optimizer`: the adversarial optimiser, e.g.
      `eqopt.chain(eqopt.contrib.normalize(), eqopt.sgd(rho))`.
    - `sync_period`: the cycle length: `sync_period - 1` adversarial steps, one
      outer step (static).
    - `reset_state`: reset the adversarial optimiser's state after each outer step.
    - `opaque_mode`: run the cycle inside one `update` (static).
    - `batch_axis_name`: in opaque mode, average the adversarial gradients over
      this named axis with `jax.lax.pmean` (for `pmap`/`shard_map`).

    **References:** Foret, Kleiner, Mobahi & Neyshabur, *Sharpness-Aware
    Minimization for Efficiently Improving Generalization*, ICLR 2021.
    """

    optimizer: AbstractGradientTransformation = eqx.field(converter=as_transform)
    adv_optimizer: AbstractGradientTransformation = eqx.field(converter=as_transform)
    sync_period: int = eqx.field(default=2, static=True)
    reset_state: bool = eqx.field(default=True, static=True)
    opaque_mode: bool = eqx.field(default=False, static=True)
    batch_axis_name: str | None = eqx.field(default=None, static=True)

    def __check_init__(self):
        if not isinstance(self.sync_period, int) or self.sync_period < 1:
            raise ValueError(
                f"SAM: `sync_period` must be an int >= 1, got {self.sync_period!r}."
            )

    @property
    def elementwise(self) -> bool:
        return False

    @init_entry
    def init(self, params: Params) -> SAMState:
        return SAMState(
            steps_since_sync=jnp.zeros([], jnp.int32),
            opt_state=self.optimizer.init(params),
            adv_state=self.adv_optimizer.init(params),
            # A copy: a step that donates the params and the state cannot take
            # one buffer twice.
            cache=None
            if self.opaque_mode
            else jax.tree.map(jnp.copy, eqx.filter(params, is_trainable)),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: SAMState,
        params: Params | None = None,
        *,
        grad_fn: Callable[[Params, int], Updates] | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, SAMState]:
        if self.opaque_mode:
            return self._opaque_update(updates, state, params, grad_fn, extra_args)
        return self._transparent_update(updates, state, params, extra_args)

    def _transparent_update(self, updates, state, params, extra_args):
        if params is None:
            raise ValueError(
                "sam needs `params` (outside opaque mode): call "
                "`update(updates, state, params)`."
            )
        first_step = state.steps_since_sync == 0
        last_step = state.steps_since_sync == self.sync_period - 1
        adv_updates, adv_state = self.adv_optimizer.update(
            updates, state.adv_state, params, **extra_args
        )
        adv_updates = _negate(adv_updates)
        # The outer step starts from the cached outer params, not the adversarial ones.
        outer_params = jax.tree.map(
            lambda cached, p: p if cached is None else cached,
            state.cache,
            params,
            is_leaf=is_none,
        )
        opt_updates, opt_state = self.optimizer.update(
            updates, state.opt_state, outer_params, **extra_args
        )
        opt_updates = jax.tree.map(
            lambda u, cached, p: None if u is None else cached - p + u,
            opt_updates,
            state.cache,
            params,
            is_leaf=is_none,
        )
        cache = _select(first_step, eqx.filter(params, is_trainable), state.cache)
        new_updates = _select(last_step, opt_updates, adv_updates)
        if self.reset_state:
            adv_state = _select(last_step, self.adv_optimizer.init(params), adv_state)
        else:
            adv_state = _select(last_step, state.adv_state, adv_state)
        opt_state = _select(last_step, opt_state, state.opt_state)
        return new_updates, SAMState(
            steps_since_sync=(state.steps_since_sync + 1) % self.sync_period,
            opt_state=opt_state,
            adv_state=adv_state,
            cache=cache,
        )

    def _opaque_update(self, updates, state, params, grad_fn, extra_args):
        if grad_fn is None:
            raise ValueError(
                "sam with opaque_mode=True needs `grad_fn`: call `update(updates, "
                "state, params, grad_fn=grad_fn)` with `grad_fn(params, i)` returning "
                "the gradients at `params` (e.g. from `eqx.filter_grad`)."
            )
        require_params(
            params, "sam", call="update(updates, state, params, grad_fn=...)"
        )
        adv_params, adv_updates, adv_state = params, updates, state.adv_state
        for i in range(self.sync_period - 1):
            adv_updates, adv_state = self.adv_optimizer.update(
                adv_updates, adv_state, adv_params, **extra_args
            )
            adv_params = apply_updates(adv_params, _negate(adv_updates))
            adv_updates = grad_fn(adv_params, i)
            if self.batch_axis_name is not None:
                adv_updates = jax.lax.pmean(adv_updates, axis_name=self.batch_axis_name)
        if self.reset_state:
            adv_state = self.adv_optimizer.init(params)
        new_updates, opt_state = self.optimizer.update(
            adv_updates, state.opt_state, params, **extra_args
        )
        return new_updates, SAMState(
            steps_since_sync=jnp.zeros([], jnp.int32),
            opt_state=opt_state,
            adv_state=adv_state,
            cache=None,
        )


@checked
def sam(
    optimizer: Any,
    adv_optimizer: Any,
    sync_period: int = 2,
    reset_state: bool = True,
    opaque_mode: bool = False,
    batch_axis_name: str | None = None,
) -> SAM:
    """Optax spelling of `eqopt.contrib.SAM`.

    !!! example

        ```python
        rho = 0.05
        opt = eqopt.contrib.sam(
            eqopt.sgd(0.1),
            eqopt.chain(eqopt.contrib.normalize(), eqopt.sgd(rho)),
            sync_period=2,
        )
        ```
    """
    return SAM(
        optimizer=optimizer,
        adv_optimizer=adv_optimizer,
        sync_period=sync_period,
        reset_state=reset_state,
        opaque_mode=opaque_mode,
        batch_axis_name=batch_axis_name,
    )
