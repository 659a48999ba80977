"""Whole-tree reductions and small per-leaf helpers shared by the contrib optimisers.

The learning-rate-free methods (Prodigy, D-Adaptation, DoG, DoWG, Mechanic, MoMo)
estimate their step size from inner products and norms over the whole model.
These helpers compute them over the leaves that have an update (skipping `None`),
in a floating dtype at least as wide as `float32`, and treat complex leaves as
pairs of reals: $\\langle a, b \\rangle = \\operatorname{Re} \\sum \\bar a\\, b$.
"""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp

from .._base import Params, is_none, is_trainable, path_str
from .._leafwise import leafwise


@no_type_check
def scalar_dtype(params: Params) -> Any:
    """The dtype of a scalar accumulator for `params`: `float32`, or wider for `float64`."""
    dtypes = [
        jnp.finfo(leaf.dtype).dtype
        for leaf in jax.tree.leaves(params)
        if is_trainable(leaf)
    ]
    return jnp.result_type(jnp.float32, *dtypes)


@no_type_check
def _wide(x):
    if jnp.iscomplexobj(x):
        return x.astype(jnp.promote_types(x.dtype, jnp.complex64))
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


@no_type_check
def real_inner(a, b):
    """$\\operatorname{Re}\\sum_i \\bar a_i b_i$ of two arrays, in at least `float32`."""
    a, b = _wide(a), _wide(b)
    if jnp.iscomplexobj(a) or jnp.iscomplexobj(b):
        return jnp.sum(jnp.real(a) * jnp.real(b) + jnp.imag(a) * jnp.imag(b))
    return jnp.sum(a * b)


@no_type_check
def total(contributions):
    """The sum of the scalar leaves of a tree (`None` skipped), `0` for none."""
    values = [x for x in jax.tree.leaves(contributions) if x is not None]
    if not values:
        return jnp.zeros([], jnp.float32)
    return sum(values[1:], values[0])


@no_type_check
def tree_real_inner(updates, other):
    """$\\sum_\\ell \\operatorname{Re}\\langle u_\\ell, o_\\ell\\rangle$ over the leaves with an update."""
    return total(leafwise(real_inner, updates, other, per_layer=False))


@no_type_check
def tree_squared_norm(updates):
    """$\\sum_\\ell \\|u_\\ell\\|^2$ over the leaves that are not `None`."""
    return total(leafwise(lambda u: real_inner(u, u), updates, per_layer=False))


@no_type_check
def tree_abs_sum(updates):
    """$\\sum_\\ell \\|u_\\ell\\|_1$ (moduli for complex leaves)."""
    return total(
        leafwise(lambda u: jnp.sum(jnp.abs(_wide(u))), updates, per_layer=False)
    )


@no_type_check
def trainable_part(params, updates):
    """The leaves of `params` where `updates` is not `None`, `None` elsewhere."""
    return jax.tree.map(
        lambda u, p: None if u is None else p, updates, params, is_leaf=is_none
    )


@no_type_check
def copy_trainable(params):
    """Copies of the trainable leaves of `params`, `None` elsewhere.

    Copies, not references: a state that shared buffers with the model could not
    be donated together with it (`eqx.filter_jit(donate="all-except-first")`).
    """
    return jax.tree.map(lambda p: jnp.copy(p) if is_trainable(p) else None, params)


def refuse_complex(params: Params, owner: str) -> None:
    """Raises a `TypeError` naming the first complex leaf, for real-only methods."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    for path, leaf in flat:
        if eqx.is_array(leaf) and jnp.iscomplexobj(leaf):
            raise TypeError(
                f"{owner} works on real parameters, but the leaf at {path_str(path)} "
                f"is {leaf.dtype}. Optimise its real and imaginary parts as separate "
                f"real parameters: wrap the optimiser in "
                "`eqopt.contrib.split_real_and_imaginary`."
            )


@no_type_check
def cast_to(x, dtype):
    """`x` in `dtype` (a no-op when it already is)."""
    return x if x.dtype == dtype else x.astype(dtype)


@no_type_check
def require_params(params, owner: str) -> None:
    if params is None:
        raise ValueError(
            f"{owner} needs the current parameters: call "
            "`update(updates, state, params)`."
        )


@no_type_check
def evaluate(value, count):
    """A hyperparameter that may be a schedule, at the step `count`."""
    if callable(value):
        return jnp.asarray(value(count))
    return value
