"""AdaBelief: Adam with the second moment of the gradient's prediction error."""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
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
from .._leafwise import full_like_trainable_real, leafwise, zeros_like_trainable
from .._numerics import abs_squared, debias, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from .basic import ScaleByLearningRate


@checked
class ScaleByBeliefState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByBelief`: the step count, $m$ and $s$."""

    count: Int[Array, ""]
    mu: Updates
    nu: Updates


@checked
class ScaleByBelief(AbstractGradientTransformation):
    r"""Rescales updates by AdaBelief's belief in the gradient.

    Adam divides the first moment by the root of the second moment of the
    gradient; AdaBelief divides it by the root of the second moment of the
    *prediction error* $g_t - m_t$, so steps are large where the gradient is
    close to its running mean and small where it is not.

    $$
    \begin{aligned}
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t \\
    s_t &= \beta_2 s_{t-1} + (1 - \beta_2)\, |g_t - m_t|^2 + \epsilon_{\text{root}} \\
    u_t &= \frac{m_t / (1 - \beta_1^t)}{\sqrt{s_t / (1 - \beta_2^t)} + \epsilon}
    \end{aligned}
    $$

    With `nesterov=True` the numerator is Dozat's look-ahead
    $\beta_1 m_t / (1 - \beta_1^{t+1}) + (1 - \beta_1) g_t / (1 - \beta_1^t)$.
    For complex updates $s$ is real (the squared modulus of the error).

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `b1`, `b2`: the decay rates $\beta_1, \beta_2 \in [0, 1)$.
    - `eps`: $\epsilon$, added to the denominator outside the square root.
    - `eps_root`: $\epsilon_{\text{root}}$, added to $s_t$ at every step (keep it
      positive when differentiating through the update).
    - `nesterov`: use Nesterov momentum.

    **References:** Zhuang, Tang, Ding, Tatikonda, Dvornek, Papademetris &
    Duncan, *AdaBelief Optimizer: Adapting Stepsizes by the Belief in Observed
    Gradients*, NeurIPS 2020.
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-16, converter=as_scalar)
    eps_root: Scalar = eqx.field(default=1e-16, converter=as_scalar)
    nesterov: bool = eqx.field(default=False, static=True)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("eps_root", self.eps_root, low=0.0)

    @init_entry
    def init(self, params: Params) -> ScaleByBeliefState:
        return ScaleByBeliefState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params),
            nu=full_like_trainable_real(params, 0.0),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByBeliefState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByBeliefState]:
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        count = safe_int32_increment(state.count)
        one_minus_b1, one_minus_b2 = 1 - b1, 1 - b2
        correction1, correction2 = 1 - b1**count, 1 - b2**count
        if self.nesterov:
            next_correction1 = 1 - b1 ** safe_int32_increment(count)

        @no_type_check
        def step(g, mu, nu):
            mu = b1 * mu + one_minus_b1 * g
            nu = b2 * nu + one_minus_b2 * abs_squared(g - mu) + eps_root
            if self.nesterov:
                mu_hat = b1 * debias(mu, next_correction1) + debias(
                    one_minus_b1 * g, correction1
                )
            else:
                mu_hat = debias(mu, correction1)
            return mu_hat / (eps + jnp.sqrt(debias(nu, correction2))), mu, nu

        updates, mu, nu = leafwise(step, updates, state.mu, state.nu, n_out=3)
        return updates, ScaleByBeliefState(count=count, mu=mu, nu=nu)


@checked
def scale_by_belief(
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-16,
    eps_root: ScalarLike = 1e-16,
    *,
    nesterov: bool = False,
) -> ScaleByBelief:
    """Optax spelling of `eqopt.ScaleByBelief`."""
    return ScaleByBelief(b1=b1, b2=b2, eps=eps, eps_root=eps_root, nesterov=nesterov)


@checked
def adabelief(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-16,
    eps_root: ScalarLike = 1e-16,
    *,
    nesterov: bool = False,
) -> Chain:
    r"""AdaBelief: Adam whose step adapts to the belief in the observed gradient.

    $$
    u_t = -\eta_t\, \frac{\hat m_t}{\sqrt{\hat s_t} + \epsilon}, \qquad
    s_t = \beta_2 s_{t-1} + (1 - \beta_2)\, |g_t - m_t|^2 + \epsilon_{\text{root}}
    $$

    with $\hat m_t, \hat s_t$ the bias-corrected moments. The chain is
    `eqopt.ScaleByBelief`, then `eqopt.ScaleByLearningRate`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `b1`, `b2`, `eps`, `eps_root`, `nesterov`: as `eqopt.ScaleByBelief`.

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        opt = eqopt.adabelief(learning_rate=1e-3)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        state.scale_by_belief.nu     # the "belief": variance of g around its mean
        ```

    **References:** Zhuang et al., *AdaBelief Optimizer: Adapting Stepsizes by
    the Belief in Observed Gradients*, NeurIPS 2020.
    """
    return Chain(
        ScaleByBelief(b1=b1, b2=b2, eps=eps, eps_root=eps_root, nesterov=nesterov),
        ScaleByLearningRate(learning_rate=learning_rate),
    )
