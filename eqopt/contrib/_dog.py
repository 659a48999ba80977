"""DoG and DoWG: parameter-free step sizes from the distance travelled.

DoG is from Ivgi, Hinder & Carmon (2023), DoWG from Khaled, Mishchenko & Jin
(2023).
"""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from .._base import AbstractGradientTransformation, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._filters import FilterSpec
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_optional_scalar,
    as_scalar,
    check_hyperparameter,
)
from .._leafwise import leafwise
from .._optax_tuple import OptaxTuple
from .._transform.basic import Identity, ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._reductions import (
    cast_to,
    copy_trainable,
    require_params,
    scalar_dtype,
    tree_squared_norm,
)

_INIT_STEP_KINDS = ("distance", "learning_rate", "heuristic")


@no_type_check
def _squared_distance(updates, params, init_params):
    return tree_squared_norm(
        leafwise(lambda g, p, p0: p - p0, updates, params, init_params)
    )


@no_type_check
def _scale(updates, step_size):
    return leafwise(lambda g: cast_to(step_size * g, g.dtype), updates)


@checked
class DoGState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByDoG`: the initial parameters, the
    largest distance from them $\\bar r_t$ and the sum of squared gradient norms."""

    is_init_step: Bool[Array, ""]
    init_params: Updates
    max_dist: Float[Array, ""]
    sum_sq_norm_grads: Float[Array, ""]


@checked
class ScaleByDoG(AbstractGradientTransformation):
    r"""Scales the updates by DoG's step size, distance over gradients.

    $$
    \bar r_t = \max\big(r_\epsilon,\ \max_{k \le t} \|x_k - x_0\|\big), \qquad
    G_t = \sum_{k \le t} \|g_k\|^2, \qquad
    u_t = \frac{\bar r_t}{\sqrt{G_t + \epsilon}}\, g_t
    $$

    The norms are over the whole model. The first step is set by
    `init_step_kind`: `"distance"` gives $r_\epsilon$ = `init_step_value`;
    `"heuristic"` gives $r_\epsilon = \alpha (1 + \|x_0\|)$ with $\alpha$ =
    `init_step_value` (so `init` needs the real parameters); `"learning_rate"`
    makes the first step size `init_step_value` itself (and $r_\epsilon = 0$).

    The updates are not negated: `eqopt.contrib.dog` follows this with the
    learning rate.

    **Global**: one step size over all the leaves, a stacked layer's slices included.

    **Arguments:**

    - `init_step_kind`: `"heuristic"`, `"distance"` or `"learning_rate"` (static).
    - `init_step_value`: the value that goes with it.
    - `eps`: added to $G_t$.

    **References:** Ivgi, Hinder & Carmon, *DoG is SGD's Best Friend: A
    Parameter-Free Dynamic Step Size Schedule*, ICML 2023 (arXiv:2302.12022).
    """

    init_step_kind: str = eqx.field(default="heuristic", static=True)
    init_step_value: Scalar = eqx.field(default=1e-6, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        # The norms are over the whole model: concatenating leaves changes nothing.
        return True

    def __check_init__(self):
        if self.init_step_kind not in _INIT_STEP_KINDS:
            raise ValueError(
                f"dog: the tag of `init_step` must be one of {_INIT_STEP_KINDS}, "
                f"got {self.init_step_kind!r}."
            )
        check_hyperparameter("init_step_value", self.init_step_value, low=0.0)
        check_hyperparameter("eps", self.eps, low=0.0)

    @init_entry
    def init(self, params: Params) -> DoGState:
        dtype = scalar_dtype(params)
        init_params = copy_trainable(params)
        if self.init_step_kind == "heuristic":
            norm = jnp.sqrt(tree_squared_norm(init_params))
            max_dist = self.init_step_value * (1 + norm)
        elif self.init_step_kind == "distance":
            max_dist = self.init_step_value
        else:
            max_dist = jnp.zeros([])
        return DoGState(
            is_init_step=jnp.asarray(True),
            init_params=init_params,
            max_dist=jnp.array(max_dist, dtype),
            sum_sq_norm_grads=jnp.zeros([], dtype),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: DoGState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, DoGState]:
        require_params(params, "dog")
        distance = jnp.sqrt(_squared_distance(updates, params, state.init_params))
        max_dist = jnp.maximum(state.max_dist, distance).astype(state.max_dist.dtype)
        sum_sq = (state.sum_sq_norm_grads + tree_squared_norm(updates)).astype(
            state.sum_sq_norm_grads.dtype
        )
        step_size = max_dist / jnp.sqrt(sum_sq + self.eps)
        if self.init_step_kind == "learning_rate":
            step_size = jnp.where(state.is_init_step, self.init_step_value, step_size)
        return _scale(updates, step_size), DoGState(
            is_init_step=jnp.asarray(False),
            init_params=state.init_params,
            max_dist=max_dist,
            sum_sq_norm_grads=sum_sq,
        )


@checked
def dog(
    learning_rate: ScalarOrSchedule = 1.0,
    init_step: tuple[str, ScalarLike] = ("heuristic", 1e-6),
    eps: ScalarLike = 1e-8,
    weight_decay: ScalarLike | None = None,
    mask: FilterSpec | None = None,
) -> Chain:
    r"""DoG: SGD with the parameter-free step size of `eqopt.contrib.ScaleByDoG`.

    $$ x_{t+1} = x_t - \gamma_t \frac{\bar r_t}{\sqrt{G_t + \epsilon}}\,
       (g_t + \lambda x_t) $$

    The chain is weight decay (`eqopt.AddDecayedWeights`, or
    `eqopt.Identity` when `weight_decay` is `None`), `eqopt.contrib.ScaleByDoG`,
    `eqopt.ScaleByLearningRate`. `mask` is an Equinox filter spec of the
    leaves to decay (a callable is a per-leaf predicate, never a function of the
    whole params). The authors recommend averaging the iterates.

    **Arguments:**

    - `learning_rate`: $\gamma$, an optional multiplier or schedule.
    - `init_step`: `(kind, value)`, see `eqopt.contrib.ScaleByDoG`; the
      suggested `("heuristic", 1e-6)` uses `1e-4` for models with batch norm.
    - `eps`: added to the sum of squared gradient norms.
    - `weight_decay`: $\lambda$, or `None` for none.
    - `mask`: the filter spec of the leaves to decay.

    **Returns:** an `eqopt.Chain`.

    **References:** Ivgi, Hinder & Carmon, *DoG is SGD's Best Friend: A
    Parameter-Free Dynamic Step Size Schedule*, ICML 2023.
    """
    kind, value = init_step
    return Chain(
        Identity() if weight_decay is None else AddDecayedWeights(weight_decay, mask),
        ScaleByDoG(init_step_kind=kind, init_step_value=value, eps=eps),
        ScaleByLearningRate(learning_rate),
    )


@checked
class DoWGState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByDoWG`: the initial parameters, the
    weighted sum of squared gradient norms $v_t$ and the squared distance
    estimate $\\bar r_t^2$."""

    init_params: Updates
    weighted_sq_norm_grads: Float[Array, ""]
    estim_sq_dist: Float[Array, ""]


@checked
class ScaleByDoWG(AbstractGradientTransformation):
    r"""Scales the updates by DoWG's step size, distance over weighted gradients.

    $$
    \bar r_t^2 = \max\big(\bar r_{t-1}^2,\ \|x_t - x_0\|^2\big), \qquad
    v_t = v_{t-1} + \bar r_t^2 \|g_t\|^2, \qquad
    u_t = \frac{\bar r_t^2}{\sqrt{v_t} + \epsilon}\, g_t
    $$

    with $\bar r_0^2$ = `init_estim_sq_dist`, or $\epsilon$ when it is `None`.
    The norms are over the whole model. The updates are not negated:
    `eqopt.contrib.dowg` follows this with the learning rate.

    **Global**: one step size over all the leaves, a stacked layer's slices included.

    **Arguments:**

    - `init_estim_sq_dist`: the initial guess of the squared distance to the
      solution, or `None`.
    - `eps`: added to $\sqrt{v_t}$, and the default initial guess.

    **References:** Khaled, Mishchenko & Jin, *DoWG Unleashed: An Efficient
    Universal Parameter-Free Gradient Descent Method*, NeurIPS 2023
    (arXiv:2305.16284).
    """

    init_estim_sq_dist: Scalar | None = eqx.field(
        default=None, converter=as_optional_scalar
    )
    eps: Scalar = eqx.field(default=1e-4, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_hyperparameter("init_estim_sq_dist", self.init_estim_sq_dist, low=0.0)
        check_hyperparameter("eps", self.eps, low=0.0)

    @init_entry
    def init(self, params: Params) -> DoWGState:
        dtype = scalar_dtype(params)
        initial = (
            self.eps if self.init_estim_sq_dist is None else self.init_estim_sq_dist
        )
        return DoWGState(
            init_params=copy_trainable(params),
            weighted_sq_norm_grads=jnp.zeros([], dtype),
            estim_sq_dist=jnp.array(initial, dtype),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: DoWGState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, DoWGState]:
        require_params(params, "dowg")
        dtype = state.estim_sq_dist.dtype
        squared_distance = _squared_distance(updates, params, state.init_params)
        estim_sq_dist = jnp.maximum(state.estim_sq_dist, squared_distance).astype(dtype)
        weighted = (
            state.weighted_sq_norm_grads + estim_sq_dist * tree_squared_norm(updates)
        ).astype(dtype)
        step_size = estim_sq_dist / (jnp.sqrt(weighted) + self.eps)
        return _scale(updates, step_size), DoWGState(
            init_params=state.init_params,
            weighted_sq_norm_grads=weighted,
            estim_sq_dist=estim_sq_dist,
        )


@checked
def dowg(
    learning_rate: ScalarOrSchedule = 1.0,
    init_estim_sq_dist: ScalarLike | None = None,
    eps: ScalarLike = 1e-4,
    weight_decay: ScalarLike | None = None,
    mask: FilterSpec | None = None,
) -> Chain:
    r"""DoWG: SGD with the parameter-free step size of `eqopt.contrib.ScaleByDoWG`.

    $$ x_{t+1} = x_t - \gamma_t \frac{\bar r_t^2}{\sqrt{v_t} + \epsilon}\,
       (g_t + \lambda x_t) $$

    The chain is weight decay (`eqopt.AddDecayedWeights`, or
    `eqopt.Identity` when `weight_decay` is `None`),
    `eqopt.contrib.ScaleByDoWG`, `eqopt.ScaleByLearningRate`. `mask` is
    an Equinox filter spec of the leaves to decay.

    **Arguments:**

    - `learning_rate`: $\gamma$, an optional multiplier or schedule.
    - `init_estim_sq_dist`: the initial guess of the squared distance to the
      solution (default: `eps`).
    - `eps`: added to the denominator.
    - `weight_decay`: $\lambda$, or `None` for none.
    - `mask`: the filter spec of the leaves to decay.

    **Returns:** an `eqopt.Chain`.

    **References:** Khaled, Mishchenko & Jin, *DoWG Unleashed: An Efficient
    Universal Parameter-Free Gradient Descent Method*, NeurIPS 2023.
    """
    return Chain(
        Identity() if weight_decay is None else AddDecayedWeights(weight_decay, mask),
        ScaleByDoWG(init_estim_sq_dist=init_estim_sq_dist, eps=eps),
        ScaleByLearningRate(learning_rate),
    )
