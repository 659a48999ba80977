"""Arrays sharded over explicit mesh axes (`jax.sharding.AxisType.Explicit`).

Under explicit sharding, JAX refuses operations whose output sharding is
ambiguous: a matmul contracting a sharded dimension, an SVD of a sharded
matrix, a slice of a sharded vector. The few transforms that do such things
(Muon's Newton–Schulz iteration, `flatten`, tree inner products) use these
helpers; everywhere else sharding simply propagates. Arrays without explicit
axes (the default `Auto` mode, a single device) pass through untouched, so the
helpers cost nothing there.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def _explicit_spec(x: Any) -> Any:
    """The `PartitionSpec` of `x` if it names an explicit mesh axis, else `None`."""
    typeof = getattr(jax, "typeof", None)
    if typeof is None or not hasattr(jax.sharding, "reshard"):
        return None
    sharding = getattr(typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    spec = getattr(sharding, "spec", None)
    if mesh is None or spec is None or getattr(mesh, "empty", True):
        return None
    explicit = {
        name
        for name, kind in zip(mesh.axis_names, mesh.axis_types, strict=True)
        if kind == jax.sharding.AxisType.Explicit
    }
    for entry in spec:
        names = entry if isinstance(entry, tuple) else (entry,)
        if any(name in explicit for name in names if name is not None):
            return spec
    return None


def is_explicitly_sharded(x: Any) -> bool:
    """Whether `x` is sharded over an explicit mesh axis."""
    return _explicit_spec(x) is not None


def gathered(x: Any) -> tuple[Any, Callable[[Any], Any]]:
    """`x` replicated over the mesh, and a function that shards a result like `x`.

    For an array not sharded over an explicit axis, returns it unchanged and the
    identity.
    """
    spec = _explicit_spec(x)
    if spec is None:
        return x, lambda y: y
    replicated = jax.sharding.reshard(x, jax.sharding.PartitionSpec())
    return replicated, lambda y: jax.sharding.reshard(y, spec)


def inner(x: Any, y: Any) -> Any:
    """$\\sum_i \\bar x_i y_i$ at the highest precision, also for explicitly sharded arrays."""
    if is_explicitly_sharded(x) or is_explicitly_sharded(y):
        # A local product and a reduction (an all-reduce), never a contraction
        # over a sharded dimension.
        dtype = jnp.result_type(x, y)
        wide = jnp.promote_types(dtype, jnp.float32)
        return jnp.sum(jnp.conj(x).astype(wide) * y.astype(wide)).astype(dtype)
    return jnp.vdot(x, y, precision=jax.lax.Precision.HIGHEST)
