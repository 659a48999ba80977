"""Contrastive and metric-learning losses: NT-Xent and the triplet margin loss."""

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, Real

from .._typecheck import checked
from ._utils import normalize_axes, same_shapes


@same_shapes("embeddings[:1]", "labels")
@checked
def ntxent(
    embeddings: Float[ArrayLike, "batch features"],
    labels: Int[ArrayLike, " batch"],
    temperature: Real[ArrayLike, ""] = 0.07,
) -> Float[Array, ""]:
    r"""The normalised temperature-scaled cross-entropy (NT-Xent) loss.

    Embeddings with the same label are positive pairs, all others negative.
    With $s_{ij} = \cos(e_i, e_j) / \tau$, $P$ the ordered positive pairs
    $(i, j)$, $i \ne j$, and $N(i)$ the negatives of $i$,

    $$ \ell = \frac{1}{|P|} \sum_{(i, j) \in P} -\log
       \frac{e^{s_{ij}}}{e^{s_{ij}} + \sum_{k \in N(i)} e^{s_{ik}}} $$

    For two views per example this is the SimCLR loss. Embeddings are
    normalised as $e / \sqrt{\|e\|^2 + \varepsilon}$ with $\varepsilon$ the
    machine epsilon, so a zero embedding has a finite gradient.

    A batch without positive pairs has loss 0 (Optax returns NaN).

    **Arguments:**

    - `embeddings`: the embeddings, of shape `(batch, features)`.
    - `labels`: integer group labels, of shape `(batch,)`; equal labels mark
      positive pairs.
    - `temperature`: the temperature $\tau > 0$.

    **Returns:**

    The loss averaged over positive pairs, a scalar.

    **References:**

    Chen et al., *A Simple Framework for Contrastive Learning of Visual
    Representations*, ICML 2020.
    """
    embeddings = jnp.asarray(embeddings)
    labels = jnp.asarray(labels)
    epsilon = jnp.finfo(embeddings.dtype).eps
    normalised = embeddings * jax.lax.rsqrt(
        jnp.sum(jnp.square(embeddings), axis=-1, keepdims=True) + epsilon
    )
    similarities = normalised @ normalised.T / temperature
    same = labels[:, None] == labels[None, :]
    positive = same & ~jnp.eye(labels.shape[0], dtype=bool)
    negative = ~same
    # log sum_k exp(s_ik) over negatives; rows without negatives give -inf, and
    # are computed over all entries so that the gradient stays finite.
    has_negative = jnp.any(negative, axis=1, keepdims=True)
    log_negatives = jax.nn.logsumexp(
        jnp.where(negative | ~has_negative, similarities, -jnp.inf),
        axis=1,
        keepdims=True,
    )
    log_negatives = jnp.where(has_negative, log_negatives, -jnp.inf)
    pair_losses = jnp.logaddexp(similarities, log_negatives) - similarities
    num_positive = jnp.sum(positive)
    total = jnp.sum(jnp.where(positive, pair_losses, 0))
    return total / jnp.maximum(num_positive, 1).astype(total.dtype)


@same_shapes("anchors", "positives", "negatives")
@checked
def triplet_margin_loss(
    anchors: Float[ArrayLike, "*shape"],
    positives: Float[ArrayLike, "*shape"],
    negatives: Float[ArrayLike, "*shape"],
    axis: int = -1,
    norm_degree: Real[ArrayLike, ""] = 2,
    margin: Real[ArrayLike, ""] = 1.0,
    eps: Real[ArrayLike, ""] = 1e-6,
) -> Float[Array, "..."]:
    r"""The triplet margin loss: anchors should be nearer positives than negatives.

    With the distance $d(a, b) = \big(\sum_i |a_i - b_i|^p + \varepsilon\big)^{1/p}$
    over `axis`,

    $$ \ell(a, p, n) = \max\big(0,\ d(a, p) - d(a, n) + m\big) $$

    The $\varepsilon$ inside the root keeps the gradient finite when two
    embeddings coincide.

    The absolute value makes $d$ a distance for every degree $p \ge 1$. Optax
    raises the signed difference to the power $p$, which agrees for even $p$
    (the default $p = 2$ included) but not for odd $p$ (for $p = 1$ it is not
    the $L_1$ distance, and for $p = 3$ it is NaN).

    **Arguments:**

    - `anchors`: the anchor embeddings, e.g. of shape `(batch, features)`.
    - `positives`: embeddings similar to the anchors, of the same shape.
    - `negatives`: embeddings dissimilar to the anchors, of the same shape.
    - `axis`: the feature axis.
    - `norm_degree`: the degree $p$ of the distance.
    - `margin`: the margin $m$.
    - `eps`: the $\varepsilon$ added inside the root.

    **Returns:**

    The losses, with the shape of `anchors` without `axis`.

    **References:**

    Balntas et al., *Learning Local Feature Descriptors with Triplets and
    Shallow Convolutional Neural Networks*, BMVC 2016; Schroff, Kalenichenko &
    Philbin, *FaceNet*, CVPR 2015.
    """
    anchors = jnp.asarray(anchors)
    (axis,) = normalize_axes(axis, anchors.ndim)

    def distance(x, y):
        powers = jnp.abs(x - jnp.asarray(y)) ** norm_degree
        return (jnp.sum(powers, axis=axis) + eps) ** (1 / norm_degree)

    return jax.nn.relu(
        distance(anchors, positives) - distance(anchors, negatives) + margin
    )
