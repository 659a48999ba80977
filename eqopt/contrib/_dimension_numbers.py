"""Viewing a parameter of any rank as a matrix: the dimension numbers of Muon and GaLore.

Muon and GaLore act on matrices. A parameter of higher rank (a convolution
kernel, an attention weight with a head axis) is viewed as a matrix, or a batch
of matrices, by naming its *reduction* axes (the rows: contracted with the
input, $x W = y$) and its *output* axes (the columns). The other axes are batch
axes.

Which leaves are treated as matrices is an Equinox filter spec whose leaves may
also be dimension numbers: a bool, a dimension-numbers object, `None`, a per-leaf
callable returning one of these, or a prefix pytree of them.

Dimension numbers describe one layer: a leaf stacked with `eqx.filter_vmap`
(see `eqopt._layer_axes`) is viewed slice by slice (`leafwise` runs the
transform on each slice), and a predicate in the spec is shown one slice.
Dimension numbers written for the whole stacked leaf (Optax's way, with the
stack axes as batch axes) are moved onto the slice when every axis they name
is behind the stack axes.

What `True` means is the leaf's own orientation: a weight of a known Equinox
layer (`eqx.nn.Linear.weight` is `(out, in)`) has its input axes as reduction
axes and its output axes as output axes (`layer_oriented`); any other leaf
gets the default dimension numbers, Optax's convention (rows on axis 0, the
input of a Flax `(in, out)` kernel). Dimension numbers given explicitly are
used as they are.
"""

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, no_type_check

import jax
import numpy as np

from .._base import is_none, is_trainable, path_str
from .._filters import is_spec_leaf, per_leaf_hint
from .._layer_axes import layer_leaves, one_layer, stack_axes_by_path


def _axes_tuple(value: Any, name: str, owner: str) -> int | tuple[int, ...]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, Sequence) and all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value
    ):
        return tuple(int(v) for v in value)
    raise TypeError(
        f"{owner}: `{name}` must be an int or a sequence of ints, got {value!r}."
    )


@dataclasses.dataclass(frozen=True)
class _AbstractDimensionNumbers:
    reduction_axis: int | Sequence[int] = 0
    output_axis: int | Sequence[int] = 1

    def __post_init__(self):
        owner = type(self).__name__
        for name in ("reduction_axis", "output_axis"):
            object.__setattr__(
                self, name, _axes_tuple(getattr(self, name), name, owner)
            )


@no_type_check
def normalize_axes(ndim: int, dimension_numbers: Any) -> tuple[tuple, tuple]:
    """The reduction and output axes as two tuples of non-negative ints."""

    def as_tuple(axes):
        axes = (axes,) if isinstance(axes, int) else tuple(axes)
        return tuple(axis % ndim for axis in axes)

    return (
        as_tuple(dimension_numbers.reduction_axis),
        as_tuple(dimension_numbers.output_axis),
    )


@no_type_check
def fans(shape: tuple[int, ...], dimension_numbers: Any) -> tuple[int, int]:
    """`(fan_in, fan_out)`: the sizes of the reduction and of the output axes."""
    reduction, output = normalize_axes(len(shape), dimension_numbers)
    return (
        math.prod(shape[axis] for axis in reduction),
        math.prod(shape[axis] for axis in output),
    )


@no_type_check
def check_dimension_numbers(
    shape: tuple[int, ...],
    dimension_numbers: Any,
    *,
    owner: str,
    path: str,
    batch_axes: bool,
) -> None:
    """Raises one `ValueError` naming the leaf if the dimension numbers do not fit it."""
    ndim = len(shape)
    if ndim < 2:
        raise ValueError(
            f"{owner}: the leaf at {path} has shape {shape}, but {owner} acts on "
            "matrices (rank >= 2). Select only matrices, e.g. with the filter spec "
            "`lambda x: x.ndim == 2`."
        )
    for axes in (dimension_numbers.reduction_axis, dimension_numbers.output_axis):
        for axis in (axes,) if isinstance(axes, int) else axes:
            if not -ndim <= axis < ndim:
                raise ValueError(
                    f"{owner}: {dimension_numbers} names axis {axis}, but the leaf at "
                    f"{path} has rank {ndim} (shape {shape})."
                )
    reduction, output = normalize_axes(ndim, dimension_numbers)
    if set(reduction) & set(output) or len(set(reduction)) != len(reduction):
        raise ValueError(
            f"{owner}: the reduction axes {reduction} and output axes {output} of the "
            f"leaf at {path} (shape {shape}) must be distinct."
        )
    if not batch_axes and len(set(reduction) | set(output)) != ndim:
        raise ValueError(
            f"{owner}: every axis of the leaf at {path} (shape {shape}) must be a "
            f"reduction or an output axis; got reduction {reduction} and output "
            f"{output}."
        )


@no_type_check
def matrix_view(
    shape: tuple[int, ...], dimension_numbers: Any
) -> tuple[Callable, Callable]:
    """Functions to and from the `(batch, fan_in, fan_out)` view of an array.

    The batch axes (those named neither reduction nor output) come first, in
    order; a leaf without batch axes has a batch of one.
    """
    ndim = len(shape)
    reduction, output = normalize_axes(ndim, dimension_numbers)
    batch = tuple(a for a in range(ndim) if a not in reduction and a not in output)
    order = batch + reduction + output
    inverse_order = tuple(int(i) for i in np.argsort(order))
    sizes = tuple(shape[a] for a in order)
    flat = (
        math.prod(shape[a] for a in batch),
        math.prod(shape[a] for a in reduction),
        math.prod(shape[a] for a in output),
    )

    def to_matrix(x):
        return x.transpose(order).reshape(flat)

    def from_matrix(x):
        return x.reshape(sizes).transpose(inverse_order)

    return to_matrix, from_matrix


