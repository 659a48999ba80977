"""ADOPT: Adam that converges for any beta2 (Taniguchi et al., 2024)."""

from collections.abc import Callable
from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Int

from .._base import AbstractGradientTransformation, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_decays,
    check_hyperparameter,
)
from .._leafwise import leafwise, zeros_like_trainable
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._transform.basic import ScaleByLearningRate
from .._typecheck import checked
from ._reductions import cast_to, refuse_complex


def default_clip_value(count: Any) -> Any:
    """ADOPT's default clipping threshold at step $t$: $t^{1/4}$."""
    return count**0.25


@checked
class ScaleByAdoptState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByAdopt`: step count and the two moments."""

    count: Int[Array, ""]
    mu: Updates
    nu: Updates


@checked
class ScaleByAdopt(AbstractGradientTransformation):
    r"""Rescales updates with ADOPT: the gradient is normalised by the *previous*
    second moment before it enters the momentum.

    $$
    \begin{aligned}
    v_0 &= g_0^2 \quad (\text{the first step only initialises } v;\ u_0 = 0) \\
    \tilde g_t &= \operatorname{clip}\Big(\frac{g_t}{\max(\sqrt{v_{t-1}}, \epsilon)},\ \pm c_t\Big) \\
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, \tilde g_t, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, g_t^2 \\
    u_t &= m_t \quad\text{or, with Nesterov,}\quad \beta_1 m_t + (1 - \beta_1)\, \tilde g_t
    \end{aligned}
    $$

    with $c_t$ = `clip_value_fn(t)` when `use_clipping` (the paper's
    $t^{1/4}$ by default), no clipping otherwise. Complex parameters are refused
    with a clear error (Optax fails on them too); use
    `eqopt.contrib.split_real_and_imaginary`.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `b1`, `b2`: the decay rates, in $[0, 1)$.
    - `eps`: the floor of $\sqrt{v}$.
    - `mu_dtype`: dtype to store the first moment in (default: the params').
    - `nesterov`: use Nesterov momentum.
    - `use_clipping`: clip the normalised gradient (recommended when training
      from scratch).
    - `clip_value_fn`: the threshold as a function of the step count.

    **References:** Taniguchi et al., *ADOPT: Modified Adam Can Converge with
    Any $\beta_2$ with the Optimal Rate*, NeurIPS 2024 (arXiv:2411.02853).
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.9999, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-6, converter=as_scalar)
    mu_dtype: DTypeLike | None = eqx.field(default=None, static=True)
    nesterov: bool = eqx.field(default=False, static=True)
    use_clipping: bool = eqx.field(default=True, static=True)
    clip_value_fn: Callable[[Any], Any] = default_clip_value

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("eps", self.eps, low=0.0)

    @init_entry
    def init(self, params: Params) -> ScaleByAdoptState:
        refuse_complex(params, "adopt")
        return ScaleByAdoptState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params, self.mu_dtype),
            nu=zeros_like_trainable(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByAdoptState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByAdoptState]:
        b1, b2, eps = self.b1, self.b2, self.eps
        first = state.count == 0
        one_minus_b1, one_minus_b2 = 1 - b1, 1 - b2
        threshold = self.clip_value_fn(state.count) if self.use_clipping else None

        @no_type_check
        def step(g, mu, nu):
            normalised = g / jnp.maximum(jnp.sqrt(nu), eps)
            if threshold is not None:
                normalised = jnp.clip(normalised, -threshold, threshold)
            new_mu = cast_to(b1 * mu + one_minus_b1 * normalised, mu.dtype)
            new_nu = cast_to(b2 * nu + one_minus_b2 * jnp.square(g), nu.dtype)
            if self.nesterov:
                update = b1 * new_mu + one_minus_b1 * normalised
            else:
                update = new_mu
            return (
                cast_to(jnp.where(first, jnp.zeros_like(update), update), g.dtype),
                jnp.where(first, mu, new_mu),
                jnp.where(first, cast_to(jnp.square(g), nu.dtype), new_nu),
            )

        new_updates, mu, nu = leafwise(step, updates, state.mu, state.nu, n_out=3)
        return new_updates, ScaleByAdoptState(
            count=safe_int32_increment(state.count), mu=mu, nu=nu
        )


@checked
def scale_by_adopt(
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.9999,
    eps: ScalarLike = 1e-6,
    mu_dtype: DTypeLike | None = None,
    *,
    nesterov: bool = False,
    use_clipping: bool = True,
    clip_value_fn: Callable[[Any], Any] = default_clip_value,
) -> ScaleByAdopt:
    """Optax spelling of `eqopt.contrib.ScaleByAdopt`."""
    return ScaleByAdopt(
        b1=b1,
        b2=b2,
        eps=eps,
        mu_dtype=mu_dtype,
        nesterov=nesterov,
        use_clipping=use_clipping,
        clip_value_fn=clip_value_fn,
    )


@checked
def adopt(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.9999,
    eps: ScalarLike = 1e-6,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = False,
    use_clipping: bool = True,
    clip_value_fn: Callable[[Any], Any] = default_clip_value,
) -> Chain:
    r"""ADOPT: `eqopt.contrib.ScaleByAdopt` then the learning rate.

    $$ x_{t+1} = x_t - \eta_t\, m_t $$

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - the others: as `eqopt.contrib.ScaleByAdopt`.

    **Returns:** an `eqopt.Chain`.

    **References:** Taniguchi et al., *ADOPT: Modified Adam Can Converge with
    Any $\beta_2$ with the Optimal Rate*, NeurIPS 2024.
    """
    return Chain(
        ScaleByAdopt(
            b1=b1,
            b2=b2,
            eps=eps,
            mu_dtype=mu_dtype,
            nesterov=nesterov,
            use_clipping=use_clipping,
            clip_value_fn=clip_value_fn,
        ),
        ScaleByLearningRate(learning_rate),
    )
