"""MARS: variance-reduced gradients for AdamW and Lion (MARS-AdamW, MARS-Lion)."""

from typing import Any, Literal, no_type_check

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
    as_optional_scalar,
    as_scalar,
    check_decays,
    check_hyperparameter,
)
from .._leafwise import full_like_trainable_real, leafwise, zeros_like_trainable
from .._numerics import abs_squared, debias, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked

Preconditioner = Literal["adamw", "lion"]
_PRECONDITIONERS = ("adamw", "lion")


@checked
class ScaleByMarsState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByMars`.

    - `count`: the number of steps taken.
    - `mu`: the momentum of the corrected gradients $m_t$.
    - `nu`: their second moment $v_t$ (`None` for the Lion preconditioner).
    - `previous_grad`: the last step's gradient $g_{t-1}$.
    """

    count: Int[Array, ""]
    mu: Updates
    nu: Updates | None
    previous_grad: Updates


@checked
class ScaleByMars(AbstractGradientTransformation):
    r"""Preconditions MARS's variance-reduced gradient with AdamW or Lion.

    MARS-approx (the variant that keeps the last gradient instead of computing
    the gradient at the previous point on the new batch), for each leaf:

    $$
    \begin{aligned}
    c_t &= g_t + \gamma\, \frac{\beta_1}{1 - \beta_1}\, (g_t - g_{t-1}),
      \qquad \tilde c_t = c_t / \max(1, \|c_t\|_2 / \tau) \\
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, \tilde c_t \\
    \text{AdamW:}\quad v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, |\tilde c_t|^2, \qquad
      u_t = \frac{m_t / (1 - \beta_1^t)}{\sqrt{v_t / (1 - \beta_2^t)} + \epsilon} \\
    \text{Lion:}\quad u_t &= \operatorname{sign}(m_t)
    \end{aligned}
    $$

    The norm $\|c_t\|_2$ is the leaf's, so with clipping ($\tau$ =
    `max_norm`, 1 in the paper) the transform is not elementwise.

    **The first step.** The paper starts from $x_1 = x_0$, so the correction
    $g_1 - g_0$ vanishes and $c_1 = g_1$; the authors' code and
    `pytorch-optimizer` start from $g_0 = 0$ instead, so their first step
    uses $c_1 = (1 + \gamma \beta_1 / (1 - \beta_1))\, g_1$ (before clipping).
    eqopt follows the paper (`tests/test_contrib_mars.py` shows the
    difference). The denominator is $\sqrt{v_t / (1 - \beta_2^t)} +
    \epsilon$: $\epsilon$ is added after the bias correction of $v$, as in the
    authors' code and in Adam.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each slice,
    batched, as on the list of those layers. With `max_norm=None` it is element-wise.

    **Arguments:**

    - `b1`: $\beta_1$, the momentum decay (which also sets the weight of the
      correction).
    - `b2`: $\beta_2$, the decay of the second moment (AdamW only).
    - `gamma`: $\gamma$, the scale of the gradient correction (0 gives AdamW or
      Lion on clipped gradients).
    - `eps`: $\epsilon$ (AdamW only).
    - `max_norm`: $\tau$, the per-leaf norm above which $c_t$ is rescaled, or
      `None` for no clipping (then the transform is elementwise).
    - `preconditioner`: `"adamw"` (MARS-AdamW) or `"lion"` (MARS-Lion).
    - `mu_dtype`: dtype to store $m$ in (default: the params').

    **References:** Yuan, Liu, Wu, Zhou & Gu, *MARS: Unleashing the Power of
    Variance Reduction for Training Large Models*, arXiv:2411.10438, ICML 2025.
    """

    b1: Scalar = eqx.field(default=0.95, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.99, converter=as_scalar)
    gamma: Scalar = eqx.field(default=0.025, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    max_norm: Scalar | None = eqx.field(default=1.0, converter=as_optional_scalar)
    preconditioner: Preconditioner = eqx.field(default="adamw", static=True)
    mu_dtype: DTypeLike | None = eqx.field(default=None, static=True)

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("gamma", self.gamma, low=0.0)
        check_hyperparameter("eps", self.eps, low=0.0)
        if self.max_norm is not None:
            check_hyperparameter("max_norm", self.max_norm, low=0.0)
        if self.preconditioner not in _PRECONDITIONERS:
            raise ValueError(
                f"ScaleByMars: `preconditioner` must be one of {_PRECONDITIONERS}, "
                f"got {self.preconditioner!r}."
            )

    @property
    def elementwise(self) -> bool:
        return self.max_norm is None

    @init_entry
    def init(self, params: Params) -> ScaleByMarsState:
        adamw = self.preconditioner == "adamw"
        return ScaleByMarsState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params, self.mu_dtype),
            nu=full_like_trainable_real(params, 0.0) if adamw else None,
            previous_grad=zeros_like_trainable(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByMarsState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByMarsState]:
        b1, b2, eps, max_norm = self.b1, self.b2, self.eps, self.max_norm
        count = safe_int32_increment(state.count)
        one_minus_b1, one_minus_b2 = 1 - b1, 1 - b2
        correction1, correction2 = 1 - b1**count, 1 - b2**count
        # The paper's x_1 = x_0: no correction on the first step.
        weight = jnp.where(state.count > 0, self.gamma * b1 / one_minus_b1, 0.0)
        adamw = self.preconditioner == "adamw"

        @no_type_check
        def corrected(g, previous):
            c = g + weight * (g - previous)
            if max_norm is not None:
                norm = jnp.sqrt(jnp.sum(abs_squared(c)))
                c = c / jnp.maximum(1, norm / max_norm).astype(c.dtype)
            return c

        @no_type_check
        def step_adamw(g, mu, nu, previous):
            c = corrected(g, previous)
            mu_next = b1 * mu + one_minus_b1 * c
            nu = b2 * nu + one_minus_b2 * abs_squared(c)
            update = debias(mu_next, correction1) / (
                eps + jnp.sqrt(debias(nu, correction2))
            )
            return update.astype(g.dtype), mu_next.astype(mu.dtype), nu, g

        @no_type_check
        def step_lion(g, mu, previous):
            c = corrected(g, previous)
            mu_next = b1 * mu + one_minus_b1 * c
            return jnp.sign(mu_next).astype(g.dtype), mu_next.astype(mu.dtype), g

        if adamw:
            updates, mu, nu, previous = leafwise(
                step_adamw,
                updates,
                state.mu,
                state.nu,
                state.previous_grad,
                n_out=4,
            )
        else:
            updates, mu, previous = leafwise(
                step_lion, updates, state.mu, state.previous_grad, n_out=3
            )
            nu = None
        return updates, ScaleByMarsState(
            count=count, mu=mu, nu=nu, previous_grad=previous
        )


@checked
def scale_by_mars(
    b1: ScalarLike = 0.95,
    b2: ScalarLike = 0.99,
    gamma: ScalarLike = 0.025,
    eps: ScalarLike = 1e-8,
    max_norm: ScalarLike | None = 1.0,
    preconditioner: Preconditioner = "adamw",
    mu_dtype: DTypeLike | None = None,
) -> ScaleByMars:
    """Lowercase spelling of `eqopt.contrib.ScaleByMars`."""
    return ScaleByMars(
        b1=b1,
        b2=b2,
        gamma=gamma,
        eps=eps,
        max_norm=max_norm,
        preconditioner=preconditioner,
        mu_dtype=mu_dtype,
    )


@checked
def mars_adamw(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.95,
    b2: ScalarLike = 0.99,
    gamma: ScalarLike = 0.025,
    eps: ScalarLike = 1e-8,
    weight_decay: ScalarOrSchedule = 0.0,
    mask: FilterSpec | None = None,
    max_norm: ScalarLike | None = 1.0,
    mu_dtype: DTypeLike | None = None,
) -> Chain:
    r"""MARS-AdamW: AdamW on MARS's variance-reduced gradient.

    $$ x_{t+1} = x_t - \eta_t \big(u_t + \lambda\, x_t\big) $$

    with $u_t$ from `eqopt.contrib.ScaleByMars` (`preconditioner="adamw"`).
    Unlike the authors' code, every selected leaf gets MARS (theirs trains 1-D
    parameters with plain AdamW by default); use `eqopt.partition` for
    that split.

    !!! example

        ```python
        opt = eqopt.contrib.mars_adamw(3e-3, weight_decay=0.1)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        ```

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - `b1`, `b2`, `gamma`, `eps`, `max_norm`, `mu_dtype`: as for
      `eqopt.contrib.ScaleByMars`.
    - `weight_decay`: $\lambda$ (decoupled, multiplied by the learning rate).
    - `mask`: a filter spec of the leaves to decay.

    **Returns:** an `eqopt.Chain`.

    **References:** Yuan et al., *MARS: Unleashing the Power of Variance
    Reduction for Training Large Models*, arXiv:2411.10438, 2024.
    """
    return Chain(
        ScaleByMars(
            b1=b1,
            b2=b2,
            gamma=gamma,
            eps=eps,
            max_norm=max_norm,
            preconditioner="adamw",
            mu_dtype=mu_dtype,
        ),
        AddDecayedWeights(weight_decay, mask),
        ScaleByLearningRate(learning_rate),
    )


@checked
def mars_lion(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.95,
    gamma: ScalarLike = 0.025,
    weight_decay: ScalarOrSchedule = 0.0,
    mask: FilterSpec | None = None,
    max_norm: ScalarLike | None = 1.0,
    mu_dtype: DTypeLike | None = None,
) -> Chain:
    r"""MARS-Lion: the sign of the momentum of MARS's variance-reduced gradient.

    $$ x_{t+1} = x_t - \eta_t \big(\operatorname{sign}(m_t) + \lambda\, x_t\big) $$

    with $m_t$ from `eqopt.contrib.ScaleByMars` (`preconditioner="lion"`).

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - `b1`, `gamma`, `max_norm`, `mu_dtype`: as for `eqopt.contrib.ScaleByMars`.
    - `weight_decay`: $\lambda$ (decoupled, multiplied by the learning rate).
    - `mask`: a filter spec of the leaves to decay.

    **Returns:** an `eqopt.Chain`.

    **References:** Yuan et al., *MARS: Unleashing the Power of Variance
    Reduction for Training Large Models*, arXiv:2411.10438, 2024.
    """
    return Chain(
        ScaleByMars(
            b1=b1,
            gamma=gamma,
            max_norm=max_norm,
            preconditioner="lion",
            mu_dtype=mu_dtype,
        ),
        AddDecayedWeights(weight_decay, mask),
        ScaleByLearningRate(learning_rate),
    )
