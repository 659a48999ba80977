"""Shared test helpers."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


def tree_allclose(x, y, *, rtol=1e-5, atol=1e-6, equal_nan=False) -> bool:
    """Whether two pytrees have the same structure and close array leaves."""
    x_leaves, x_def = jax.tree.flatten(x)
    y_leaves, y_def = jax.tree.flatten(y)
    if x_def != y_def:
        return False
    for a, b in zip(x_leaves, y_leaves):
        if eqx.is_array_like(a) and eqx.is_array_like(b):
            a = np.asarray(jnp.asarray(a).astype(jnp.promote_types(jnp.asarray(a).dtype, jnp.float32)))
            b = np.asarray(jnp.asarray(b).astype(jnp.promote_types(jnp.asarray(b).dtype, jnp.float32)))
            if a.shape != b.shape:
                return False
            if not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan):
                return False
        elif a != b:
            return False
    return True


def assert_tree_allclose(x, y, *, rtol=1e-5, atol=1e-6, equal_nan=False):
    """`tree_allclose` with a message showing the largest difference."""
    if tree_allclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan):
        return
    x_leaves = jax.tree.leaves(x)
    y_leaves = jax.tree.leaves(y)
    msg = [f"trees differ: {jax.tree.structure(x)} vs {jax.tree.structure(y)}"]
    for i, (a, b) in enumerate(zip(x_leaves, y_leaves)):
        a = np.asarray(jnp.asarray(a, dtype=jnp.complex64 if jnp.iscomplexobj(a) else jnp.float32))
        b = np.asarray(jnp.asarray(b, dtype=jnp.complex64 if jnp.iscomplexobj(b) else jnp.float32))
        if a.shape == b.shape and a.size:
            msg.append(f"leaf {i}: max abs diff {np.max(np.abs(a - b))}")
        else:
            msg.append(f"leaf {i}: shapes {a.shape} vs {b.shape}")
    raise AssertionError("\n".join(msg))
