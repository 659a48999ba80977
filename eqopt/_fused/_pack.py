"""Packed parameters: a model's trainable arrays kept in one flat buffer per dtype."""

import weakref
from collections.abc import Hashable
from typing import Any, NamedTuple, TypeVar, cast, no_type_check

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Inexact, PyTree

from .._leaves import is_none, is_trainable
from .._quantize import QuantizedArray
from .._sharding import gathered
from .._structure import structure_mismatch_message
from .._typecheck import checked
from ._split import split_buffer


class _Slot(NamedTuple):
    # Where one trainable leaf lives: its position among the model's leaves (None
    # counted as a leaf), its buffer, its offset in that buffer and its shape.
    leaf_index: int
    buffer: int
    offset: int
    shape: tuple[int, ...]


_S = TypeVar("_S", bound="_Static")


class _Static:
    # Static metadata of a `Packed` (part of its treedef), which `jit` hashes and
    # compares on every call. Equal metadata is one object (interned), so the
    # default identity hash and equality are right and cost nothing, where a
    # tuple of 2000 slots or a treedef of 2000 nodes would cost hundreds of
    # microseconds a call.
    __slots__ = ("__weakref__", "_key")
    _interned: "weakref.WeakValueDictionary[Any, _Static]"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._interned = weakref.WeakValueDictionary()

    @classmethod
    def make(cls: type[_S], *key: Any) -> _S:
        found = cls._interned.get(key)
        if found is None:
            found = cls.__new__(cls)
            found._key = key
            cls._interned[key] = found
        return cast(_S, found)

    def __reduce__(self):
        return (type(self).make, self._key)


class _Layout(_Static):
    __slots__ = ()

    @property
    def slots(self) -> tuple[_Slot, ...]:
        return self._key[0]

    @property
    def buffers(self) -> tuple[tuple[str, int, Hashable], ...]:
        # One (dtype, size, sharding key) per buffer.
        return self._key[1]

    def sizes(self) -> tuple[int, ...]:
        return tuple(size for _, size, _ in self.buffers)

    def n_leaves(self) -> int:
        """How many trainable leaves the buffers hold."""
        return len(self.slots)

    def segments(self, per_leaf: Any) -> tuple[tuple[tuple[Any, int], ...], ...]:
        """Per buffer, its leaves in the buffer's order as `(value, size)` pairs:
        `value` is `per_leaf[i]` for the leaf at position `i` of the model's leaves
        (`None` counted), `size` its number of elements."""
        parts: list[list[tuple[Any, int]]] = [[] for _ in self.buffers]
        for slot in self.slots:
            size = int(np.prod(slot.shape, dtype=np.int64))
            parts[slot.buffer].append((per_leaf[slot.leaf_index], size))
        return tuple(tuple(part) for part in parts)


class _Rest(_Static):
    # The model's treedef (with `None` counted as a leaf) and the positions of
    # the leaves a `Packed` keeps in `rest_leaves`: the ones that are not
    # trainable (functions, ints, integer arrays, `None`; `None` everywhere in a
    # gradient). Models have few of them, so a `Packed` flattens to its buffers
    # and a handful of leaves, whatever the number of trainable arrays.
    __slots__ = ()

    @property
    def treedef(self) -> Any:
        return self._key[0]

    @property
    def kept(self) -> tuple[int, ...]:
        return self._key[1]

    def leaves(self, rest_leaves: tuple) -> list:
        leaves: list = [None] * self.treedef.num_leaves
        for index, leaf in zip(self.kept, rest_leaves, strict=True):
            leaves[index] = leaf
        return leaves


def _sharding_key(x: Any) -> Hashable:
    # Leaves with different shardings go to different buffers; concrete leaves on
    # a single device (the common case) share one.
    if isinstance(x, jax.core.Tracer):
        # Checked first: reading a tracer's `sharding` inside `jit` builds an
        # error message that walks the whole trace (80 ms a leaf on 400 leaves).
        return None
    sharding = getattr(x, "sharding", None)
    if sharding is None:
        return None
    try:
        if sharding.is_fully_replicated:
            return None
    except AttributeError:
        return None
    return sharding


