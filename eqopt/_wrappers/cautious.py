"""Cautious updates: `cautious`, which keeps an optimiser's update only where it agrees with the gradient."""

from typing import Any, Literal, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp

from .._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    Params,
    Updates,
    is_none,
)
from .._entry import init_entry, update_entry
from .._interop import as_transform
from .._leafwise import leafwise
from .._optax_tuple import OptaxTuple
from .._typecheck import checked

Rescale = Literal["leaf", "global", "none"]
_RESCALES = ("leaf", "global", "none")


@checked
class CautiousState(eqx.Module, OptaxTuple):
    """The state of `eqopt.Cautious`: the wrapped optimiser's state (no state of its own)."""

    inner_state: Any


@no_type_check
def _agrees(u, g, descent):
    """Where the update moves against (or with) the gradient, as float32 0/1.

    Counted in float32 whatever the dtype: a bfloat16 sum is not exact past 256.
    """
    product = jnp.real(jnp.conj(u) * g)
    agree = product < 0 if descent else product > 0
    return agree.astype(jnp.float32)


@checked
class Cautious(AbstractWrapper):
    r"""Applies an optimiser's update only where it agrees in sign with the gradient.

    With $u_t$ the wrapped optimiser's step direction and $g_t$ the gradient,
    coordinates where the two disagree are dropped and the others scaled up so
    that the step keeps its size on average:

    $$
    \phi_t = \mathbb{1}\big[u_t \odot g_t > 0\big], \qquad
    \tilde u_t = \frac{d}{\|\phi_t\|_0 + 1}\; u_t \odot \phi_t
    $$

    where $d$ is the number of coordinates the count runs over. Each kept
    coordinate then decreases the loss to first order: the step is a descent
    direction whatever the momentum was.

    **Where $d$ and $\|\phi_t\|_0$ are counted** (`rescale`): the paper writes
    the rule for the whole parameter vector, but its PyTorch code, like
    `pytorch-optimizer`, heavyball and timm, applies it to each parameter
    tensor. `"leaf"` (default) counts per leaf, as that code does, so the
    wrapper is not elementwise; `"global"` counts over all leaves (then it is
    elementwise exactly when the wrapped optimiser is); `"none"` only masks.
    heavyball scales by $d / \max(\|\phi_t\|_0, 1)$ instead of
    $d / (\|\phi_t\|_0 + 1)$ (see `tests/test_cautious.py`); eqopt follows the
    paper's Algorithm 2.

    **Sign convention** (`descent`): an eqopt optimiser such as
    `eqopt.adamw` returns the step to *add* to the parameters, which points
    against the gradient, so by default a coordinate is kept where
    $-\tilde u_t$ and $g_t$ agree. To wrap a direction that is later scaled by
    a negative learning rate (a `scale_by_*` transform inside a
    `eqopt.chain`), pass `descent=False`. That is also how to leave weight
    decay unmasked, as the paper's C-AdamW does: put
    `eqopt.add_decayed_weights` after the wrapper (see the example).
    Complex updates compare $\operatorname{Re}(\bar u_t g_t)$.

    !!! example

        ```python
        # C-AdamW as in the paper: Adam's direction masked, weight decay not.
        opt = eqopt.chain(
            eqopt.cautious(eqopt.scale_by_adam(), descent=False),
            eqopt.add_decayed_weights(0.1),
            eqopt.scale_by_learning_rate(1e-3),
        )
        # Or any whole optimiser (its weight decay is masked too):
        opt = eqopt.cautious(eqopt.lion(1e-4))
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        ```

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each slice,
    batched, as on the list of those layers. With `rescale="global"` or `"none"` its
    kind is its inner optimiser's.

    **Arguments:**

    - `inner`: the optimiser or transform to wrap; it sees the gradients and
      keeps its own state (`state.inner_state`).
    - `rescale`: `"leaf"`, `"global"` or `"none"`, as above.
    - `descent`: whether `inner` returns steps to add to the parameters
      (default) or ascent directions.

    **References:** Liang, Chen, Liu & Liu, *Cautious Optimizers: Improving
    Training with One Line of Code*, arXiv:2411.16085, 2024.
    """

    inner: AbstractGradientTransformation
    rescale: Rescale = eqx.field(default="leaf", static=True)
    descent: bool = eqx.field(default=True, static=True)

    def __init__(self, inner: Any, rescale: Rescale = "leaf", descent: bool = True):
        self.inner = as_transform(inner)
        self.rescale = rescale
        self.descent = descent

    def __check_init__(self):
        super().__check_init__()
        if self.rescale not in _RESCALES:
            raise ValueError(
                f"Cautious: `rescale` must be one of {_RESCALES}, got {self.rescale!r}."
            )

    @property
    def elementwise(self) -> bool:
        # The global count is the same on split and concatenated leaves.
        return self.rescale != "leaf" and self.inner.elementwise

    @property
    def runs_on_buffers(self) -> bool:
        return self.rescale != "leaf" and self.inner.runs_on_buffers

    @init_entry
    def init(self, params: Params) -> CautiousState:
        return CautiousState(inner_state=self.inner.init(params))

    @update_entry
    def update(
        self,
        updates: Updates,
        state: CautiousState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, CautiousState]:
        inner_updates, inner_state = self.inner.update(
            updates, state.inner_state, params, **extra_args
        )
        descent = self.descent

        @no_type_check
        def mask(u, g):
            if u is None or g is None:
                return None
            return _agrees(u, g, descent)

        masks = jax.tree.map(mask, inner_updates, updates, is_leaf=is_none)
        if self.rescale == "global":
            leaves = [m for m in jax.tree.leaves(masks) if eqx.is_array(m)]
            size = sum(m.size for m in leaves)
            kept = sum((jnp.sum(m) for m in leaves), jnp.zeros([], jnp.float32))
            factor = size / (kept + 1)

        @no_type_check
        def apply(u, m):
            if m is None:
                return u
            if self.rescale == "leaf":
                scale = m * (m.size / (jnp.sum(m) + 1))
            elif self.rescale == "global":
                scale = m * factor
            else:
                scale = m
            return (u * scale.astype(u.dtype)).astype(u.dtype)

        out = leafwise(apply, inner_updates, masks)
        return out, CautiousState(inner_state=inner_state)


@checked
def cautious(
    inner: Any, rescale: Rescale = "leaf", *, descent: bool = True
) -> Cautious:
    """Lowercase spelling of `eqopt.Cautious`."""
    return Cautious(inner, rescale=rescale, descent=descent)
