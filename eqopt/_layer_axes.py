"""What eqopt knows of each trainable leaf: its layer, input and output axes, and stack axes.

"The model knows its layers" (docs/design.md, "Whole models are the params").
A transform that needs to know which axis of a matrix is its input (Muon's
width factor, NorMuon's neurons, GaLore's sides, Adam-mini's blocks) reads it
here. `eqx.nn.Linear.weight` is `(out, in)`, as PyTorch's; Optax's convention
for a bare matrix is Flax's `(in, out)` kernel. A leaf of a known layer is
described by the layer; any other leaf is not described, and its transform
keeps Optax's convention.

**A stack of layers is its layers.** A layer built by `eqx.filter_vmap` (a
scanned block, `lax.scan` over it in the forward pass) has leading axes in
front of the layer's own: `(L, out, in)` for a `Linear` weight, `(L, d)` for
its bias or a `LayerNorm` scale, `(L1, L2, ...)` for a stack of stacks. They
are its *stack axes* (`LayerLeaf.stack_axes`); `input_axes` and `output_axes`
are axes of one slice. `eqopt._leafwise.leafwise` runs a per-layer function on
each slice (`jax.vmap` over the stack axes), so a stacked model computes what
the list of its layers computes.

For a bare array or a custom module's field the user says how many leading
axes are stack axes, once, with `eqopt.with_stack_axes(opt, stack_axes)`;
while that optimiser runs, `given_stack_axes` holds the user's spec here and
`describe` applies it: what the user says wins over the layer.

The API other modules read:

- `describe(tree)`: one `LayerLeaf` (or `None`) per leaf of `tree` flattened
  with `is_leaf=is_none`, the user's spec applied; cached by structure.
- `layer_leaves(tree)`: the same, as a dict by key path, described leaves only.
- `stack_axes(tree)`: the number of stack axes of each leaf, a list.

Gradients from `eqx.filter_grad` are Modules of the same types as the model,
so the `updates` alone are enough (`params` are not needed).

This module imports only Equinox, JAX and the leaves' helpers.
"""

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any, TypeAlias

import equinox as eqx
import jax

from ._leaves import InputError, is_none, is_trainable, path_str

# Layers whose weight maps axis 1 onwards (the input) to axis 0 (the output).
_OUT_IN_WEIGHTS = {
    eqx.nn.Linear: ("weight",),
    # Equinox stores a transposed convolution as it stores a convolution:
    # `(out_channels, in_channels // groups, *kernel)`, run by
    # `lax.conv_general_dilated` with the default OIH... layout.
    eqx.nn.Conv: ("weight",),
    eqx.nn.ConvTranspose: ("weight",),
    # Gates stacked on axis 0: `(gates * hidden, input)` and `(gates * hidden, hidden)`.
    eqx.nn.GRUCell: ("weight_ih", "weight_hh"),
    eqx.nn.LSTMCell: ("weight_ih", "weight_hh"),
}
NORMALISATIONS = (eqx.nn.LayerNorm, eqx.nn.RMSNorm, eqx.nn.GroupNorm, eqx.nn.BatchNorm)
_KNOWN = (
    eqx.nn.MultiheadAttention,
    eqx.nn.Embedding,
    *_OUT_IN_WEIGHTS,
    *NORMALISATIONS,
)
_HEADED_PROJECTIONS = ("query_proj", "key_proj")