@no_type_check
def _layout_of(leaves: list) -> _Layout:
    groups: dict[tuple[str, Hashable], int] = {}
    sizes: list[int] = []
    keys: list[tuple[str, int, Hashable]] = []
    slots = []
    for index, leaf in enumerate(leaves):
        if not is_trainable(leaf):
            continue
        group = (jnp.dtype(leaf.dtype).name, _sharding_key(leaf))
        if group not in groups:
            groups[group] = len(sizes)
            sizes.append(0)
            keys.append(group)
        buffer = groups[group]
        slots.append(_Slot(index, buffer, sizes[buffer], tuple(leaf.shape)))
        sizes[buffer] += int(np.prod(leaf.shape, dtype=np.int64))
    buffers = tuple(
        (dtype, size, sharding)
        for (dtype, sharding), size in zip(keys, sizes, strict=True)
    )
    return _Layout.make(tuple(slots), buffers)


#: The automatic choice buckets when the trainable leaves average at most this
#: many elements. Past it, one leaf's arithmetic costs more than the few
#: microseconds of per-leaf overhead that bucketing saves, while the extra pass
#: bucketing makes (gathering the gradients, scattering the updates) grows with
#: the size. Whole training steps (benchmarks/train_step_bench.py) put the line
#: between 136 elements a leaf (200 residual layers: 0.42-0.81 of Optax's step)
#: and 3.9k-4.8k (a small ResNet and transformer: 0.70-1.25, A/A 0.92-1.02);
#: on one 33M-element leaf bucketing made clipped AdamW 2.5 times slower.
MAX_MEAN_LEAF_SIZE = 1024
#: ...and when there are at least this many trainable leaves per buffer (a
#: 28-leaf transformer gained nothing).
MIN_LEAVES_PER_BUFFER = 32


def worth_bucketing(layout: _Layout) -> bool:
    """Whether bucketing the state of params laid out as `layout` is worth it."""
    n_leaves = len(layout.slots)
    n_elements = sum(layout.sizes())
    return (
        n_leaves >= MIN_LEAVES_PER_BUFFER * len(layout.buffers)
        and n_elements <= MAX_MEAN_LEAF_SIZE * n_leaves
    )


@no_type_check
def _parts(leaves: list, layout: _Layout) -> list[list]:
    # Each buffer's leaves, flattened, in the layout's order.
    parts: list[list] = [[] for _ in layout.buffers]
    for slot in layout.slots:
        parts[slot.buffer].append(jnp.ravel(leaves[slot.leaf_index]))
    return parts


@no_type_check
def _concatenate(leaves: list, layout: _Layout) -> tuple:
    parts = _parts(leaves, layout)
    return tuple(
        jnp.concatenate(chunks) if len(chunks) > 1 else chunks[0] for chunks in parts
    )


@no_type_check
def _assemble(leaves: list, layout: _Layout, bases: tuple | None = None) -> tuple:
    """The buffers of `leaves` as `_concatenate` makes them, written piece by piece.

    For leaves that are computed in the step (a transform's updates): each is
    written into its buffer by its own kernel (`dynamic_update_slice` in
    place). A concatenation was fused with the arithmetic of every piece and
    with its consumers (`apply_updates`), so each element went through a
    branch on its leaf and the arithmetic ran unvectorised: 8-bit Adam's
    packed step took 1.5-2 times as long (benchmarks/lowbit_bench.py). The
    pieces are written over a copy of `bases` (the buffers of the packed
    gradient: every element is overwritten), where zeros made XLA fuse the
    first piece into a pass over the whole buffer. A sharded buffer is
    concatenated (an update at an offset could gather it).
    """
    parts = _parts(leaves, layout)
    buffers = []
    for chunks, (dtype, size, sharding) in zip(parts, layout.buffers, strict=True):
        if len(chunks) == 1 or sharding is not None:
            buffers.append(jnp.concatenate(chunks) if len(chunks) > 1 else chunks[0])
            continue
        base = None if bases is None else bases[len(buffers)]
        if base is None or base.dtype != dtype:
            base = jnp.zeros((size,), dtype)
        buffer, offset = base, 0
        for chunk in chunks:
            buffer = jax.lax.dynamic_update_slice_in_dim(buffer, chunk, offset, 0)
            offset += chunk.shape[0]
        buffers.append(buffer)
    return tuple(buffers)


