"""Selecting parameters with filter specs: masked, freeze, selective_transform."""

import warnings
from typing import Any, ClassVar

import equinox as eqx
import jax

from .._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    EmptyState,
    OptState,
    Params,
    Updates,
    is_none,
)
from .._entry import init_entry, update_entry
from .._filters import (
    FilterSpec,
    as_filter_spec,
    keep_selected,
    merge_selected,
    resolve_filter,
    select_trainable,
    warn_if_selects_nothing,
)
from .._interop import as_transform
from .._optax_tuple import OptaxTuple
from .._transform.basic import SetToZero
from .._typecheck import checked


@checked
class MaskedState(eqx.Module, OptaxTuple):
    """The state of `eqopt.Masked`: the inner state, for the selected leaves only."""

    inner_state: OptState


@checked
class Masked(AbstractWrapper):
    """Applies `inner` to the selected leaves only; the others pass through unchanged.

    The selection is an Equinox filter spec, with the meaning of `eqx.filter`:
    a bool, a per-leaf predicate (`lambda x: x.ndim > 1`), or a prefix pytree of
    bools and predicates (built, for example, with `eqx.tree_at` on the model).
    A full boolean pytree, as Optax masks are, is one such spec.

    The inner transform sees `None` at unselected leaves and keeps no state for
    them. Masks nest: `masked(masked(t, a), b)` applies `t` where both select.
    A mask that selects no trainable leaf is allowed (every leaf passes
    through), with a warning at `init`.

    Unlike Optax, a callable mask is a per-leaf predicate, never a function of
    the whole params (Equinox modules are callable pytrees, and guessing which
    a callable is would be ambiguous).

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `inner`: the transform to apply to the selection.
    - `mask`: the filter spec.

    !!! example

        ```python
        # Weight decay on the matrices only; other leaves pass through unchanged.
        opt = eqopt.chain(
            eqopt.masked(eqopt.add_decayed_weights(1e-4), lambda x: x.ndim > 1),
            eqopt.sgd(1e-2),
        )
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        ```
    """

    inner: AbstractGradientTransformation
    mask: FilterSpec

    def __init__(self, inner: Any, mask: FilterSpec):
        self.inner = as_transform(inner)
        self.mask = as_filter_spec(mask)

    @property
    def elementwise(self) -> bool:
        # A selection by leaf is lost when leaves are concatenated.
        return self.mask is True and self.inner.elementwise

    @property
    def runs_on_buffers(self) -> bool:
        return self.mask is True and self.inner.runs_on_buffers

    def _selection(self, tree: Any) -> Any:
        return select_trainable(
            self.mask, tree, what="mask", fix="masked(inner, mask_fn(params))"
        )

    def frozen_selection(self, tree: Any) -> Any | None:
        """The leaves the inner transform freezes among the selected ones, or `None`."""
        if not self.inner.freezes:
            return None
        selection = self._selection(tree)
        inner = self.inner.frozen_selection(keep_selected(tree, selection))
        if inner is None:
            return None
        return jax.tree.map(
            lambda chosen, frozen: bool(chosen) and bool(frozen),
            selection,
            inner,
            is_leaf=is_none,
        )

    @init_entry
    def init(self, params: Params) -> MaskedState:
        selection = self._selection(params)
        warn_if_selects_nothing(
            selection,
            f"mask of masked({type(self.inner).__name__})",
            self.mask,
            "every update passes through unchanged",
        )
        return MaskedState(self.inner.init(keep_selected(params, selection)))

    @update_entry
    def update(
        self,
        updates: Updates,
        state: MaskedState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, MaskedState]:
        selection = self._selection(updates if params is None else params)
        selected = keep_selected(updates, selection)
        if not jax.tree.leaves(selected):
            # Nothing selected (the warning at `init` said so): every update passes
            # through, and the inner transform, which would see no leaf (and no
            # params, on a one-leaf tree), is not run.
            return updates, state
        inner_updates, inner_state = self.inner.update(
            selected,
            state.inner_state,
            None if params is None else keep_selected(params, selection),
            **extra_args,
        )
        return merge_selected(inner_updates, updates, selection), MaskedState(
            inner_state
        )


@checked
def masked(
    inner: Any, mask: FilterSpec, *, mask_compatible_extra_args: bool = False
) -> Masked:
    """Optax spelling of `eqopt.Masked`.

    `mask_compatible_extra_args` is accepted for Optax compatibility: eqopt
    forwards every extra argument unchanged.
    """
    return Masked(inner=inner, mask=mask)


