"""Rectified Adam: Adam with its adaptive step switched on once its variance is tractable."""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp

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
from .._typecheck import checked
from .adam import ScaleByAdamState
from .basic import ScaleByLearningRate


@checked
class ScaleByRadam(AbstractGradientTransformation):
    r"""Rescales updates with Rectified Adam.

    Early in training Adam's second moment rests on few samples, and the
    variance of its adaptive step is large (unbounded at first). RAdam tracks
    the length $\rho_t$ of the approximating simple moving average and uses
    momentum alone until $\rho_t$ exceeds a threshold, then Adam's step times a
    rectification $r_t$ that corrects its variance:

    $$
    \begin{aligned}
    \rho_\infty &= \frac{2}{1 - \beta_2} - 1, \qquad
    \rho_t = \rho_\infty - \frac{2 t \beta_2^t}{1 - \beta_2^t} \\
    r_t &= \sqrt{\frac{(\rho_t - 4)(\rho_t - 2)\,\rho_\infty}{(\rho_\infty - 4)(\rho_\infty - 2)\,\rho_t}} \\
    u_t &= \begin{cases}
        r_t\, \hat m_t / \big(\sqrt{\hat v_t + \epsilon_{\text{root}}} + \epsilon\big) & \rho_t > \text{threshold} \\
        \hat m_t & \text{otherwise}
    \end{cases}
    \end{aligned}
    $$

    with $m_t, v_t$ Adam's moments and hats dividing by $1 - \beta^t$. With
    `nesterov=True`, $\hat m_t$ is Dozat's look-ahead as in
    `eqopt.ScaleByAdam`. The state is Adam's.

    !!! note "Numerics"
        `b2` is a float32 leaf, so $\rho_\infty$ is computed from float32's
        $1 - \beta_2$, where Optax uses Python's double precision: with
        $\beta_2 = 0.999$, $\rho_\infty$ is 1999.03 instead of 1999, which
        changes $r_t$ by up to about 1% in the first steps after the threshold.
        For a $\beta_2$ with $1 - \beta_2$ a power of two the two agree.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `b1`, `b2`: the decay rates $\beta_1, \beta_2 \in [0, 1)$.
    - `eps`: added to the denominator outside the square root.
    - `eps_root`: added inside the square root.
    - `threshold`: the $\rho_t$ above which the adaptive step is used (the
      paper uses 4; Optax's default, 5, is kept).
    - `nesterov`: use Nesterov momentum.

    **References:** Liu, Jiang, He, Chen, Liu, Gao & Han, *On the Variance of
    the Adaptive Learning Rate and Beyond*, ICLR 2020.
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    eps_root: Scalar = eqx.field(default=0.0, converter=as_scalar)
    threshold: Scalar = eqx.field(default=5.0, converter=as_scalar)
    nesterov: bool = eqx.field(default=False, static=True)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("eps_root", self.eps_root, low=0.0)
        check_hyperparameter("threshold", self.threshold)

    @init_entry
    def init(self, params: Params) -> ScaleByAdamState:
        return ScaleByAdamState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params),
            nu=full_like_trainable_real(params, 0.0),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByAdamState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByAdamState]:
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        count = safe_int32_increment(state.count)
        one_minus_b1, one_minus_b2 = 1 - b1, 1 - b2
        b2_power = b2**count
        correction1, correction2 = 1 - b1**count, 1 - b2_power
        if self.nesterov:
            next_correction1 = 1 - b1 ** safe_int32_increment(count)
        rho_inf = 2 / one_minus_b2 - 1
        rho = rho_inf - 2 * count * b2_power / correction2
        rectified = rho > self.threshold
        # Guarded so that the unused branch stays finite (and differentiable).
        safe_rho = jnp.where(rectified, rho, rho_inf)
        rectification = jnp.sqrt(
            (safe_rho - 4)
            * (safe_rho - 2)
            * rho_inf
            / ((rho_inf - 4) * (rho_inf - 2) * safe_rho)
        )

        @no_type_check
        def step(g, mu_old, nu_old):
            mu = (b1 * mu_old + one_minus_b1 * g).astype(mu_old.dtype)
            nu = (b2 * nu_old + one_minus_b2 * abs_squared(g)).astype(nu_old.dtype)
            if self.nesterov:
                mu_hat = b1 * debias(mu, next_correction1) + debias(
                    one_minus_b1 * g, correction1
                )
            else:
                mu_hat = debias(mu, correction1)
            nu_hat = debias(nu, correction2)
            adaptive = rectification * mu_hat / (eps + jnp.sqrt(eps_root + nu_hat))
            # `b2**count` is a strong float32 under jit (an int32 power): the
            # update keeps the gradient's dtype, the moments their own.
            return jnp.where(rectified, adaptive, mu_hat).astype(g.dtype), mu, nu

        updates, mu, nu = leafwise(step, updates, state.mu, state.nu, n_out=3)
        return updates, ScaleByAdamState(count=count, mu=mu, nu=nu)


@checked
def scale_by_radam(
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    threshold: ScalarLike = 5.0,
    *,
    nesterov: bool = False,
) -> ScaleByRadam:
    """Optax spelling of `eqopt.ScaleByRadam`."""
    return ScaleByRadam(
        b1=b1,
        b2=b2,
        eps=eps,
        eps_root=eps_root,
        threshold=threshold,
        nesterov=nesterov,
    )


@checked
def radam(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    threshold: ScalarLike = 5.0,
    *,
    nesterov: bool = False,
) -> Chain:
    r"""RAdam: Adam with a rectified adaptive step and no need for warm-up.

    $$
    u_t = -\eta_t \begin{cases}
        r_t\, \hat m_t / \big(\sqrt{\hat v_t + \epsilon_{\text{root}}} + \epsilon\big) & \rho_t > \text{threshold} \\
        \hat m_t & \text{otherwise}
    \end{cases}
    $$

    with $\rho_t$ and $r_t$ as in `eqopt.ScaleByRadam`. The chain is
    `eqopt.ScaleByRadam`, then `eqopt.ScaleByLearningRate`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `b1`, `b2`, `eps`, `eps_root`, `threshold`, `nesterov`: as
      `eqopt.ScaleByRadam`.

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        opt = eqopt.radam(learning_rate=1e-3)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)   # SGD with momentum at first
        model = eqopt.apply_updates(model, updates)
        ```

    **References:** Liu et al., *On the Variance of the Adaptive Learning Rate
    and Beyond*, ICLR 2020.
    """
    return Chain(
        ScaleByRadam(
            b1=b1,
            b2=b2,
            eps=eps,
            eps_root=eps_root,
            threshold=threshold,
            nesterov=nesterov,
        ),
        ScaleByLearningRate(learning_rate=learning_rate),
    )