@no_type_check
def _split(buffers: tuple, layout: _Layout, static: bool = False) -> dict[int, Array]:
    # One split per buffer, not one slice per leaf: see `_split.py` for why
    # (the gradient is one concatenation, each shape one kernel). `static`
    # slices at offsets XLA sees (see `unpack_all`).
    out = {}
    for index, (buffer, (_, _, sharding)) in enumerate(
        zip(buffers, layout.buffers, strict=True)
    ):
        slots = [slot for slot in layout.slots if slot.buffer == index]
        if buffer is None:
            out.update((slot.leaf_index, None) for slot in slots)
            continue
        if isinstance(buffer, QuantizedArray):
            # A moment of a packed buffer quantised as one array: its leaves are
            # pieces of the dequantised moment.
            buffer = buffer.dequantize()
        sizes = tuple(int(np.prod(slot.shape, dtype=np.int64)) for slot in slots)
        if sharding is None:
            # Leaves laid out whole (replicated) whose buffer was split over an
            # explicit axis (ZeRO-1's updates): JAX cannot cut a split buffer at
            # offsets that do not divide by the axis, so it is gathered first,
            # the all-gather that gives every device the whole update anyway.
            buffer = gathered(buffer)[0]
        pieces = split_buffer(buffer, sizes, sharded=sharding is not None or static)
        for slot, piece in zip(slots, pieces, strict=True):
            out[slot.leaf_index] = piece.reshape(slot.shape)
    return out


@checked
class Packed(eqx.Module):
    """A model whose trainable arrays live in one flat buffer per dtype.

    Made by `eqopt.pack`. Its fields are the flat `buffers` (one per dtype,
    and per sharding when leaves are sharded differently), `rest_leaves`, the
    model's leaves that are not trainable (non-array leaves and integer arrays,
    kept as they are; `None` in a gradient), and static metadata saying where
    each leaf lives. `packed.rest` is the model with every trainable leaf
    replaced by `None`. Whatever the number of trainable arrays, a `Packed`
    crosses the `jit` boundary as a few buffers. Call `eqopt.Packed.unpack`
    inside the jitted step to get the model back: the slices are free in XLA.

    A `Packed` is a pytree like any Module, so it goes straight into every eqopt
    transform: `eqx.filter_grad` of `loss(packed.unpack())` with respect to
    `packed` gives a `Packed` gradient, `init`/`update` keep their state in a
    handful of buffers, and `apply_updates` adds to them. Elementwise
    transforms (Adam, SGD, Lion, RMSProp, global-norm clipping...) then run as a
    few kernels over a few buffers, whatever the number of leaves, and so does a
    weight-decay mask (it selects segments of a buffer). Transforms that are not
    elementwise (per-leaf norms, trust ratios, factored moments, freezing) see
    the unpacked model, so their results are the same as without packing.

    !!! example

        ```python
        packed = eqopt.pack(model)
        opt = eqopt.adam(1e-3)
        state = opt.init(packed)

        @eqx.filter_jit
        def step(packed, state, x, y):
            grads = eqx.filter_grad(lambda p: loss_fn(p.unpack(), x, y))(packed)
            updates, state = opt.update(grads, state, packed)
            return eqopt.apply_updates(packed, updates), state

        packed, state = step(packed, state, x, y)
        model = packed.unpack()
        ```
    """

    # A moment quantised as one array per buffer holds a `QuantizedArray` there.
    buffers: tuple[Inexact[Array, " _"] | QuantizedArray | None, ...]
    rest_leaves: tuple[Any, ...]
    layout: _Layout = eqx.field(static=True)
    structure: _Rest = eqx.field(static=True)

    def __init__(
        self,
        buffers: tuple[Inexact[Array, " _"] | None, ...],
        rest: PyTree[Any],
        layout: _Layout,
    ):
        leaves, treedef = jax.tree.flatten(rest, is_leaf=is_none)
        # Every position that is not a trainable leaf, so that the params, their
        # gradients and the moments share one structure.
        trainable = {slot.leaf_index for slot in layout.slots}
        kept = tuple(i for i in range(len(leaves)) if i not in trainable)
        self.buffers = buffers
        self.rest_leaves = tuple(leaves[i] for i in kept)
        self.layout = layout
        self.structure = _Rest.make(treedef, kept)

    @property
    def rest(self) -> PyTree[Any]:
        """The model with every trainable leaf replaced by `None`."""
        return jax.tree.unflatten(
            self.structure.treedef, self.structure.leaves(self.rest_leaves)
        )

    def unpack(self) -> PyTree[Any]:
        """The model, rebuilt from the buffers (reshaped slices) and `rest`.

        On a packed gradient or update the trainable leaves are the gradients
        and every other leaf is `None`, as `eqx.filter_grad` would give.
        """
        return self._unpack()

    def _unpack(self, static: bool = False) -> PyTree[Any]:
        leaves = self.structure.leaves(self.rest_leaves)
        for index, value in _split(self.buffers, self.layout, static).items():
            leaves[index] = value
        return jax.tree.unflatten(self.structure.treedef, leaves)

    @staticmethod
    def like(packed: "Packed", tree: PyTree[Any]) -> "Packed":
        """Packs a model-shaped tree (gradients, updates) with `packed`'s layout.

        `None` at a trainable leaf becomes zeros; the other leaves of the result
        are `None`, as in a gradient.
        """
        return packed_like(packed, tree)

    def segment_masks(self, selected: PyTree[Any]) -> tuple[Any, ...]:
        """Per buffer, which elements belong to selected leaves.

        `selected` is shaped like the model, with a bool at each trainable leaf
        (as a filter spec resolves to). Each entry of the result is `True` (the
        whole buffer), `False` (none of it) or a NumPy boolean array (a constant
        of the compiled program).
        """
        flags = jax.tree.flatten(selected, is_leaf=is_none)[0]
        masks: list[Any] = []
        for segments in self.layout.segments(flags):
            segments = [(bool(flag), size) for flag, size in segments]
            values = {flag for flag, _ in segments}
            if values == {True}:
                masks.append(True)
            elif values <= {False}:
                masks.append(False)
            else:
                masks.append(
                    np.concatenate([np.full(size, flag) for flag, size in segments])
                )
        return tuple(masks)

    def __check_init__(self):
        if len(self.buffers) != len(self.layout.buffers):
            raise ValueError(
                f"A Packed model has {len(self.layout.buffers)} buffers in its layout "
                f"but {len(self.buffers)} were given."
            )
        for buffer, (dtype, size, _) in zip(
            self.buffers, self.layout.buffers, strict=True
        ):
            if buffer is None:
                continue
            if not eqx.is_array(buffer) or buffer.shape != (size,):
                raise ValueError(
                    f"A Packed buffer must be a 1-D array of {size} {dtype} elements, "
                    f"got {getattr(buffer, 'shape', type(buffer).__name__)}: was it made "
                    "for another model?"
                )


