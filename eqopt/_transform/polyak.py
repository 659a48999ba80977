"""Polyak's step size: the suboptimality gap over the squared gradient norm."""

from typing import Any, Literal, no_type_check

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import ArrayLike, Real

from .._base import AbstractGradientTransformation, EmptyState, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_hyperparameter,
)
from .._leafwise import leafwise
from .._numerics import tree_l2_norm
from .._typecheck import checked
from .basic import Identity, ScaleByLearningRate

_VARIANTS = ("sps", "sps+")


@checked
class ScaleByPolyak(AbstractGradientTransformation):
    r"""Scales the updates by the stochastic Polyak step size.

    $$
    \gamma_t = \min\left( \frac{f(\theta_t) - f^\star}{\|g_t\|^2 + \epsilon},\ \gamma_{\max} \right),
    \qquad u_t = \gamma_t\, g_t
    $$

    where $f(\theta_t)$ is the objective's current value, passed to `update` as
    the keyword argument `value`, and $\|g_t\|$ is the norm of all the updates
    together (so the transform is elementwise in the sense of fusion). With
    `variant="sps+"` the gap is clipped at zero, $(f(\theta_t) - f^\star)_+$. A
    zero gradient gives a zero update, as in Optax. Follow with a negative
    scaling to descend, as `eqopt.polyak_sgd` does.

    !!! example

        ```python
        opt = eqopt.chain(
            eqopt.scale_by_polyak(max_learning_rate=1.0), eqopt.scale(-1.0)
        )
        state = opt.init(model)
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        updates, state = opt.update(grads, state, model, value=loss)
        ```

    **Global**: one step size over all the leaves, a stacked layer's slices included.

    **Arguments:**

    - `f_min`: $f^\star$, a lower bound on the objective (0 for models that can
      interpolate the data).
    - `max_learning_rate`: $\gamma_{\max}$.
    - `eps`: $\epsilon$, added to the squared norm.
    - `variant`: `"sps"` or `"sps+"`.

    **References:** Polyak, *Introduction to Optimization*, 1987; Loizou,
    Vaswani, Laradji & Lacoste-Julien, *Stochastic Polyak Step-size for SGD: An
    Adaptive Learning Rate for Fast Convergence*, AISTATS 2021; Berrada,
    Zisserman & Kumar, *Training Neural Networks for and by Interpolation*,
    ICML 2020; Garrigos, Gower & Schaipp, *Function Value Learning: Adaptive
    Learning Rates Based on the Polyak Stepsize and Function Splitting in
    ERM*, arXiv:2307.14528, 2023 (SPS+).
    """

    f_min: Scalar = eqx.field(default=0.0, converter=as_scalar)
    max_learning_rate: Scalar = eqx.field(default=1.0, converter=as_scalar)
    eps: Scalar = eqx.field(default=0.0, converter=as_scalar)
    variant: Literal["sps", "sps+"] = eqx.field(default="sps", static=True)

    # The step size reads only the updates and the value, so `params` (of any
    # structure, as in Optax) is not checked against them.
    params_like_updates = False

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_hyperparameter("max_learning_rate", self.max_learning_rate, low=0.0)
        check_hyperparameter("eps", self.eps, low=0.0)
        if self.variant not in _VARIANTS:
            raise ValueError(
                f"scale_by_polyak: `variant` must be 'sps' or 'sps+', got {self.variant!r}."
            )

    @init_entry
    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    @update_entry
    def update(
        self,
        updates: Updates,
        state: EmptyState,
        params: Params | None = None,
        *,
        value: Real[ArrayLike, ""] | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmptyState]:
        if value is None:
            # A missing argument: a TypeError, as Python (and Optax) say.
            raise TypeError(
                "scale_by_polyak needs the objective's current value: call "
                "`update(updates, state, params, value=loss)`."
            )
        gap = jnp.asarray(value) - self.f_min
        if self.variant == "sps+":
            gap = jnp.maximum(gap, 0)
        denominator = tree_l2_norm(updates) ** 2 + self.eps
        # A zero gradient (with eps = 0) takes no step rather than 0 * inf.
        positive = denominator > 0
        step_size = jnp.where(
            positive,
            jnp.minimum(
                gap / jnp.where(positive, denominator, 1), self.max_learning_rate
            ),
            0,
        )

        @no_type_check
        def scale(g):
            return (step_size * g).astype(g.dtype)

        return leafwise(scale, updates), state


@checked
def scale_by_polyak(
    f_min: ScalarLike = 0.0,
    max_learning_rate: ScalarLike = 1.0,
    eps: ScalarLike = 0.0,
    variant: Literal["sps", "sps+"] = "sps",
) -> ScaleByPolyak:
    """Optax spelling of `eqopt.ScaleByPolyak`."""
    return ScaleByPolyak(
        f_min=f_min, max_learning_rate=max_learning_rate, eps=eps, variant=variant
    )


@checked
def polyak_sgd(
    max_learning_rate: ScalarLike = 1.0,
    scaling: ScalarOrSchedule = 1.0,
    f_min: ScalarLike = 0.0,
    eps: ScalarLike = 0.0,
    variant: Literal["sps", "sps+"] = "sps",
) -> Chain:
    r"""SGD with the stochastic Polyak step size.

    The chain is `eqopt.sgd` with learning rate `scaling`, then
    `eqopt.ScaleByPolyak`; `update` needs the keyword argument `value`, the
    objective at the current parameters. With $s$ the scaling, the Polyak step
    is computed on the already scaled gradient $-s\,g_t$:

    $$
    u_t = -\min\left( \frac{f(\theta_t) - f^\star}{s^2 \|g_t\|^2 + \epsilon},\ \gamma_{\max} \right) s\, g_t
    $$

    so while the step is below $\gamma_{\max}$ it is $1/s$ times Polyak's, not
    $s$ times as Optax's documentation says (its code, which eqopt matches,
    computes the formula above). Leave `scaling` at 1 for the textbook method.

    !!! example
        ```python
        opt = eqopt.polyak_sgd(max_learning_rate=1.0)
        state = opt.init(model)
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        updates, state = opt.update(grads, state, model, value=loss)  # the loss too
        ```

    **Arguments:**

    - `max_learning_rate`: $\gamma_{\max}$.
    - `scaling`: $s$, a number or a schedule of the step count.
    - `f_min`: $f^\star$, a lower bound on the objective.
    - `eps`: $\epsilon$, added to the squared norm.
    - `variant`: `"sps"`, or `"sps+"` to clip the gap at zero.

    **Returns:** an `eqopt.Chain`.

    **References:** Loizou, Vaswani, Laradji & Lacoste-Julien, *Stochastic
    Polyak Step-size for SGD: An Adaptive Learning Rate for Fast Convergence*,
    AISTATS 2021; Berrada, Zisserman & Kumar, *Training Neural Networks for and
    by Interpolation*, ICML 2020.
    """
    # `Chain(Identity(), ScaleByLearningRate(...))` is `eqopt.sgd(scaling)`, written
    # from its parts: a transform family sits below the optimisers of `_alias`.
    return Chain(
        Chain(Identity(), ScaleByLearningRate(learning_rate=scaling)),
        ScaleByPolyak(
            f_min=f_min, max_learning_rate=max_learning_rate, eps=eps, variant=variant
        ),
    )
