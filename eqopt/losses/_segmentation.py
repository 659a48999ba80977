"""Overlap losses for segmentation: soft Dice, Tversky and generalised Dice."""

from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Real

from .._typecheck import checked
from ._utils import as_float, normalize_axes, one_of, same_shapes

# Keeps the inverse squared class volume finite for a class absent from the batch.
_VOLUME_EPSILON = 1e-6


def _probabilities(predictions, apply_activation):
    if not apply_activation:
        return predictions
    if predictions.shape[-1] == 1:
        return jax.nn.sigmoid(predictions)
    return jax.nn.softmax(predictions, axis=-1)


def _per_class_dice(probabilities, targets, axis, smooth, alpha, beta):
    ndim = probabilities.ndim
    if axis is None:
        axes = tuple(range(1, ndim - 1))
    else:
        axes = normalize_axes(axis, ndim)
        if ndim - 1 in axes:
            raise ValueError(
                f"`axis`={axis!r} includes the class axis (the last one); sum over "
                "spatial (and batch) axes only."
            )
    intersection = jnp.sum(probabilities * targets, axis=axes)
    predicted = jnp.sum(probabilities, axis=axes)
    target = jnp.sum(targets, axis=axes)
    false_positives = predicted - intersection
    false_negatives = target - intersection
    denominator = intersection + alpha * false_positives + beta * false_negatives
    return 1 - (intersection + smooth) / (denominator + smooth)


def _dice(
    probabilities,
    targets,
    *,
    class_weights,
    smooth,
    alpha,
    beta,
    reduction,
    ignore_background,
    axis,
):
    losses = _per_class_dice(probabilities, targets, axis, smooth, alpha, beta)
    if class_weights is not None:
        losses = losses * jnp.broadcast_to(jnp.asarray(class_weights), losses.shape)
    if ignore_background and losses.shape[-1] > 1:
        # A single class is the foreground (a binary segmentation): nothing to drop.
        losses = losses[..., 1:]
    if reduction == "mean":
        return jnp.mean(losses, axis=-1)
    if reduction == "sum":
        return jnp.sum(losses, axis=-1)
    return losses


@one_of(reduction=("mean", "sum", "none"))
@same_shapes("predictions", "targets")
@checked
def dice_loss(
    predictions: Float[ArrayLike, "*batch classes"],
    targets: Real[ArrayLike, "*batch classes"] | Bool[ArrayLike, "*batch classes"],
    *,
    class_weights: Real[ArrayLike, " classes"] | None = None,
    smooth: Real[ArrayLike, ""] = 1.0,
    alpha: Real[ArrayLike, ""] = 0.5,
    beta: Real[ArrayLike, ""] = 0.5,
    apply_softmax: bool = True,
    reduction: Literal["mean", "sum", "none"] = "mean",
    ignore_background: bool = False,
    axis: int | Sequence[int] | None = None,
) -> Float[Array, "..."]:
    r"""The soft Dice loss (Tversky loss for $\alpha \ne \beta$), per class.

    With $p$ the predicted probabilities and $t$ the targets, summed over `axis`
    for each class $c$: the overlap $I_c = \sum_i p_{ic} t_{ic}$, the predicted
    mass $P_c = \sum_i p_{ic}$ and the target mass $T_c = \sum_i t_{ic}$,

    $$ \ell_c = 1 - \frac{I_c + s}{I_c + \alpha (P_c - I_c) + \beta (T_c - I_c) + s} $$

    With $\alpha = \beta = \tfrac12$ this is $1 - \frac{2 I_c + 2s}{P_c + T_c +
    2s}$, one minus the soft Dice coefficient; $\alpha$ weighs false positives
    and $\beta$ false negatives. The per-class losses are multiplied by
    `class_weights`, the first class is dropped if `ignore_background` (unless it
    is the only one, as in a binary segmentation), and the
    rest are averaged or summed according to `reduction`.

    Probabilities are the softmax of `predictions` over the class axis, or their
    sigmoid when there is a single class. With `apply_softmax=False` the
    predictions are used as given; unlike Optax, which checks that they sum to 1
    (and so fails under `jit`, and for a single class), nothing is checked.

    **Arguments:**

    - `predictions`: logits (or probabilities, see `apply_softmax`), of shape
      `(batch, *spatial, classes)`.
    - `targets`: one-hot (or soft) targets, of the same shape (boolean or
      integer one-hot targets are taken as the predictions' float dtype).
    - `class_weights`: per-class weights, of shape `(classes,)`.
    - `smooth`: the smoothing constant $s$, which also keeps empty classes
      finite.
    - `alpha`: the weight $\alpha$ of false positives.
    - `beta`: the weight $\beta$ of false negatives.
    - `apply_softmax`: whether to turn `predictions` into probabilities.
    - `reduction`: `"mean"` or `"sum"` over classes, or `"none"`.
    - `ignore_background`: whether to leave out class 0 (no effect with a
      single class).
    - `axis`: the axis or axes to sum over; by default every axis except the
      first (batch) and the last (class).

    **Returns:**

    The losses, with the shape of `predictions` without `axis` and without the
    class axis (`reduction="none"` keeps the class axis).

    **References:**

    Milletari, Navab & Ahmadi, *V-Net: Fully Convolutional Neural Networks for
    Volumetric Medical Image Segmentation*, 3DV 2016; Salehi, Erdogmus &
    Gholipour, *Tversky Loss Function for Image Segmentation Using 3D Fully
    Convolutional Deep Networks*, MLMI 2017.
    """
    predictions = jnp.asarray(predictions)
    targets = as_float(targets, predictions)
    probabilities = _probabilities(predictions, apply_softmax)
    return _dice(
        probabilities,
        targets,
        class_weights=class_weights,
        smooth=smooth,
        alpha=alpha,
        beta=beta,
        reduction=reduction,
        ignore_background=ignore_background,
        axis=axis,
    )


