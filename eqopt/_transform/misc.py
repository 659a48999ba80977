"""Small corrections to the updates: gradient centralisation, zeroing NaNs, non-negativity."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, PyTree

from .._base import (
    AbstractGradientTransformation,
    EmptyState,
    Params,
    Updates,
    is_none,
    is_trainable,
)
from .._checks import _paths
from .._entry import init_entry, update_entry
from .._leafwise import leafwise, require_params
from .._optax_tuple import OptaxTuple
from .._structure import structure_mismatch_message
from .._typecheck import checked


@no_type_check
def _subtract_mean(g):
    if g.ndim <= 1:
        return g
    return g - jnp.mean(g, axis=tuple(range(1, g.ndim)), keepdims=True)


@checked
class Centralize(AbstractGradientTransformation):
    r"""Centralises each update of two or more dimensions: subtracts its mean over all but the first axis.

    $$ u_{i, \dots} = g_{i, \dots} - \frac{1}{n} \sum_{j} g_{i, j} $$

    where $i$ indexes the first axis and $j$ runs over the $n$ elements of the
    other axes. Scalars and vectors pass through unchanged. For an
    `eqx.nn.Linear` weight of shape `(out_features, in_features)` or an
    `eqx.nn.Conv` kernel of shape `(out_channels, in_channels, *kernel)` this
    centres the weight vector of each output unit, as in the paper.

    Per-leaf, so not elementwise.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each slice,
    batched, as on the list of those layers.

    **References:** Yong, Huang, Hua & Zhang, *Gradient Centralization: A New
    Optimization Technique for Deep Neural Networks*, ECCV 2020.
    """

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
        return leafwise(_subtract_mean, updates), state


@checked
def centralize() -> Centralize:
    """Optax spelling of `eqopt.Centralize`."""
    return Centralize()


@checked
class ZeroNansState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ZeroNans`: per leaf, whether the last update had a NaN.

    `None` at leaves that are not trainable.
    """

    found_nan: PyTree[Bool[Array, ""] | None]


@checked
class ZeroNans(AbstractGradientTransformation):
    r"""Replaces NaNs in the updates by zeros, and records where it did.

    $$ u = \begin{cases} 0 & g \text{ is NaN} \\ g & \text{otherwise} \end{cases} $$

    A complex element is NaN if either part is. The state's `found_nan` is
    shaped like the params: for each trainable leaf, whether the last update
    of that leaf contained a NaN (`False` when the leaf's update was `None`).
    The state is only reported, never used.

    Not elementwise: the update is, but `found_nan` reduces each leaf.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.
    """

    @property
    def elementwise(self) -> bool:
        return False

    @init_entry
    def init(self, params: Params) -> ZeroNansState:
        return ZeroNansState(
            found_nan=jax.tree.map(
                lambda p: jnp.array(False) if is_trainable(p) else None, params
            )
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ZeroNansState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ZeroNansState]:
        if jax.tree.structure(updates, is_leaf=is_none) != jax.tree.structure(
            state.found_nan, is_leaf=is_none
        ):
            raise ValueError(
                structure_mismatch_message(updates, state.found_nan, "updates", "state")
            )
        new_updates = leafwise(lambda g: jnp.where(jnp.isnan(g), 0, g), updates)
        found_nan = jax.tree.map(
            lambda g, found: (
                None
                if found is None
                else (jnp.array(False) if g is None else jnp.any(jnp.isnan(g)))
            ),
            updates,
            state.found_nan,
            is_leaf=is_none,
        )
        return new_updates, ZeroNansState(found_nan=found_nan)


@checked
def zero_nans() -> ZeroNans:
    """Optax spelling of `eqopt.ZeroNans`."""
    return ZeroNans()


@checked
class KeepParamsNonnegative(AbstractGradientTransformation):
    r"""Shortens the updates so that no parameter becomes negative.

    $$ u = \begin{cases} -\theta & \theta + g < 0 \\ g & \text{otherwise} \end{cases} $$

    so that $\theta + u \ge 0$ (a projection onto the non-negative orthant when
    $\theta \ge 0$; a negative parameter is moved to $0$). Place it last in a
    chain, after the learning rate. Needs `params`.

    Real parameters only: a complex parameter is an error naming its path
    (Optax compares complex numbers instead).

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
        require_params(params, "keep_params_nonnegative")
        for path, leaf in zip(
            _paths(params), jax.tree.leaves(params, is_leaf=is_none), strict=True
        ):
            if is_trainable(leaf) and jnp.iscomplexobj(leaf):
                raise ValueError(
                    f"keep_params_nonnegative needs real parameters; the one at {path} is "
                    f"{leaf.dtype}."
                )
        return leafwise(
            lambda g, p: jnp.where(p + g < 0, -p, g), updates, params
        ), state


@checked
def keep_params_nonnegative() -> KeepParamsNonnegative:
    """Optax spelling of `eqopt.KeepParamsNonnegative`."""
    return KeepParamsNonnegative()
