"""Optax's `optax.tree_utils`: the functions of `eqopt.tree` under their `tree_*` names.

Code written against `optax.tree_utils` runs unchanged. The names are
`eqopt.tree`'s functions (`tree_norm` is `eqopt.tree.norm`, reached through
`__wrapped__`) with Optax's one difference of rule: a Python number in a tree
(an `int`, `float` or `complex`, not a `bool`) is data, as in Optax
(`tree_vdot((1.0, 2.0), (3.0, 4.0))` is 11), where `eqopt.tree`, following
Equinox, leaves it alone as a model's `Dropout.p` (see `_numbers_are_data`).
`tree_get`, `tree_set` and `tree_get_all_with_path` find what `eqopt.tree.get`,
`set` and `get_all_with_path` find, with Optax's paths (a `NamedTupleKey` for
the field of a state). eqopt's own docs use the short names of `eqopt.tree`.
"""

import functools
import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from .._numerics import (
    bias_correction as tree_bias_correction,
    update_infinity_moment as tree_update_infinity_moment,
    update_moment as tree_update_moment,
    update_moment_per_elem_norm as tree_update_moment_per_elem_norm,
)
from ..tree import _casting, _creation, _math
from ..tree._keys import NamedTupleKey as NamedTupleKey
from ..tree._state import map_params as tree_map_params
from ._state import (
    tree_get as tree_get,
    tree_get_all_with_path as tree_get_all_with_path,
    tree_set as tree_set,
)

_P = ParamSpec("_P")
_R = TypeVar("_R")

# The arguments of `eqopt.tree`'s functions that are trees of data.
_TREES = {
    "tree",
    "tree_x",
    "tree_y",
    "other_trees",
    "other_tree",
    "a",
    "b",
    "target_tree",
}


def _number_as_array(x: Any) -> Any:
    is_number = isinstance(x, int | float | complex | np.number)
    return jnp.asarray(x) if is_number and not isinstance(x, bool) else x


def _numbers_are_data(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """`fn` of `eqopt.tree` with Optax's rule: a Python number in a tree
    argument is data, a weakly typed scalar array (`eqopt.tree` passes it
    through, or leaves it out of a reduction, as Equinox does a `Dropout.p`)."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def with_numbers(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        bound = signature.bind(*args, **kwargs)
        for name in _TREES.intersection(bound.arguments):
            bound.arguments[name] = jax.tree_util.tree_map(
                _number_as_array, bound.arguments[name]
            )
        return fn(*bound.args, **bound.kwargs)

    with_numbers.__doc__ = (
        f"{fn.__doc__}\n\n    Under `eqopt.tree_utils`, Optax's spelling, a Python "
        "number in a tree is\n    data, as in Optax (here, in `eqopt.tree`, it is "
        "not).\n"
    )
    return with_numbers


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
