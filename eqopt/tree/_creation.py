"""Pytrees of constants and of random numbers shaped like another pytree."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import ArrayLike, PRNGKeyArray, PyTree, Shaped

from .._typecheck import checked
from ._paths import map_single


@checked
def zeros_like(tree: PyTree, dtype: DTypeLike | None = None) -> PyTree:
    """A pytree shaped like `tree` with every array leaf filled with zeros.

    **Arguments:**

    - `tree`: the pytree. Non-array leaves and `None` pass through.
    - `dtype`: the dtype of the new leaves (default: each leaf's own).

    **Returns:** a pytree shaped like `tree`.
    """
    return map_single(lambda x: jnp.zeros_like(x, dtype=dtype), tree)


@checked
def ones_like(tree: PyTree, dtype: DTypeLike | None = None) -> PyTree:
    """A pytree shaped like `tree` with every array leaf filled with ones.

    **Arguments:**

    - `tree`: the pytree. Non-array leaves and `None` pass through.
    - `dtype`: the dtype of the new leaves (default: each leaf's own).

    **Returns:** a pytree shaped like `tree`.
    """
    return map_single(lambda x: jnp.ones_like(x, dtype=dtype), tree)


@checked
def full_like(
    tree: PyTree, fill_value: Shaped[ArrayLike, "..."], dtype: DTypeLike | None = None
) -> PyTree:
    """A pytree shaped like `tree` with every array leaf filled with `fill_value`.

    **Arguments:**

    - `tree`: the pytree. Non-array leaves and `None` pass through.
    - `fill_value`: the value, broadcast to each leaf's shape.
    - `dtype`: the dtype of the new leaves (default: each leaf's own).

    **Returns:** a pytree shaped like `tree`.
    """
    return map_single(lambda x: jnp.full_like(x, fill_value, dtype=dtype), tree)


@checked
def split_key_like(rng_key: PRNGKeyArray, target_tree: PyTree) -> PyTree:
    """Splits a random key into one key per array leaf of a pytree.

    The key is split with `jax.random.split(rng_key, n)` for the `n` array leaves
    and the keys are handed out in leaf order, so the keys match Optax's for a
    pytree of arrays.

    **Arguments:**

    - `rng_key`: a new-style (`jax.random.key`) or raw (`jax.random.PRNGKey`) key.
    - `target_tree`: the pytree. Non-array leaves and `None` pass through and
      receive no key.

    **Returns:** a pytree shaped like `target_tree` with a key at each array leaf.
    """
    leaves, treedef = jax.tree_util.tree_flatten(target_tree)
    count = sum(1 for x in leaves if eqx.is_array(x))
    keys = iter(jax.random.split(rng_key, count))
    return jax.tree_util.tree_unflatten(
        treedef, [next(keys) if eqx.is_array(x) else x for x in leaves]
    )


@checked
def random_like(
    rng_key: PRNGKeyArray,
    target_tree: PyTree,
    sampler: Callable[..., Any] = jax.random.normal,
    dtype: DTypeLike | None = None,
) -> PyTree:
    """A pytree shaped like `target_tree` with random array leaves.

    Leaf $\\ell$ is `sampler(key_ℓ, leaf.shape, dtype)` with `key_ℓ` from
    `eqopt.tree.split_key_like`, so the numbers match Optax's.

    **Arguments:**

    - `rng_key`: the random key.
    - `target_tree`: the pytree. Non-array leaves and `None` pass through.
    - `sampler`: a function `(key, shape, dtype) -> array`, such as
      `jax.random.normal` (default), `jax.random.uniform` or
      `jax.random.rademacher` (integer dtypes only).
    - `dtype`: the dtype passed to `sampler` (default: each leaf's own).

    **Returns:** a pytree shaped like `target_tree`.
    """
    keys = split_key_like(rng_key, target_tree)

    def sample(key, leaf):
        if not eqx.is_array(leaf):
            return leaf
        return sampler(key, leaf.shape, dtype if dtype is not None else leaf.dtype)

    return jax.tree_util.tree_map(sample, keys, target_tree)


def _is_key_array(x: Any) -> bool:
    return eqx.is_array(x) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


@checked
def unwrap_random_key_data(input_tree: PyTree) -> PyTree:
    """Replaces every new-style random key leaf by its raw `uint32` data.

    Useful to compare or serialise pytrees holding `jax.random.key` arrays.

    **Arguments:**

    - `input_tree`: the pytree. Other leaves pass through.

    **Returns:** a pytree shaped like `input_tree` with `jax.random.key_data(k)`
    in place of each key array `k`.
    """
    return map_single(
        lambda x: jax.random.key_data(x) if _is_key_array(x) else x, input_tree
    )
