"""Arrays sharded over explicit mesh axes (`jax.sharding.AxisType.Explicit`).

Under explicit sharding, JAX refuses operations whose output sharding is
ambiguous: a matmul contracting a sharded dimension, an SVD of a sharded
matrix, a slice of a sharded vector, a `lax.cond` whose branches return
differently sharded arrays, a `select` whose condition is sharded otherwise
than its cases. The transforms that do such things use these helpers:

- inherently global operations gather (Muon's Newton–Schulz iteration, GaLore's
  SVD, the flat vector of `flatten`) and put their result back in the
  parameter's sharding;
- inner products (`tree.vdot`, L-BFGS, the line searches) are local products
  and a reduction, never a contraction over a sharded dimension;
- zeros built from a shape (in `lax.cond` branches, L-BFGS's memory) get the
  sharding of what they stand for.

Everywhere else sharding simply propagates. Arrays without explicit axes (the
default `Auto` mode of `jax.sharding.Mesh`, a single device) take the plain
path: the helpers decide in Python, at trace time, and add nothing to the
computation there.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.numpy as jnp


def explicit_sharding(x: Any) -> Any:
    """The sharding of `x` (an array or a `jax.ShapeDtypeStruct`) if it names an
    explicit mesh axis, else `None`."""
    typeof = getattr(jax, "typeof", None)
    if typeof is None or not hasattr(jax.sharding, "reshard"):
        return None
    if isinstance(x, jax.ShapeDtypeStruct):
        sharding = x.sharding
    else:
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
            return sharding
    return None


def is_explicitly_sharded(x: Any) -> bool:
    """Whether `x` is sharded over an explicit mesh axis."""
    return explicit_sharding(x) is not None


def gathered(x: Any) -> tuple[Any, Callable[[Any], Any]]:
    """`x` replicated over the mesh, and a function that shards a result like `x`.

    For an array not sharded over an explicit axis, returns it unchanged and the
    identity.
    """
    sharding = explicit_sharding(x)
    if sharding is None:
        return x, lambda y: y
    replicated = sharding.update(spec=jax.sharding.PartitionSpec())
    return jax.sharding.reshard(x, replicated), lambda y: jax.sharding.reshard(
        y, sharding
    )


def whole(tree: Any) -> Any:
    """Every array of `tree` replicated over the mesh where it is split over an
    explicit axis (a whole matrix for a step that needs one; ZeRO-1 splits
    state that is not shaped like the params too)."""
    return jax.tree.map(lambda x: gathered(x)[0], tree)


def inner(x: Any, y: Any) -> Any:
    """$\\sum_i \\bar x_i y_i$ at the highest precision, also for explicitly sharded arrays."""
    if is_explicitly_sharded(x) or is_explicitly_sharded(y):
        # A local product and a reduction (an all-reduce), never a contraction
        # over a sharded dimension.
        dtype = jnp.result_type(x, y)
        wide = jnp.promote_types(dtype, jnp.float32)
        return jnp.sum(jnp.conj(x).astype(wide) * y.astype(wide)).astype(dtype)
    return jnp.vdot(x, y, precision=jax.lax.Precision.HIGHEST)


def like(y: Any, x: Any) -> Any:
    """`y` resharded like `x` when `x` is explicitly sharded, else `y` unchanged."""
    sharding = explicit_sharding(x)
    if sharding is None:
        return y
    return jax.sharding.reshard(y, sharding)


def replicated_matmul(a: Any, b: Any) -> Any:
    """`a @ b`, replicated when an operand is explicitly sharded.

    A contraction over a sharded dimension becomes local products and an
    all-reduce, rather than an error.
    """
    for x in (a, b):
        sharding = explicit_sharding(x)
        if sharding is not None:
            replicated = sharding.update(spec=jax.sharding.PartitionSpec())
            return jnp.matmul(a, b, out_sharding=replicated)
    return a @ b


def zeros(structure: jax.ShapeDtypeStruct) -> Any:
    """Zeros of the shape, dtype and (explicit) sharding of `structure`."""
    sharding = explicit_sharding(structure)
    if sharding is None:
        return jnp.zeros(structure.shape, structure.dtype)
    return jnp.zeros(structure.shape, structure.dtype, out_sharding=sharding)


def zeros_like(x: Any, dtype: Any = None) -> Any:
    """`jnp.zeros_like(x, dtype)`, keeping an explicit sharding also where `x` is a
    concrete array closed over by a traced function (a `lax.cond` branch run
    eagerly), where `jnp.zeros_like` drops it."""
    sharding = explicit_sharding(x)
    if sharding is None:
        return jnp.zeros_like(x, dtype)
    dtype = x.dtype if dtype is None else dtype
    return jnp.zeros(jnp.shape(x), dtype, out_sharding=sharding)


def stacked_zeros(n: int, x: Any) -> Any:
    """Zeros of shape `(n, *x.shape)` and `x`'s dtype, each of the `n` slices
    sharded like `x` (explicit axes, or a concrete array over automatic axes)."""
    shape = (n, *x.shape)
    sharding = explicit_sharding(x)
    if sharding is not None:
        spec = jax.sharding.PartitionSpec(None, *sharding.spec)
        return jnp.zeros(shape, x.dtype, out_sharding=sharding.update(spec=spec))
    placed = None if isinstance(x, jax.core.Tracer) else getattr(x, "sharding", None)
    if (
        isinstance(placed, jax.sharding.NamedSharding)
        and not placed.is_fully_replicated
    ):
        # A concrete array laid out over automatic axes: place the zeros the
        # same way (inside `jit`, XLA propagates the layout instead).
        spec = jax.sharding.PartitionSpec(None, *placed.spec)
        return jnp.zeros(shape, x.dtype, device=placed.update(spec=spec))
    return jnp.zeros(shape, x.dtype)


def where(condition: Any, x: Any, y: Any) -> Any:
    """`jnp.where(condition, x, y)`, also when `condition` broadcasts against
    explicitly sharded `x` and `y` (it is broadcast and sharded like them)."""
    if is_explicitly_sharded(x) or is_explicitly_sharded(y):
        condition, x, y = jnp.asarray(condition), jnp.asarray(x), jnp.asarray(y)
        like = x if is_explicitly_sharded(x) else y
        shape = jnp.broadcast_shapes(condition.shape, x.shape, y.shape)
        if condition.ndim and shape == like.shape:
            condition = jnp.broadcast_to(condition, shape)
            condition = jax.sharding.reshard(condition, explicit_sharding(like))
    return jnp.where(condition, x, y)
