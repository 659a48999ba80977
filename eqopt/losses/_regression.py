"""Regression losses: squared error, Huber, log-cosh and cosine similarity."""

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Real

from .._typecheck import checked
from ._utils import expand_where, normalize_axes, same_shapes


def _difference(
    predictions: Float[ArrayLike, "*shape"], targets: Real[ArrayLike, "*shape"] | None
) -> Float[Array, "*shape"]:
    predictions = jnp.asarray(predictions)
    if targets is None:
        return predictions
    return predictions - jnp.asarray(targets)


@same_shapes("predictions", "targets")
@checked
def squared_error(
    predictions: Float[ArrayLike, "*shape"],
    targets: Real[ArrayLike, "*shape"] | None = None,
) -> Float[Array, "*shape"]:
    r"""The elementwise squared error between predictions and targets.

    $$ \ell(\hat y, y) = (\hat y - y)^2 $$

    The mean squared error is `squared_error(predictions, targets).mean()`. No
    axis is reduced. `targets` must have exactly the shape of `predictions`.

    **Arguments:**

    - `predictions`: the predicted values, a floating array of any shape.
    - `targets`: the target values, of the same shape. `None` means zeros.

    **Returns:**

    The squared errors, with the shape of `predictions`.

    **References:**

    Bishop, *Pattern Recognition and Machine Learning*, 2006, §1.1.
    """
    return jnp.square(_difference(predictions, targets))


@same_shapes("predictions", "targets")
@checked
def l2_loss(
    predictions: Float[ArrayLike, "*shape"],
    targets: Real[ArrayLike, "*shape"] | None = None,
) -> Float[Array, "*shape"]:
    r"""Half the elementwise squared error between predictions and targets.

    $$ \ell(\hat y, y) = \tfrac{1}{2} (\hat y - y)^2 $$

    The factor $\tfrac12$ makes the gradient the plain residual $\hat y - y$.
    No axis is reduced; `targets` must have exactly the shape of `predictions`.

    **Arguments:**

    - `predictions`: the predicted values, a floating array of any shape.
    - `targets`: the target values, of the same shape. `None` means zeros.

    **Returns:**

    Half the squared errors, with the shape of `predictions`.

    **References:**

    Bishop, *Pattern Recognition and Machine Learning*, 2006, §1.1 (eq. 1.2).
    """
    return 0.5 * squared_error(predictions, targets)


@same_shapes("predictions", "targets")
@checked
def huber_loss(
    predictions: Float[ArrayLike, "*shape"],
    targets: Real[ArrayLike, "*shape"] | None = None,
    *,
    delta: Real[ArrayLike, ""] = 1.0,
) -> Float[Array, "*shape"]:
    r"""The elementwise Huber loss: quadratic near zero, linear beyond `delta`.

    With $r = \hat y - y$,

    $$ \ell(r) = \begin{cases} \tfrac12 r^2 & |r| \le \delta \\
       \delta\,(|r| - \tfrac12 \delta) & |r| > \delta \end{cases} $$

    Its gradient is the residual clipped to $[-\delta, \delta]$. No axis is
    reduced.

    `targets` must have exactly the shape of `predictions`: a `(batch, 1)`
    prediction against `(batch,)` targets is an error here, where Optax
    silently broadcasts to `(batch, batch)`. Broadcast explicitly if that is
    meant.

    **Arguments:**

    - `predictions`: the predicted values, a floating array of any shape.
    - `targets`: the target values, of the same shape. `None` means zeros.
    - `delta`: the residual at which the loss turns from quadratic to linear.

    **Returns:**

    The Huber losses, with the shape of `predictions`.

    **References:**

    Huber, *Robust Estimation of a Location Parameter*, Annals of Mathematical
    Statistics, 1964.
    """
    residual = jnp.abs(_difference(predictions, targets))
    # Written as quadratic + linear parts so both branches are smooth and finite.
    quadratic = jnp.minimum(residual, delta)
    linear = residual - quadratic
    return 0.5 * jnp.square(quadratic) + delta * linear


@same_shapes("predictions", "targets")
@checked
def log_cosh(
    predictions: Float[ArrayLike, "*shape"],
    targets: Real[ArrayLike, "*shape"] | None = None,
) -> Float[Array, "*shape"]:
    r"""The elementwise logarithm of the hyperbolic cosine of the error.

    $$ \ell(\hat y, y) = \log\cosh(\hat y - y) $$

    It behaves like $\tfrac12 r^2$ for small errors and like $|r| - \log 2$ for
    large ones, and is twice differentiable. It is computed as
    $\operatorname{logaddexp}(r, -r) - \log 2$, which does not overflow. No axis
    is reduced; `targets` must have exactly the shape of `predictions` (Optax
    broadcasts them).

    **Arguments:**

    - `predictions`: the predicted values, a floating array of any shape.
    - `targets`: the target values, of the same shape. `None` means zeros.

    **Returns:**

    The log-cosh losses, with the shape of `predictions`.

    **References:**

    Chen et al., *Log Hyperbolic Cosine Loss Improves Variational Auto-Encoder*,
    2019.
    """
    residual = _difference(predictions, targets)
    return jnp.logaddexp(residual, -residual) - jnp.log(2.0).astype(residual.dtype)


