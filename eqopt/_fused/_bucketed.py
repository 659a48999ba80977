"""Bucketed optimiser state: the params stay as they are, the state lives in a few buffers."""

from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp

from .._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    OptState,
    Params,
    Updates,
)
from .._entry import init_entry, update_entry
from .._interop import as_transform
from .._leaves import is_none
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._pack import (
    MAX_MEAN_LEAF_SIZE as MAX_MEAN_LEAF_SIZE,
    MIN_LEAVES_PER_BUFFER as MIN_LEAVES_PER_BUFFER,
    Packed,
    _layout_of,
    check_treedef,
    pack,
    packed_from_layout,
    unpack_all,
    worth_bucketing,
)


@checked
class BucketedState(eqx.Module, OptaxTuple):
    """The state of `eqopt.Bucketed`: the inner state over packed buffers.

    `inner` is the inner transform's state for the packed params, so its moments
    are `eqopt.Packed` trees of one buffer per dtype. `eqopt.BucketedState.unpacked`
    gives the same state with every moment model-shaped, as the inner transform
    would have made it on the params directly.
    """

    inner: OptState
    layout: Any = eqx.field(static=True)
    treedef: Any = eqx.field(static=True)

    @property
    def is_bucketed(self) -> bool:
        """Whether the state lives in buffers (`False`: the per-leaf plan was chosen)."""
        return self.layout is not None

    def unpacked(self) -> OptState:
        """The inner state with every packed moment rebuilt in the shape of the params
        (a moment quantised as one array per buffer, see `eqopt.Quantized`'s
        `packed_blocks`, is dequantised)."""
        return unpack_all(self.inner)


@checked
class Bucketed(AbstractWrapper):
    r"""Keeps the state of an elementwise transform in one flat buffer per dtype.

    The params and updates that the user sees are unchanged: at each step the
    gradients are concatenated into one buffer per dtype (one kernel), the inner
    transform updates those buffers (a few kernels, whatever the number of
    leaves), and the updates are split back into the shape of the params
    (slices). A model of thousands of small leaves then passes two state
    buffers instead of thousands across the `jit` boundary, and XLA compiles a
    handful of kernels instead of several per leaf.

    The numbers are those of the inner transform applied leaf by leaf, for
    every transform: an elementwise one (Adam, SGD, Lion, RMSProp, global-norm
    clipping, and chains of them) runs on the buffers, as does a weight-decay
    mask (on segments of a buffer), and one that is not (per-leaf norms,
    freezing) sees the params unpacked, as with `eqopt.pack`. For the
    largest speed-up, also keep the params packed with `eqopt.pack`.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `inner`: the transform (an eqopt transform or an Optax-style pair).
    - `always`: bucket whatever the params. By default (`False`) `init` chooses:
      it buckets when `inner` runs on the buffers throughout
      (`inner.runs_on_buffers`: elementwise parts, and weight-decay masks, which
      select segments of a buffer), there are at least `MIN_LEAVES_PER_BUFFER`
      (32) trainable leaves per buffer and they average at most
      `MAX_MEAN_LEAF_SIZE` (1024) elements, and otherwise keeps the per-leaf
      plan, where bucketing would only add a gather and a scatter per step (and,
      for a per-leaf part such as trust ratios or a freeze, an unpacking and
      repacking). The choice is made once, at `init`, from the shapes, and read
      back with `state.is_bucketed`.

    !!! example

        ```python
        opt = eqopt.bucketed(eqopt.adamw(1e-3))
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        state.unpacked()[0].mu  # model-shaped first moment
        ```
    """

    inner: AbstractGradientTransformation
    always: bool = eqx.field(static=True)

    # Bucketing is the advice; a bucketed optimiser needs none.
    @property
    def advises_bucketing(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return False

    def __init__(self, inner: Any, always: bool = False):
        self.inner = as_transform(inner)
        self.always = always

    @property
    def runs_on_buffers(self) -> bool:
        # It buckets the inner transform's buffers; around it, only an
        # elementwise inner transform runs on the outer buffers as they are.
        return self.inner.elementwise

    @init_entry
    def init(self, params: Params) -> BucketedState:
        leaves, treedef = jax.tree.flatten(params, is_leaf=is_none)
        layout = _layout_of(leaves)
        if not layout.slots:
            raise ValueError(
                "`bucketed` found no trainable array in the params (no floating or complex "
                "JAX array leaf): there is no state to bucket."
            )
        if not (
            self.always or (self.inner.runs_on_buffers and worth_bucketing(layout))
        ):
            return BucketedState(
                inner=self.inner.init(params), layout=None, treedef=treedef
            )
        return BucketedState(
            inner=self.inner.init(pack(params)), layout=layout, treedef=treedef
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: BucketedState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, BucketedState]:
        if state.layout is None:
            check_treedef(state.treedef, updates)
            new_updates, inner = self.inner.update(
                updates, state.inner, params, **extra_args
            )
            return new_updates, BucketedState(
                inner=inner, layout=None, treedef=state.treedef
            )
        packed_updates = packed_from_layout(state.layout, state.treedef, updates)
        # Packing the params is a concatenation that XLA removes when nothing reads it.
        packed_params = None if params is None else pack(params)
        new_updates, inner = self.inner.update(
            cast(Any, packed_updates), state.inner, packed_params, **extra_args
        )
        unpacked = cast(Packed, new_updates).unpack()
        # Leaves without a gradient keep `None`, as on the per-leaf path.
        unpacked = jax.tree.map(
            lambda new, old: None if old is None else new.astype(jnp.result_type(old)),
            unpacked,
            updates,
            is_leaf=is_none,
        )
        return unpacked, BucketedState(
            inner=inner, layout=state.layout, treedef=state.treedef
        )


@checked
def bucketed(inner: Any, always: bool = False) -> Bucketed:
    """Keeps `inner`'s state in one flat buffer per dtype: see `eqopt.Bucketed`."""
    return Bucketed(inner, always=always)