@dataclasses.dataclass(frozen=True)
class LayerLeaf:
    """A leaf of a known Equinox layer, or one the user gave stack axes.

    - `layer`: the layer's class (`eqx.nn.Linear`, `eqx.nn.LayerNorm`...);
      `None` for a leaf described by the user's `stack_axes` only.
    - `field`: the field's name (`"weight"`, `"bias"`, `"weight_ih"`...).
    - `input_axes`, `output_axes`: for a weight, the axes of one slice
      contracted with the layer's input and the axes of its output (`(1,)`
      and `(0,)` for a `Linear`, stacked or not); empty for a leaf that is not
      a weight matrix (a bias, a normalisation's scale).
    - `heads`: for the query and key projections of a `MultiheadAttention`,
      its number of heads (contiguous groups of the output axis).
    - `stack_axes`: how many leading axes are a stack of layers
      (`eqx.filter_vmap` of the layer); 0 for a layer that is not stacked.
    """

    layer: type | None
    field: str | None
    input_axes: tuple[int, ...] = ()
    output_axes: tuple[int, ...] = ()
    heads: int | None = None
    stack_axes: int = 0

    @property
    def is_matrix(self) -> bool:
        """Whether the leaf is a weight with input and output axes."""
        return bool(self.input_axes) and bool(self.output_axes)

    @property
    def is_normalisation(self) -> bool:
        """Whether the leaf is a scale or offset of a normalisation layer."""
        return self.layer is not None and issubclass(self.layer, NORMALISATIONS)


def _is_layer_or_none(x: Any) -> bool:
    return x is None or isinstance(x, _KNOWN)


def _own_ndim(layer: Any, field: str) -> int | None:
    # The number of axes of the field of one (unstacked) layer, or None when
    # the field is not one of the layer's parameters.
    if isinstance(layer, (eqx.nn.Conv, eqx.nn.ConvTranspose)):
        # `weight` is `(out, in, *kernel)`, `bias` `(out, 1, ..., 1)`.
        return {
            "weight": 2 + layer.num_spatial_dims,
            "bias": 1 + layer.num_spatial_dims,
        }.get(field)
    if isinstance(layer, (eqx.nn.LayerNorm, eqx.nn.RMSNorm)):
        return len(layer.shape) if field in ("weight", "bias") else None
    if isinstance(layer, (eqx.nn.GroupNorm, eqx.nn.BatchNorm)):
        return 1 if field in ("weight", "bias") else None
    if isinstance(layer, eqx.nn.Embedding):
        return 2 if field == "weight" else None
    if isinstance(layer, (eqx.nn.Linear, eqx.nn.GRUCell, eqx.nn.LSTMCell)):
        return (
            2 if field.startswith("weight") else 1 if field.startswith("bias") else None
        )
    return None


def _describe(layer: Any, field: str, leaf: Any, heads: int | None) -> LayerLeaf:
    kind = type(layer)
    own = _own_ndim(layer, field)
    # Axes before the layer's own are a stack of layers (`eqx.filter_vmap`).
    stack = getattr(leaf, "ndim", 0) - own if own is not None else -1
    if stack < 0:
        return LayerLeaf(kind, field)
    assert own is not None
    if isinstance(layer, eqx.nn.Embedding):
        # A lookup is a one-hot row times the weight: tokens in, features out.
        return LayerLeaf(kind, field, (0,), (1,), stack_axes=stack)
    for known, weights in _OUT_IN_WEIGHTS.items():
        if isinstance(layer, known) and field in weights:
            return LayerLeaf(kind, field, tuple(range(1, own)), (0,), heads, stack)
    return LayerLeaf(kind, field, stack_axes=stack)


def _layer_leaves(layer: Any, heads: int | None = None) -> dict[tuple, LayerLeaf]:
    """The leaves of one known layer, by their key paths inside it."""
    found: dict[tuple, LayerLeaf] = {}
    if isinstance(layer, eqx.nn.MultiheadAttention):
        # Its projections are `Linear`s; queries and keys are cut into heads.
        for name in ("query_proj", "key_proj", "value_proj", "output_proj"):
            projection = getattr(layer, name)
            inner_heads = layer.num_heads if name in _HEADED_PROJECTIONS else None
            for path, described in _layer_leaves(projection, inner_heads).items():
                found[(jax.tree_util.GetAttrKey(name), *path)] = described
        return found
    leaves = jax.tree_util.tree_flatten_with_path(
        layer, is_leaf=lambda x: x is not layer and _is_layer_or_none(x)
    )[0]
    for path, leaf in leaves:
        if leaf is None or not path:
            continue
        if isinstance(leaf, _KNOWN):  # a layer held by a layer (as `WeightNorm` does)
            for inner, described in _layer_leaves(leaf).items():
                found[(*path, *inner)] = described
            continue
        key = path[0]
        field = getattr(key, "name", None)
        if isinstance(field, str) and len(path) == 1:
            found[path] = _describe(layer, field, leaf, heads)
    return found


