"""Control flow over whole states: a `lax.cond` for pytrees with non-array leaves, selects."""

from collections.abc import Callable
from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from .. import _sharding
from .._base import is_none


@no_type_check
def filter_cond(
    predicate: Any, true_fn: Callable[[], Any], false_fn: Callable[[], Any]
):
    """`lax.cond` on two closures whose outputs may hold non-array leaves.

    Only the array leaves go through `lax.cond`; the rest (static fields, Python
    values, `None`) must be the same in both branches and are put back after.
    A concrete Python bool chooses the branch directly, without tracing the other.
    """
    if isinstance(predicate, bool):
        return true_fn() if predicate else false_fn()
    statics = []

    def branch(fn):
        def run():
            dynamic, static = eqx.partition(fn(), eqx.is_array)
            statics.append(static)
            return dynamic

        return run

    dynamic = lax.cond(jnp.asarray(predicate), branch(true_fn), branch(false_fn))
    return eqx.combine(dynamic, statics[0])


@no_type_check
def zeros_like_output(structure: Any) -> Any:
    """Zeros shaped like a tree of `jax.ShapeDtypeStruct`s (from `eqx.filter_eval_shape`).

    Explicitly sharded structures give zeros of that sharding.
    """
    return jax.tree.map(
        lambda s: _sharding.zeros(s) if isinstance(s, jax.ShapeDtypeStruct) else s,
        structure,
    )


@no_type_check
def select(predicate: Any, on_true: Any, on_false: Any) -> Any:
    """`jnp.where(predicate, a, b)` at every array leaf; other leaves from `on_true`."""
    return jax.tree.map(
        lambda a, b: jnp.where(predicate, a, b) if eqx.is_array(a) else a,
        on_true,
        on_false,
        is_leaf=is_none,
    )


@no_type_check
def cast_like(tree: Any, structure: Any) -> Any:
    """Casts the array leaves of `tree` to the dtypes in `structure` (a real part for
    real); `None` where `structure` has `None` (no gradient there)."""

    def cast(x, s):
        if s is None:
            return None
        if x is None or not eqx.is_array(x):
            return x
        if jnp.iscomplexobj(x) and not jnp.issubdtype(s.dtype, jnp.complexfloating):
            x = jnp.real(x)
        return x.astype(s.dtype)

    return jax.tree.map(cast, tree, structure, is_leaf=is_none)