@checked
def pack(model: PyTree[Any]) -> Packed:
    """Keeps a model's trainable arrays in one flat buffer per dtype.

    The trainable leaves are the inexact (floating or complex) arrays; every
    other leaf (functions, ints, strings, integer arrays, `None`) is kept in
    place in `eqopt.Packed``.rest`. Leaves are grouped by dtype, and by
    sharding when they are sharded differently, in the order of
    `jax.tree.leaves(model)`.

    Pack once, outside the training loop; unpack inside the jitted step.

    **Arguments:**

    - `model`: any pytree, typically a whole Equinox model.

    **Returns:** an `eqopt.Packed`.

    **Raises:** `ValueError` if the model has no trainable array.
    """
    leaves, treedef = jax.tree.flatten(model, is_leaf=is_none)
    layout = _layout_of(leaves)
    if not layout.slots:
        raise ValueError(
            "`eqopt.pack` found no trainable array in the model (no floating or complex "
            "JAX array leaf): there is nothing to pack."
        )
    buffers = _concatenate(leaves, layout)
    rest = jax.tree.unflatten(
        treedef, [None if is_trainable(leaf) else leaf for leaf in leaves]
    )
    return Packed(buffers=buffers, rest=rest, layout=layout)


def packed_like(packed: Packed, tree: PyTree[Any], computed: bool = False) -> Packed:
    """Packs a model-shaped tree of updates with `packed`'s layout.

    `None` at a trainable leaf becomes zeros; the `rest` of the result holds
    `None` everywhere, as for a gradient. `computed=True` writes each leaf into
    its buffer by a kernel of its own (see `_assemble`), for leaves that are
    costly expressions of the step rather than arrays already in memory.
    """
    leaves, treedef = jax.tree.flatten(tree, is_leaf=is_none)
    reference_leaves, reference_treedef = jax.tree.flatten(packed.rest, is_leaf=is_none)
    if treedef != reference_treedef:
        raise ValueError(
            "The updates do not have the structure of the packed model: pack the "
            "model and its gradients with the same layout (`eqopt.pack`)."
        )
    filled = list(leaves)
    for slot in packed.layout.slots:
        if filled[slot.leaf_index] is None:
            dtype = packed.layout.buffers[slot.buffer][0]
            filled[slot.leaf_index] = jnp.zeros(slot.shape, dtype)
    if computed:
        buffers = _assemble(filled, packed.layout, packed.buffers)
    else:
        buffers = _concatenate(filled, packed.layout)
    rest = jax.tree.unflatten(treedef, [None] * len(reference_leaves))
    return Packed(buffers=buffers, rest=rest, layout=packed.layout)


