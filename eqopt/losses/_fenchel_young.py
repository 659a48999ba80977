"""Fenchel-Young losses, and the sparsemax losses that are instances of them."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Real

from .._typecheck import checked
from ._utils import class_indices, nan_where, same_shapes


class _FenchelYoungLoss(eqx.Module):
    """A Fenchel-Young loss built from a max function; see `make_fenchel_young_loss`."""

    max_fun: Callable[..., Any]

    def __call__(
        self,
        scores: Float[ArrayLike, "*batch dim"],
        targets: Float[ArrayLike, "*batch dim"],
        *args: Any,
        **kwargs: Any,
    ) -> Float[Array, "*batch"]:
        scores = jnp.asarray(scores)
        targets = jnp.asarray(targets)
        batch_shape = scores.shape[:-1]

        def regularised_max(vector):
            value = jnp.asarray(self.max_fun(vector, *args, **kwargs))
            if value.shape != ():
                raise ValueError(
                    "`max_fun` must map a vector to a scalar; it returned shape "
                    f"{value.shape} for a vector of shape {vector.shape}."
                )
            return value

        flat_scores = scores.reshape(-1, scores.shape[-1])
        maxima = jax.vmap(regularised_max)(flat_scores).reshape(batch_shape)
        return maxima - jnp.sum(scores * targets, axis=-1)


@checked
def make_fenchel_young_loss(
    max_fun: Callable[..., Any],
) -> Callable[..., Float[Array, "..."]]:
    r"""Builds the Fenchel-Young loss of a regularised max function.

    Given a convex "regularised max" $\Omega^*(\theta) = \max_{\mu \in
    \operatorname{dom}\Omega} \langle \theta, \mu \rangle - \Omega(\mu)$ (for
    example `jax.nn.logsumexp`, the conjugate of the negative entropy), the loss
    of scores $\theta$ against a target $y$ in the domain of $\Omega$ is

    $$ L_\Omega(\theta; y) = \Omega^*(\theta) - \langle \theta, y \rangle $$

    dropping the constant $\Omega(y)$. Its gradient is
    $\nabla\Omega^*(\theta) - y$, the regularised prediction minus the target.
    With `logsumexp` it is the softmax cross-entropy.

    The returned loss is called as `loss(scores, targets, *args, **kwargs)`;
    `scores` and `targets` have shape `(*batch, dim)`, `max_fun` is applied to
    each vector of shape `(dim,)` (with the extra arguments) and must return a
    scalar, and the result has shape `(*batch,)`. It is an `equinox.Module`
    whose only field is `max_fun`, so two losses built from the same function
    compare and hash equal, and `jit` does not recompile for a new one.

    **Arguments:**

    - `max_fun`: the regularised max function $\Omega^*$, mapping a vector to a
      scalar.

    **Returns:**

    The Fenchel-Young loss, a callable module.

    **References:**

    Blondel, Martins & Niculae, *Learning with Fenchel-Young Losses*, JMLR 2020.
    """
    return _FenchelYoungLoss(max_fun)


def _sparse_plus(x):
    r"""$\max_{p \in [0, 1]} p x - (p^2 - p)$: 0, then $(x + 1)^2 / 4$, then $x$."""
    # Clipping (rather than a second `where`) keeps infinite inputs out of the
    # quadratic branch's gradient.
    return jnp.where(x >= 1, x, jnp.square(jnp.clip(x, -1, 1) + 1) / 4)


@same_shapes("logits", "labels")
@checked
def sparsemax_loss(
    logits: Float[ArrayLike, "*shape"],
    labels: Real[ArrayLike, "*shape"] | Bool[ArrayLike, "*shape"],
) -> Float[Array, "*shape"]:
    r"""The binary sparsemax loss, the Fenchel-Young loss of the sparse sigmoid.

    The sparse sigmoid $\operatorname{clip}((x + 1)/2, 0, 1)$ is the prediction
    for the regulariser $\Omega(p) = p^2 - p$ on $[0, 1]$, whose conjugate is
    the "sparse plus" $\Omega^*(x) = 0$ for $x \le -1$, $(x+1)^2/4$ for
    $|x| < 1$ and $x$ for $x \ge 1$. For a label $y \in \{0, 1\}$,

    $$ \ell(x, y) = \Omega^*(x) - x y = \Omega^*\big((1 - 2y)\,x\big) $$

    which is zero exactly when the sparse sigmoid of $x$ equals $y$. The second
    form is used, so logits of $\pm\infty$ on the side of the label give 0. No
    axis is reduced; `labels` must have exactly the shape of `logits` (Optax
    broadcasts them).

    **Arguments:**

    - `logits`: the scores of the positive class, a floating array.
    - `labels`: labels 0 or 1, of the same shape: integers, floats or
        booleans. As in Optax, any label other than 0 counts as 1.

    **Returns:**

    The losses, with the shape of `logits`.

    **References:**

    Blondel, Martins & Niculae, *Learning with Fenchel-Young Losses*, JMLR 2020,
    §4.4.
    """
    logits = jnp.asarray(logits)
    positive = jnp.asarray(labels) != 0
    return _sparse_plus(jnp.where(positive, -logits, logits))


def _sparsemax_threshold(scores):
    r"""The threshold $\tau$ with $\sum_c \max(z_c - \tau, 0) = 1$, over the last axis."""
    num_classes = scores.shape[-1]
    descending = -jnp.sort(-scores, axis=-1)
    partial_sums = jnp.cumsum(descending, axis=-1)
    ranks = jnp.broadcast_to(
        jnp.arange(1, num_classes + 1, dtype=scores.dtype), scores.shape
    )
    in_support = 1 + ranks * descending > partial_sums
    support_size = jnp.sum(in_support, axis=-1, keepdims=True)
    support_sum = jnp.take_along_axis(partial_sums, support_size - 1, axis=-1)
    return (support_sum - 1) / support_size.astype(scores.dtype)


@same_shapes("scores[:-1]", "labels")
@checked
def multiclass_sparsemax_loss(
    scores: Float[ArrayLike, "*batch classes"],
    labels: Int[ArrayLike, "*batch"],
) -> Float[Array, "*batch"]:
    r"""The multiclass sparsemax loss.

    Sparsemax is the Euclidean projection of the scores $z$ onto the simplex,
    $p_c = \max(z_c - \tau(z), 0)$, with support $S(z) = \{c : p_c > 0\}$. Its
    loss for a class $k$ is

    $$ \ell(z, k) = -z_k + \tfrac12 \sum_{c \in S(z)} \big(z_c^2 -
       \tau(z)^2\big) + \tfrac12
       = \langle p, z \rangle - \tfrac12 \|p\|^2 + \tfrac12 - z_k $$

    the Fenchel-Young loss of $\tfrac12\|p\|^2$ on the simplex. It is zero
    exactly when sparsemax puts all its mass on $k$, and its gradient is
    $\operatorname{sparsemax}(z) - e_k$.

    The loss does not change when a constant is added to every score. It is
    computed, in the second form, on the scores shifted to a maximum of zero,
    which keeps it exact for scores of any size (the first form subtracts
    squares of the scores and loses everything to rounding in float32 once the
    scores reach about $10^4$).

    **Arguments:**

    - `scores`: the class scores, of shape `(*batch, classes)`.
    - `labels`: integer class indices in `[0, classes)`, of shape `(*batch,)`.
      A label outside that range (`-1` too) gives a NaN loss for its example
      (and a zero gradient), where Optax silently reads some class.

    **Returns:**

    The losses, of shape `(*batch,)`.

    **References:**

    Martins & Astudillo, *From Softmax to Sparsemax: A Sparse Model of
    Attention and Multi-Label Classification*, ICML 2016 (eq. 14).
    """
    scores = jnp.asarray(scores)
    indices, out_of_range = class_indices(jnp.asarray(labels), scores.shape[-1])
    # The loss is unchanged by adding a constant to every score, so the scores
    # are shifted to a maximum of 0 (the shift is not differentiated: it has no
    # effect). Then the threshold lies in [-1, 0) and, written as
    # <p, z> - |p|^2 / 2, every term is of order one: no cancellation between
    # squares of large scores, at any scale.
    scores = scores - jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    threshold = _sparsemax_threshold(scores)
    probabilities = jnp.maximum(scores - threshold, 0)
    conjugate = jnp.sum(
        probabilities * (scores - 0.5 * probabilities), axis=-1
    )  # max over the simplex of <p, z> - |p|^2 / 2
    label_scores = jnp.take_along_axis(scores, indices[..., None], axis=-1)[..., 0]
    return nan_where(out_of_range, conjugate + 0.5 - label_scores)
