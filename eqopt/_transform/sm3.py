"""SM3: a memory-efficient Adagrad with one accumulator per row, column, ... of each leaf."""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp

from .._base import AbstractGradientTransformation, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._hyper import Scalar, ScalarLike, as_scalar, check_decays, check_hyperparameter
from .._leafwise import map_layers, zeros_like_trainable
from .._leaves import InexactTree
from .._numerics import abs_squared
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._layerwise import layerwise, real_dtype
from .basic import ScaleByLearningRate

#: Per leaf, a tuple of one vector per axis (empty for a scalar leaf).
Accumulators = InexactTree


@checked
class ScaleBySM3State(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleBySM3` (Optax's field names).

    `mu` holds, at each leaf of shape $(d_1, \\dots, d_k)$, a tuple of $k$ real
    vectors of shapes $(d_1,), \\dots, (d_k,)$: the accumulators of the cover
    by rows, columns, ... . `nu` is the momentum, shaped like the params.
    """

    mu: Accumulators
    nu: Updates


@no_type_check
def _accumulators(p):
    return tuple(jnp.zeros([size], real_dtype(p)) for size in p.shape)


@no_type_check
def _max_over_other_axes(x, axis):
    others = tuple(a for a in range(x.ndim) if a != axis)
    return jnp.max(x, axis=others) if others else x


@checked
class ScaleBySM3(AbstractGradientTransformation):
    r"""Rescales updates with SM3-II, then applies momentum.

    Adagrad keeps one sum of squared gradients per element. SM3 keeps one per
    row, one per column (and one per slice along each further axis) of every
    leaf, and bounds each element's sum by the smallest of those that cover it.
    For a leaf with accumulators $\mu^{(r)}$, one per axis $r$:

    $$
    \begin{aligned}
    \nu_t(i) &= \beta_2 \min_{r} \mu^{(r)}_{t-1}(i_r) + c\, |g_t(i)|^2,
        \qquad c = \begin{cases} 1 & \beta_2 = 1 \\ 1 - \beta_2 & \beta_2 < 1 \end{cases} \\
    \mu^{(r)}_t(j) &= \max_{i:\, i_r = j} \nu_t(i) \\
    u_t &= \beta_1 u_{t-1} + (1 - \beta_1)\, \frac{g_t}{\sqrt{\nu_t + \epsilon}}
    \end{aligned}
    $$

    with $0/0 = 0$. $\beta_2 = 1$ (the default) is the paper's sum; $\beta_2 <
    1$ turns it into an exponential moving average. A scalar leaf has no
    accumulator, so its $\nu_t = c\,|g_t|^2$. The accumulators use $O(\sum_r
    d_r)$ memory per leaf instead of $O(\prod_r d_r)$; they are per leaf, so the
    transform is not elementwise. Complex updates use $|g|^2$.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `b1`: $\beta_1 \in [0, 1)$, the momentum of the output.
    - `b2`: $\beta_2 \in [0, 1]$, the decay of the accumulators.
    - `eps`: $\epsilon$, added under the square root.

    **References:** Anil, Gupta, Koren & Singer, *Memory-Efficient Adaptive
    Optimization*, NeurIPS 2019.
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=1.0, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return False

    def __check_init__(self):
        check_decays(self, "b1")
        check_decays(self, "b2", high_inclusive=True)
        check_hyperparameter("eps", self.eps, low=0.0)

    @init_entry
    def init(self, params: Params) -> ScaleBySM3State:
        return ScaleBySM3State(
            mu=map_layers(_accumulators, params),
            nu=zeros_like_trainable(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleBySM3State,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleBySM3State]:
        b1, b2, eps = self.b1, self.b2, self.eps
        weight = jnp.where(b2 == 1, 1.0, 1 - b2)

        @no_type_check
        def step(g, accumulators, momentum):
            if len(accumulators) != g.ndim or any(
                a.shape != (size,)
                for a, size in zip(accumulators, g.shape, strict=False)
            ):
                raise ValueError(
                    f"scale_by_sm3: the state's accumulators have shapes "
                    f"{[a.shape for a in accumulators]} for an update of shape "
                    f"{g.shape}: was the state made for other params?"
                )
            squared = abs_squared(g)
            nu = weight.astype(squared.dtype) * squared
            if accumulators:
                bound = accumulators[0].reshape((-1,) + (1,) * (g.ndim - 1))
                for axis, accumulator in enumerate(accumulators[1:], start=1):
                    shape = [1] * g.ndim
                    shape[axis] = -1
                    bound = jnp.minimum(bound, accumulator.reshape(shape))
                nu = b2 * bound + nu
            accumulators = tuple(
                _max_over_other_axes(nu, axis) for axis in range(g.ndim)
            )
            positive = nu > 0
            denominator = jnp.sqrt(jnp.where(positive, nu, 1) + eps)
            scaled = jnp.where(positive, g / denominator.astype(g.dtype), 0)
            momentum = b1 * momentum + (1 - b1) * scaled
            return momentum, accumulators, momentum

        updates, mu, nu = layerwise(step, updates, state.mu, state.nu, n_out=3)
        return updates, ScaleBySM3State(mu=mu, nu=nu)


@checked
def scale_by_sm3(
    b1: ScalarLike = 0.9, b2: ScalarLike = 1.0, eps: ScalarLike = 1e-8
) -> ScaleBySM3:
    """Optax spelling of `eqopt.ScaleBySM3`."""
    return ScaleBySM3(b1=b1, b2=b2, eps=eps)


@checked
def sm3(learning_rate: ScalarLike, momentum: ScalarLike | None = 0.9) -> Chain:
    r"""SM3: Adagrad with sub-linear memory, from accumulators per row and column.

    $$
    u_t = -\eta\, \Big(\beta\, u_{t-1} + (1 - \beta)\, \frac{g_t}{\sqrt{\nu_t + \epsilon}}\Big)
    $$

    with $\nu_t$ SM3-II's bound on each element's sum of squared gradients
    (`eqopt.ScaleBySM3`). The chain is `eqopt.ScaleBySM3`, then
    `eqopt.ScaleByLearningRate`.

    **Arguments:**

    - `learning_rate`: $\eta$.
    - `momentum`: $\beta$, or `None` for no momentum ($\beta = 0$; Optax
      0.2.8 raises a `TypeError` for `None`).

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        opt = eqopt.sm3(learning_rate=1e-1)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
        ```

    **References:** Anil, Gupta, Koren & Singer, *Memory-Efficient Adaptive
    Optimization*, NeurIPS 2019.
    """
    return Chain(
        ScaleBySM3(b1=0.0 if momentum is None else momentum),
        ScaleByLearningRate(learning_rate=learning_rate),
    )
