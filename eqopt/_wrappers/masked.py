"""Selecting parameters with filter specs: masked, freeze, selective_transform."""

from typing import Any

import equinox as eqx
import jax

from .._base import (
    AbstractGradientTransformation,
    EmptyState,
    OptState,
    Params,
    Updates,
    as_transform,
    is_none,
)
from .._filters import (
    FilterSpec,
    check_selects_something,
    keep_selected,
    merge_selected,
    resolve_filter,
    select_trainable,
)
from .._transform.basic import SetToZero


class MaskedState(eqx.Module):
    """The state of [`eqopt.Masked`][]: the inner state, for the selected leaves only."""

    inner_state: OptState


class Masked(AbstractGradientTransformation):
    """Applies `inner` to the selected leaves only; the others pass through unchanged.

    The selection is an Equinox filter spec, with the meaning of `eqx.filter`:
    a bool, a per-leaf predicate (`lambda x: x.ndim > 1`), or a prefix pytree of
    bools and predicates (built, for example, with `eqx.tree_at` on the model).
    A full boolean pytree, as Optax masks are, is one such spec.

    The inner transform sees `None` at unselected leaves and keeps no state for
    them. Masks nest: `masked(masked(t, a), b)` applies `t` where both select.
    A mask that selects no trainable leaf is an error at `init`.

    Unlike Optax, a callable mask is a per-leaf predicate, never a function of
    the whole params (Equinox modules are callable pytrees, and guessing which
    a callable is would be ambiguous).

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
        self.mask = mask

    @property
    def elementwise(self) -> bool:
        # A selection by leaf is lost when leaves are concatenated.
        return self.mask is True and self.inner.elementwise

    def _selection(self, tree: Any) -> Any:
        return select_trainable(
            self.mask, tree, what="mask", fix="masked(inner, mask_fn(params))"
        )

    def init(self, params: Params) -> MaskedState:
        selection = self._selection(params)
        check_selects_something(selection)
        return MaskedState(self.inner.init(keep_selected(params, selection)))

    def update(
        self,
        updates: Updates,
        state: MaskedState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, MaskedState]:
        selection = self._selection(updates if params is None else params)
        inner_updates, inner_state = self.inner.update(
            keep_selected(updates, selection),
            state.inner_state,
            None if params is None else keep_selected(params, selection),
            **extra_args,
        )
        return merge_selected(inner_updates, updates, selection), MaskedState(
            inner_state
        )


def masked(
    inner: Any, mask: FilterSpec, *, mask_compatible_extra_args: bool = False
) -> Masked:
    """Optax spelling of [`eqopt.Masked`][].

    `mask_compatible_extra_args` is accepted for Optax compatibility: eqopt
    forwards every extra argument unchanged.
    """
    return Masked(inner=inner, mask=mask)


def freeze(mask: FilterSpec) -> Masked:
    """Freezes the selected leaves: zero updates and no state for them.

    The other leaves pass through unchanged, so chain it with an optimiser (or
    use [`eqopt.selective_transform`][]).

    **Arguments:**

    - `mask`: a filter spec of the leaves to freeze.
    """
    return Masked(inner=SetToZero(), mask=mask)


class SelectiveTransform(AbstractGradientTransformation):
    """Trains the leaves not selected by `freeze_mask` with `optimizer`; freezes the rest.

    Frozen leaves get zero updates and the optimiser keeps no state for them.

    **Arguments:**

    - `optimizer`: the transform for the trained leaves.
    - `freeze_mask`: a filter spec of the leaves to freeze.
    """

    optimizer: AbstractGradientTransformation
    freeze_mask: FilterSpec

    def __init__(self, optimizer: Any, freeze_mask: FilterSpec):
        self.optimizer = as_transform(optimizer)
        self.freeze_mask = freeze_mask

    @property
    def elementwise(self) -> bool:
        return False

    def _trained(self, tree: Any) -> Masked:
        frozen = resolve_filter(self.freeze_mask, tree, what="freeze mask")
        trained = jax.tree.map(lambda f: not f, frozen, is_leaf=is_none)
        return Masked(inner=self.optimizer, mask=trained)

    def init(self, params: Params) -> OptState:
        check_selects_something(
            select_trainable(self.freeze_mask, params), "freeze mask"
        )
        return self._trained(params).init(params)

    def update(
        self,
        updates: Updates,
        state: OptState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, OptState]:
        reference = updates if params is None else params
        frozen = select_trainable(self.freeze_mask, reference, what="freeze mask")
        updates, state = self._trained(reference).update(
            updates, state, params, **extra_args
        )
        zeros, _ = SetToZero().update(keep_selected(updates, frozen), EmptyState())
        return merge_selected(zeros, updates, frozen), state


def selective_transform(
    optimizer: Any, *, freeze_mask: FilterSpec
) -> SelectiveTransform:
    """Optax spelling of [`eqopt.SelectiveTransform`][]."""
    return SelectiveTransform(optimizer=optimizer, freeze_mask=freeze_mask)
