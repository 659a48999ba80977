"""Optax's `optax.tree_utils`: the functions of `eqopt.tree` under their `tree_*` names.

Each name is the same object as `eqopt.tree`'s (`tree_norm` is `eqopt.tree.norm`),
so code written against `optax.tree_utils` runs unchanged, except `tree_get`,
`tree_set` and `tree_get_all_with_path`: they find what `eqopt.tree.get`, `set`
and `get_all_with_path` find, with Optax's paths (a `NamedTupleKey` for the
field of a state). eqopt's own docs use the short names of `eqopt.tree`.
"""

from .._numerics import (
    bias_correction as tree_bias_correction,
    update_infinity_moment as tree_update_infinity_moment,
    update_moment as tree_update_moment,
    update_moment_per_elem_norm as tree_update_moment_per_elem_norm,
)
from ..tree._casting import (
    cast as tree_cast,
    cast_like as tree_cast_like,
    dtype as tree_dtype,
)
from ..tree._creation import (
    full_like as tree_full_like,
    ones_like as tree_ones_like,
    random_like as tree_random_like,
    split_key_like as tree_split_key_like,
    unwrap_random_key_data as tree_unwrap_random_key_data,
    zeros_like as tree_zeros_like,
)
from ..tree._keys import NamedTupleKey as NamedTupleKey
from ..tree._math import (
    add as tree_add,
    add_scale as tree_add_scale,
    allclose as tree_allclose,
    batch_shape as tree_batch_shape,
    clip as tree_clip,
    conj as tree_conj,
    div as tree_div,
    max as tree_max,
    min as tree_min,
    mul as tree_mul,
    norm as tree_norm,
    real as tree_real,
    scale as tree_scale,
    size as tree_size,
    sub as tree_sub,
    sum as tree_sum,
    vdot as tree_vdot,
    where as tree_where,
)
from ..tree._state import map_params as tree_map_params
from ._state import (
    tree_get as tree_get,
    tree_get_all_with_path as tree_get_all_with_path,
    tree_set as tree_set,
)

__all__ = [
    "NamedTupleKey",
    "tree_add",
    "tree_add_scale",
    "tree_allclose",
    "tree_batch_shape",
    "tree_bias_correction",
    "tree_cast",
    "tree_cast_like",
    "tree_clip",
    "tree_conj",
    "tree_div",
    "tree_dtype",
    "tree_full_like",
    "tree_get",
    "tree_get_all_with_path",
    "tree_map_params",
    "tree_max",
    "tree_min",
    "tree_mul",
    "tree_norm",
    "tree_ones_like",
    "tree_random_like",
    "tree_real",
    "tree_scale",
    "tree_set",
    "tree_size",
    "tree_split_key_like",
    "tree_sub",
    "tree_sum",
    "tree_unwrap_random_key_data",
    "tree_update_infinity_moment",
    "tree_update_moment",
    "tree_update_moment_per_elem_norm",
    "tree_vdot",
    "tree_where",
    "tree_zeros_like",
]
