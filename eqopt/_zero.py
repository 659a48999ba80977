"""Optimiser state sharded over the data axis of a mesh (ZeRO stage 1).

In data-parallel training every device holds the whole model, and by default
the whole optimiser state: Adam's two moments are twice the model, on every
device. ZeRO-1 (Rajbhandari et al., 2020) splits the *state* over the devices
of the data axis, so that each holds $1/n$ of it, while the parameters and
gradients keep their own layout. eqopt owns its state, so the layout is one
call: these helpers compute shardings and constraints, and JAX's own engine
(`jit` with shardings, `jax.distributed`, Orbax) moves the bytes.

The rule (which dimension of each leaf takes the data axis) is in
`eqopt/_zero_rule.py`; The plan of a training run (`eqopt.zero_plan`, `eqopt.ZeroPlan`) is in
`eqopt/_zero_plan.py`.
"""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.core
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding

from ._leaves import is_none
from ._sharding import host_kind, to_memory
from ._typecheck import checked
from ._zero_rule import (
    MIN_SIZE,
    axes_of,
    axis_size,
    pad_quantized,
    plan_leaves,
    reasons_of,
    shardings_of,
)


@checked
def zero_shardings(
    state: Any,
    mesh: Mesh | AbstractMesh,
    axis: str | Sequence[str] = "data",
    *,
    min_size: int = MIN_SIZE,
) -> Any:
    """The ZeRO-1 sharding of each array leaf of an optimiser state.

    Each array leaf keeps the sharding it has on `mesh` (its parameter's), and
    the `axis` of the mesh is added to its first dimension that divides evenly
    by the axis size and is not already sharded. Scalars, leaves smaller than
    `min_size` elements and leaves with no such dimension keep their layout
    (`eqopt.zero_unsplit` lists them); a leaf already sharded over `axis`
    is left as it is.

    **Arguments:**

    - `state`: an optimiser state, or the abstract one from
      `eqx.filter_eval_shape(opt.init, params)` (`jax.ShapeDtypeStruct` leaves,
      which `eqx.is_array` does not count as arrays; they are counted here).
    - `mesh`: the `jax.sharding.Mesh` (or a `jax.sharding.AbstractMesh`, to
      plan without devices).
    - `axis`: the mesh axis (or tuple of axes) to split the state over.
    - `min_size`: leaves with fewer elements are not split.

    **Returns:**

    A pytree shaped like `state` with a `jax.sharding.NamedSharding` at every
    array leaf and `None` elsewhere, for `jax.device_put`, `eqx.filter_shard`
    or the `out_shardings` of `jax.jit`.

    **References:**

    Rajbhandari, Rasley, Ruwase, He, *ZeRO: Memory Optimizations Toward Training
    Trillion Parameter Models*, SC 2020.
    """
    return shardings_of(plan_leaves(state, mesh, axis, min_size, "zero_shardings"))


@checked
def zero_unsplit(
    state: Any,
    mesh: Mesh | AbstractMesh,
    axis: str | Sequence[str] = "data",
    *,
    min_size: int = MIN_SIZE,
) -> dict[str, str]:
    """The array leaves of `state` that `eqopt.zero_shardings` leaves whole
    over `axis`, each with the reason: `{path: reason}`.

    Arguments as for `eqopt.zero_shardings`.
    """
    return dict(reasons_of(plan_leaves(state, mesh, axis, min_size, "zero_unsplit")))


def constrain(tree: Any, shardings: Any) -> Any:
    """Places each array of `tree` on the sharding at the same place in `shardings`.

    Outside `jit` this is `jax.device_put`; inside, a sharding constraint
    (`jax.lax.with_sharding_constraint` on automatic axes, `jax.sharding.reshard`
    on explicit ones), then a transfer to host memory where the sharding's
    memory kind is a host one (`eqopt.offload`); an array in host memory
    stays there. Leaves of `tree` that are not arrays, or where
    `shardings` has `None`, are returned unchanged; `tree` may have `None`
    where `shardings` has a sharding (a gradient that `eqx.filter_grad` did not
    compute).

    **Arguments:**

    - `tree`: a pytree (a state, gradients, updates, params).
    - `shardings`: a pytree shaped like `tree` with a sharding or `None` at each
      leaf, such as `eqopt.zero_shardings` or `eqopt.ZeroPlan`'s fields.

    **Returns:**

    `tree` with its arrays laid out on `shardings`.
    """

    def place(sharding, x):
        if sharding is None or not eqx.is_array(x):
            return x
        if isinstance(x, jax.core.Tracer):
            # The constraints keep an array's memory but do not move it.
            host = host_kind(sharding) is not None
            if host:
                sharding = NamedSharding(sharding.mesh, sharding.spec)
            if _explicit(sharding):
                x = jax.sharding.reshard(x, sharding)
            else:
                x = jax.lax.with_sharding_constraint(x, sharding)
            return to_memory(x, True) if host else x
        return jax.device_put(x, sharding)

    return jax.tree.map(place, shardings, tree, is_leaf=is_none)


def _explicit(sharding: Any) -> bool:
    mesh = sharding.mesh
    return any(kind == AxisType.Explicit for kind in mesh.axis_types)


@checked
def shard_state(
    state: Any,
    mesh: Mesh,
    axis: str | Sequence[str] = "data",
    *,
    min_size: int = MIN_SIZE,
) -> Any:
    """`state` laid out on its `eqopt.zero_shardings`: ZeRO-1 for a state built
    already (outside `jit`; to build it straight into this layout without
    materialising it whole, use `eqopt.zero_plan`). A quantised moment whose
    block count does not divide the axis size is first padded with rows that
    decode to zero, as `eqopt.zero_plan` pads it.

    Arguments as for `eqopt.zero_shardings`; returns the state.
    """
    size = axis_size(mesh, axes_of(axis), "shard_state")
    state = pad_quantized(state, size, min_size)
    return constrain(state, zero_shardings(state, mesh, axis, min_size=min_size))