@no_type_check
def contains_packed(*trees: Any) -> bool:
    """Whether any of the trees is, or contains, a `Packed` node."""
    for tree in trees:
        if isinstance(tree, Packed):
            return True
        if tree is None or eqx.is_array(tree):
            continue
        nodes = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, Packed))
        if any(isinstance(node, Packed) for node in nodes):
            return True
    return False


@no_type_check
def unpack_all(tree: Any, static: bool = False) -> Any:
    """Replaces every `Packed` node in `tree` by its unpacked model.

    `static` cuts the leaves at offsets XLA sees (`lax.split`) rather than at
    run-time offsets (`_split.py`): more distinct kernels to compile, but XLA
    on CPU then vectorises a kernel that reads a leaf's elements out of order,
    as packing 4-bit codes two to a byte does (with run-time offsets, a packed
    4-bit Adam step took 3-4 times as long as with these; 8-bit was the same).
    """
    if isinstance(tree, Packed):
        return tree._unpack(static)
    return jax.tree.map(
        lambda x: x._unpack(static) if isinstance(x, Packed) else x,
        tree,
        is_leaf=lambda x: isinstance(x, Packed),
    )


@no_type_check
def repack_like(reference: Any, tree: Any, computed: bool = False) -> Any:
    """Packs each subtree of `tree` that sits where `reference` has a `Packed` node
    (`computed` as for `packed_like`)."""
    if isinstance(reference, Packed):
        return packed_like(reference, tree, computed)
    is_packed = lambda x: isinstance(x, Packed)  # noqa: E731
    reference_nodes, reference_def = jax.tree.flatten(reference, is_leaf=is_packed)
    nodes = reference_def.flatten_up_to(tree)
    return jax.tree.unflatten(
        reference_def,
        [
            packed_like(ref, node, computed) if isinstance(ref, Packed) else node
            for ref, node in zip(reference_nodes, nodes, strict=True)
        ],
    )


def check_treedef(treedef: Any, tree: PyTree[Any]) -> list[Any]:
    """The leaves of `tree` (`None` counted), if it has the structure `treedef` describes."""
    leaves, tree_treedef = jax.tree.flatten(tree, is_leaf=is_none)
    if tree_treedef != treedef:
        made_for = jax.tree.unflatten(treedef, [None] * treedef.num_leaves)
        raise ValueError(
            structure_mismatch_message(tree, made_for, "updates", "state")
            + " Was the state made by this transform's `init` on these params?"
        )
    return leaves


def packed_from_layout(layout: _Layout, treedef: Any, tree: PyTree[Any]) -> Packed:
    """Packs a tree shaped like the model that `layout` and `treedef` describe.

    Trainable leaves that are `None` become zeros; every other leaf of the
    result's `rest` is `None`.
    """
    leaves = check_treedef(treedef, tree)
    filled = list(leaves)
    for slot in layout.slots:
        if filled[slot.leaf_index] is None:
            dtype = layout.buffers[slot.buffer][0]
            filled[slot.leaf_index] = jnp.zeros(slot.shape, dtype)
    return Packed(
        buffers=_concatenate(filled, layout),
        rest=jax.tree.unflatten(treedef, [None] * len(leaves)),
        layout=layout,
    )
