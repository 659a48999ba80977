"""Connectionist temporal classification (CTC)."""

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Real

from .._typecheck import checked
from ._utils import class_indices, nan_where, same_shapes


def _is_padding(paddings) -> Bool[Array, "..."]:
    return jnp.asarray(paddings) > 0.5


@same_shapes("logits[:-1]", "logit_paddings")
@same_shapes("labels", "label_paddings")
@same_shapes("logits[:1]", "labels[:1]")
@checked
def ctc_loss_with_forward_probs(
    logits: Float[ArrayLike, "batch time classes"],
    logit_paddings: Real[ArrayLike, "batch time"] | Bool[ArrayLike, "batch time"],
    labels: Int[ArrayLike, "batch labels"],
    label_paddings: Real[ArrayLike, "batch labels"] | Bool[ArrayLike, "batch labels"],
    *,
    blank_id: int = 0,
    log_epsilon: Real[ArrayLike, ""] = -1e5,
) -> tuple[
    Float[Array, " batch"],
    Float[Array, "time batch labels+1"],
    Float[Array, "time batch labels"],
]:
    r"""The CTC loss and the forward (alpha) log-probabilities behind it.

    CTC scores a label sequence $y_{1:N}$ against per-frame class distributions
    $p_t = \operatorname{softmax}(x_t)$ by summing over every alignment $\pi$
    (one symbol per frame, with a blank $\phi$) that collapses to $y$ once
    repeats are merged and blanks removed:

    $$ \ell(x, y) = -\log \sum_{\pi \to y} \prod_{t} p_t(\pi_t) $$

    The sum is computed by the forward recursion in log space. With
    $B_t(n)$ the probability of having emitted $y_{1:n}$ and sitting on a blank
    at frame $t$, and $L_t(n)$ that of sitting on $y_n$:

    $$ B_t(n) = \big(B_{t-1}(n) + L_{t-1}(n)\big)\, p_t(\phi), \qquad
       L_t(n) = \big(L_{t-1}(n) + B_{t-1}(n-1)
       + [y_n \ne y_{n-1}]\, L_{t-1}(n-1)\big)\, p_t(y_n) $$

    starting from $B_{-1}(0) = 1$ and every other state at probability
    $e^{\texttt{log\_epsilon}}$ (a stand-in for $\log 0$ that keeps gradients
    finite). Padded frames leave the states unchanged. In the returned
    `logalpha_blank`, the last frame holds $\log(B_{T}(n) + L_{T}(n))$, the
    probability of having emitted $y_{1:n}$ by the end, so the loss of a
    sequence with $N$ labels is minus its entry $N$.

    A sequence whose labels are all padding has loss $-\sum_t \log p_t(\phi)$;
    one that is too short for its labels has a loss near `-log_epsilon`.

    **Arguments:**

    - `logits`: per-frame class logits, of shape `(batch, time, classes)`,
      blank included.
    - `logit_paddings`: 1 (or `True`) for padded frames, 0 otherwise, of shape
      `(batch, time)`.
    - `labels`: integer label sequences, of shape `(batch, labels)`, each
      label a class in `[0, classes)`. A label outside that range that is not
      padding (`-1` too) gives a NaN loss for its sequence (and a zero
      gradient), where Optax silently reads some class. Padded labels may be
      anything.
    - `label_paddings`: 1 (or `True`) for padded labels, 0 otherwise, of shape
      `(batch, labels)`. Padding must be on the right.
    - `blank_id`: the class index of the blank.
    - `log_epsilon`: the log-probability standing in for $\log 0$.

    **Returns:**

    A tuple `(loss, logalpha_blank, logalpha_label)`: the losses of shape
    `(batch,)`, $\log B$ of shape `(time, batch, labels + 1)` (indexed by the
    number of labels emitted, 0 to $N$) and $\log L$ of shape
    `(time, batch, labels)` (indexed by the label, $y_1$ to $y_N$). All three
    are NaN for a sequence with a label out of range.

    **References:**

    Graves et al., *Connectionist Temporal Classification: Labelling
    Unsegmented Sequence Data with Recurrent Neural Networks*, ICML 2006.
    """
    logits = jnp.asarray(logits)
    labels = jnp.asarray(labels)
    batch_size, _, num_classes = logits.shape
    num_labels = labels.shape[1]
    if not 0 <= blank_id < num_classes:
        raise ValueError(f"`blank_id`={blank_id} is not a class of {num_classes}.")
    dtype = logits.dtype
    log_epsilon = jnp.asarray(log_epsilon, dtype)
    frame_padding = _is_padding(logit_paddings)
    label_padding = _is_padding(label_paddings)
    label_lengths = jnp.sum(~label_padding, axis=1)
    # A label outside [0, classes) makes its sequence NaN (padded labels may be
    # anything); it is read as class 0 meanwhile, so nothing else is touched.
    labels, out_of_range = class_indices(labels, num_classes)
    bad = jnp.any(out_of_range & ~label_padding, axis=1)

    log_probs = jax.nn.log_softmax(logits, axis=-1)
    log_probs_blank = log_probs[:, :, blank_id]
    log_probs_labels = jnp.take_along_axis(log_probs, labels[:, None, :], axis=2)
    # A repeated label cannot be reached directly from the previous one.
    repeated = jnp.concatenate(
        [jnp.zeros((batch_size, 1), bool), labels[:, 1:] == labels[:, :-1]], axis=1
    )
    epsilon_column = jnp.full((batch_size, 1), log_epsilon, dtype)

    def step(carry, frame):
        blank, label = carry
        log_prob_blank, log_prob_labels, padded = frame
        label_with_none = jnp.concatenate([epsilon_column, label], axis=1)
        new_blank = jnp.logaddexp(blank, label_with_none) + log_prob_blank[:, None]
        from_previous_label = jnp.where(
            repeated, label_with_none[:, :-1] + log_epsilon, label_with_none[:, :-1]
        )
        new_label = (
            jnp.logaddexp(jnp.logaddexp(label, blank[:, :-1]), from_previous_label)
            + log_prob_labels
        )
        new_blank = jnp.where(padded[:, None], blank, new_blank)
        new_label = jnp.where(padded[:, None], label, new_label)
        return (new_blank, new_label), (new_blank, new_label)

    initial_blank = jnp.concatenate(
        [
            jnp.zeros((batch_size, 1), dtype),
            jnp.full((batch_size, num_labels), log_epsilon, dtype),
        ],
        axis=1,
    )
    initial_label = jnp.full((batch_size, num_labels), log_epsilon, dtype)
    frames = (
        jnp.swapaxes(log_probs_blank, 0, 1),
        jnp.swapaxes(log_probs_labels, 0, 1),
        jnp.swapaxes(frame_padding, 0, 1),
    )
    (last_blank, last_label), (logalpha_blank, logalpha_label) = jax.lax.scan(
        step, (initial_blank, initial_label), frames
    )
    emitted = jnp.logaddexp(
        last_blank, jnp.concatenate([epsilon_column, last_label], axis=1)
    )
    logalpha_blank = logalpha_blank.at[-1].set(emitted)
    loss = -jnp.take_along_axis(emitted, label_lengths[:, None], axis=1)[:, 0]
    logalpha_blank = jnp.where(bad[None, :, None], jnp.nan, logalpha_blank)
    logalpha_label = jnp.where(bad[None, :, None], jnp.nan, logalpha_label)
    return nan_where(bad, loss), logalpha_blank, logalpha_label