@same_shapes("predictions", "targets")
@checked
def binary_dice_loss(
    predictions: Float[ArrayLike, "*shape"],
    targets: Real[ArrayLike, "*shape"] | Bool[ArrayLike, "*shape"],
    *,
    smooth: Real[ArrayLike, ""] = 1.0,
    apply_sigmoid: bool = True,
) -> Float[Array, "..."]:
    r"""The soft Dice loss of a binary segmentation.

    With $p = \sigma(x)$ and binary targets $t$, summed over every axis except
    the first (batch),

    $$ \ell = 1 - \frac{2 \sum_i p_i t_i + 2s}{\sum_i p_i + \sum_i t_i + 2s} $$

    A trailing axis of size 1 is taken as the (single) class axis; otherwise one
    is added. With `apply_sigmoid=False` the predictions are used as
    probabilities (Optax raises an error in that case).

    **Arguments:**

    - `predictions`: logits (or probabilities), of shape `(batch, *spatial)`
      or `(batch, *spatial, 1)`.
    - `targets`: binary targets (integer or floating), of the same shape.
    - `smooth`: the smoothing constant $s$.
    - `apply_sigmoid`: whether to apply the sigmoid to `predictions`.

    **Returns:**

    The losses, of shape `(batch,)` (a scalar for a 1-D input).

    **References:**

    Milletari, Navab & Ahmadi, *V-Net: Fully Convolutional Neural Networks for
    Volumetric Medical Image Segmentation*, 3DV 2016.
    """
    predictions = jnp.asarray(predictions)
    targets = as_float(targets, predictions)
    if predictions.ndim == 0 or predictions.shape[-1] != 1:
        predictions = predictions[..., None]
        targets = targets[..., None]
    probabilities = jax.nn.sigmoid(predictions) if apply_sigmoid else predictions
    return _dice(
        probabilities,
        targets,
        class_weights=None,
        smooth=smooth,
        alpha=0.5,
        beta=0.5,
        reduction="mean",
        ignore_background=False,
        axis=None,
    )


@same_shapes("predictions", "targets")
@checked
def multiclass_generalized_dice_loss(
    predictions: Float[ArrayLike, "*batch classes"],
    targets: Real[ArrayLike, "*batch classes"] | Bool[ArrayLike, "*batch classes"],
    *,
    smooth: Real[ArrayLike, ""] = 1.0,
    apply_softmax: bool = True,
    ignore_background: bool = False,
) -> Float[Array, ""]:
    r"""The soft Dice loss with classes weighted by their inverse squared volume.

    Each class $c$ gets the weight of Sudre et al.,
    $w_c = 1 / (V_c^2 + \varepsilon)$ with $V_c$ its target volume over the whole
    batch (and $\varepsilon = 10^{-6}$), rescaled to average 1 over the classes,
    $\hat w_c = C\, w_c / \sum_k w_k$. The loss is the mean over the batch and
    the (kept) classes of the weighted per-class Dice losses $\hat w_c \ell_c$
    of `eqopt.losses.dice_loss`:

    $$ \ell = \frac{1}{|B|} \sum_{b \in B} \frac{1}{C} \sum_c \hat w_c
       \Big(1 - \frac{2 I_{bc} + 2s}{P_{bc} + T_{bc} + 2s}\Big) $$

    so rare classes count as much as frequent ones. This weighted mean of
    per-class losses is what Optax computes; Sudre et al. instead take one
    ratio of weighted sums, $1 - 2\sum_c w_c I_c / \sum_c w_c (P_c + T_c)$.

    **Arguments:**

    - `predictions`: logits (or probabilities), of shape
      `(batch, *spatial, classes)`.
    - `targets`: one-hot (or soft) targets, of the same shape (boolean or
      integer one-hot targets are taken as the predictions' float dtype).
    - `smooth`: the smoothing constant $s$.
    - `apply_softmax`: whether to apply the softmax over classes (a sigmoid for
      a single class).
    - `ignore_background`: whether to leave out class 0 (the weights are still
      normalised over every class).

    **Returns:**

    The loss, a scalar.

    **References:**

    Sudre et al., *Generalised Dice Overlap as a Deep Learning Loss Function
    for Highly Unbalanced Segmentations*, DLMIA 2017.
    """
    predictions = jnp.asarray(predictions)
    targets = as_float(targets, predictions)
    num_classes = targets.shape[-1]
    volumes = jnp.sum(targets, axis=tuple(range(targets.ndim - 1)))
    weights = 1 / (jnp.square(volumes) + _VOLUME_EPSILON)
    weights = num_classes * weights / jnp.sum(weights)
    losses = _dice(
        _probabilities(predictions, apply_softmax),
        targets,
        class_weights=weights,
        smooth=smooth,
        alpha=0.5,
        beta=0.5,
        reduction="mean",
        ignore_background=ignore_background,
        axis=None,
    )
    return jnp.mean(losses)
