"""AdEMAMix and its simplified form: Adam with a mixture of a fast and a slow EMA.

AdEMAMix is from Pagliardini, Ablin & Grangier (2024); the simplified version
from Morwani et al. (2025).
"""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int

from .._base import AbstractGradientTransformation, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._filters import FilterSpec
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    Schedule,
    as_scalar,
    as_scalar_or_schedule,
    check_decays,
    check_hyperparameter,
)
from .._leafwise import full_like_trainable_real, leafwise, zeros_like_trainable
from .._numerics import abs_squared, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._quantize import MomentDType, any_quantized, quantized_on_buffers
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._reductions import cast_to, evaluate


@checked
class ScaleByAdemamixState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByAdemamix`: the step count, the fast
    and slow EMAs $m_1, m_2$ and the second moment $\\nu$."""

    count: Int[Array, ""]
    m1: Updates
    m2: Updates
    nu: Updates


@checked
class ScaleByAdemamix(AbstractGradientTransformation):
    r"""Rescales updates with AdEMAMix: Adam's fast EMA plus a slow one.

    $$
    \begin{aligned}
    m_1 &\leftarrow \beta_1 m_1 + (1 - \beta_1)\, g, \qquad
    m_2 \leftarrow \beta_3 m_2 + (1 - \beta_3)\, g, \qquad
    \nu \leftarrow \beta_2 \nu + (1 - \beta_2)\, |g|^2 \\
    u_t &= \frac{m_1 / (1 - \beta_1^t) + \alpha\, m_2}
                {\sqrt{\nu / (1 - \beta_2^t) + \bar\epsilon} + \epsilon}
    \end{aligned}
    $$

    The slow EMA $m_2$ is not bias-corrected. $\beta_3$ and $\alpha$ may be
    schedules of the step count (the paper warms both up).

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `b1`: the decay of the fast EMA.
    - `b2`: the decay of the second moment.
    - `b3`: the decay of the slow EMA, a number or a schedule.
    - `alpha`: the weight of the slow EMA, a number or a schedule.
    - `eps`, `eps_root`: added outside and inside the square root.
    - `mu_dtype`: dtype to store the two EMAs in (default: the params'), or a
      `eqopt.Quantized` format.

    **References:** Pagliardini, Ablin & Grangier, *The AdEMAMix Optimizer:
    Better, Faster, Older*, ICLR 2025 (arXiv:2409.03137).
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    b3: Scalar | Schedule = eqx.field(default=0.9999, converter=as_scalar_or_schedule)
    alpha: Scalar | Schedule = eqx.field(default=6.0, converter=as_scalar_or_schedule)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    eps_root: Scalar = eqx.field(default=0.0, converter=as_scalar)
    mu_dtype: MomentDType = eqx.field(default=None, static=True)

    @property
    def elementwise(self) -> bool:
        return not any_quantized(self.mu_dtype)

    @property
    def runs_on_buffers(self) -> bool:
        # A packed buffer's quantised moments are quantised as one array.
        return quantized_on_buffers(self.mu_dtype)

    def __check_init__(self):
        check_decays(self, "b1", "b2", "b3")
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("eps_root", self.eps_root, low=0.0)

    @init_entry
    def init(self, params: Params) -> ScaleByAdemamixState:
        return ScaleByAdemamixState(
            count=jnp.zeros([], jnp.int32),
            m1=zeros_like_trainable(params, self.mu_dtype),
            m2=zeros_like_trainable(params, self.mu_dtype),
            nu=full_like_trainable_real(params, 0.0),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByAdemamixState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByAdemamixState]:
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        b3 = evaluate(self.b3, state.count)
        alpha = evaluate(self.alpha, state.count)
        count = safe_int32_increment(state.count)
        correction1, correction2 = 1 - b1**count, 1 - b2**count
        one_minus_b1, one_minus_b2, one_minus_b3 = 1 - b1, 1 - b2, 1 - b3

        @no_type_check
        def step(g, m1, m2, nu):
            m1 = cast_to(b1 * m1 + one_minus_b1 * g, m1.dtype)
            m2 = cast_to(b3 * m2 + one_minus_b3 * g, m2.dtype)
            nu = cast_to(b2 * nu + one_minus_b2 * abs_squared(g), nu.dtype)
            numerator = m1 / correction1.astype(m1.dtype) + alpha * m2
            denominator = jnp.sqrt(nu / correction2.astype(nu.dtype) + eps_root) + eps
            return cast_to(numerator / denominator, g.dtype), m1, m2, nu

        new_updates, m1, m2, nu = leafwise(
            step, updates, state.m1, state.m2, state.nu, n_out=4, elementwise=True
        )
        return new_updates, ScaleByAdemamixState(count=count, m1=m1, m2=m2, nu=nu)


@checked
def scale_by_ademamix(
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    b3: ScalarOrSchedule = 0.9999,
    alpha: ScalarOrSchedule = 6.0,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    mu_dtype: MomentDType = None,
) -> ScaleByAdemamix:
    """Optax spelling of `eqopt.contrib.ScaleByAdemamix`."""
    return ScaleByAdemamix(
        b1=b1,
        b2=b2,
        b3=b3,
        alpha=alpha,
        eps=eps,
        eps_root=eps_root,
        mu_dtype=mu_dtype,
    )


@checked
def ademamix(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    b3: ScalarOrSchedule = 0.9999,
    alpha: ScalarOrSchedule = 5.0,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    mu_dtype: MomentDType = None,
    weight_decay: ScalarLike = 0.0,
    mask: FilterSpec | None = None,
) -> Chain:
    r"""AdEMAMix: AdamW with a mixture of a fast and a slow EMA of the gradients.

    $$ x_t = x_{t-1} - \eta_t \left( \frac{\hat m_1 + \alpha m_2}
       {\sqrt{\hat\nu + \bar\epsilon} + \epsilon} + \lambda x_{t-1} \right) $$

    The chain is `eqopt.contrib.ScaleByAdemamix`,
    `eqopt.AddDecayedWeights`, `eqopt.ScaleByLearningRate`. `mask` is an
    Equinox filter spec of the leaves to decay (a callable is a per-leaf
    predicate). Note that `alpha` defaults to 5 here and to 6 in
    `eqopt.contrib.scale_by_ademamix`, as in Optax.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - `b1`, `b2`, `b3`, `alpha`, `eps`, `eps_root`, `mu_dtype`: as
      `eqopt.contrib.ScaleByAdemamix`.
    - `weight_decay`: $\lambda$, decoupled, multiplied by the learning rate.
    - `mask`: the filter spec of the leaves to decay.

    **Returns:** an `eqopt.Chain`.

    **References:** Pagliardini, Ablin & Grangier, *The AdEMAMix Optimizer:
    Better, Faster, Older*, ICLR 2025.
    """
    return Chain(
        ScaleByAdemamix(
            b1=b1,
            b2=b2,
            b3=b3,
            alpha=alpha,
            eps=eps,
            eps_root=eps_root,
            mu_dtype=mu_dtype,
        ),
        AddDecayedWeights(weight_decay, mask),
        ScaleByLearningRate(learning_rate),
    )


@checked
class ScaleBySimplifiedAdEMAMixState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleBySimplifiedAdemamix`: the step count,
    the (undamped) momentum $m$ and the second moment $n$."""

    count: Int[Array, ""]
    m: Updates
    n: Updates


@checked
class ScaleBySimplifiedAdemamix(AbstractGradientTransformation):
    r"""Rescales updates with simplified AdEMAMix: one momentum buffer plus the gradient.

    $$
    \begin{aligned}
    m &\leftarrow \beta_1 m + g, \qquad
    n \leftarrow \beta_2 n + (1 - \beta_2)\, |g|^2 \\
    u_t &= \frac{m + \alpha\, g}{\sqrt{n / (1 - \beta_2^t) + \bar\epsilon} + \epsilon}
    \end{aligned}
    $$

    The momentum is a plain sum (no $1 - \beta_1$ factor and no bias
    correction); with $\alpha = 0$ this is Adam up to a rescaling of the
    learning rate and $\beta_1$. $\alpha$ may be a schedule.

    !!! note "Differences from Optax"
        Complex parameters use $|g|^2$ in $n$, as Adam does; Optax squares the
        complex gradient ($g^2$), so on complex parameters the two differ.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `b1`: the decay of the momentum.
    - `b2`: the decay of the second moment.
    - `alpha`: the weight of the current gradient, a number or a schedule.
    - `eps`, `eps_root`: added outside and inside the square root.

    **References:** Morwani et al., *Connections between
    Schedule-Free Optimizers, AdEMAMix, and Accelerated SGD Variants*, 2025
    (arXiv:2502.02431).
    """

    b1: Scalar = eqx.field(default=0.99, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.95, converter=as_scalar)
    alpha: Scalar | Schedule = eqx.field(default=0.0, converter=as_scalar_or_schedule)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    eps_root: Scalar = eqx.field(default=0.0, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("eps_root", self.eps_root, low=0.0)

    @init_entry
    def init(self, params: Params) -> ScaleBySimplifiedAdEMAMixState:
        return ScaleBySimplifiedAdEMAMixState(
            count=jnp.zeros([], jnp.int32),
            m=zeros_like_trainable(params),
            n=full_like_trainable_real(params, 0.0),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleBySimplifiedAdEMAMixState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleBySimplifiedAdEMAMixState]:
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        alpha = evaluate(self.alpha, state.count)
        count = safe_int32_increment(state.count)
        correction2 = 1 - b2**count
        one_minus_b2 = 1 - b2

        @no_type_check
        def step(g, m, n):
            m = cast_to(b1 * m + g, m.dtype)
            n = cast_to(b2 * n + one_minus_b2 * abs_squared(g), n.dtype)
            denominator = jnp.sqrt(n / correction2.astype(n.dtype) + eps_root) + eps
            return cast_to((m + alpha * g) / denominator, g.dtype), m, n

        new_updates, m, n = leafwise(step, updates, state.m, state.n, n_out=3)
        return new_updates, ScaleBySimplifiedAdEMAMixState(count=count, m=m, n=n)


@checked
def scale_by_simplified_ademamix(
    b1: ScalarLike = 0.99,
    b2: ScalarLike = 0.95,
    alpha: ScalarOrSchedule = 0.0,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
) -> ScaleBySimplifiedAdemamix:
    """Optax spelling of `eqopt.contrib.ScaleBySimplifiedAdemamix`."""
    return ScaleBySimplifiedAdemamix(
        b1=b1, b2=b2, alpha=alpha, eps=eps, eps_root=eps_root
    )


@checked
def simplified_ademamix(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.99,
    b2: ScalarLike = 0.95,
    alpha: ScalarOrSchedule = 0.0,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    weight_decay: ScalarLike = 0.0,
    mask: FilterSpec | None = None,
) -> Chain:
    r"""Simplified AdEMAMix with decoupled weight decay.

    $$ x_t = x_{t-1} - \eta_t \left( \frac{m + \alpha g}
       {\sqrt{\hat n + \bar\epsilon} + \epsilon} + \lambda x_{t-1} \right) $$

    The chain is `eqopt.contrib.ScaleBySimplifiedAdemamix`,
    `eqopt.AddDecayedWeights`, `eqopt.ScaleByLearningRate`. `mask` is an
    Equinox filter spec of the leaves to decay.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - `b1`, `b2`, `alpha`, `eps`, `eps_root`: as
      `eqopt.contrib.ScaleBySimplifiedAdemamix`.
    - `weight_decay`: $\lambda$, decoupled, multiplied by the learning rate.
    - `mask`: the filter spec of the leaves to decay.

    **Returns:** an `eqopt.Chain`.

    **References:** Morwani et al., *Connections between
    Schedule-Free Optimizers, AdEMAMix, and Accelerated SGD Variants*, 2025.
    """
    return Chain(
        ScaleBySimplifiedAdemamix(
            b1=b1, b2=b2, alpha=alpha, eps=eps, eps_root=eps_root
        ),
        AddDecayedWeights(weight_decay, mask),
        ScaleByLearningRate(learning_rate),
    )
