"""NovoGrad: momentum over gradients normalised by a per-layer second moment."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Int

from .._base import AbstractGradientTransformation, Params, Updates
from .._checks import check_updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_decays,
    check_hyperparameter,
    is_concrete,
)
from .._leafwise import map_layers, zeros_like_trainable
from .._numerics import abs_squared, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._layerwise import layerwise, real_dtype
from .basic import ScaleByLearningRate


@checked
class ScaleByNovogradState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByNovograd`.

    `mu` is shaped like the params; `nu` holds one real scalar per leaf (the
    layer's second moment).
    """

    count: Int[Array, ""]
    mu: Updates
    nu: Updates


_NEEDS_PARAMS = (
    "scale_by_novograd with a non-zero `weight_decay` needs `params`: call "
    "`update(updates, state, params)`."
)


@checked
class ScaleByNovograd(AbstractGradientTransformation):
    r"""Rescales updates with NovoGrad's layer-wise normalised momentum.

    Each leaf $\ell$ is a layer with one second moment, the running average of
    its squared gradient norm; the gradient is normalised by it, weight decay is
    added, and the result is accumulated as momentum:

    $$
    \begin{aligned}
    v^\ell_t &= \beta_2 v^\ell_{t-1} + (1 - \beta_2)\, \|g^\ell_t\|^2,
        \qquad v^\ell_1 = \|g^\ell_1\|^2 \\
    m^\ell_t &= \beta_1 m^\ell_{t-1} + \frac{g^\ell_t}{\sqrt{v^\ell_t + \epsilon_{\text{root}}} + \epsilon}
        + \lambda\, \theta^\ell_{t-1}, \qquad m^\ell_0 = 0
    \end{aligned}
    $$

    and the update is $m^\ell_t$. The normalisation is per leaf, so the
    transform is not elementwise. `update` needs `params` when `weight_decay`
    is not zero.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `b1`: $\beta_1 \in [0, 1)$, the momentum.
    - `b2`: $\beta_2 \in [0, 1)$, the decay of the layer's second moment.
    - `eps`: $\epsilon$, added to the denominator outside the square root.
    - `eps_root`: $\epsilon_{\text{root}}$, added inside the square root.
    - `weight_decay`: $\lambda$.
    - `mu_dtype`: dtype to store $m$ in (default: the params').

    **References:** Ginsburg, Castonguay, Hrinchuk, Kuchaiev, Lavrukhin, Leary,
    Li, Nguyen, Zhang & Cohen, *Stochastic Gradient Methods with Layer-wise
    Adaptive Moments for Training of Deep Networks*, arXiv:1905.11286, 2019.
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.25, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    eps_root: Scalar = eqx.field(default=0.0, converter=as_scalar)
    weight_decay: Scalar = eqx.field(default=0.0, converter=as_scalar)
    mu_dtype: DTypeLike | None = eqx.field(default=None, static=True)

    @property
    def elementwise(self) -> bool:
        return False

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("eps_root", self.eps_root, low=0.0)
        check_hyperparameter("weight_decay", self.weight_decay)

    @init_entry
    def init(self, params: Params) -> ScaleByNovogradState:
        return ScaleByNovogradState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params, self.mu_dtype),
            nu=map_layers(lambda p: jnp.zeros([], real_dtype(p)), params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByNovogradState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByNovogradState]:
        b1, b2, eps, eps_root, weight_decay = (
            self.b1,
            self.b2,
            self.eps,
            self.eps_root,
            self.weight_decay,
        )
        if params is not None:
            check_updates(updates, params)
        if params is None:
            # Without params the decay term is dropped, which is only right
            # when the decay is zero: checked now if known, else at run time.
            if is_concrete(weight_decay):
                if weight_decay != 0:
                    raise ValueError(_NEEDS_PARAMS)
            else:
                updates = eqx.error_if(updates, weight_decay != 0, _NEEDS_PARAMS)
        first = state.count == 0
        count = safe_int32_increment(state.count)

        @no_type_check
        def step(g, mu, nu, p):
            squared_norm = jnp.sum(abs_squared(g))
            nu = jnp.where(first, squared_norm, b2 * nu + (1 - b2) * squared_norm)
            nu = nu.astype(squared_norm.dtype)
            normalised = g / (jnp.sqrt(nu + eps_root) + eps).astype(g.dtype)
            if p is not None:
                normalised = normalised + weight_decay * p
            new_mu = jnp.where(first, normalised, b1 * mu + normalised)
            return new_mu, new_mu.astype(mu.dtype), nu

        # The params at leaves with an update (all None without params).
        params = jax.tree.map(
            lambda u, p: None if u is None or params is None else p,
            updates,
            updates if params is None else params,
            is_leaf=lambda x: x is None,
        )
        updates, mu, nu = layerwise(step, updates, state.mu, state.nu, params, n_out=3)
        return updates, ScaleByNovogradState(count=count, mu=mu, nu=nu)


@checked
def scale_by_novograd(
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.25,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    weight_decay: ScalarLike = 0.0,
    mu_dtype: DTypeLike | None = None,
) -> ScaleByNovograd:
    """Optax spelling of `eqopt.ScaleByNovograd`."""
    return ScaleByNovograd(
        b1=b1,
        b2=b2,
        eps=eps,
        eps_root=eps_root,
        weight_decay=weight_decay,
        mu_dtype=mu_dtype,
    )


@checked
def novograd(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.25,
    eps: ScalarLike = 1e-6,
    eps_root: ScalarLike = 0.0,
    weight_decay: ScalarLike = 0.0,
) -> Chain:
    r"""NovoGrad: SGD with momentum over gradients normalised per layer.

    $$
    u_t = -\eta_t\, m_t, \qquad
    m^\ell_t = \beta_1 m^\ell_{t-1} + \frac{g^\ell_t}{\sqrt{v^\ell_t + \epsilon_{\text{root}}} + \epsilon}
               + \lambda\, \theta^\ell_{t-1}
    $$

    with $v^\ell_t$ the running average of the squared norm of leaf $\ell$'s
    gradient (`eqopt.ScaleByNovograd`). It keeps one scalar second moment
    per leaf, half Adam's memory. The chain is `eqopt.ScaleByNovograd`, then
    `eqopt.ScaleByLearningRate`; `update` needs `params` when
    `weight_decay` is not zero.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `b1`, `b2`, `eps`, `eps_root`, `weight_decay`: as
      `eqopt.ScaleByNovograd` (`eps` defaults to `1e-6` here, as in Optax).

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        opt = eqopt.novograd(learning_rate=1e-2, weight_decay=1e-3)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
        ```

    **References:** Ginsburg et al., *Stochastic Gradient Methods with
    Layer-wise Adaptive Moments for Training of Deep Networks*,
    arXiv:1905.11286, 2019.
    """
    return Chain(
        ScaleByNovograd(
            b1=b1, b2=b2, eps=eps, eps_root=eps_root, weight_decay=weight_decay
        ),
        ScaleByLearningRate(learning_rate=learning_rate),
    )
