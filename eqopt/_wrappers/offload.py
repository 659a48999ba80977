"""Optimiser state kept in host memory between steps: `eqopt.offload`."""

from typing import Any, ClassVar

import equinox as eqx
import jax

from .. import _backend
from .._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    OptState,
    Params,
    Updates,
)
from .._entry import init_entry, update_entry
from .._interop import as_transform
from .._leaves import InputError
from .._quantize import is_quantized
from .._sharding import abstract_init, auto_mesh, in_host_memory, to_memory
from .._typecheck import checked

#: State leaves with fewer elements than this stay in device memory by default:
#: a transfer has a fixed cost (a DMA's set-up, microseconds) that a few
#: kilobytes do not pay for, and a transformer's biases and norms are a few
#: thousandths of its state. The same threshold keeps a leaf in float32 under
#: `eqopt.Quantized` (`min_size`, 4096).
MIN_SIZE = 4096


def _moved(tree: Any, host: bool, min_size: int) -> Any:
    """`tree` with its arrays of at least `min_size` elements moved to host
    memory (`host=True`), or with every array in host memory moved to the
    device (`host=False`). A quantised moment moves whole (its codes and
    scales), counted by its elements.

    Scalars (step counts) always stay on the device: four bytes save nothing,
    and under `jit` JAX 0.10 matches a donated buffer to an output of the same
    shape and dtype whatever their memory (`docs/memory.md`, "State in host
    memory"): a host count was given to `eqx.filter_jit`'s int32 marker.
    """

    def move(x):
        if is_quantized(x):
            if host and x.size < min_size:
                return x
            return jax.tree.map(lambda a: move_array(a, 0), x)
        return move_array(x, min_size)

    def move_array(x, min_size):
        if not isinstance(x, jax.Array):
            return x  # None, a NumPy hyperparameter (`eqopt.on_host`), ...
        if host:
            return to_memory(x, True) if x.ndim and x.size >= min_size else x
        return to_memory(x, False) if in_host_memory(x) else x

    return jax.tree.map(move, tree, is_leaf=is_quantized)


def _on(mesh: Any, x: Any) -> bool:
    return getattr(getattr(x, "sharding", None), "mesh", None) == mesh


def _is_abstract(x: Any) -> bool:
    return isinstance(x, jax.ShapeDtypeStruct)


def _check_backend() -> None:
    reason = _backend.lacks_host_memory()
    if reason is not None:
        raise InputError(
            f"eqopt.offload: {reason}, so the state cannot be kept in host "
            "memory; keep it on the device (drop `eqopt.offload`)."
        )


