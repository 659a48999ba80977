"""The ZeRO-1 plan of a training run: `eqopt.zero_plan` and `eqopt.ZeroPlan`.

`zero_plan` applies the rule of `eqopt/_zero_rule.py` to the params too and reads
the state's layout from `init` on explicitly sharded stand-ins
(`_abstract_state`), so that a state leaf made from a parameter (a moment,
L-BFGS's stack of past differences, a packed buffer) is split like the
gradient it is combined with.
"""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._fused._bucketed import Bucketed
from ._leaves import is_none
from ._sharding import abstract_init
from ._typecheck import checked
from ._wrappers.offload import Offload
from ._zero import constrain, zero_shardings
from ._zero_rule import (
    MIN_SIZE,
    axes_of,
    axis_size,
    entries_of,
    is_array_like,
    pad_quantized,
    plan_leaves,
    reasons_of,
    shardings_of,
)


def _shardings_of(tree: Any, mesh: Mesh) -> Any:
    """The sharding of each array of `tree` on `mesh` (replicated where it has none)."""

    def sharding(x):
        if not is_array_like(x):
            return None
        entries = entries_of(getattr(x, "sharding", None), mesh, len(x.shape))
        return NamedSharding(mesh, PartitionSpec(*entries))

    return jax.tree.map(sharding, tree, is_leaf=is_none)


def _abstract_state(opt: Any, params: Any, param_shardings: Any, mesh: Mesh) -> Any:
    """The abstract state, each leaf carrying the sharding `opt.init` gives it
    from params laid out on `param_shardings` (`eqopt._sharding.abstract_init`)."""
    return abstract_init(opt.init, params, param_shardings, mesh)


@checked
class ZeroPlan(eqx.Module):
    r"""Where an optimiser's state lives under ZeRO-1, computed without building it.

    Made by `eqopt.zero_plan` from the optimiser, the params (or their
    abstract shapes) and the mesh. Each array leaf of the state keeps its
    parameter's sharding and is split over the data axis by the rule of
    `eqopt.zero_shardings`; the parameters and gradients keep their own
    layout. A step with data parallelism then reads, per device:

    $$
    g \xrightarrow{\text{own part}} g_i,\quad
    (u_i, s_i') = \operatorname{update}(g_i, s_i, p_i),\quad
    u = \operatorname{all\text{-}gather}(u_i)
    $$

    where $s_i$ is the device's $1/n$ of the state: the state is never whole on
    one device. Elementwise transforms compute exactly what they compute
    unsharded. Transforms that need a whole matrix (Muon's orthogonalisation,
    GaLore's SVD, the flat vector of `eqopt.flatten`) gather it first, so they
    give the same numbers too and communicate that matrix each step.

    With `opt = eqopt.offload(...)`, the state's shardings carry the
    `pinned_host` memory kind where `eqopt.offload` keeps a leaf in host
    memory: each device's shard of it lives in its own host memory, built
    there by `init` and kept there by `update`.

    **Fields:**

    - `mesh`, `axis`, `min_size`: as given to `eqopt.zero_plan`.
    - `param_shardings`: the params' own shardings (a pytree like the params).
    - `split_param_shardings`: the params' shardings split by the same rule as
      the state, on which `update` computes.
    - `state_shardings`: the ZeRO sharding of each array leaf of the state.
    - `abstract_state`: the state as `jax.ShapeDtypeStruct`s carrying those
      shardings (the target for restoring a checkpoint onto this mesh).
    - `unsplit`: `{path: reason}` for the state leaves left whole over `axis`.

    **References:**

    Rajbhandari, Rasley, Ruwase, He, *ZeRO: Memory Optimizations Toward Training
    Trillion Parameter Models*, SC 2020.

    !!! example

        ```python
        opt = eqopt.adam(1e-3)
        mesh = jax.make_mesh((jax.device_count(),), ("data",))
        plan = eqopt.zero_plan(opt, model, mesh, axis="data")
        state = plan.init(opt, model)  # already split: never whole on a device

        @eqx.filter_jit
        def step(opt, model, state, x, y):
            grads = eqx.filter_grad(loss_fn)(model, x, y)
            updates, state = plan.update(opt, grads, state, model)
            return eqopt.apply_updates(model, updates), state

        model, state = step(opt, model, state, x, y)
        ```
    """

    mesh: Mesh = eqx.field(static=True)
    axis: str | tuple[str, ...] = eqx.field(static=True)
    min_size: int = eqx.field(static=True)
    param_shardings: Any
    split_param_shardings: Any
    state_shardings: Any
    abstract_state: Any
    unsplit_leaves: tuple[tuple[str, str], ...] = eqx.field(static=True)

    @property
    def unsplit(self) -> dict[str, str]:
        """`{path: reason}` for the state leaves left whole over the axis."""
        return dict(self.unsplit_leaves)

    def init(self, opt: Any, params: Any) -> Any:
        """`opt.init(params)`, built straight into the ZeRO layout.

        One `jax.jit` with the state's shardings as `out_shardings`: each device
        allocates its own part of each leaf only, so the replicated state is
        never materialised (and an offloaded leaf's part is written to host
        memory, see `eqopt.offload`).
        """
        opt_arrays, opt_rest = eqx.partition(opt, eqx.is_array)
        arrays, rest = eqx.partition(params, eqx.is_array)
        outside: dict[str, Any] = {}

        def build(opt_arrays, arrays):
            transform = eqx.combine(opt_arrays, opt_rest)
            state = transform.init(eqx.combine(arrays, rest))
            state = constrain(self.pad_quantized(state), self.state_shardings)
            dynamic, outside["static"] = eqx.partition(state, eqx.is_array)
            leaves, outside["treedef"] = jax.tree.flatten(dynamic)
            return leaves

        out_shardings = jax.tree.leaves(self.state_shardings)
        with jax.set_mesh(self.mesh):
            leaves = jax.jit(build, out_shardings=out_shardings)(opt_arrays, arrays)
        dynamic = jax.tree.unflatten(outside["treedef"], leaves)
        return eqx.combine(dynamic, outside["static"])

    def shard(self, state: Any) -> Any:
        """An existing `state` moved onto (outside `jit`) or constrained to (inside)
        the ZeRO layout (its quantised moments padded to this plan's rows of
        codes: a state built by `opt.init`, or padded for another mesh)."""
        return constrain(self.pad_quantized(state), self.state_shardings)

    def pad_quantized(self, state: Any) -> Any:
        # Rows of codes to a multiple of the axis size (`pad_quantized`); nothing is
        # computed for a state that has them already.
        size = axis_size(self.mesh, axes_of(self.axis), "ZeroPlan")
        return pad_quantized(state, size, self.min_size)

    def update(
        self, opt: Any, updates: Any, state: Any, params: Any = None, **extra_args: Any
    ) -> tuple[Any, Any]:
        """`opt.update(updates, state, params, **extra_args)` inside a jitted step,
        with the gradients, params and returned updates on the params' own
        shardings and the state on its ZeRO shardings.

        Without these constraints, XLA is free to return the updates (and so the
        parameters) split like the state, and on explicit axes the next forward
        pass then fails.
        """
        # The gradients and params are cut like the state (on a replicated
        # gradient each device keeps its own part; XLA can fuse the data-parallel
        # all-reduce with this into a reduce-scatter), so that every array the
        # update combines is laid out alike.
        updates = constrain(updates, self.split_param_shardings)
        state = constrain(self.pad_quantized(state), self.state_shardings)
        if params is not None:
            params = constrain(params, self.split_param_shardings)
        extra_args = {
            name: self._split_like_params(value) for name, value in extra_args.items()
        }
        updates, state = opt.update(updates, state, params, **extra_args)
        return (
            constrain(updates, self.param_shardings),
            constrain(state, self.state_shardings),
        )

    def _split_like_params(self, value: Any) -> Any:
        # An extra argument shaped like the params (a line search's `grad`) is
        # cut like them; any other is passed as it is.
        shape = jax.tree.structure(self.split_param_shardings, is_leaf=is_none)
        if jax.tree.structure(value, is_leaf=is_none) != shape:
            return value
        return constrain(value, self.split_param_shardings)


