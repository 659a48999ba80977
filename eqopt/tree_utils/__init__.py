"""Optax's `optax.tree_utils`: the functions of `eqopt.tree` under their `tree_*` names.

Code written against `optax.tree_utils` runs unchanged. The names are
`eqopt.tree`'s functions (`tree_norm` is `eqopt.tree.norm`, reached through
`__wrapped__`) with Optax's one difference of rule: a Python number in a tree
(an `int`, `float` or `complex`, not a `bool`) is data, as in Optax
(`tree_vdot((1.0, 2.0), (3.0, 4.0))` is 11), where `eqopt.tree`, following
Equinox, leaves it alone as a model's `Dropout.p` (`_numbers.py`).
`tree_get`, `tree_set` and `tree_get_all_with_path` find what `eqopt.tree.get`,
`set` and `get_all_with_path` find, with Optax's paths (a `NamedTupleKey` for
the field of a state). eqopt's own docs use the short names of `eqopt.tree`.
"""

from .._numerics import (
    bias_correction as tree_bias_correction,
    update_infinity_moment as tree_update_infinity_moment,
    update_moment as tree_update_moment,
    update_moment_per_elem_norm as tree_update_moment_per_elem_norm,
)
from ..tree import _casting, _creation, _math
from ..tree._keys import NamedTupleKey as NamedTupleKey
from ..tree._state import map_params as tree_map_params
from ._numbers import numbers_are_data as _numbers_are_data
from ._state import (
    tree_get as tree_get,
    tree_get_all_with_path as tree_get_all_with_path,
    tree_set as tree_set,
)

tree_add = _numbers_are_data(_math.add)
tree_add_scale = _numbers_are_data(_math.add_scale)
tree_allclose = _numbers_are_data(_math.allclose)
tree_batch_shape = _numbers_are_data(_math.batch_shape)
tree_cast = _numbers_are_data(_casting.cast)
tree_cast_like = _numbers_are_data(_casting.cast_like)
tree_clip = _numbers_are_data(_math.clip)
tree_conj = _numbers_are_data(_math.conj)
tree_div = _numbers_are_data(_math.div)
tree_dtype = _numbers_are_data(_casting.dtype)
tree_full_like = _numbers_are_data(_creation.full_like)
tree_max = _numbers_are_data(_math.max)
tree_min = _numbers_are_data(_math.min)
tree_mul = _numbers_are_data(_math.mul)
tree_norm = _numbers_are_data(_math.norm)
tree_ones_like = _numbers_are_data(_creation.ones_like)
tree_random_like = _numbers_are_data(_creation.random_like)
tree_real = _numbers_are_data(_math.real)
tree_scale = _numbers_are_data(_math.scale)
tree_size = _numbers_are_data(_math.size)
tree_split_key_like = _numbers_are_data(_creation.split_key_like)
tree_sub = _numbers_are_data(_math.sub)
tree_sum = _numbers_are_data(_math.sum)
tree_unwrap_random_key_data = _creation.unwrap_random_key_data
tree_vdot = _numbers_are_data(_math.vdot)
tree_where = _numbers_are_data(_math.where)
tree_zeros_like = _numbers_are_data(_creation.zeros_like)

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
