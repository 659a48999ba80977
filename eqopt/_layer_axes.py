"""Which Equinox layer each leaf belongs to, and which of its axes are the layer's input and output.

"The model knows its layers" (docs/design.md, "Whole models are the params"). A transform that needs to know
which axis of a matrix is its input (Muon's width factor, NorMuon's neurons,
GaLore's sides, Adam-mini's blocks) reads it here. `eqx.nn.Linear.weight` is
`(out, in)`, as PyTorch's; Optax's convention for a bare matrix is Flax's
`(in, out)` kernel. A leaf of a known layer is described by the layer; any
other leaf is not described, and its transform keeps Optax's convention.

Gradients from `eqx.filter_grad` are Modules of the same types as the model, so
the `updates` alone are enough (`params` are not needed). A layer stacked with
`eqx.filter_vmap` (a scanned block) has leading axes on its weights: they are
neither input nor output (a transform treats them as a batch of matrices).

This module imports only Equinox and JAX.
"""

import dataclasses
from typing import Any

import equinox as eqx
import jax

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
    """A leaf of a known Equinox layer.

    - `layer`: the layer's class (`eqx.nn.Linear`, `eqx.nn.LayerNorm`...).
    - `field`: the field's name (`"weight"`, `"bias"`, `"weight_ih"`...).
    - `input_axes`, `output_axes`: for a weight, the axes contracted with the
      layer's input and the axes of its output (`(1,)` and `(0,)` for a
      `Linear`); empty for a leaf that is not a weight matrix (a bias, a
      normalisation's scale).
    - `heads`: for the query and key projections of a `MultiheadAttention`,
      its number of heads (contiguous groups of the output axis).
    """

    layer: type
    field: str
    input_axes: tuple[int, ...] = ()
    output_axes: tuple[int, ...] = ()
    heads: int | None = None

    @property
    def is_matrix(self) -> bool:
        """Whether the leaf is a weight with input and output axes."""
        return bool(self.input_axes) and bool(self.output_axes)

    @property
    def is_normalisation(self) -> bool:
        """Whether the leaf is a scale or offset of a normalisation layer."""
        return issubclass(self.layer, NORMALISATIONS)


def _is_layer_or_none(x: Any) -> bool:
    return x is None or isinstance(x, _KNOWN)


def _weight_ndim(layer: Any) -> int:
    # The number of axes of one (unstacked) layer's weight.
    if isinstance(layer, (eqx.nn.Conv, eqx.nn.ConvTranspose)):
        return 2 + layer.num_spatial_dims
    return 2


def _describe(layer: Any, field: str, leaf: Any, heads: int | None) -> LayerLeaf:
    kind = type(layer)
    # Axes before the layer's own are a stack of layers (`eqx.filter_vmap`).
    lead = getattr(leaf, "ndim", 0) - _weight_ndim(layer)
    if lead < 0:
        return LayerLeaf(kind, field)
    if isinstance(layer, eqx.nn.Embedding) and field == "weight":
        # A lookup is a one-hot row times the weight: tokens in, features out.
        return LayerLeaf(kind, field, input_axes=(lead,), output_axes=(lead + 1,))
    for known, weights in _OUT_IN_WEIGHTS.items():
        if isinstance(layer, known) and field in weights:
            inputs = tuple(range(lead + 1, leaf.ndim))
            return LayerLeaf(kind, field, inputs, (lead,), heads)
    return LayerLeaf(kind, field)


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


def layer_leaves(tree: Any) -> dict[tuple, LayerLeaf]:
    """Each leaf of `tree` that belongs to a known Equinox layer, by its key path.

    The key paths are those of `jax.tree_util.tree_flatten_with_path(tree,
    is_leaf=lambda x: x is None)`. Known layers: `Linear` (`weight` is
    `(out, in)`), `Conv*` and `ConvTranspose*` (`(out, in, *kernel)`),
    `Embedding` (`(num_embeddings, dim)`: tokens in, features out), `GRUCell`
    and `LSTMCell` (gates stacked on the output axis), `MultiheadAttention`
    (its projections are `Linear`s; queries and keys carry the number of
    heads), and the normalisations `LayerNorm`, `RMSNorm`, `GroupNorm`,
    `BatchNorm`. An `MLP`, a `Sequential` or any other module is looked into.
    """
    found: dict[tuple, LayerLeaf] = {}
    nodes = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_layer_or_none)[0]
    for path, node in nodes:
        if node is not None and isinstance(node, _KNOWN):
            for inner, described in _layer_leaves(node).items():
                found[(*path, *inner)] = described
    return found