def _known_layer_leaves(tree: Any) -> dict[tuple, LayerLeaf]:
    found: dict[tuple, LayerLeaf] = {}
    nodes = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_layer_or_none)[0]
    for path, node in nodes:
        if node is not None and isinstance(node, _KNOWN):
            for inner, described in _layer_leaves(node).items():
                found[(*path, *inner)] = described
    return found


# ---------------------------------------------------------------------------
# What the user says: stack axes of bare arrays and custom modules
# ---------------------------------------------------------------------------

#: The user's spec of stack axes: an int for every leaf, a function of a leaf's
#: path (as `jax.tree_util.keystr` writes it, `".blocks.weight"`) returning an
#: int or `None`, or a prefix pytree of the params whose leaves are such ints,
#: `None`s or functions. `None` means "as the layer says" (0 for a bare array).
StackAxesSpec: TypeAlias = Any

_GIVEN: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "eqopt_stack_axes", default=None
)


@contextlib.contextmanager
def given_stack_axes(spec: StackAxesSpec) -> Iterator[None]:
    """While the block runs, `describe` applies the user's `spec` (see `StackAxesSpec`).

    Entered by `eqopt.with_stack_axes` around its inner `init` and `update`
    (at trace time under `jit`).
    """
    token = _GIVEN.set(spec)
    try:
        yield
    finally:
        _GIVEN.reset(token)


def _is_spec_leaf(x: Any) -> bool:
    return x is None or isinstance(x, int) or callable(x)


def _given(spec: Any, tree: Any) -> list[int | None]:
    """The user's stack axes of each leaf of `tree` (flattened with `is_none`)."""
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_none)[0]
    if _is_spec_leaf(spec) and not isinstance(spec, eqx.Module):
        pairs = [(spec, path, leaf) for path, leaf in flat]
    else:
        spec_flat, spec_def = jax.tree_util.tree_flatten_with_path(
            spec, is_leaf=_is_spec_leaf
        )
        try:
            subtrees = spec_def.flatten_up_to(tree)
        except (ValueError, TypeError):
            raise InputError(
                "The `stack_axes` spec is not a prefix of the params' structure: "
                "build it with `jax.tree.map(lambda _: None, model)` and `eqx.tree_at`."
            ) from None
        pairs = []
        for (prefix, value), subtree in zip(spec_flat, subtrees, strict=True):
            for path, leaf in jax.tree_util.tree_flatten_with_path(
                subtree, is_leaf=is_none
            )[0]:
                pairs.append((value, prefix + path, leaf))
    out: list[int | None] = []
    for value, path, leaf in pairs:
        if callable(value):
            value = value(path_str(path))
        if value is None or not is_trainable(leaf):
            out.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(
                f"`stack_axes` gave {value!r} for the leaf at {path_str(path)}: "
                "expected a number of leading axes (an int >= 0) or None."
            )
        if value > leaf.ndim:
            raise InputError(
                f"`stack_axes` gives the leaf at {path_str(path)} (shape "
                f"{tuple(leaf.shape)}) {value} stack axes, more than it has."
            )
        out.append(value)
    return out


