"""Layer-wise trust ratios: the transform, and LAMB, LARS and Fromage built on it."""

from collections.abc import Callable
from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Real

from .._base import AbstractGradientTransformation, EmptyState, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._filters import FilterSpec
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_hyperparameter,
)
from .._leafwise import leafwise, require_params
from .._typecheck import checked
from ..schedules._base import AbstractSchedule
from .adam import ScaleByAdam
from .basic import ScaleByLearningRate
from .block import floored_norm
from .decay import AddDecayedWeights


@checked
class ScaleByTrustRatio(AbstractGradientTransformation):
    r"""Rescales each leaf's update by the ratio of the parameter's norm to the update's.

    $$
    u_\ell \mapsto c\, \frac{\|\theta_\ell\|_m}{\|u_\ell\|_m + \epsilon}\, u_\ell,
    \qquad \|x\|_m = \max(\|x\|_2, m)
    $$

    with the norms over the whole leaf (one trust ratio per leaf, so the
    transform is not elementwise). Where either norm is zero the ratio is 1:
    a zero-initialised layer, or one with no gradient, is left unscaled. This
    is the layer-wise adaptation of LARS and LAMB.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `min_norm`: $m \ge 0$, the floor of both norms.
    - `trust_coefficient`: $c$.
    - `eps`: $\epsilon \ge 0$, added to the update's norm.

    **References:** You, Gitman & Ginsburg, *Large Batch Training of
    Convolutional Networks*, arXiv:1708.03888, 2017; You et al., *Large Batch
    Optimization for Deep Learning: Training BERT in 76 minutes*, ICLR 2020.
    """

    min_norm: Scalar = eqx.field(default=0.0, converter=as_scalar)
    trust_coefficient: Scalar = eqx.field(default=1.0, converter=as_scalar)
    eps: Scalar = eqx.field(default=0.0, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return False

    def __check_init__(self):
        check_hyperparameter("min_norm", self.min_norm, low=0.0)
        check_hyperparameter("eps", self.eps, low=0.0)

    @init_entry
    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    @update_entry
    def update(
        self,
        updates: Updates,
        state: EmptyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmptyState]:
        require_params(params, "scale_by_trust_ratio")
        min_norm, coefficient, eps = self.min_norm, self.trust_coefficient, self.eps

        @no_type_check
        def step(u, p):
            param_norm = floored_norm(p, min_norm)
            update_norm = floored_norm(u, min_norm)
            zero = (param_norm == 0) | (update_norm == 0)
            # The denominator is replaced where unused, so no inf/NaN is formed.
            ratio = coefficient * param_norm / jnp.where(zero, 1, update_norm + eps)
            return (u * jnp.where(zero, 1, ratio)).astype(u.dtype)

        return leafwise(step, updates, params), state


@checked
def scale_by_trust_ratio(
    min_norm: ScalarLike = 0.0,
    trust_coefficient: ScalarLike = 1.0,
    eps: ScalarLike = 0.0,
) -> ScaleByTrustRatio:
    """Optax spelling of `eqopt.ScaleByTrustRatio`."""
    return ScaleByTrustRatio(
        min_norm=min_norm, trust_coefficient=trust_coefficient, eps=eps
    )


@checked
def lamb(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-6,
    eps_root: ScalarLike = 0.0,
    weight_decay: ScalarOrSchedule = 0.0,
    mask: FilterSpec | None = None,
) -> Chain:
    r"""LAMB: Adam with decoupled weight decay, rescaled per layer by a trust ratio.

    $$
    r_t = \frac{\hat m_t}{\sqrt{\hat v_t + \epsilon_{\text{root}}} + \epsilon} + \lambda\, \theta_{t-1},
    \qquad
    u_t = -\eta_t\, \frac{\|\theta_{t-1}\|}{\|r_t\|}\, r_t
    $$

    per leaf, with $\hat m_t, \hat v_t$ Adam's bias-corrected moments (the
    ratio is 1 where a norm is zero). The chain is `eqopt.ScaleByAdam`,
    `eqopt.AddDecayedWeights`, `eqopt.ScaleByTrustRatio`,
    `eqopt.ScaleByLearningRate`; `update` needs `params`.

    `mask` selects the leaves to decay with an Equinox filter spec: a per-leaf
    predicate such as `lambda x: x.ndim > 1`, or a prefix pytree of bools and
    predicates. A full boolean pytree (Optax's kind of mask) is one such spec.
    Unlike Optax, a callable is always a per-leaf predicate, never a function
    of the whole params.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `b1`, `b2`: Adam's decay rates.
    - `eps`, `eps_root`: added to Adam's denominator, outside and inside the root.
    - `weight_decay`: $\lambda$, a number or a schedule.
    - `mask`: the filter spec of the leaves to decay (default: all).

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        opt = eqopt.lamb(1e-3, weight_decay=1e-2, mask=lambda x: x.ndim > 1)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)   # params: for the trust ratio
        model = eqopt.apply_updates(model, updates)
        ```

    **References:** You et al., *Large Batch Optimization for Deep Learning:
    Training BERT in 76 minutes*, ICLR 2020.
    """
    return Chain(
        ScaleByAdam(b1=b1, b2=b2, eps=eps, eps_root=eps_root),
        AddDecayedWeights(weight_decay=weight_decay, mask=mask),
        ScaleByTrustRatio(),
        ScaleByLearningRate(learning_rate),
    )


class _FromageFactor(AbstractSchedule):
    # Fromage's two scalars for a scheduled learning rate: the step
    # $\eta / \sqrt{1 + \eta^2}$ and the shrinkage $1 / \sqrt{1 + \eta^2} - 1$.
    learning_rate: Callable[..., Any]
    shrinkage: bool = eqx.field(static=True)

    def __call__(self, count: Real[ArrayLike, ""]) -> Float[Array, ""]:
        learning_rate = jnp.asarray(self.learning_rate(count))
        return _fromage_factor(learning_rate, self.shrinkage)


@no_type_check
def _fromage_factor(learning_rate, shrinkage):
    multiplier = 1 / jnp.sqrt(1 + learning_rate**2)
    return multiplier - 1 if shrinkage else learning_rate * multiplier


@checked
def fromage(learning_rate: ScalarOrSchedule, min_norm: ScalarLike = 1e-6) -> Chain:
    r"""Fromage: steps by the gradient rescaled to the weights' norm, then shrinks the weights.

    $$
    \theta_t = \frac{1}{\sqrt{1 + \eta_t^2}} \left( \theta_{t-1}
        - \eta_t\, \frac{\|\theta_{t-1}\|_m}{\|g_t\|_m}\, g_t \right)
    $$

    per leaf, with $\|x\|_m = \max(\|x\|_2, m)$: a step of relative size
    $\eta$ on each layer, then a shrinkage that keeps the weights' norm from
    growing. The chain is `eqopt.ScaleByTrustRatio`,
    `eqopt.ScaleByLearningRate` (by $\eta / \sqrt{1 + \eta^2}$) and
    `eqopt.AddDecayedWeights` (by $1 / \sqrt{1 + \eta^2} - 1$); `update`
    needs `params`. With a scheduled learning rate both factors follow the
    schedule.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `min_norm`: $m$, the floor of both norms.

    **Returns:** an `eqopt.Chain`.

    **References:** Bernstein, Vahdat, Yue & Liu, *On the distance between two
    neural networks and the stability of learning*, NeurIPS 2020.
    """
    if callable(learning_rate):
        step = _FromageFactor(learning_rate, shrinkage=False)
        shrinkage = _FromageFactor(learning_rate, shrinkage=True)
    else:
        learning_rate = as_scalar(learning_rate)
        step = _fromage_factor(learning_rate, False)
        shrinkage = _fromage_factor(learning_rate, True)
    return Chain(
        ScaleByTrustRatio(min_norm=min_norm),
        ScaleByLearningRate(step),
        AddDecayedWeights(weight_decay=shrinkage),
    )
