"""Yogi: Adam with an additive, sign-controlled second moment."""

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
from .._leafwise import full_like_trainable_real, leafwise
from .._numerics import abs_squared, debias, safe_int32_increment
from .._typecheck import checked
from ._layerwise import map_trainable
from .adam import ScaleByAdamState
from .basic import ScaleByLearningRate


@checked
class ScaleByYogi(AbstractGradientTransformation):
    r"""Rescales updates with Yogi's moment estimates.

    Adam's second moment moves multiplicatively towards $|g_t|^2$, so it can
    forget a large gradient quickly and let the step grow. Yogi moves it
    additively, by at most $(1 - \beta_2)|g_t|^2$ per step:

    $$
    \begin{aligned}
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t \\
    v_t &= v_{t-1} - (1 - \beta_2)\, \operatorname{sign}\big(v_{t-1} - |g_t|^2\big)\, |g_t|^2 \\
    u_t &= \frac{m_t / (1 - \beta_1^t)}{\sqrt{v_t / (1 - \beta_2^t) + \epsilon_{\text{root}}} + \epsilon}
    \end{aligned}
    $$

    Both moments start at `initial_accumulator_value`. The moments are
    bias-corrected as in Adam (Optax does the same; the paper does not). The
    state is Adam's; $v$ is real for complex updates.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `b1`, `b2`: the decay rates $\beta_1, \beta_2 \in [0, 1)$.
    - `eps`: $\epsilon$, added to the denominator outside the square root
      (Yogi's default, $10^{-3}$, is larger than Adam's).
    - `eps_root`: added inside the square root.
    - `initial_accumulator_value`: $m_0 = v_0 > 0$.

    **References:** Zaheer, Reddi, Sachan, Kale & Kumar, *Adaptive Methods for
    Nonconvex Optimization*, NeurIPS 2018.
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-3, converter=as_scalar)
    eps_root: Scalar = eqx.field(default=0.0, converter=as_scalar)
    initial_accumulator_value: Scalar = eqx.field(default=1e-6, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("eps_root", self.eps_root, low=0.0)
        check_hyperparameter(
            "initial_accumulator_value",
            self.initial_accumulator_value,
            low=0.0,
            low_inclusive=False,
        )

    @init_entry
    def init(self, params: Params) -> ScaleByAdamState:
        value = self.initial_accumulator_value
        return ScaleByAdamState(
            count=jnp.zeros([], jnp.int32),
            mu=map_trainable(lambda p: jnp.full_like(p, value), params),
            nu=full_like_trainable_real(params, value),
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
        correction1, correction2 = 1 - b1**count, 1 - b2**count

        @no_type_check
        def step(g, mu, nu):
            squared = abs_squared(g)
            mu = b1 * mu + one_minus_b1 * g
            nu = nu - one_minus_b2 * jnp.sign(nu - squared) * squared
            nu_hat = debias(nu, correction2)
            update = debias(mu, correction1) / (eps + jnp.sqrt(eps_root + nu_hat))
            return update, mu, nu

        updates, mu, nu = leafwise(step, updates, state.mu, state.nu, n_out=3)
        return updates, ScaleByAdamState(count=count, mu=mu, nu=nu)


@checked
def scale_by_yogi(
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-3,
    eps_root: ScalarLike = 0.0,
    initial_accumulator_value: ScalarLike = 1e-6,
) -> ScaleByYogi:
    """Optax spelling of `eqopt.ScaleByYogi`."""
    return ScaleByYogi(
        b1=b1,
        b2=b2,
        eps=eps,
        eps_root=eps_root,
        initial_accumulator_value=initial_accumulator_value,
    )


@checked
def yogi(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-3,
) -> Chain:
    r"""Yogi: Adam whose second moment changes additively, controlled by a sign.

    $$
    v_t = v_{t-1} - (1 - \beta_2)\, \operatorname{sign}\big(v_{t-1} - |g_t|^2\big)\, |g_t|^2,
    \qquad u_t = -\eta_t\, \frac{\hat m_t}{\sqrt{\hat v_t} + \epsilon}
    $$

    The chain is `eqopt.ScaleByYogi`, then `eqopt.ScaleByLearningRate`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `b1`, `b2`, `eps`: as `eqopt.ScaleByYogi`.

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        opt = eqopt.yogi(learning_rate=1e-2)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
        ```

    **References:** Zaheer, Reddi, Sachan, Kale & Kumar, *Adaptive Methods for
    Nonconvex Optimization*, NeurIPS 2018.
    """
    return Chain(
        ScaleByYogi(b1=b1, b2=b2, eps=eps),
        ScaleByLearningRate(learning_rate=learning_rate),
    )