@functools.lru_cache(maxsize=256)
def _describe_structure(treedef: Any, ndims: tuple) -> tuple:
    # The known layers' descriptions depend only on the structure (layer types,
    # static fields) and the leaves' ranks: stand-in leaves of those ranks.
    stand_ins = [None if n is None else _Rank(n) for n in ndims]
    tree = jax.tree.unflatten(treedef, stand_ins)
    found = _known_layer_leaves(tree)
    paths = [
        p for p, _ in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_none)[0]
    ]
    return tuple(found.get(path) for path in paths)


class _Rank:
    # A stand-in leaf with a rank only (what the descriptions read).
    __slots__ = ("ndim",)

    def __init__(self, ndim: int):
        self.ndim = ndim


def describe(tree: Any) -> list[LayerLeaf | None]:
    """One `LayerLeaf` or `None` per leaf of `tree` flattened with `is_leaf=is_none`.

    Known layers describe their leaves; the user's spec (`given_stack_axes`)
    gives stack axes to others and wins where it says something. Computed
    once per structure and ranks (cached): a transform may call it at every
    trace.
    """
    leaves, treedef = jax.tree.flatten(tree, is_leaf=is_none)
    ndims = tuple(getattr(x, "ndim", None) if x is not None else None for x in leaves)
    try:
        described = list(_describe_structure(treedef, ndims))
    except TypeError:  # an unhashable static field: describe without the cache
        described = list(_describe_structure.__wrapped__(treedef, ndims))
    spec = _GIVEN.get()
    if spec is None:
        return described
    for index, (given, leaf) in enumerate(zip(_given(spec, tree), leaves, strict=True)):
        if given is None:
            continue
        known = described[index]
        if known is not None and known.stack_axes == given:
            continue
        # The user's number wins; the layer's axes hold only if one slice still
        # has the layer's own rank.
        if known is not None and known.layer is not None:
            own = leaf.ndim - known.stack_axes
            keep = leaf.ndim - given == own
            described[index] = dataclasses.replace(
                known if keep else LayerLeaf(known.layer, known.field),
                stack_axes=given,
            )
        else:
            described[index] = LayerLeaf(None, None, stack_axes=given)
    return described


def stack_axes(tree: Any) -> list[int]:
    """The number of stack axes of each leaf of `tree` (flattened with `is_none`)."""
    return [0 if d is None else d.stack_axes for d in describe(tree)]


def layer_leaves(tree: Any) -> dict[tuple, LayerLeaf]:
    """Each described leaf of `tree`, by its key path.

    The key paths are those of `jax.tree_util.tree_flatten_with_path(tree,
    is_leaf=lambda x: x is None)`. Known layers: `Linear` (`weight` is
    `(out, in)`), `Conv*` and `ConvTranspose*` (`(out, in, *kernel)`),
    `Embedding` (`(num_embeddings, dim)`: tokens in, features out), `GRUCell`
    and `LSTMCell` (gates stacked on the output axis), `MultiheadAttention`
    (its projections are `Linear`s; queries and keys carry the number of
    heads), and the normalisations `LayerNorm`, `RMSNorm`, `GroupNorm`,
    `BatchNorm`. An `MLP`, a `Sequential` or any other module is looked into.
    Leaves the user gave stack axes (`given_stack_axes`) are described too.
    """
    paths = [
        p for p, _ in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_none)[0]
    ]
    return {
        path: d for path, d in zip(paths, describe(tree), strict=True) if d is not None
    }


def stack_axes_by_path(tree: Any) -> dict[tuple, int]:
    """The stack axes of each stacked leaf of `tree`, by its key path."""
    return {
        path: d.stack_axes for path, d in layer_leaves(tree).items() if d.stack_axes
    }


def one_layer(leaf: Any, stack: int) -> Any:
    """The first slice of a leaf with `stack` stack axes (the leaf itself for 0).

    What a per-leaf predicate of a filter spec is shown: a stack of layers is
    its layers, so `lambda x: x.ndim == 2` selects a stacked `Linear`'s weight
    and not its bias.
    """
    return leaf if stack == 0 else leaf[(0,) * stack]