@same_shapes("logits[:-1]", "logit_paddings")
@same_shapes("labels", "label_paddings")
@same_shapes("logits[:1]", "labels[:1]")
@checked
def ctc_loss(
    logits: Float[ArrayLike, "batch time classes"],
    logit_paddings: Real[ArrayLike, "batch time"] | Bool[ArrayLike, "batch time"],
    labels: Int[ArrayLike, "batch labels"],
    label_paddings: Real[ArrayLike, "batch labels"] | Bool[ArrayLike, "batch labels"],
    *,
    blank_id: int = 0,
    log_epsilon: Real[ArrayLike, ""] = -1e5,
) -> Float[Array, " batch"]:
    r"""The connectionist temporal classification (CTC) loss.

    $$ \ell(x, y) = -\log \sum_{\pi \to y} \prod_{t} \operatorname{softmax}(x_t)_{\pi_t} $$

    the negative log-probability of the label sequence $y$, summed over every
    frame-level alignment $\pi$ that collapses to $y$ once repeats are merged
    and blanks removed. See `eqopt.losses.ctc_loss_with_forward_probs` for
    the recursion and the treatment of padding.

    **Arguments:**

    - `logits`: per-frame class logits, of shape `(batch, time, classes)`,
      blank included.
    - `logit_paddings`: 1 (or `True`) for padded frames, 0 otherwise, of shape
      `(batch, time)`.
    - `labels`: integer label sequences, of shape `(batch, labels)`, each
      label a class in `[0, classes)`. A label outside that range that is not
      padding (`-1` too) gives a NaN loss for its sequence (and a zero
      gradient), where Optax silently reads some class. Padded labels may be
      anything.
    - `label_paddings`: 1 (or `True`) for padded labels, 0 otherwise, of shape
      `(batch, labels)`. Padding must be on the right.
    - `blank_id`: the class index of the blank.
    - `log_epsilon`: the log-probability standing in for $\log 0$.

    **Returns:**

    The losses, of shape `(batch,)`.

    **References:**

    Graves et al., *Connectionist Temporal Classification: Labelling
    Unsegmented Sequence Data with Recurrent Neural Networks*, ICML 2006.
    """
    loss, _, _ = ctc_loss_with_forward_probs(
        logits,
        logit_paddings,
        labels,
        label_paddings,
        blank_id=blank_id,
        log_epsilon=log_epsilon,
    )
    return loss
