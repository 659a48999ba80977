"""Optax's rule for `eqopt.tree_utils`: a Python number in a tree is data."""

import functools
import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import jax
import jax.numpy as jnp

from ..tree._math import _is_number

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
    return jnp.asarray(x) if _is_number(x) else x


def numbers_are_data(fn: Callable[_P, _R]) -> Callable[_P, _R]:
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
        f"{fn.__doc__}\n\n    Under `eqopt.tree_utils` (Optax's names) a Python "
        "number in a tree is data,\n    as in Optax; `eqopt.tree`'s function leaves "
        "it alone.\n"
    )
    return with_numbers
