"""LaProp: momentum of the RMS-normalised gradient (Ziyin, Wang & Ueda, 2020)."""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Int

from .._base import AbstractGradientTransformation, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._filters import FilterSpec
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_decays,
    check_hyperparameter,
)
from .._leafwise import full_like_trainable_real, leafwise, zeros_like_trainable
from .._numerics import abs_squared, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._reductions import cast_to


@checked
class ScaleByLaPropState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByLaProp`: the step count, the momentum
    $m$ of the normalised gradients and the second moment $v$ of the gradients."""

    count: Int[Array, ""]
    mu: Updates
    nu: Updates


@checked
class ScaleByLaProp(AbstractGradientTransformation):
    r"""Rescales updates with LaProp: momentum of the gradient normalised by its RMS.

    $$
    \begin{aligned}
    v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, |g_t|^2 \\
    n_t &= \frac{g_t}{\sqrt{v_t / (1 - \beta_2^t)} + \epsilon} \\
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, n_t \\
    u_t &= m_t / (1 - \beta_1^t)
    \end{aligned}
    $$

    Adam takes the momentum of the gradient and then divides by the RMS;
    LaProp divides first and takes the momentum of the normalised gradient, so
    $\beta_1$ and $\beta_2$ can be chosen independently (any $\beta_1 <
    1$ is stable for any $\beta_2$) and a large gradient cannot be amplified
    by a small, stale denominator. Both moments are bias-corrected.

    **Where the learning rate enters.** The paper (and pytorch-optimizer)
    accumulates $\eta_t n_t$ in the momentum, bias-corrected by the average
    of the past learning rates; eqopt scales $u_t$ by $\eta_t$ afterwards
    (`eqopt.contrib.laprop`), as every Optax-style chain does. The two are the
    same for a constant learning rate; under a schedule eqopt's step follows
    the current rate at once. **Where $\epsilon$ sits:** as the paper, added
    to the bias-corrected RMS; pytorch-optimizer adds it before the bias
    correction ($\epsilon / \sqrt{1 - \beta_2^t}$ in this form), heavyball
    takes $\max(\sqrt{\hat v_t}, \epsilon)$.

    **Element-wise**: each entry's update depends on that entry alone, so a
    layer stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `b1`: $\beta_1$, the decay of the momentum of the normalised gradient.
    - `b2`: $\beta_2$, the decay of the second moment.
    - `eps`: $\epsilon$, added to the RMS.
    - `mu_dtype`: dtype to store the momentum in (default: the params').

    **References:** Ziyin, Wang & Ueda, *LaProp: Separating Momentum and
    Adaptivity in Adam*, arXiv:2002.04839, 2020.
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-15, converter=as_scalar)
    mu_dtype: DTypeLike | None = eqx.field(default=None, static=True)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("eps", self.eps, low=0.0)

    @init_entry
    def init(self, params: Params) -> ScaleByLaPropState:
        return ScaleByLaPropState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params, self.mu_dtype),
            nu=full_like_trainable_real(params, 0.0),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByLaPropState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByLaPropState]:
        b1, b2, eps = self.b1, self.b2, self.eps
        count = safe_int32_increment(state.count)
        correction1 = 1 - b1**count
        correction2 = 1 - b2**count
        one_minus_b1, one_minus_b2 = 1 - b1, 1 - b2

        @no_type_check
        def step(g, mu, nu):
            new_nu = b2 * nu + one_minus_b2 * abs_squared(g)
            rms = jnp.sqrt(new_nu / correction2.astype(new_nu.dtype))
            normalised = g / (eps + rms).astype(g.dtype)
            new_mu = b1 * mu + one_minus_b1 * normalised
            update = new_mu / correction1.astype(new_nu.dtype)
            return (
                cast_to(update, g.dtype),
                cast_to(new_mu, mu.dtype),
                cast_to(new_nu, nu.dtype),
            )

        new_updates, mu, nu = leafwise(
            step, updates, state.mu, state.nu, n_out=3, elementwise=True
        )
        return new_updates, ScaleByLaPropState(count=count, mu=mu, nu=nu)


@checked
def scale_by_laprop(
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-15,
    mu_dtype: DTypeLike | None = None,
) -> ScaleByLaProp:
    """Lowercase spelling of `eqopt.contrib.ScaleByLaProp`."""
    return ScaleByLaProp(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype)


@checked
def laprop(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-15,
    weight_decay: ScalarOrSchedule = 0.0,
    mask: FilterSpec | None = None,
    mu_dtype: DTypeLike | None = None,
    *,
    cautious_weight_decay: bool = False,
) -> Chain:
    r"""LaProp with optional decoupled weight decay.

    $$ \theta_t = \theta_{t-1} - \eta_t \big( u_t + \lambda\, \theta_{t-1} \big) $$

    with $u_t$ from `eqopt.contrib.ScaleByLaProp`. The chain is
    `eqopt.contrib.ScaleByLaProp`, `eqopt.AddDecayedWeights`,
    `eqopt.ScaleByLearningRate`; `mask` is an Equinox filter spec of the
    leaves to decay (a callable is a per-leaf predicate).

    !!! example

        ```python
        opt = eqopt.contrib.laprop(4e-4, b2=0.99, weight_decay=1e-2)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
        ```

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - `b1`, `b2`, `eps`, `mu_dtype`: as `eqopt.contrib.ScaleByLaProp`.
    - `weight_decay`: $\lambda$, decoupled, multiplied by the learning rate.
    - `mask`: the filter spec of the leaves to decay.
    - `cautious_weight_decay`: as `cautious` of `eqopt.AddDecayedWeights`.

    **Returns:** an `eqopt.Chain`.

    **References:** Ziyin, Wang & Ueda, *LaProp: Separating Momentum and
    Adaptivity in Adam*, arXiv:2002.04839, 2020.
    """
    return Chain(
        ScaleByLaProp(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype),
        AddDecayedWeights(weight_decay, mask, cautious=cautious_weight_decay),
        ScaleByLearningRate(learning_rate),
    )
