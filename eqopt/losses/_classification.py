"""Classification losses: cross-entropies, focal, poly, hinge and perceptron losses.

Labels that index a class are integers (`Int`). Labels that are a distribution
over classes (one-hot, soft or smoothed) are floating (`Float`), so passing class
indices where a distribution is expected, or the reverse, fails at the
annotations rather than broadcasting. Binary targets that are naturally 0/1 or
±1 accept either (`Real`).
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Real

from .._typecheck import checked
from ._utils import (
    as_float,
    class_indices,
    cross_entropy_terms,
    expand_where,
    nan_where,
    normalize_axes,
    reduced_shape,
    safe_log,
    safe_logaddexp,
    same_shapes,
    weighted_log,
)


@same_shapes("logits", "labels")
@checked
def softmax_cross_entropy(
    logits: Float[ArrayLike, "*shape"],
    labels: Float[ArrayLike, "*shape"],
    axis: int | tuple[int, ...] | None = -1,
    where: Bool[ArrayLike, "..."] | None = None,
) -> Float[Array, "..."]:
    r"""The cross-entropy between target distributions and the softmax of logits.

    $$ \ell(x, y) = -\sum_c y_c \log \frac{e^{x_c}}{\sum_k e^{x_k}} $$

    The sums run over `axis` (by default the last, class, axis) and over the
    classes selected by `where`; a slice with no class selected has loss 0.

    A class with label weight exactly 0 contributes nothing even where its logit
    is $-\infty$ (the convention $0 \log 0 = 0$), so masking logits with
    `-inf` gives a finite loss and gradient. Optax returns NaN for the loss
    there (its gradient is finite); this function then agrees with
    `eqopt.losses.safe_softmax_cross_entropy`.

    **Arguments:**

    - `logits`: unnormalised log-probabilities, e.g. of shape
      `(*batch, classes)`.
    - `labels`: target distributions (one-hot or soft), of the same shape. For
      integer class indices use
      `eqopt.losses.softmax_cross_entropy_with_integer_labels`.
    - `axis`: the class axis or axes (`None`: all axes).
    - `where`: a boolean mask of the shape of `logits` (classes to include), or
      of the output shape (examples to include).

    **Returns:**

    The cross-entropies, with the shape of `logits` without `axis`.

    **References:**

    Bishop, *Pattern Recognition and Machine Learning*, 2006, §4.3.4
    (multiclass logistic regression).
    """
    logits = jnp.asarray(logits)
    labels = jnp.asarray(labels)
    axes = normalize_axes(axis, logits.ndim)
    where = expand_where(where, logits.shape, axes, allow_batch_shape=True)
    loss, _ = cross_entropy_terms(logits, labels, axes, where)
    return loss


@checked
def softmax_cross_entropy_with_integer_labels(
    logits: Float[ArrayLike, "..."],
    labels: Int[ArrayLike, "..."],
    axis: int | tuple[int, ...] = -1,
    where: Bool[ArrayLike, "..."] | None = None,
) -> Float[Array, "..."]:
    r"""The cross-entropy between integer class labels and the softmax of logits.

    $$ \ell(x, y) = \log \sum_k e^{x_k} - x_y $$

    With `axis` a tuple, the classes are the entries of a slice over those axes,
    taken in the order given, and a label is a flat (row-major) index into it.
    The normaliser runs over the classes selected by `where`; a slice with no
    class selected has loss 0.

    `labels` must have the shape of `logits` without `axis`; anything else is a
    `ValueError` (the shapes depend on `axis`, so they are checked in the body,
    the dtypes by the annotations).

    **Arguments:**

    - `logits`: unnormalised log-probabilities, e.g. of shape
      `(*batch, classes)`.
    - `labels`: integer class indices in `[0, classes)`, e.g. of shape
      `(*batch,)`. A label outside that range gives a NaN loss for its example
      (and a zero gradient): `-1` too, which Optax reads as the last
      class (an example left out by `where` has loss 0 whatever its label).
      For one-hot or soft labels use `eqopt.losses.softmax_cross_entropy`.
    - `axis`: the class axis or axes.
    - `where`: a boolean mask of the shape of `logits` (classes to include), or
      of `labels` (examples to include).

    **Returns:**

    The cross-entropies, with the shape of `labels`.

    **References:**

    Bishop, *Pattern Recognition and Machine Learning*, 2006, §4.3.4
    (multiclass logistic regression).
    """
    logits = jnp.asarray(logits)
    labels = jnp.asarray(labels)
    axes = normalize_axes(axis, logits.ndim)
    batch_shape = reduced_shape(logits.shape, axes)
    if labels.shape != batch_shape:
        raise ValueError(
            f"`labels` must have the shape of `logits` {logits.shape} without "
            f"axis {axis}, that is {batch_shape}; got {labels.shape}."
        )
    where = expand_where(where, logits.shape, axes, allow_batch_shape=True)
    # Move the class axes to the end, in the order given, and flatten them.
    destination = tuple(range(len(batch_shape), logits.ndim))
    logits = jnp.moveaxis(logits, axes, destination).reshape(*batch_shape, -1)
    if where is not None:
        where = jnp.moveaxis(where, axes, destination).reshape(*batch_shape, -1)
        anything = jnp.any(where, axis=-1, keepdims=True)
        normalised = jnp.where(where | ~anything, logits, -jnp.inf)
    else:
        anything = None
        normalised = logits
    log_normaliser = jax.nn.logsumexp(normalised, axis=-1)
    indices, out_of_range = class_indices(labels, logits.shape[-1])
    label_logits = jnp.take_along_axis(logits, indices[..., None], axis=-1)[..., 0]
    loss = nan_where(out_of_range, log_normaliser - label_logits)
    if anything is not None:
        # An example left out by `where` has loss 0, whatever its label.
        loss = jnp.where(anything[..., 0], loss, 0)
    return loss


@same_shapes("logits", "labels")
@checked
def safe_softmax_cross_entropy(
    logits: Float[ArrayLike, "*batch classes"],
    labels: Float[ArrayLike, "*batch classes"],
) -> Float[Array, "*batch"]:
    r"""The softmax cross-entropy with $0 \log 0 = 0$ for logits of $-\infty$.

    $$ \ell(x, y) = -\sum_c y_c \log \frac{e^{x_c}}{\sum_k e^{x_k}},
       \qquad 0 \cdot \log 0 := 0 $$

    A class whose logit is $-\infty$ (masked out) and whose label is 0 adds
    nothing to the loss or its gradient. Here
    `eqopt.losses.softmax_cross_entropy` follows the same convention, so the
    two agree; this one reduces only the last axis and has no `where`.

    **Arguments:**

    - `logits`: unnormalised log-probabilities, of shape `(*batch, classes)`;
      entries may be $-\infty$.
    - `labels`: target distributions, of the same shape.

    **Returns:**

    The cross-entropies, of shape `(*batch,)`.

    **References:**

    Bishop, *Pattern Recognition and Machine Learning*, 2006, §4.3.4.
    """
    logits = jnp.asarray(logits)
    labels = jnp.asarray(labels)
    loss, _ = cross_entropy_terms(logits, labels, (logits.ndim - 1,), None)
    return loss


def _sigmoid_cross_entropy(logits, labels):
    return -(
        weighted_log(labels, jax.nn.log_sigmoid(logits))
        + weighted_log(1 - labels, jax.nn.log_sigmoid(-logits))
    )


@same_shapes("logits", "labels")
@checked
def sigmoid_binary_cross_entropy(
    logits: Float[ArrayLike, "*shape"],
    labels: Real[ArrayLike, "*shape"],
) -> Float[Array, "*shape"]:
    r"""The elementwise binary cross-entropy of sigmoid probabilities.

    With $p = \sigma(x) = 1 / (1 + e^{-x})$,

    $$ \ell(x, y) = -y \log p - (1 - y) \log(1 - p) $$

    computed from $\log \sigma(\pm x)$ so that it is stable for large logits.
    Each entry is an independent binary prediction (multi-label
    classification). No axis is reduced.

    A label of exactly 0 or 1 drops the other term, so a logit of $\pm\infty$
    on the side of its label gives loss 0 and gradient 0 (Optax gives NaN).
    `labels` must have exactly the shape of `logits` (Optax broadcasts them).

    **Arguments:**

    - `logits`: the logits of the positive class, a floating array.
    - `labels`: binary labels in $\{0, 1\}$ (integer or floating) or target
      probabilities in $[0, 1]$, of the same shape.

    **Returns:**

    The cross-entropies, with the shape of `logits`.

    **References:**

    Goodfellow, Bengio & Courville, *Deep Learning*, 2016, §6.2.2.2.
    """
    logits = jnp.asarray(logits)
    return _sigmoid_cross_entropy(logits, as_float(labels, logits))


@same_shapes("logits", "labels")
@checked
def sigmoid_focal_loss(
    logits: Float[ArrayLike, "*shape"],
    labels: Real[ArrayLike, "*shape"],
    *,
    alpha: Real[ArrayLike, ""] | None = None,
    gamma: Real[ArrayLike, ""] = 2.0,
) -> Float[Array, "*shape"]:
    r"""The focal loss: a sigmoid cross-entropy down-weighting easy examples.

    With $p = \sigma(x)$, $p_t = y p + (1 - y)(1 - p)$ the probability given to
    the label and $\alpha_t = y\alpha + (1 - y)(1 - \alpha)$,

    $$ \ell(x, y) = \alpha_t\, (1 - p_t)^\gamma\,
       \big(-y \log p - (1 - y) \log(1 - p)\big) $$

    which is $-\alpha_t (1 - p_t)^\gamma \log p_t$ for hard labels. The factor
    $(1 - p_t)^\gamma$ is computed as $\exp(\gamma \log(1 - p_t))$ from
    log-sigmoids, so its gradient is finite for $\gamma < 1$ and for confident
    predictions. No axis is reduced; `labels` must have exactly the shape of
    `logits` (Optax broadcasts them).

    **Arguments:**

    - `logits`: the logits of the positive class, a floating array.
    - `labels`: binary labels in $\{0, 1\}$ (integer or floating) or target
      probabilities in $[0, 1]$, of the same shape.
    - `alpha`: the weight $\alpha$ of positive examples, in $[0, 1]$; `None`
      weights every example by 1.
    - `gamma`: the focusing exponent $\gamma \ge 0$; 0 gives the binary
      cross-entropy.

    **Returns:**

    The focal losses, with the shape of `logits`.

    **References:**

    Lin et al., *Focal Loss for Dense Object Detection*, ICCV 2017.
    """
    logits = jnp.asarray(logits)
    labels = as_float(labels, logits)
    cross_entropy = _sigmoid_cross_entropy(logits, labels)
    # 1 - p_t = y (1 - p) + (1 - y) p, in log space.
    log_one_minus_pt = safe_logaddexp(
        safe_log(labels) + jax.nn.log_sigmoid(-logits),
        safe_log(1 - labels) + jax.nn.log_sigmoid(logits),
    )
    # Clamped so that gamma = 0 gives 0^0 = 1 rather than 0 * -inf.
    floor = jnp.finfo(log_one_minus_pt.dtype).min
    modulator = jnp.exp(gamma * jnp.maximum(log_one_minus_pt, floor))
    loss = modulator * cross_entropy
    if alpha is not None:
        alpha = jnp.asarray(alpha)
        loss = (alpha * labels + (1 - alpha) * (1 - labels)) * loss
    return loss


@same_shapes("logits", "labels", "where")
@checked
def poly_loss_cross_entropy(
    logits: Float[ArrayLike, "*shape"],
    labels: Float[ArrayLike, "*shape"],
    *,
    epsilon: Real[ArrayLike, ""] = 2.0,
    axis: int | tuple[int, ...] | None = -1,
    where: Bool[ArrayLike, "*shape"] | None = None,
) -> Float[Array, "..."]:
    r"""The Poly-1 loss: softmax cross-entropy plus a first-order polynomial term.

    With $p = \operatorname{softmax}(x)$,

    $$ \ell(x, y) = -\sum_c y_c \log p_c + \epsilon \sum_c y_c (1 - p_c) $$

    For labels summing to 1 the second term is $\epsilon(1 - p_t)$, with
    $p_t = \sum_c y_c p_c$ the probability given to the target. Cross-entropy
    expands as $\sum_{j \ge 1} \frac1j (1 - p_t)^j$; Poly-1 shifts the first
    coefficient by $\epsilon$. The sums run over `axis` and over the classes
    selected by `where`; a slice with none selected has loss 0.

    **Arguments:**

    - `logits`: unnormalised log-probabilities, e.g. of shape
      `(*batch, classes)`.
    - `labels`: target distributions (one-hot or soft), of the same shape.
    - `epsilon`: the shift of the first polynomial coefficient (the paper
      suggests 2 for ImageNet classification, -1 for detection).
    - `axis`: the class axis or axes (`None`: all axes).
    - `where`: a boolean mask of the shape of `logits`; classes to include.

    **Returns:**

    The losses, with the shape of `logits` without `axis`.

    **References:**

    Leng et al., *PolyLoss: A Polynomial Expansion Perspective of
    Classification Loss Functions*, ICLR 2022.
    """
    logits = jnp.asarray(logits)
    labels = jnp.asarray(labels)
    axes = normalize_axes(axis, logits.ndim)
    where = expand_where(where, logits.shape, axes, allow_batch_shape=False)
    cross_entropy, log_probs = cross_entropy_terms(logits, labels, axes, where)
    # sum_c y_c (1 - p_c): equal to 1 - p_t for labels that sum to 1.
    missed = labels * (1 - jnp.exp(log_probs))
    if where is not None:
        missed = jnp.where(where, missed, 0)
    return cross_entropy + epsilon * jnp.sum(missed, axis=axes)


@same_shapes("labels", "where")
@checked
def smooth_labels(
    labels: Float[ArrayLike, "*shape"],
    alpha: Real[ArrayLike, ""],
    *,
    axis: int | tuple[int, ...] | None = -1,
    where: Bool[ArrayLike, "*shape"] | None = None,
) -> Float[Array, "*shape"]:
    r"""Label smoothing: mixes the labels with the uniform distribution.

    With $K$ the number of classes (selected by `where`) along `axis`,

    $$ \tilde y_c = (1 - \alpha)\, y_c + \frac{\alpha}{K} $$

    Entries that `where` leaves out keep their label unchanged, so the smoothed
    distribution stays on the selected classes (and a slice with no class
    selected is returned as is). Optax adds $\alpha / K$ to the left-out entries
    too, and returns infinities where nothing is selected.

    **Arguments:**

    - `labels`: one-hot (or soft) labels, a floating array.
    - `alpha`: the smoothing factor in $[0, 1]$.
    - `axis`: the class axis or axes (`None`: all axes).
    - `where`: a boolean mask of the shape of `labels`; classes to smooth over.

    **Returns:**

    The smoothed labels, with the shape of `labels`.

    **References:**

    Szegedy et al., *Rethinking the Inception Architecture for Computer
    Vision*, CVPR 2016, §7; Müller, Kornblith & Hinton, *When Does Label
    Smoothing Help?*, NeurIPS 2019.
    """
    labels = jnp.asarray(labels)
    alpha = jnp.asarray(alpha)
    axes = normalize_axes(axis, labels.ndim)
    where = expand_where(where, labels.shape, axes, allow_batch_shape=False)
    if where is None:
        num_classes = 1
        for a in axes:
            num_classes *= labels.shape[a]
        return (1 - alpha) * labels + alpha / num_classes
    num_classes = jnp.sum(where, axis=axes, keepdims=True).astype(labels.dtype)
    smoothed = (1 - alpha) * labels + alpha / jnp.maximum(num_classes, 1)
    return jnp.where(where, smoothed, labels)


@same_shapes("predictor_outputs", "targets")
@checked
def hinge_loss(
    predictor_outputs: Float[ArrayLike, "*shape"],
    targets: Real[ArrayLike, "*shape"],
) -> Float[Array, "*shape"]:
    r"""The elementwise binary hinge loss.

    $$ \ell(s, y) = \max(0,\ 1 - y s), \qquad y \in \{-1, 1\} $$

    No axis is reduced; `targets` must have exactly the shape of
    `predictor_outputs` (Optax broadcasts them).

    **Arguments:**

    - `predictor_outputs`: the scores $s$ of a decision function.
    - `targets`: the labels, $-1$ or $1$ (integer or floating), of the same
      shape.

    **Returns:**

    The hinge losses, with the shape of `predictor_outputs`.

    **References:**

    Cortes & Vapnik, *Support-Vector Networks*, Machine Learning, 1995.
    """
    scores = jnp.asarray(predictor_outputs)
    return jax.nn.relu(1 - as_float(targets, scores) * scores)


@same_shapes("predictor_outputs", "targets")
@checked
def perceptron_loss(
    predictor_outputs: Float[ArrayLike, "*shape"],
    targets: Real[ArrayLike, "*shape"],
) -> Float[Array, "*shape"]:
    r"""The elementwise binary perceptron loss.

    $$ \ell(s, y) = \max(0,\ -y s), \qquad y \in \{-1, 1\} $$

    No axis is reduced; `targets` must have exactly the shape of
    `predictor_outputs`.

    **Arguments:**

    - `predictor_outputs`: the scores $s$ of a decision function.
    - `targets`: the labels, $-1$ or $1$ (integer or floating), of the same
      shape.

    **Returns:**

    The perceptron losses, with the shape of `predictor_outputs`.

    **References:**

    Rosenblatt, *The Perceptron: A Probabilistic Model for Information Storage
    and Organization in the Brain*, Psychological Review, 1958.
    """
    scores = jnp.asarray(predictor_outputs)
    return jax.nn.relu(-as_float(targets, scores) * scores)


def _label_scores(scores, labels):
    return jnp.take_along_axis(scores, labels[..., None], axis=-1)[..., 0]


@same_shapes("scores[:-1]", "labels")
@checked
def multiclass_hinge_loss(
    scores: Float[ArrayLike, "*batch classes"],
    labels: Int[ArrayLike, "*batch"],
) -> Float[Array, "*batch"]:
    r"""The multiclass hinge loss of Crammer and Singer.

    $$ \ell(s, y) = \max_c \big(s_c + [c \ne y]\big) - s_y $$

    It is zero when the score of the label beats every other score by at least 1.

    **Arguments:**

    - `scores`: the class scores, of shape `(*batch, classes)`.
    - `labels`: integer class indices in `[0, classes)`, of shape `(*batch,)`.
      A label outside that range (`-1` too) gives a NaN loss for its example
      (and a zero gradient), where Optax silently reads some class.

    **Returns:**

    The losses, of shape `(*batch,)`.

    **References:**

    Crammer & Singer, *On the Algorithmic Implementation of Multiclass
    Kernel-based Vector Machines*, JMLR 2001.
    """
    scores = jnp.asarray(scores)
    labels, out_of_range = class_indices(jnp.asarray(labels), scores.shape[-1])
    margins = 1 - jax.nn.one_hot(labels, scores.shape[-1], dtype=scores.dtype)
    loss = jnp.max(scores + margins, axis=-1) - _label_scores(scores, labels)
    return nan_where(out_of_range, loss)


@same_shapes("scores[:-1]", "labels")
@checked
def multiclass_perceptron_loss(
    scores: Float[ArrayLike, "*batch classes"],
    labels: Int[ArrayLike, "*batch"],
) -> Float[Array, "*batch"]:
    r"""The multiclass perceptron loss.

    $$ \ell(s, y) = \max_c s_c - s_y $$

    **Arguments:**

    - `scores`: the class scores, of shape `(*batch, classes)`.
    - `labels`: integer class indices in `[0, classes)`, of shape `(*batch,)`.
      A label outside that range (`-1` too) gives a NaN loss for its example
      (and a zero gradient), where Optax silently reads some class.

    **Returns:**

    The losses, of shape `(*batch,)`.

    **References:**

    Collins, *Discriminative Training Methods for Hidden Markov Models: Theory
    and Experiments with Perceptron Algorithms*, EMNLP 2002.
    """
    scores = jnp.asarray(scores)
    labels, out_of_range = class_indices(jnp.asarray(labels), scores.shape[-1])
    loss = jnp.max(scores, axis=-1) - _label_scores(scores, labels)
    return nan_where(out_of_range, loss)