def _floored_norm(x, axes, epsilon):
    """$\\sqrt{\\max(\\|x\\|^2, \\epsilon)}$, with a zero gradient where it is zero."""
    squared = jnp.maximum(jnp.sum(jnp.square(x), axis=axes), epsilon)
    positive = squared > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, squared, 1)), 0)


@same_shapes("predictions", "targets", "where")
@checked
def cosine_similarity(
    predictions: Float[ArrayLike, "*shape"],
    targets: Float[ArrayLike, "*shape"],
    *,
    epsilon: Real[ArrayLike, ""] = 0.0,
    axis: int | tuple[int, ...] | None = -1,
    where: Bool[ArrayLike, "*shape"] | None = None,
) -> Float[Array, "..."]:
    r"""The cosine of the angle between predicted and target vectors.

    $$ \cos(\hat y, y) = \frac{\langle \hat y, y \rangle}
       {\sqrt{\max(\|\hat y\|^2, \epsilon)}\,\sqrt{\max(\|y\|^2, \epsilon)}} $$

    The inner product and norms run over `axis` and over the entries selected
    by `where`. As in Optax, `epsilon` floors the *squared* norms.

    Where a norm in the denominator is zero (a zero vector with `epsilon=0`, or
    a `where` that selects nothing), the similarity is 0 and its gradient is
    finite; Optax returns NaN values or gradients there.

    **Arguments:**

    - `predictions`: the predicted vectors, a floating array.
    - `targets`: the target vectors, of the same shape.
    - `epsilon`: the least value of each squared norm in the denominator.
    - `axis`: the axis or axes holding the vector components (`None`: all).
    - `where`: a boolean mask of the shape of `predictions`; only the selected
      components count.

    **Returns:**

    The similarities, with the shape of `predictions` without `axis`.

    **References:**

    Manning, Raghavan & Schütze, *Introduction to Information Retrieval*, 2008,
    §6.3.1.
    """
    predictions = jnp.asarray(predictions)
    targets = jnp.asarray(targets)
    axes = normalize_axes(axis, predictions.ndim)
    where = expand_where(where, predictions.shape, axes, allow_batch_shape=False)
    if where is not None:
        predictions = jnp.where(where, predictions, 0)
        targets = jnp.where(where, targets, 0)
    inner = jnp.sum(predictions * targets, axis=axes)
    denominator = _floored_norm(predictions, axes, epsilon) * _floored_norm(
        targets, axes, epsilon
    )
    positive = denominator > 0
    return jnp.where(positive, inner / jnp.where(positive, denominator, 1), 0)


@same_shapes("predictions", "targets", "where")
@checked
def cosine_distance(
    predictions: Float[ArrayLike, "*shape"],
    targets: Float[ArrayLike, "*shape"],
    *,
    epsilon: Real[ArrayLike, ""] = 0.0,
    axis: int | tuple[int, ...] | None = -1,
    where: Bool[ArrayLike, "*shape"] | None = None,
) -> Float[Array, "..."]:
    r"""One minus the cosine similarity between predicted and target vectors.

    $$ d(\hat y, y) = 1 - \frac{\langle \hat y, y \rangle}
       {\sqrt{\max(\|\hat y\|^2, \epsilon)}\,\sqrt{\max(\|y\|^2, \epsilon)}} $$

    It lies in $[0, 2]$. Zero norms are handled as in
    `eqopt.losses.cosine_similarity` (distance 1, finite gradient).

    **Arguments:**

    - `predictions`: the predicted vectors, a floating array.
    - `targets`: the target vectors, of the same shape.
    - `epsilon`: the least value of each squared norm in the denominator.
    - `axis`: the axis or axes holding the vector components (`None`: all).
    - `where`: a boolean mask of the shape of `predictions`; only the selected
      components count.

    **Returns:**

    The distances, with the shape of `predictions` without `axis`.

    **References:**

    Manning, Raghavan & Schütze, *Introduction to Information Retrieval*, 2008,
    §6.3.1.
    """
    similarity = cosine_similarity(
        predictions, targets, epsilon=epsilon, axis=axis, where=where
    )
    return 1 - similarity
