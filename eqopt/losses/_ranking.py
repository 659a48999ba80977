"""Listwise ranking losses."""

from collections.abc import Callable

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Real

from .._typecheck import checked
from ._utils import as_float, cross_entropy_terms, same_shapes


@same_shapes("logits", "labels", "where", "weights")
@checked
def ranking_softmax_loss(
    logits: Float[ArrayLike, "*batch items"],
    labels: Real[ArrayLike, "*batch items"],
    *,
    where: Bool[ArrayLike, "*batch items"] | None = None,
    weights: Real[ArrayLike, "*batch items"] | None = None,
    reduce_fn: Callable[..., Array] | None = jnp.mean,
) -> Float[Array, "..."]:
    r"""The listwise softmax loss for learning to rank.

    For each list, with item scores $s$, relevance labels $y$ and item weights
    $w$ (default 1),

    $$ \ell(s, y) = -\sum_i w_i\, y_i \log \frac{e^{s_i}}{\sum_j e^{s_j}} $$

    the cross-entropy between the (unnormalised) relevance and the softmax of
    the scores. Items left out by `where` take no part in either sum.

    `reduce_fn` then reduces the per-list losses. When `where` is given it is
    called as `reduce_fn(losses, where=valid)`, with `valid` marking the lists
    with at least one item, so the default mean runs over those lists only (0
    if there are none).

    **Arguments:**

    - `logits`: item scores, of shape `(*batch, items)`.
    - `labels`: relevance labels (integer grades or floating), of the same
      shape.
    - `where`: a boolean mask of the same shape; items to include.
    - `weights`: per-item weights, of the same shape.
    - `reduce_fn`: reduces the losses of shape `(*batch,)`, e.g. `jnp.mean` or
      `jnp.sum`; `None` returns them unreduced.

    **Returns:**

    The reduced loss (a scalar for `jnp.mean` and `jnp.sum`), or the losses of
    shape `(*batch,)` if `reduce_fn` is `None`.

    **References:**

    Cao et al., *Learning to Rank: From Pairwise Approach to Listwise
    Approach*, ICML 2007; Bruch et al., *An Analysis of the Softmax Cross
    Entropy Loss for Learning-to-Rank with Binary Relevance*, ICTIR 2019.
    """
    logits = jnp.asarray(logits)
    labels = as_float(labels, logits)
    if weights is not None:
        labels = labels * jnp.asarray(weights)
    axes = (logits.ndim - 1,)
    if where is not None:
        where = jnp.asarray(where)
    losses, _ = cross_entropy_terms(logits, labels, axes, where)
    if reduce_fn is None:
        return losses
    if where is None:
        return reduce_fn(losses)
    valid = jnp.any(where, axis=-1)
    if reduce_fn is jnp.mean:
        # The mean over valid lists, 0 (not NaN) when there is none.
        count = jnp.maximum(jnp.sum(valid), 1).astype(losses.dtype)
        return jnp.sum(jnp.where(valid, losses, 0)) / count
    return reduce_fn(losses, where=valid)