@checked
class Freeze(AbstractGradientTransformation):
    r"""Freezes the selected leaves: they do not move, and no state is kept for them.

    $$ u_i \mapsto 0 \quad \text{for the selected leaves } i $$

    Alone, it sets the updates of the selected leaves to zero and passes the
    others through. In a `eqopt.chain` it freezes for the whole chain,
    wherever it stands: the parts after it see `None` at the frozen leaves, as
    for a leaf that is not differentiated, so they keep no state for them
    (Adam's moments are `None` there) and add nothing to them (weight decay
    included), and the chain returns zero updates there. The parts before it
    still see the frozen leaves; put `freeze` first to keep no state at all.
    A nested chain freezes for the chain around it too.

    A mask that selects no trainable leaf freezes nothing, with a warning at
    `init`.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `mask`: a filter spec of the leaves to freeze (a bool, a per-leaf
      predicate, or a prefix pytree of these, e.g. built with `eqx.tree_at`).

    !!! example

        ```python
        frozen = eqx.tree_at(
            lambda m: m.layers[0], jax.tree.map(lambda _: False, model), True
        )
        opt = eqopt.chain(eqopt.freeze(frozen), eqopt.adamw(1e-3, weight_decay=1e-2))
        state = opt.init(model)   # no Adam moments for the first layer
        ```
    """

    mask: FilterSpec = eqx.field(converter=as_filter_spec)

    #: It freezes leaves for the chain around it (see `eqopt.Chain`).
    freezes: ClassVar[bool] = True

    @property
    def elementwise(self) -> bool:
        # It changes what the chain around it gives the parts after it, by leaf.
        return False

    def frozen_selection(self, tree: Any) -> Any:
        """The leaves this transform freezes: a tree of bools shaped like `tree`."""
        return select_trainable(self.mask, tree, what="freeze mask")

    @init_entry
    def init(self, params: Params) -> EmptyState:
        warn_if_selects_nothing(
            self.frozen_selection(params),
            "mask of freeze",
            self.mask,
            "no parameter is frozen",
        )
        return EmptyState()

    @update_entry
    def update(
        self,
        updates: Updates,
        state: EmptyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmptyState]:
        frozen = self.frozen_selection(updates if params is None else params)
        zeros, _ = SetToZero().update(keep_selected(updates, frozen), EmptyState())
        return merge_selected(zeros, updates, frozen), state


@checked
def freeze(mask: FilterSpec) -> Freeze:
    """Optax spelling of `eqopt.Freeze`: the selected leaves do not move.

    Unlike Optax's `freeze` (a masked `set_to_zero`, which a later weight decay
    still moves), the leaves stay frozen wherever `freeze` stands in a chain.
    """
    return Freeze(mask=mask)


@checked
class SelectiveTransform(AbstractWrapper):
    """Trains the leaves not selected by `freeze_mask` with `optimizer`; freezes the rest.

    Frozen leaves get zero updates and the optimiser keeps no state for them.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `optimizer`: the transform for the trained leaves.
    - `freeze_mask`: a filter spec of the leaves to freeze.
    """

    optimizer: AbstractGradientTransformation
    freeze_mask: FilterSpec

    def __init__(self, optimizer: Any, freeze_mask: FilterSpec):
        self.optimizer = as_transform(optimizer)
        self.freeze_mask = as_filter_spec(freeze_mask)

    @property
    def inner(self) -> AbstractGradientTransformation:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.optimizer

    @property
    def elementwise(self) -> bool:
        return False

    @property
    def runs_on_buffers(self) -> bool:
        # Its freezing is by leaf: it sees the unpacked model.
        return False

    @property
    def freezes(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return True

    def frozen_selection(self, tree: Any) -> Any:
        """The leaves `freeze_mask` selects, and those `optimizer` freezes."""
        own = Freeze(mask=self.freeze_mask).frozen_selection(tree)
        return jax.tree.map(
            lambda mine, theirs: bool(mine) or bool(theirs),
            own,
            self._trained(tree).frozen_selection(tree) or own,
            is_leaf=is_none,
        )

    def _trained(self, tree: Any) -> Masked:
        frozen = resolve_filter(self.freeze_mask, tree, what="freeze mask")
        trained = jax.tree.map(lambda f: not f, frozen, is_leaf=is_none)
        return Masked(inner=self.optimizer, mask=trained)

    @init_entry
    def init(self, params: Params) -> OptState:
        warn_if_selects_nothing(
            select_trainable(self.freeze_mask, params, what="freeze mask"),
            "freeze mask of selective_transform",
            self.freeze_mask,
            "no parameter is frozen",
        )
        trained = self._trained(params)
        # Every leaf frozen is allowed too; the inner mask's warning would repeat this.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return trained.init(params)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: OptState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, OptState]:
        reference = updates if params is None else params
        updates, state = self._trained(reference).update(
            updates, state, params, **extra_args
        )
        updates, _ = Freeze(mask=self.freeze_mask).update(updates, EmptyState(), params)
        return updates, state


@checked
def selective_transform(
    optimizer: Any, *, freeze_mask: FilterSpec
) -> SelectiveTransform:
    """Optax spelling of `eqopt.SelectiveTransform`."""
    return SelectiveTransform(optimizer=optimizer, freeze_mask=freeze_mask)
