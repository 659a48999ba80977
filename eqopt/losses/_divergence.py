"""Kullback-Leibler divergences between target and predicted distributions.

Every entry with target probability exactly 0 contributes 0 (the convention
$0 \\log 0 = 0$), with a finite gradient, even where the predicted
log-probability is $-\\infty$.
"""

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from .._deprecation import deprecated
from .._typecheck import checked
from ._utils import expand_where, normalize_axes, same_shapes


def _prepare(log_predictions, targets, axis, where, *, log_targets=False):
    """Arrays and axes; entries left out by `where` become empty (t = q = 0)."""
    log_predictions = jnp.asarray(log_predictions)
    targets = jnp.asarray(targets)
    axes = normalize_axes(axis, log_predictions.ndim)
    where = expand_where(where, log_predictions.shape, axes, allow_batch_shape=False)
    if where is not None:
        log_predictions = jnp.where(where, log_predictions, -jnp.inf)
        targets = jnp.where(where, targets, -jnp.inf if log_targets else 0)
    return log_predictions, targets, axes


def _relative_entropy_terms(log_predictions, targets):
    r"""$t (\log t - \log q)$, zero with a finite gradient where $t = 0$."""
    vanishes = targets == 0
    safe_targets = jnp.where(vanishes, 1, targets)
    safe_log_predictions = jnp.where(vanishes, 0, log_predictions)
    terms = safe_targets * (jnp.log(safe_targets) - safe_log_predictions)
    return jnp.where(vanishes, 0, terms)


@same_shapes("log_predictions", "targets", "where")
@checked
def kl_divergence(
    log_predictions: Float[ArrayLike, "*shape"],
    targets: Float[ArrayLike, "*shape"],
    axis: int | tuple[int, ...] | None = -1,
    where: Bool[ArrayLike, "*shape"] | None = None,
) -> Float[Array, "..."]:
    r"""The Kullback-Leibler divergence of the predictions from the targets.

    $$ D_{\mathrm{KL}}(t \,\|\, q) = \sum_c t_c\, (\log t_c - \log q_c) $$

    The predictions are given as log-probabilities $\log q$, the targets as
    probabilities $t$. The sum runs over `axis` and the entries selected by
    `where`. Entries with $t_c = 0$ contribute 0, also where
    $\log q_c = -\infty$ (Optax returns NaN there).

    **Arguments:**

    - `log_predictions`: predicted log-probabilities, e.g. of shape
      `(*batch, classes)`.
    - `targets`: target probabilities (non-negative), of the same shape.
    - `axis`: the axis or axes of the distribution (`None`: all axes).
    - `where`: a boolean mask of the shape of `log_predictions`; entries to
      include.

    **Returns:**

    The divergences, with the shape of `log_predictions` without `axis`.

    **References:**

    Kullback & Leibler, *On Information and Sufficiency*, Annals of
    Mathematical Statistics, 1951.
    """
    log_predictions, targets, axes = _prepare(log_predictions, targets, axis, where)
    return jnp.sum(_relative_entropy_terms(log_predictions, targets), axis=axes)


@same_shapes("log_predictions", "log_targets", "where")
@checked
def kl_divergence_with_log_targets(
    log_predictions: Float[ArrayLike, "*shape"],
    log_targets: Float[ArrayLike, "*shape"],
    axis: int | tuple[int, ...] | None = -1,
    where: Bool[ArrayLike, "*shape"] | None = None,
) -> Float[Array, "..."]:
    r"""The Kullback-Leibler divergence, with the targets given as log-probabilities.

    $$ D_{\mathrm{KL}}(t \,\|\, q) = \sum_c e^{\log t_c}\, (\log t_c - \log q_c) $$

    Entries with $\log t_c = -\infty$ contribute 0 with a zero gradient (Optax
    returns NaN there).

    **Arguments:**

    - `log_predictions`: predicted log-probabilities, e.g. of shape
      `(*batch, classes)`.
    - `log_targets`: target log-probabilities, of the same shape.
    - `axis`: the axis or axes of the distribution (`None`: all axes).
    - `where`: a boolean mask of the shape of `log_predictions`; entries to
      include.

    **Returns:**

    The divergences, with the shape of `log_predictions` without `axis`.

    **References:**

    Kullback & Leibler, *On Information and Sufficiency*, Annals of
    Mathematical Statistics, 1951.
    """
    log_predictions, log_targets, axes = _prepare(
        log_predictions, log_targets, axis, where, log_targets=True
    )
    vanishes = jnp.isneginf(log_targets)
    safe_log_targets = jnp.where(vanishes, 0, log_targets)
    safe_log_predictions = jnp.where(vanishes, 0, log_predictions)
    terms = jnp.exp(safe_log_targets) * (safe_log_targets - safe_log_predictions)
    return jnp.sum(jnp.where(vanishes, 0, terms), axis=axes)


