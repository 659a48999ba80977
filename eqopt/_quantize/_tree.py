"""What the transforms call on moment trees and moment dtypes: building moments
in a format, casting, dequantising a tree, and the tests on formats."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp

from .._sharding import like
from ._array import QuantizedArray, _with_lookup, is_quantized
from ._format import is_quantized_format


@no_type_check
def moment_like(
    params: Any, dtype: Any, *, second: bool = False, value: float = 0.0
) -> Any:
    """A moment tree for `params` filled with `value`, stored in `dtype`.

    `dtype` may be `None` (each parameter's dtype; the real dtype for a second
    moment), a dtype, or a `eqopt.Quantized` format (then leaves of at least
    `min_size` real elements are `eqopt.QuantizedArray`, smaller or complex
    ones float32 arrays). `None` where a leaf is not trainable.
    """
    quantized = is_quantized_format(dtype)

    def make(p):
        if not eqx.is_inexact_array(p):
            return None
        real = jnp.finfo(p.dtype).dtype
        if quantized:
            if p.size < dtype.min_size or jnp.iscomplexobj(p):
                float_dtype = jnp.promote_types(
                    real if second else p.dtype, jnp.float32
                )
                return jnp.full_like(p, value, dtype=float_dtype)
            kind = "sqrt" if second else dtype.first_moment_map
            return QuantizedArray.full(
                tuple(p.shape),
                value,
                dtype.bits,
                kind,
                dtype.block,
                jnp.float32,
                normalization=dtype.normalization_of(tuple(p.shape)),
                rounding=dtype.rounding_in_use,
            )
        if dtype is None:
            dtype_here = real if second else p.dtype
        else:
            dtype_here = dtype
        return jnp.full_like(p, value, dtype=dtype_here)

    return jax.tree.map(make, params)


@no_type_check
def cast_moment(x: Any, dtype: Any) -> Any:
    """`x` cast to a moment dtype; unchanged for a quantised format (the per-leaf
    loop quantises it) or `None`."""
    if dtype is None or is_quantized_format(dtype):
        return x
    if x.dtype == dtype and not getattr(x, "weak_type", True):
        return x  # what `astype` gives, without its cost in an eager step
    return x.astype(dtype)


@no_type_check
def dequantize_all(tree: Any, reference: Any = None) -> Any:
    """`tree` with every `eqopt.QuantizedArray` replaced by its dequantised array
    (sharded like `reference` when that is an array sharded over an explicit axis)."""
    if is_quantized(tree):
        return (
            tree.dequantize()
            if reference is None
            else like(tree.dequantize(), reference)
        )
    leaves = jax.tree.leaves(tree, is_leaf=is_quantized)
    if not any(is_quantized(leaf) for leaf in leaves):
        return tree
    return jax.tree.map(
        lambda x: x.dequantize() if is_quantized(x) else x, tree, is_leaf=is_quantized
    )


@no_type_check
def with_lookup(tree: Any, lookup: bool) -> Any:
    """`tree` with every `eqopt.QuantizedArray`'s `lookup` set to `lookup`.

    `False` for the state of a transform run on the leaves cut from packed
    buffers (the packed adapter, `eqopt/_entry.py`, sets it for the call and
    back to `True` after): there a lookup makes the step 1.7-2.4 times as long
    (`eqopt._backend.decodes_by_lookup`). Requantising keeps the old moment's
    `lookup`, so the moments made in the call carry it too.
    """
    return jax.tree.map(
        lambda x: _with_lookup(x, lookup) if is_quantized(x) else x,
        tree,
        is_leaf=is_quantized,
    )


def quantized_on_buffers(*dtypes: Any) -> bool:
    """Whether a transform whose arithmetic is elementwise, with these moment
    dtypes, runs on packed buffers as they are: every quantised format among
    them quantises a packed buffer as one array (`packed_blocks="buffer"`, block
    normalisation). True when none is quantised."""
    return all(
        dtype.packed_blocks == "buffer" and dtype.normalization == "block"
        for dtype in dtypes
        if is_quantized_format(dtype)
    )


def any_quantized(*dtypes: Any) -> bool:
    """Whether any of the moment dtypes is a quantised format."""
    return any(is_quantized_format(dtype) for dtype in dtypes)
