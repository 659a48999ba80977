"""Decoupled weight decay."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._base import AbstractGradientTransformation, OptState, Params, Updates
from .._entry import _call_unpacked, init_entry, update_entry
from .._filters import FilterSpec, select_trainable, warn_if_selects_nothing
from .._fused._pack import Packed, contains_packed, unpack_all
from .._hyper import (
    Scalar,
    ScalarOrSchedule,
    Schedule,
    as_scalar_or_schedule,
    check_hyperparameter,
)
from .._leaf_scales import LeafScales, decay_leaves
from .._leafwise import leafwise
from .._leaves import is_none
from .._scheduled import current_value, init_count_if_scheduled
from .._typecheck import checked


@checked
class AddDecayedWeights(AbstractGradientTransformation):
    r"""Adds the parameters, scaled by the weight decay, to the updates.

    $$ u \mapsto u + \lambda\, \theta $$

    Placed before the learning rate, this is the decoupled weight decay of
    AdamW.

    **Cautious weight decay.** With `cautious=True` an entry is decayed only
    where the incoming update $u$ (the optimiser's direction, before the
    learning rate) and the parameter agree in sign:

    $$ u \mapsto u + \lambda\, \mathbb{1}[u \odot \theta \ge 0] \odot \theta $$

    so the decay never pulls against the step the optimiser takes
    ($\operatorname{Re}(u \bar\theta) \ge 0$ for complex leaves). Every
    optimiser whose chain ends with this transform and the learning rate
    (`eqopt.adamw`, `eqopt.lion`, `eqopt.contrib.muon`, ...) gets it from
    this one flag; those three also spell it `cautious_weight_decay=True`.
    This is not `eqopt.cautious`, which masks the update by the sign of the
    gradient.

    `mask` is an Equinox filter spec selecting the leaves to decay (a bool, a
    per-leaf predicate such as `lambda x: x.ndim > 1`, or a prefix pytree of
    these); unselected leaves pass through. Unlike Optax, a callable mask is a
    per-leaf predicate, never a function of the whole params. A mask that
    selects no trainable leaf decays nothing, with a warning at `init`.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `weight_decay`: $\lambda$, a number or a schedule of the step count (then
      the state counts steps).
    - `mask`: optional filter spec.
    - `cautious`: decay only where the update and the parameter agree in sign.

    **References:** Loshchilov & Hutter, *Decoupled Weight Decay
    Regularization*, ICLR 2019; Chen, Li, Liang, Su, Xie, Pierse, Liang, Lao
    & Liu, *Cautious Weight Decay*, arXiv:2510.12402, 2025 (`cautious=True`).
    """

    weight_decay: Scalar | Schedule = eqx.field(
        default=0.0, converter=as_scalar_or_schedule
    )
    mask: FilterSpec | None = None
    #: Per-leaf multipliers of the decay (arrays from the groups' state), set by
    #: `eqopt.param_groups` for its call (`eqopt._leaf_scales`); `None` otherwise.
    scales: LeafScales | None = None
    cautious: bool = eqx.field(default=False, static=True)

    def __check_init__(self):
        check_hyperparameter("weight_decay", self.weight_decay)

    # On packed params (`eqopt.pack`) a mask selects segments of the buffers, so
    # the masked decay stays a few kernels over the buffers.
    handles_packed = True

    @property
    def elementwise(self) -> bool:
        # Without a mask every element is treated alike; a mask selects by leaf.
        return self.mask is None and self.scales is None

    @property
    def runs_on_buffers(self) -> bool:
        # A mask selects segments of the packed buffers (`Packed.segment_masks`).
        return True

    @init_entry
    def init(self, params: Params) -> OptState:
        if self.mask is not None:
            warn_if_selects_nothing(
                select_trainable(self.mask, unpack_all(params)),
                "weight-decay mask",
                self.mask,
                "no parameter is decayed",
            )
        return init_count_if_scheduled(self.weight_decay)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: OptState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, OptState]:
        if params is None and jax.tree.leaves(updates):
            raise ValueError(
                "add_decayed_weights needs `params`: call `update(updates, state, params)`."
            )
        # (Called through the class: a Module's bound method is a new Module.)
        if AddDecayedWeights._by_leaf(self, updates, params):
            # A mask, multipliers or the sign test select by leaf, and a packed
            # tree here is not a whole pair of `Packed` whose buffers they can
            # select segments of: the entry's adapter gives the unpacked trees.
            return _call_unpacked(
                AddDecayedWeights._decay, self, updates, state, params, extra_args
            )
        return AddDecayedWeights._decay(self, updates, state, params)

    def _by_leaf(self, updates: Updates, params: Params | None) -> bool:
        # Whether this call needs the model's leaves of a partly packed pair.
        whole = isinstance(updates, Packed) and isinstance(params, Packed)
        return (
            (self.cautious or self.mask is not None or self.scales is not None)
            and params is not None
            and not whole
            and contains_packed(updates, params)
        )

    def _decay(self, updates, state, params, **extra_args):
        weight_decay, state = current_value(self.weight_decay, state)
        if params is None:  # nothing to decay (an empty group of a partition)
            return updates, state
        decayed = _decayed(
            self.mask, self.scales, weight_decay, updates, params, self.cautious
        )
        return decayed, state


def _aligned(u, p):
    """`p` where the update `u` agrees with it in sign (`Re(u conj(p)) >= 0`), else 0."""
    if u is None or p is None:
        return p
    product = u * jnp.conj(p) if jnp.iscomplexobj(p) else u * p
    return jnp.where(jnp.real(product) >= 0, p, jnp.zeros_like(p))


def _decayed(mask_spec, scales, weight_decay, updates, params, cautious=False):
    """`updates + weight_decay * params` on the leaves `mask_spec` selects, the decay
    times each leaf's multiplier (`scales`, from `eqopt.param_groups`); with
    `cautious`, only the entries of `params` that agree with `updates` in sign.
    Packed trees come as a pair of `Packed` or inside a tree decayed as a whole
    (`AddDecayedWeights._by_leaf`)."""
    packed = isinstance(params, Packed) and isinstance(updates, Packed)
    if cautious:
        if packed:
            buffers = tuple(map(_aligned, updates.buffers, params.buffers))
            params = Packed(buffers=buffers, rest=params.rest, layout=params.layout)
        else:
            params = jax.tree.map(_aligned, updates, params, is_leaf=is_none)
    if mask_spec is None and scales is None:
        return leafwise(lambda g, p: weight_decay * p + g, updates, params)
    if packed:
        # A mask selects segments of the packed buffers.
        if mask_spec is None:
            selected = (True,) * len(params.buffers)
        else:
            mask = select_trainable(
                mask_spec, params.unpack(), what="weight-decay mask"
            )
            selected = params.segment_masks(mask)
        return decay_leaves(updates, params, weight_decay, scales, selected)
    if mask_spec is None:
        selected = jax.tree.map(lambda _: True, params, is_leaf=is_none)
    else:
        selected = select_trainable(mask_spec, params, what="weight-decay mask")
    return decay_leaves(updates, params, weight_decay, scales, selected)


@checked
def add_decayed_weights(
    weight_decay: ScalarOrSchedule = 0.0,
    mask: FilterSpec | None = None,
    *,
    cautious: bool = False,
) -> AddDecayedWeights:
    """Optax spelling of `eqopt.AddDecayedWeights`."""
    return AddDecayedWeights(weight_decay=weight_decay, mask=mask, cautious=cautious)
