"""DoG: a learning-rate-free step size, distance travelled over accumulated gradients."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from .._base import AbstractGradientTransformation, Params, Updates, is_none, path_str
from .._entry import init_entry, update_entry
from .._hyper import Scalar, ScalarLike, as_scalar, check_hyperparameter
from .._leafwise import map_layers, require_params
from .._numerics import abs_squared
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._layerwise import layerwise, map_trainable


@checked
class ScaleByDistanceOverGradientsState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByDistanceOverGradients` (Optax's field names).

    Per leaf: `max_dist`, the largest distance $r_t$ from the initial
    parameters so far, and `grad_sum_of_squares`, $G_t$ (both real scalars, in
    the wider of the parameter's dtype and `param_dtype`; Optax stores $G_t$
    with shape `(1,)`); `init_params`, the initial parameters in `param_dtype`.
    """

    max_dist: Updates
    grad_sum_of_squares: Updates
    init_params: Updates


@no_type_check
def _norm(x):
    return jnp.sqrt(jnp.sum(abs_squared(x)))


@no_type_check
def real_dtype(dtype):
    return jnp.finfo(dtype).dtype


@checked
class ScaleByDistanceOverGradients(AbstractGradientTransformation):
    r"""Scales each leaf by DoG's step size: distance travelled over gradient norms.

    Layer-wise DoG (LDoG): each leaf $\ell$ gets the step size

    $$
    \begin{aligned}
    r^\ell_t &= \max\big(r^\ell_{t-1},\ \|\theta^\ell_t - \theta^\ell_0\|\big),
        \qquad r^\ell_0 = \epsilon_{\text{rel}} \big(1 + \|\theta^\ell_0\|\big) \\
    G^\ell_t &= G^\ell_{t-1} + \|g^\ell_t\|^2 \\
    u^\ell_t &= s\, \frac{r^\ell_t}{\sqrt{G^\ell_t + \epsilon}}\, g^\ell_t
    \end{aligned}
    $$

    with $s$ the `global_scale`. There is no learning rate to tune: the step
    grows with the distance from the start. The output points up the gradient
    for $s > 0$: follow it with `eqopt.ScaleByLearningRate` (1.0, say) to
    descend. `update` needs `params`. The step sizes are per leaf, so the
    transform is not elementwise. The authors recommend averaging the iterates.
    Updates have the shape of their parameter (Optax 0.2.8 returns shape `(1,)`
    for a scalar parameter).

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `reps_rel`: $\epsilon_{\text{rel}}$, which sets the first step; the
      authors recommend `1e-4` for models with batch norm, `1e-6` otherwise.
    - `eps`: $\epsilon$, added to $G_t$.
    - `param_dtype`: the dtype to keep $\theta_0$ in.
    - `global_scale`: $s$, typically 1 or -1.

    !!! example

        ```python
        # No learning rate to tune: DoG, then a rate of 1 (which negates) to descend.
        opt = eqopt.chain(
            eqopt.ScaleByDistanceOverGradients(reps_rel=1e-6),
            eqopt.scale_by_learning_rate(1.0),
        )
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)   # params are needed
        model = eqopt.apply_updates(model, updates)
        ```

    **References:** Ivgi, Hinder & Carmon, *DoG is SGD's Best Friend: A
    Parameter-Free Dynamic Step Size Schedule*, ICML 2023.
    """

    reps_rel: Scalar = eqx.field(default=1e-6, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    param_dtype: DTypeLike = eqx.field(default=jnp.float32, static=True)
    global_scale: Scalar = eqx.field(default=1.0, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return False

    def __check_init__(self):
        check_hyperparameter("reps_rel", self.reps_rel, low=0.0, low_inclusive=False)
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("global_scale", self.global_scale)

    @init_entry
    def init(self, params: Params) -> ScaleByDistanceOverGradientsState:
        real_param_dtype = not jnp.issubdtype(self.param_dtype, jnp.complexfloating)
        for path, p in jax.tree_util.tree_leaves_with_path(params):
            if eqx.is_inexact_array(p) and jnp.iscomplexobj(p) and real_param_dtype:
                raise ValueError(
                    f"scale_by_distance_over_gradients: the parameter at "
                    f"{path_str(path)} is complex ({p.dtype}) but `param_dtype` is "
                    f"{jnp.dtype(self.param_dtype)}; pass a complex `param_dtype`."
                )
        param_dtype = self.param_dtype
        reps_rel = self.reps_rel

        @no_type_check
        def start(p):
            # Distances are measured in the wider of the two dtypes.
            wide = jnp.promote_types(p.dtype, param_dtype)
            return (reps_rel * (1 + _norm(p.astype(wide)))).astype(real_dtype(wide))

        max_dist = map_layers(start, params)
        return ScaleByDistanceOverGradientsState(
            max_dist=max_dist,
            grad_sum_of_squares=jax.tree.map(jnp.zeros_like, max_dist),
            # A copy even when the dtype matches: a state sharing the params'
            # buffers cannot be donated with them (`filter_jit(donate=...)`).
            init_params=map_trainable(
                lambda p: jnp.array(p, dtype=param_dtype, copy=True), params
            ),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByDistanceOverGradientsState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByDistanceOverGradientsState]:
        require_params(params, "scale_by_distance_over_gradients")
        eps, global_scale = self.eps, self.global_scale
        params = jax.tree.map(
            lambda u, p: None if u is None else p, updates, params, is_leaf=is_none
        )

        @no_type_check
        def step(g, max_dist, sum_of_squares, init_param, p):
            distance = _norm(p - init_param).astype(max_dist.dtype)
            max_dist = jnp.maximum(max_dist, distance)
            sum_of_squares = sum_of_squares + jnp.sum(abs_squared(g)).astype(
                sum_of_squares.dtype
            )
            step_size = global_scale * max_dist / jnp.sqrt(sum_of_squares + eps)
            return (step_size * g).astype(g.dtype), max_dist, sum_of_squares

        updates, max_dist, sum_of_squares = layerwise(
            step,
            updates,
            state.max_dist,
            state.grad_sum_of_squares,
            state.init_params,
            params,
            n_out=3,
        )
        return updates, ScaleByDistanceOverGradientsState(
            max_dist=max_dist,
            grad_sum_of_squares=sum_of_squares,
            init_params=state.init_params,
        )


@checked
def scale_by_distance_over_gradients(
    reps_rel: ScalarLike = 1e-6,
    eps: ScalarLike = 1e-8,
    param_dtype: DTypeLike = jnp.float32,
    global_scale: ScalarLike = 1.0,
) -> ScaleByDistanceOverGradients:
    """Optax spelling of `eqopt.ScaleByDistanceOverGradients`."""
    return ScaleByDistanceOverGradients(
        reps_rel=reps_rel,
        eps=eps,
        param_dtype=param_dtype,
        global_scale=global_scale,
    )
