"""Telling eqopt which leading axes of a bare array or a custom module are a stack of layers."""

from typing import Any

from .._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    OptState,
    Params,
    Updates,
)
from .._entry import init_entry, update_entry
from .._interop import as_transform
from .._layer_axes import StackAxesSpec, given_stack_axes
from .._typecheck import checked


@checked
class WithStackAxes(AbstractWrapper):
    r"""Runs `inner` with the stack axes you give for leaves eqopt cannot read them from.

    A leaf of a known Equinox layer stacked with `eqx.filter_vmap` (a scanned
    block: `(L, out, in)` for a `Linear` weight, `(L, d)` for its bias or a
    `LayerNorm` scale) already is its L layers: every per-layer computation
    (a trust ratio, a per-leaf norm or clip, Adafactor's factoring, Muon's
    orthogonalisation, a preconditioner) runs on each slice, batched. For a
    bare array or a field of your own module, eqopt cannot tell a stack from a
    bigger tensor: say it here, once. What you say wins over the layer.

    $$
    \text{per-layer } f \text{ on a leaf } x \text{ of } k \text{ stack axes:}\quad
    f(x)_{i_1 \ldots i_k} = f(x_{i_1 \ldots i_k})
    $$

    The state is `inner`'s own (read `state.mu` as without the wrapper).

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `inner`: the optimiser.
    - `stack_axes`: how many leading axes of each leaf are stack axes: an int
      for every leaf; a function of the leaf's path, as
      `jax.tree_util.keystr` writes it (`".blocks.weight"`), returning an int
      or `None`; or a prefix pytree of the params whose leaves are such ints,
      `None`s or functions. `None` means "as the layer says" (no stack for a
      bare array).

    !!! example

        ```python
        class Blocks(eqx.Module):   # a custom stacked module: (L, d, d) and (L, d)
            weight: jax.Array
            scale: jax.Array

        opt = eqopt.with_stack_axes(
            eqopt.lamb(1e-3),
            lambda path: 1 if path.startswith(".blocks") else None,
        )
        ```
    """

    inner: AbstractGradientTransformation
    stack_axes: StackAxesSpec

    def __init__(self, inner: Any, stack_axes: StackAxesSpec):
        self.inner = as_transform(inner)
        self.stack_axes = stack_axes

    @property
    def handles_packed(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.inner.handles_packed

    @init_entry
    def init(self, params: Params) -> OptState:
        with given_stack_axes(self.stack_axes):
            return self.inner.init(params)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: OptState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, OptState]:
        with given_stack_axes(self.stack_axes):
            return self.inner.update(updates, state, params, **extra_args)


@checked
def with_stack_axes(inner: Any, stack_axes: StackAxesSpec) -> WithStackAxes:
    """Builds `eqopt.WithStackAxes`: `inner` with the stack axes you give."""
    return WithStackAxes(inner, stack_axes)