def layer_oriented(tree: Any, kind: type) -> Callable[[tuple], Any]:
    """What `True` means for the leaf at a key path of `tree`: a `kind` oriented as
    its Equinox layer says (input axes as reduction axes), or `kind()` for a leaf
    of no known layer (Optax's convention)."""
    described = layer_leaves(tree)

    def default(path: tuple) -> Any:
        leaf = described.get(path)
        if leaf is None or not leaf.is_matrix:
            return kind()
        return kind(reduction_axis=leaf.input_axes, output_axis=leaf.output_axes)

    return default


def resolve_dimension_numbers(
    spec: Any,
    tree: Any,
    kind: type,
    *,
    owner: str,
    batch_axes: bool,
    check: Callable[[tuple[int, ...], Any, str], None] | None = None,
    default: Callable[[tuple], Any] | None = None,
) -> Any:
    """Resolves a dimension-numbers spec against `tree`: one `kind` or `None` per leaf.

    The spec is a filter spec whose leaves may also be dimension numbers: `True`
    means `default(path)` (by default `kind()`; `layer_oriented` gives
    each Equinox layer's orientation), `False` and `None` mean "not a matrix",
    an instance of `kind` is used as it is, and a callable is applied to each
    trainable leaf and must return one of these. Leaves that are not trainable
    resolve to `None`. Each resolved leaf is checked against its shape, by
    `check(shape, value, path)` when given (Adam-mini's blocks), else as
    dimension numbers.
    """

    def is_leaf(x):
        return isinstance(x, kind) or is_spec_leaf(x)

    stacks = stack_axes_by_path(tree)

    def on_slice(dims, ndim, stack):
        # Dimension numbers that name axes beyond one slice were written for the
        # whole stacked leaf: moved onto the slice when the stack axes are batch axes.
        named = _named_axes(dims)
        if stack == 0 or all(-(ndim - stack) <= a < ndim - stack for a in named):
            return dims
        if not all(-ndim <= a < ndim for a in named):
            return dims
        reduction, output = normalize_axes(ndim, dims)
        if any(a < stack for a in reduction + output):
            return dims
        return dataclasses.replace(
            dims,
            reduction_axis=tuple(a - stack for a in reduction),
            output_axis=tuple(a - stack for a in output),
        )

    def resolve(value, path):
        if value is True or isinstance(value, np.bool_) and value:
            return kind() if default is None else default(path)
        if callable(value) and not isinstance(value, kind):
            raise ValueError(
                f"{owner}: the dimension-numbers callable returned a callable at "
                f"{path_str(path)}."
            )
        if value is None or value is False or isinstance(value, np.bool_) and not value:
            return None
        if isinstance(value, kind):
            return value
        raise ValueError(
            f"{owner}: expected {kind.__name__}, a bool or None for the leaf at "
            f"{path_str(path)}, got {type(value).__name__}. "
            + per_leaf_hint(
                "a dimension-numbers spec",
                "function",
                "weight_dimension_numbers=dims_fn(params)",
            )
        )

    spec_flat, spec_def = jax.tree_util.tree_flatten_with_path(spec, is_leaf=is_leaf)
    try:
        subtrees = spec_def.flatten_up_to(tree)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"{owner}: the dimension-numbers spec is not a prefix of the params' "
            f"structure: {error}. Build it with, for example, "
            "`jax.tree.map(lambda _: None, model)` and `eqx.tree_at`."
        ) from None
    resolved = []
    for (prefix, value), subtree in zip(spec_flat, subtrees, strict=True):
        flat = jax.tree_util.tree_flatten_with_path(subtree, is_leaf=is_none)[0]
        out = []
        for path, leaf in flat:
            full = prefix + path
            if not is_trainable(leaf):
                out.append(None)
                continue
            stack = stacks.get(full, 0)
            one = one_layer(leaf, stack)
            chosen = value(one) if callable(value) else value
            dims = resolve(chosen, full)
            if isinstance(dims, _AbstractDimensionNumbers) and isinstance(value, kind):
                dims = on_slice(dims, leaf.ndim, stack)
            if dims is not None and check is not None:
                check(tuple(one.shape), dims, path_str(full))
            elif dims is not None:
                check_dimension_numbers(
                    tuple(one.shape),
                    dims,
                    owner=owner,
                    path=path_str(full),
                    batch_axes=batch_axes,
                )
            out.append(dims)
        resolved.append(
            jax.tree.unflatten(jax.tree.structure(subtree, is_leaf=is_none), out)
        )
    return jax.tree.unflatten(spec_def, resolved)


def _named_axes(dims: Any) -> tuple[int, ...]:
    axes = []
    for value in (dims.reduction_axis, dims.output_axis):
        axes += [value] if isinstance(value, int) else list(value)
    return tuple(axes)


def selection_spec(spec: Any, kind: type, complement: bool = False) -> Any:
    """The filter spec of bools and predicates selecting the leaves a dimension spec names.

    With `complement=True`, it selects the other leaves instead.
    """

    def selects(value):
        if callable(value) and not isinstance(value, kind):
            return _Selects(value, kind, complement)
        if value is None or value is False or isinstance(value, np.bool_) and not value:
            return complement
        return not complement

    return jax.tree.map(
        selects, spec, is_leaf=lambda x: isinstance(x, kind) or is_spec_leaf(x)
    )


@dataclasses.dataclass(frozen=True)
class _Selects:
    """A per-leaf predicate: whether a dimension-numbers callable selects the leaf."""

    function: Callable
    kind: type
    complement: bool

    def __call__(self, leaf):
        value = self.function(leaf)
        selected = not (
            value is None or value is False or isinstance(value, np.bool_) and not value
        )
        return selected != self.complement
