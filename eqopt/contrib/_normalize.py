"""Normalising the updates by their global norm."""

from typing import Any

from .._base import AbstractGradientTransformation, EmptyState, Params, Updates
from .._entry import init_entry, update_entry
from .._leafwise import leafwise
from .._numerics import tree_l2_norm
from .._typecheck import checked

#: The state of `eqopt.contrib.Normalize` (Optax's name for an empty state).
NormalizeState = EmptyState


@checked
class Normalize(AbstractGradientTransformation):
    r"""Divides the updates by their global L2 norm.

    $$ u \mapsto \frac{u}{\|u\|_2}, \qquad \|u\|_2 = \sqrt{\textstyle\sum_\ell \sum_i |u_{\ell,i}|^2} $$

    The norm is over all leaves together. Chained before `sgd(rho)` it gives
    the adversarial step of SAM (see `eqopt.contrib.sam`). A zero update
    gives NaN, as in Optax.

    **Global**: one norm over all the leaves, a stacked layer's slices included.

    **References:** Foret, Kleiner, Mobahi & Neyshabur, *Sharpness-Aware
    Minimization for Efficiently Improving Generalization*, ICLR 2021.
    """

    @property
    def elementwise(self) -> bool:
        # A reduction over the whole tree, like global-norm clipping.
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
        norm = tree_l2_norm(updates)
        return leafwise(lambda g: g / norm.astype(g.dtype), updates), state


@checked
def normalize() -> Normalize:
    """Optax spelling of `eqopt.contrib.Normalize`."""
    return Normalize()
