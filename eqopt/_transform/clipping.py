"""Clipping: by value and by global norm."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp

from .._base import AbstractGradientTransformation, EmptyState, Params, Updates
from .._entry import init_entry, update_entry
from .._hyper import Scalar, ScalarLike, as_scalar, check_hyperparameter
from .._leaf_scales import scale_updates
from .._leafwise import leafwise
from .._numerics import tree_l2_norm
from .._typecheck import checked


@checked
class Clip(AbstractGradientTransformation):
    r"""Clips every element of the updates to $[-\delta, \delta]$.

    $$ u \mapsto \operatorname{clip}(u, -\delta, \delta) $$

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `max_delta`: $\delta \ge 0$.
    """

    max_delta: Scalar = eqx.field(converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_hyperparameter("max_delta", self.max_delta, low=0.0)

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
        max_delta = self.max_delta
        return leafwise(lambda g: jnp.clip(g, -max_delta, max_delta), updates), state


@checked
def clip(max_delta: ScalarLike) -> Clip:
    """Optax spelling of `eqopt.Clip`."""
    return Clip(max_delta=max_delta)


@checked
class ClipByGlobalNorm(AbstractGradientTransformation):
    r"""Rescales the updates so that their global L2 norm is at most `max_norm`.

    $$ u \mapsto u \cdot \min\!\Big(1, \frac{c}{\|u\|}\Big), \qquad
       \|u\| = \sqrt{\textstyle\sum_\ell \|u_\ell\|_2^2} $$

    The norm is over all leaves together, so the result does not depend on how
    the parameters are split into leaves (it is elementwise in eqopt's sense).

    Each update is multiplied by the one scalar $\min(1, c / \|u\|)$, where
    Optax divides every element by the norm and multiplies by $c$: the two
    agree to a rounding, and a product by a scalar never makes XLA write the
    clipped gradient to a parameter-sized buffer (a division of every element
    did), which makes a clipped AdamW step about twice as fast on large leaves.

    **Global**: one norm over all the leaves, a stacked layer's slices included.

    **Arguments:**

    - `max_norm`: $c > 0$.

    **References:** Pascanu, Mikolov & Bengio, *On the difficulty of training
    recurrent neural networks*, ICML 2013.
    """

    max_norm: Scalar = eqx.field(converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_hyperparameter("max_norm", self.max_norm, low=0.0, low_inclusive=False)

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
        norm = tree_l2_norm(updates)
        # One scalar factor, 1 when within the bound. A product by a scalar costs
        # nothing for XLA to recompute in each consumer, so the clipped gradient
        # never exists as a parameter-sized buffer (dividing every element by the
        # norm did: XLA keeps divisions, and materialised it). The result equals
        # Optax's `g / norm * max_norm` to a rounding.
        factor = jnp.where(norm < self.max_norm, 1.0, self.max_norm / norm)
        return scale_updates(updates, factor), state


@checked
def clip_by_global_norm(max_norm: ScalarLike) -> ClipByGlobalNorm:
    """Optax spelling of `eqopt.ClipByGlobalNorm`."""
    return ClipByGlobalNorm(max_norm=max_norm)