@same_shapes("log_predictions", "targets", "where")
@checked
def generalized_kl_divergence(
    log_predictions: Float[ArrayLike, "*shape"],
    targets: Float[ArrayLike, "*shape"],
    axis: int | tuple[int, ...] | None = -1,
    where: Bool[ArrayLike, "*shape"] | None = None,
) -> Float[Array, "..."]:
    r"""The generalised Kullback-Leibler divergence, for unnormalised measures.

    $$ D(t \,\|\, q) = \sum_c \big( t_c (\log t_c - \log q_c) - t_c + q_c \big) $$

    It is the Bregman divergence generated by $x \log x - x$, is non-negative for
    any non-negative $t$ and $q$, and equals the KL divergence when both sum to 1.
    Entries with $t_c = 0$ contribute $q_c$.

    **Arguments:**

    - `log_predictions`: logarithms of the predicted measure, e.g. of shape
      `(*batch, dim)`.
    - `targets`: the target measure (non-negative), of the same shape.
    - `axis`: the axis or axes of the measure (`None`: all axes).
    - `where`: a boolean mask of the shape of `log_predictions`; entries to
      include.

    **Returns:**

    The divergences, with the shape of `log_predictions` without `axis`.

    **References:**

    Bregman, *The Relaxation Method of Finding the Common Point of Convex Sets
    and its Application to the Solution of Problems in Convex Programming*,
    1967; Boyd & Vandenberghe, *Convex Optimization*, 2004, §3.1.5.
    """
    log_predictions, targets, axes = _prepare(log_predictions, targets, axis, where)
    terms = _relative_entropy_terms(log_predictions, targets)
    return jnp.sum(terms - targets + jnp.exp(log_predictions), axis=axes)


@deprecated(
    "`eqopt.losses.generalized_kl_divergence`", optax_says="generalized_kl_divergence"
)
@same_shapes("log_predictions", "targets", "where")
@checked
def convex_kl_divergence(
    log_predictions: Float[ArrayLike, "*shape"],
    targets: Float[ArrayLike, "*shape"],
    axis: int | tuple[int, ...] | None = -1,
    where: Bool[ArrayLike, "*shape"] | None = None,
) -> Float[Array, "..."]:
    r"""The generalised (convex) Kullback-Leibler divergence; Optax's older name.

    $$ D(t \,\|\, q) = \sum_c \big( t_c (\log t_c - \log q_c) - t_c + q_c \big) $$

    Identical to `eqopt.losses.generalized_kl_divergence`, kept so that code
    using Optax's deprecated name ports unchanged. Unlike the plain KL divergence
    it is jointly convex in $(t, q)$ for unnormalised $q$.

    **Arguments:**

    - `log_predictions`: logarithms of the predicted measure, e.g. of shape
      `(*batch, dim)`.
    - `targets`: the target measure (non-negative), of the same shape.
    - `axis`: the axis or axes of the measure (`None`: all axes).
    - `where`: a boolean mask of the shape of `log_predictions`; entries to
      include.

    **Returns:**

    The divergences, with the shape of `log_predictions` without `axis`.

    **References:**

    Bregman, 1967; Boyd & Vandenberghe, *Convex Optimization*, 2004, §3.1.5.
    """
    return generalized_kl_divergence(log_predictions, targets, axis=axis, where=where)
