"""Running a transform on one flat vector: `flatten`."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _sharding
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
from .._interop import as_transform
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from .masked import Freeze


@no_type_check
def _positions(reference: Any) -> list[int]:
    """Indices (in the flattening with `None` as a leaf) of the leaves that go in the vector."""
    leaves = jax.tree.leaves(reference, is_leaf=is_none)
    return [i for i, leaf in enumerate(leaves) if is_trainable(leaf)]


@no_type_check
def _ravel(tree: Any, positions: list[int], like: Any) -> Any:
    """One vector of the leaves of `tree` at `positions`, in their promoted dtype.

    A `None` at one of the positions contributes zeros of the size of the
    corresponding leaf of `like`.
    """
    leaves = jax.tree.leaves(tree, is_leaf=is_none)
    like_leaves = jax.tree.leaves(like, is_leaf=is_none)
    present = [leaves[i] for i in positions if leaves[i] is not None]
    if not present:
        return None
    dtype = jnp.result_type(*[leaf.dtype for leaf in present])
    pieces = [
        jnp.zeros(like_leaves[i].size, dtype)
        if leaves[i] is None
        else jnp.ravel(_sharding.gathered(leaves[i])[0]).astype(dtype)
        for i in positions
    ]
    return jnp.concatenate(pieces) if len(pieces) > 1 else pieces[0]


@no_type_check
def _unravel(flat: Any, updates: Any, positions: list[int], like: Any) -> Any:
    """Splits `flat` back into the leaves of `updates` (each in its own dtype)."""
    leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    like_leaves = jax.tree.leaves(like, is_leaf=is_none)
    out = [None] * len(leaves)
    offset = 0
    if flat is not None:
        # Split over an explicit axis (a ZeRO-1 state makes it so), the vector
        # is gathered before it is cut into leaves.
        flat = _sharding.gathered(flat)[0]
    for i in positions:
        reference = like_leaves[i]
        size = reference.size
        if leaves[i] is not None and flat is not None:
            piece = flat[offset : offset + size].reshape(reference.shape)
            if jnp.iscomplexobj(piece) and not jnp.iscomplexobj(leaves[i]):
                piece = jnp.real(piece)
            # Under explicit sharding the vector is replicated; each piece goes
            # back to its gradient's sharding.
            out[i] = _sharding.like(piece.astype(leaves[i].dtype), leaves[i])
        offset += size
    return jax.tree.unflatten(treedef, out)


@checked
class FlattenState(eqx.Module, OptaxTuple):
    """The state of `eqopt.Flatten`: the inner transform's state, for the flat vector."""

    inner_state: Any


@checked
class Flatten(AbstractWrapper):
    r"""Runs `inner` on one flat vector holding every trainable leaf of the model.

    $$
    v = \operatorname{concat}_i \operatorname{vec}(g_i), \qquad
    (u_v, s) = \texttt{inner.update}(v, s, \operatorname{concat}_i
    \operatorname{vec}(\theta_i)), \qquad u_i = \operatorname{reshape}(u_v[i])
    $$

    The leaves are the inexact arrays of the params, in pytree order; every
    other leaf of a whole Equinox model (functions, ints, strings) is left out
    and gets a `None` update. One vector instead of many small leaves reduces
    per-leaf overhead, at the cost of a copy.

    - **`None` gradients** pass through: a trainable leaf whose gradient is
      `None` contributes zeros to the vector (so the inner transform sees a
      zero gradient there) and gets a `None` update. Without `params` in
      `update`, the vector is made of the leaves whose updates are not `None`,
      which must then be the same leaves as at `init`.
    - **Mixed dtypes**: the vector has the promoted dtype of the leaves
      (`jnp.result_type`, as Optax's `ravel_pytree`): `bfloat16` with
      `float32` gives a `float32` vector, real with complex a complex one. Each
      update is cast back to its own leaf's dtype (the real part for a real
      leaf). To keep low-precision leaves in their own buffers instead, wrap
      each dtype's leaves separately with `eqopt.partition`.

    **Global**: one flat vector over all the leaves, a stacked layer's slices included.

    **Arguments:**

    - `inner`: the transform to run on the flat vector.

    !!! example

        ```python
        # The inner transform sees one flat vector of all trainable parameters.
        opt = eqopt.flatten(eqopt.adam(1e-3))
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)   # shaped like the model
        model = eqopt.apply_updates(model, updates)
        ```
    """

    inner: AbstractGradientTransformation

    def __init__(self, inner: Any):
        self.inner = as_transform(inner)

    def frozen_selection(self, tree: Any) -> Any | None:
        """Every trainable leaf if the inner transform freezes the flat vector
        (it sees one leaf), else `None`."""
        if not self.inner.freezes:
            return None
        positions = _positions(tree)
        if not positions:
            return None
        selected = self.inner.frozen_selection(_ravel(tree, positions, tree))
        return (
            None
            if selected is None
            else Freeze(mask=bool(selected)).frozen_selection(tree)
        )

    @init_entry
    def init(self, params: Params) -> FlattenState:
        positions = _positions(params)
        return FlattenState(self.inner.init(_ravel(params, positions, params)))

    @update_entry
    def update(
        self,
        updates: Updates,
        state: FlattenState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, FlattenState]:
        if params is not None:
            check_updates(updates, params)
        like = updates if params is None else params
        positions = _positions(like)
        flat_updates = _ravel(updates, positions, like)
        flat_params = None if params is None else _ravel(params, positions, params)
        flat_updates, inner_state = self.inner.update(
            flat_updates, state.inner_state, flat_params, **extra_args
        )
        return _unravel(flat_updates, updates, positions, like), FlattenState(
            inner_state
        )


@checked
def flatten(inner: Any) -> Flatten:
    """Optax spelling of `eqopt.Flatten`."""
    return Flatten(inner)