@checked
class Offload(AbstractWrapper):
    r"""Keeps the inner optimiser's state in host memory between steps.

    A layout policy over the same typed state, as ZeRO-1 and quantised
    moments are: the state *is* the inner optimiser's (`state[0].mu`,
    `state.scale_by_adam.mu` read the same), with each array leaf of at least
    `min_size` elements placed in the device's pinned host memory
    (`memory_kind == "pinned_host"`). Inside the caller's jitted step,
    `update` moves those leaves to device memory, runs the inner update, and
    moves the new state back:

    $$
    s_{\text{dev}} = \operatorname{to\_device}(s_{\text{host}}),\quad
    (u, s'_{\text{dev}}) = \operatorname{inner.update}(g, s_{\text{dev}}, p),\quad
    s'_{\text{host}} = \operatorname{to\_host}(s'_{\text{dev}})
    $$

    So between steps the device holds none of the offloaded state, and the
    numbers are the inner optimiser's, bit for bit: the transfers are copies.
    Each step pays the state's bytes across the host link twice (see the
    Memory page for when that pays).

    - **`init`** builds the state straight into host memory: the inner `init`
      runs in one `jax.jit` whose outputs are placed on the host, so the state
      is never materialised in device memory outside that program.
    - **Composes** with every other policy: under `eqopt.zero_plan` each
      device keeps its own shard on its host (the plan's shardings carry the
      `pinned_host` memory kind), quantised moments move as codes and scales,
      `eqopt.master_weights`' float32 copy moves with the moments, and packed
      or bucketed state moves as whole buffers.
    - **Small leaves** (fewer than `min_size` elements: biases, norms) and
      scalars (the step count) stay in device memory.
    - **Checkpoints** save as any state; `to_host` puts a state restored onto
      the device back in host memory. Before a step that donates the state,
      it must be there (see below); a step that does not donate it also takes
      it on the device (`update` returns it on the host).

    - **Donating the state** (`eqx.filter_jit(donate=...)`): JAX 0.10 pairs
      each donated input with an output of the same shape and dtype, in order,
      without reading memory kinds when the `jit` has no `out_shardings`. A
      step that takes and returns the model and the state in the same order
      (as below) pairs each buffer with its own output; one that returns the
      state before the model, or takes a state that is on the device, can
      pair buffers in different memories, which fails. Keep that order and
      the state in host memory, or do not donate.

    On a CPU, host and device memory are the same RAM: the state carries the
    `pinned_host` kind and the transfers compile to nothing. Needs a backend
    whose devices have `pinned_host` memory (GPU, TPU, CPU); elsewhere `init`
    and `update` raise.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `inner`: the optimiser whose state to keep in host memory (put
      `offload` outermost, around the whole optimiser).
    - `min_size`: state leaves with fewer elements stay in device memory
      (default 4096; 0 offloads every array but scalars).

    !!! example

        ```python
        opt = eqopt.offload(eqopt.adamw(1e-3))
        state = opt.init(model)  # built in host memory
        state[0].mu.layers[0].weight.sharding.memory_kind  # 'pinned_host'

        @eqx.filter_jit
        def step(opt, model, state, x, y):
            grads = eqx.filter_grad(loss_fn)(model, x, y)
            updates, state = opt.update(grads, state, model)
            return eqopt.apply_updates(model, updates), state

        model, state = step(opt, model, state, x, y)  # state back on the host
        ```

    **References:** JAX documentation, *Host offloading* (memory kinds,
    `jax.device_put` to `pinned_host` inside `jit`); MaxText's
    `optimizer_memory_host_offload`; Ren et al., *ZeRO-Offload: Democratizing
    Billion-Scale Model Training*, USENIX ATC 2021 (which also runs the step
    on the CPU: here it runs on the device).
    """

    inner: AbstractGradientTransformation
    min_size: int = eqx.field(static=True)

    # Packed params pass on to the inner optimiser, whose entry unpacks them
    # for a part that does not run on buffers.
    handles_packed: ClassVar[bool] = True

    def __init__(self, inner: Any, min_size: int = MIN_SIZE):
        self.inner = as_transform(inner)
        self.min_size = min_size

    def __check_init__(self):
        if self.min_size < 0:
            raise ValueError(
                f"eqopt.offload: min_size={self.min_size}; pass the fewest elements "
                "a state leaf needs to be kept in host memory, 0 or more."
            )

    # -- Placement --------------------------------------------------------------

    def to_host(self, state: OptState) -> OptState:
        """`state` with its leaves of at least `min_size` elements in host memory
        (a copy outside `jit`, a transfer inside): for a state restored from a
        checkpoint onto the device, or built by the inner optimiser's `init`."""
        return _moved(state, True, self.min_size)

    def to_device(self, state: OptState) -> OptState:
        """`state` with every leaf that is in host memory moved to device memory."""
        return _moved(state, False, self.min_size)

    def _host_init(self, params: Params) -> OptState:
        return self.to_host(self.inner.init(params))

    @init_entry
    def init(self, params: Params) -> OptState:
        _check_backend()
        arrays, rest = eqx.partition(params, eqx.is_array)
        outside: dict[str, Any] = {}

        def build(arrays):
            state = self._host_init(eqx.combine(arrays, rest))
            dynamic, outside["static"] = eqx.partition(state, eqx.is_array)
            leaves, outside["treedef"] = jax.tree.flatten(dynamic)
            return leaves

        # One program: each leaf is written to host memory by the computation
        # that makes it, never held in device memory between programs. On
        # automatic axes its sharding is read from `init` on explicit
        # stand-ins (under `jit` a moment made by `zeros_like` would land on
        # one device, where an eager `init` keeps its parameter's sharding).
        out_shardings = None
        mesh = auto_mesh(arrays)
        if mesh is not None:
            placed = jax.tree.map(
                lambda x: x.sharding if _on(mesh, x) else None, arrays
            )
            abstract = abstract_init(self._host_init, params, placed, mesh)
            out_shardings = [
                x.sharding for x in jax.tree.leaves(eqx.filter(abstract, _is_abstract))
            ]
            if any(sharding is None for sharding in out_shardings):
                out_shardings = None  # an `init` that needs automatic axes
        leaves = jax.jit(build, out_shardings=out_shardings)(arrays)
        dynamic = jax.tree.unflatten(outside["treedef"], leaves)
        return eqx.combine(dynamic, outside["static"])

    @update_entry
    def update(
        self,
        updates: Updates,
        state: OptState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, OptState]:
        _check_backend()
        updates, state = self.inner.update(
            updates, self.to_device(state), params, **extra_args
        )
        return updates, self.to_host(state)


@checked
def offload(inner: Any, *, min_size: int = MIN_SIZE) -> Offload:
    """Keeps `inner`'s state in host memory between steps: see `eqopt.Offload`."""
    return Offload(inner, min_size=min_size)
