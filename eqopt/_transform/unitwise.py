"""Unit-wise norms and clipping, the building blocks of adaptive gradient clipping."""

from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Inexact

from .._typecheck import checked
from .block import _unit_axes, _unitwise_norm


@checked
def unitwise_norm(
    x: ArrayLike, axis: int | tuple[int, ...] | None = None
) -> Inexact[Array, "..."]:
    r"""The L2 norm of each unit of an array, broadcast back to the array's shape.

    A unit is one output neuron or channel of a layer: the slice of `x` whose
    norm is taken over `axis`,

    $$ \|x_i\| = \Big(\sum_{j \in \text{axis}} |x_{ij}|^2\Big)^{1/2}. $$

    Without `axis`, the axes follow the usual layouts: the whole array for a
    scalar or a vector (also shaped `(1, n)`), axis 0 for a linear layer's
    `(in, out)` weight and a `(in, heads, out)` one, axes `(0, 1, 2)` for a
    2-D convolution's `(h, w, in, out)` kernel and `(0, 1, 2, 3)` for a 3-D
    one's.

    **Arguments:**

    - `x`: the array.
    - `axis`: the axes of one unit's norm; `None` for the layouts above.

    **Returns:** an array shaped like `x`, each element replaced by its unit's
    norm.

    **References:** Brock, De, Smith & Simonyan, *High-Performance Large-Scale
    Image Recognition Without Normalization*, ICML 2021 (unit-wise ratios).
    """
    x = jnp.asarray(x)
    axes = _unit_axes(x, axis)
    if axes == "no rule":
        raise ValueError(
            f"unitwise_norm: an array of shape {tuple(x.shape)} has no rule for "
            "its units (arrays of up to 5 dimensions have one): pass `axis=`."
        )
    return _unitwise_norm(x, axes)


@checked
def unitwise_clip(
    g_norm: ArrayLike, max_norm: ArrayLike, grad: ArrayLike, div_eps: Any = 1e-6
) -> Inexact[Array, "..."]:
    r"""Clips each unit of a gradient to a maximum norm.

    $$
    g_i \mapsto \begin{cases}
      g_i & \text{if } \|g_i\| < m_i \\
      m_i\, g_i / \max(\|g_i\|, \delta) & \text{otherwise}
    \end{cases}
    $$

    **Arguments:**

    - `g_norm`: $\|g_i\|$, the unit-wise norms of the gradient
      (`eqopt.transforms.unitwise_norm`), shaped like `grad`.
    - `max_norm`: $m_i$, the largest norm allowed per unit, shaped like `grad`.
    - `grad`: the gradient.
    - `div_eps`: $\delta$, keeping the division finite.

    **Returns:** the clipped gradient, shaped like `grad`.

    **References:** Brock, De, Smith & Simonyan, *High-Performance Large-Scale
    Image Recognition Without Normalization*, ICML 2021.
    """
    g_norm, max_norm, grad = (
        jnp.asarray(g_norm),
        jnp.asarray(max_norm),
        jnp.asarray(grad),
    )
    if not g_norm.shape == max_norm.shape == grad.shape:
        raise ValueError(
            "unitwise_clip: `g_norm`, `max_norm` and `grad` must have one shape, got "
            f"{tuple(g_norm.shape)}, {tuple(max_norm.shape)} and {tuple(grad.shape)}."
        )
    clipped = grad * (max_norm / jnp.maximum(g_norm, div_eps))
    return jnp.where(g_norm < max_norm, grad, clipped)
