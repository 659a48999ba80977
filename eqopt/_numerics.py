"""Numerically careful scalar and moment helpers shared by the transforms."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Inexact, Int, PyTree, Real, Shaped

from ._deprecation import deprecated
from ._leaves import Updates, is_none
from ._typecheck import checked

# The per-leaf helpers below run once per leaf at trace time; their inputs were
# checked at the public `update`, so they skip the type-check wrapper (which
# would otherwise dominate tracing a model of thousands of small leaves).


_UNSIGNED = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


@no_type_check
def unfused(x, token):
    """`x` rounded to its dtype where the compiler cannot fuse it into a multiply-add.

    XLA's CPU and GPU backends contract `a * b + c` within a kernel into one
    fused multiply-add (rounded once instead of twice), and how a program is
    laid out (a ZeRO-1 plan, a mesh) changes which products share a kernel
    with their sum: the same moment update then differs in its last bit
    between two layouts. Float32 moments do not mind; a quantised moment
    rounded stochastically can change its code on that bit. Passing each
    product through `unfused` before the sum makes the sum the same in every
    layout. The barrier is an AND of the value's bits with a mask that is all
    ones whenever `token` (an integer the program computes, such as the step
    count, never negative) is not negative, so no compiler can fold it away;
    it costs two integer instructions per element.
    """
    x = jnp.asarray(x)
    unsigned = _UNSIGNED.get(x.dtype.itemsize)
    if unsigned is None or not jnp.issubdtype(x.dtype, jnp.floating):
        return x
    ones = jnp.asarray(jnp.iinfo(unsigned).max, unsigned)
    mask = jnp.where(token >= 0, ones, ones - 1)
    bits = jax.lax.bitcast_convert_type(x, unsigned) & mask
    return jax.lax.bitcast_convert_type(bits, x.dtype)


@no_type_check
def abs_squared(g):
    """$|g|^2 = g \\bar g$, real (in the real dtype of `g`) for complex `g`."""
    if jnp.iscomplexobj(g):
        return jnp.real(g) ** 2 + jnp.imag(g) ** 2
    return jnp.square(g)


@no_type_check
def debias(moment, correction):
    """One leaf of `bias_correction`: `moment / correction`, in the moment's dtype.

    `correction` is $1 - \\beta^t$, computed once per step rather than per leaf.
    """
    return moment / correction.astype(moment.dtype)


@checked
def safe_norm(
    x: Inexact[Array, "..."],
    min_norm: Float[ArrayLike, ""],
    ord: int | float | str | None = None,
    axis: int | tuple[int, ...] | None = None,
    keepdims: bool = False,
) -> Float[Array, "..."]:
    r"""The norm of `x`, floored at `min_norm`, with a gradient that is finite at zero.

    $$ \operatorname{safe\_norm}(x) = \max(\|x\|, m) $$

    Where $\|x\| \le m$ the norm is computed on a vector of ones instead, so the
    gradient there is exactly zero rather than NaN.

    **Arguments:**

    - `x`: the array.
    - `min_norm`: the floor $m$.
    - `ord`, `axis`, `keepdims`: as for `jnp.linalg.norm`.

    **Returns:** the floored norm, a real array.
    """
    norm = jnp.linalg.norm(x, ord=ord, axis=axis, keepdims=True)
    x = jnp.where(norm <= min_norm, jnp.ones_like(x), x)
    norm = jnp.squeeze(norm, axis=axis) if not keepdims else norm
    masked_norm = jnp.linalg.norm(x, ord=ord, axis=axis, keepdims=keepdims)
    return jnp.where(norm <= min_norm, min_norm, masked_norm)


@checked
def safe_root_mean_squares(
    x: Inexact[Array, "..."], min_rms: Float[ArrayLike, ""]
) -> Float[Array, ""]:
    r"""The root mean square of `x`, floored at `min_rms`, with a finite gradient at zero.

    $$ \max\Big(\sqrt{\tfrac{1}{n}\textstyle\sum_i |x_i|^2},\ m\Big) $$
    """
    rms = jnp.sqrt(jnp.mean(jnp.square(jnp.abs(x))))
    x = jnp.where(rms <= min_rms, jnp.ones_like(x), x)
    return jnp.where(
        rms <= min_rms, min_rms, jnp.sqrt(jnp.mean(jnp.square(jnp.abs(x))))
    )


@checked
def safe_increment(count: Shaped[Array, ""]) -> Shaped[Array, ""]:
    """Adds one to a counter, saturating at the largest value of its dtype.

    Integer counters stop at their maximum instead of wrapping to a negative
    number; floating counters stop at the largest finite value.
    """
    count = jnp.asarray(count)
    if jnp.issubdtype(count.dtype, jnp.integer):
        max_value = jnp.iinfo(count.dtype).max
    elif jnp.issubdtype(count.dtype, jnp.floating):
        max_value = jnp.finfo(count.dtype).max
    else:
        raise ValueError(
            f"safe_increment: a counter is an integer or a real number, got {count.dtype}."
        )
    # In the counter's dtype: the maximum of `uint32` is no `int32` Python int.
    max_value = jnp.array(max_value, dtype=count.dtype)
    one = jnp.array(1, dtype=count.dtype)
    return jnp.where(count < max_value, count + one, max_value)


@checked
def safe_int32_increment(count: Int[Array, ""]) -> Int[Array, ""]:
    """Adds one to an `int32` counter, saturating at `2**31 - 1`."""
    count = jnp.asarray(count)
    if count.dtype != jnp.int32:
        raise ValueError(
            f"safe_int32_increment expects an int32 counter, got {count.dtype}."
        )
    return safe_increment(count)


@checked
def bias_correction(
    moment: Updates,
    decay: Real[ArrayLike, ""],
    count: Int[ArrayLike, ""],
) -> Updates:
    r"""Divides an exponential moving average by $1 - \beta^t$ (Kingma & Ba, 2015).

    $$ \hat m_t = \frac{m_t}{1 - \beta^t} $$

    `None` leaves stay `None`; the result keeps each leaf's dtype.
    """
    correction = 1 - jnp.asarray(decay) ** jnp.asarray(count)
    return jax.tree.map(lambda t: debias(t, correction), moment)


@checked
def update_moment(
    updates: Updates,
    moments: Updates,
    decay: Real[ArrayLike, ""],
    order: int,
) -> Updates:
    r"""An exponential moving average of the `order`-th power of the updates.

    $$ m_t = \beta\, m_{t-1} + (1 - \beta)\, g_t^{\,k} $$

    `None` updates leave their moment unchanged.
    """
    return jax.tree.map(
        lambda g, t: t if g is None else (1 - decay) * (g**order) + decay * t,
        updates,
        moments,
        is_leaf=is_none,
    )


@checked
def update_moment_per_elem_norm(
    updates: Updates,
    moments: Updates,
    decay: Real[ArrayLike, ""],
    order: int,
) -> Updates:
    r"""An exponential moving average of $|g|^k$, real-valued for complex updates.

    $$ v_t = \beta\, v_{t-1} + (1 - \beta)\, |g_t|^{k} $$

    For complex $g$ the squared modulus is $g \bar g$ (Kingma & Ba, 2015, applied
    to the real and imaginary parts jointly). For real $g$ the power is taken
    directly, $g^k$, as Optax does: the same as $|g|^k$ for even $k$ (Adam's
    $k = 2$), signed for odd $k$. `None` updates leave their moment unchanged.
    """

    def order_th_norm(g):
        if not jnp.iscomplexobj(g):
            return g**order
        squared = abs_squared(g)
        return squared if order == 2 else jnp.power(squared, order / 2)

    return jax.tree.map(
        lambda g, t: t if g is None else (1 - decay) * order_th_norm(g) + decay * t,
        updates,
        moments,
        is_leaf=is_none,
    )


@checked
def update_infinity_moment(
    updates: Updates,
    moments: Updates,
    decay: Real[ArrayLike, ""],
    eps: Real[ArrayLike, ""],
) -> Updates:
    r"""The exponentially weighted infinity norm of AdaMax (Kingma & Ba, 2015, §7.1).

    $$ u_t = \max(\beta\, u_{t-1},\ |g_t| + \epsilon) $$
    """
    return jax.tree.map(
        lambda g, t: t if g is None else jnp.maximum(jnp.abs(g) + eps, decay * t),
        updates,
        moments,
        is_leaf=is_none,
    )


def tree_l2_norm(updates: PyTree[Any]) -> Float[Array, ""]:
    r"""The L2 norm of all the array leaves of a pytree taken together.

    $$ \|g\| = \sqrt{\textstyle\sum_{\ell} \sum_i |g_{\ell,i}|^2} $$

    Non-array leaves and `None` are ignored, so a whole Equinox model or the
    output of `eqx.filter_grad` can be passed directly.
    """
    leaves = [x for x in jax.tree.leaves(updates) if eqx.is_array(x)]
    if not leaves:
        return jnp.zeros((), jnp.float32)
    return jnp.sqrt(sum(jnp.sum(jnp.real(x * jnp.conj(x))) for x in leaves))


@deprecated("`eqopt.tree.norm`")
@checked
def global_norm(updates: PyTree[Any]) -> Float[Array, ""]:
    """The L2 norm of all the array leaves of a pytree (deprecated, as in Optax).

    Use `eqopt.tree.norm` (the same number).
    """
    return tree_l2_norm(updates)