@checked
def zero_plan(
    opt: Any,
    params: Any,
    mesh: Mesh,
    axis: str | Sequence[str] = "data",
    *,
    min_size: int = MIN_SIZE,
) -> ZeroPlan:
    """Plans ZeRO-1 for `opt` on `params`: see `eqopt.ZeroPlan`.

    Nothing is computed or allocated: the state's shapes come from
    `eqx.filter_eval_shape(opt.init, params)`.

    **Arguments:**

    - `opt`: the optimiser (any eqopt transform).
    - `params`: the params (a whole model), laid out as they will be trained
      (replicated for data parallelism, or with their own model-parallel
      shardings), or their abstract shapes (`jax.ShapeDtypeStruct`s, replicated
      unless they carry a sharding).
    - `mesh`: the `jax.sharding.Mesh`, with automatic or explicit axes.
    - `axis`: the data axis (or tuple of axes) to split the state over.
    - `min_size`: state leaves with fewer elements are not split.

    **Returns:**

    An `eqopt.ZeroPlan`.
    """
    axes = axes_of(axis)
    size = axis_size(mesh, axes, "zero_plan")
    param_shardings = _shardings_of(params, mesh)
    split_params = zero_shardings(params, mesh, axes, min_size=min_size)
    abstract = pad_quantized(
        _abstract_state(opt, params, split_params, mesh), size, min_size
    )
    plans = plan_leaves(abstract, mesh, axes, min_size, "zero_plan")
    state_shardings = shardings_of(plans)
    abstract_state = jax.tree.map(
        lambda x, sharding: (
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
            if isinstance(x, jax.ShapeDtypeStruct)
            else x
        ),
        abstract,
        state_shardings,
        is_leaf=is_none,
    )
    if isinstance(opt.inner if isinstance(opt, Offload) else opt, Bucketed):
        # Bucketed state packs the gradients into buffers first: they are
        # concatenated as laid out, and the state's split buffers cut the result.
        split_params = param_shardings
    return ZeroPlan(
        mesh=mesh,
        axis=axes[0] if len(axes) == 1 else axes,
        min_size=min_size,
        param_shardings=param_shardings,
        split_param_shardings=split_params,
        state_shardings=state_shardings,
        abstract_state=abstract_state,
        unsplit_leaves=reasons_of(plans),
    )
