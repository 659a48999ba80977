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

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np


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


# ---------------------------------------------------------------------------
# Memory kinds: state kept in host memory (`eqopt.offload`)
# ---------------------------------------------------------------------------

#: The memory kind of a `jax.sharding.Sharding` that holds an offloaded leaf.
HOST_MEMORY = "pinned_host"


def in_host_memory(x: Any) -> bool:
    """Whether the array `x` (or, under `jit`, the value it traces) is in host
    memory: read from its type (`jax.typeof(x).memory_space`), so it holds
    under `jit`, where a tracer has no sharding to ask."""
    if not isinstance(x, jax.Array):
        return False
    return jax.typeof(x).memory_space == jax.memory.Space.Host


def host_kind(sharding: Any) -> str | None:
    """The memory kind of `sharding` where it is a host memory, else `None`."""
    kind = getattr(sharding, "memory_kind", None)
    return kind if kind in (HOST_MEMORY, "unpinned_host") else None


def to_memory(x: Any, host: bool) -> Any:
    """The array `x` moved to host memory (`host=True`) or to the device's,
    keeping its sharding: `jax.device_put` to a memory space, which under `jit`
    is a transfer inside the program (on CPU, where both are the same memory,
    it compiles to nothing)."""
    space = jax.memory.Space.Host if host else jax.memory.Space.Device
    return jax.device_put(x, space)


def auto_mesh(tree: Any) -> Any:
    """The mesh with automatic axes that an array of `tree` is laid out on, or
    `None` (arrays on one device, or on explicit axes, whose shardings a
    jitted `init` propagates itself)."""
    for x in jax.tree.leaves(tree):
        mesh = getattr(getattr(x, "sharding", None), "mesh", None)
        if isinstance(mesh, jax.sharding.Mesh) and mesh.size > 1:
            kinds = mesh.axis_types
            if any(kind != jax.sharding.AxisType.Explicit for kind in kinds):
                return mesh
    return None


def _explicit_mesh(mesh: Any) -> Any:
    return jax.sharding.Mesh(
        mesh.devices,
        mesh.axis_names,
        axis_types=(jax.sharding.AxisType.Explicit,) * mesh.devices.ndim,
    )


def abstract_init(init: Callable, params: Any, param_shardings: Any, mesh: Any) -> Any:
    """`init(params)`'s abstract result (`jax.ShapeDtypeStruct`s), each array
    leaf carrying the sharding on `mesh` that `init` gives it from params laid
    out on `param_shardings` (a tree like `params`, `None` for replicated).

    Under explicit axes the sharding is part of each array's type, so
    `eqx.filter_eval_shape` on explicitly sharded stand-ins propagates it
    through `init` without computing anything: a moment, a stack of them
    (L-BFGS's memory) or a packed buffer gets the layout of what it is made
    from. (Under `jit` on automatic axes, a moment made by `jnp.zeros_like`
    does not depend on its parameter, and lands on one device.) Where `init`
    cannot run on explicit axes, the plain abstract result is given, without
    shardings (`eqopt.zero_plan` then splits each leaf by its rule alone).

    A leaf that `init` puts in host memory (`eqopt.offload`) carries the
    `pinned_host` memory kind: read from the traced value's type, as a
    `jax.ShapeDtypeStruct` keeps no memory space.
    """
    explicit = _explicit_mesh(mesh)
    traced: dict[str, Any] = {}

    def traced_init(params):
        result = init(params)
        traced["host"] = jax.tree.map(in_host_memory, result)
        return result

    def stand_in(x, sharding):
        if not isinstance(x, (jax.Array, jax.ShapeDtypeStruct, np.ndarray)):
            return x
        spec = jax.sharding.PartitionSpec() if sharding is None else sharding.spec
        named = jax.sharding.NamedSharding(explicit, spec)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=named)

    def on_mesh(x, host):
        if not isinstance(x, jax.ShapeDtypeStruct):
            return x
        spec = getattr(x.sharding, "spec", jax.sharding.PartitionSpec())
        kind = HOST_MEMORY if host else None
        named = jax.sharding.NamedSharding(mesh, spec, memory_kind=kind)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=named)

    stand_ins = jax.tree.map(
        stand_in, params, param_shardings, is_leaf=lambda x: x is None
    )
    try:
        with jax.set_mesh(explicit):
            abstract = eqx.filter_eval_shape(traced_init, stand_ins)
    except Exception:  # an `init` that needs automatic axes
        abstract = eqx.filter_eval_shape(traced_init, params)
        return jax.tree.map(
            lambda x, host: on_mesh(x, host) if host else x, abstract, traced["host"]
        )
    return jax.tree.map(on_mesh, abstract, traced["host"])
