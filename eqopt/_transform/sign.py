"""Sign-based scalings and optimisers: signSGD, Signum and Lion."""

from typing import Any, Literal, no_type_check

import equinox as eqx
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Int

from .._base import AbstractGradientTransformation, EmptyState, Params, Updates
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
from .._leafwise import leafwise, zeros_like_trainable
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._quantize import MomentDType, any_quantized, quantized_on_buffers
from .._typecheck import checked
from .basic import ScaleByLearningRate
from .decay import AddDecayedWeights
from .momentum import Ema


@checked
class ScaleBySign(AbstractGradientTransformation):
    r"""Replaces each element of the updates by its sign.

    $$ u_t = \operatorname{sign}(g_t) \in \{-1, 0, 1\} $$

    For a complex element the sign is its phase, $g / |g|$ (and $0$ at $0$).

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **References:** Bernstein, Wang, Azizzadenesheli & Anandkumar, *signSGD:
    Compressed Optimisation for Non-Convex Problems*, ICML 2018.
    """

    @property
    def elementwise(self) -> bool:
        return True

    @init_entry
    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    @update_entry
    def update(
        self,
        updates: Updates,
        state: EmptyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmptyState]:
        return leafwise(jnp.sign, updates), state


@checked
def scale_by_sign() -> ScaleBySign:
    """Optax spelling of `eqopt.ScaleBySign`."""
    return ScaleBySign()


@checked
class ScaleByLionState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByLion`: the step count and the momentum $m$."""

    count: Int[Array, ""]
    mu: Updates


@no_type_check
def _smooth_sign(x, beta):
    if not jnp.iscomplexobj(x):
        return jnp.tanh(beta * x)
    # tanh of a complex number has poles; keep the phase and saturate the modulus.
    modulus = jnp.abs(x)
    positive = modulus > 0
    safe_modulus = jnp.where(positive, modulus, 1)
    factor = jnp.where(positive, jnp.tanh(beta * safe_modulus) / safe_modulus, beta)
    return factor.astype(x.dtype) * x


@checked
class ScaleByLion(AbstractGradientTransformation):
    r"""Rescales updates with Lion: the sign of an interpolation of momentum and gradient.

    $$
    \begin{aligned}
    c_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t \\
    u_t &= \operatorname{sign}(c_t) \\
    m_t &= \beta_2 m_{t-1} + (1 - \beta_2)\, g_t
    \end{aligned}
    $$

    Every element of the update has magnitude one (`mode="hard"`, the paper's
    rule), so the learning rate is typically 3-10 times smaller than Adam's.
    Two softer variants replace the sign:

    - `mode="smooth"`: $\tanh(\beta_s c_t)$;
    - `mode="refined"`: $c_t$ where $|c_t| < 1$, $\operatorname{sign}(c_t)$ elsewhere.

    For complex updates the sign is the phase $c / |c|$. In `"smooth"` mode eqopt
    keeps the phase and applies $\tanh$ to the modulus,
    $\tanh(\beta_s |c|)\, c / |c|$ (equal to $\tanh(\beta_s c)$ for real $c$);
    Optax applies the complex $\tanh$, which has poles.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `b1`: $\beta_1 \in [0, 1]$, the weight of the momentum in the update.
    - `b2`: $\beta_2 \in [0, 1]$, the decay of the momentum.
    - `mu_dtype`: dtype to store the momentum in (default: the params'), or a
      `eqopt.Quantized` format.
    - `mode`: `"hard"`, `"smooth"` or `"refined"`, as above.
    - `smooth_beta`: $\beta_s > 0$, the slope of the `"smooth"` sign.

    **References:** Chen et al., *Symbolic Discovery of Optimization Algorithms*,
    NeurIPS 2023.
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.99, converter=as_scalar)
    mu_dtype: MomentDType = eqx.field(default=None, static=True)
    mode: Literal["hard", "smooth", "refined"] = eqx.field(default="hard", static=True)
    smooth_beta: Scalar = eqx.field(default=1.0, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return not any_quantized(self.mu_dtype)

    @property
    def runs_on_buffers(self) -> bool:
        # A packed buffer's quantised moments are quantised as one array.
        return quantized_on_buffers(self.mu_dtype)

    def __check_init__(self):
        check_decays(self, "b1", "b2", high_inclusive=True)
        if self.mode not in ("hard", "smooth", "refined"):
            raise ValueError(
                f"`mode` must be 'hard', 'smooth' or 'refined', got {self.mode!r}."
            )
        check_hyperparameter(
            "smooth_beta", self.smooth_beta, low=0.0, low_inclusive=False
        )

    def _sign(self, c):
        if self.mode == "smooth":
            return _smooth_sign(c, self.smooth_beta)
        if self.mode == "refined":
            return jnp.where(jnp.abs(c) < 1, c, jnp.sign(c))
        return jnp.sign(c)

    @init_entry
    def init(self, params: Params) -> ScaleByLionState:
        return ScaleByLionState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params, self.mu_dtype),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByLionState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByLionState]:
        b1, b2 = self.b1, self.b2
        one_minus_b1, one_minus_b2 = 1 - b1, 1 - b2

        @no_type_check
        def step(g, mu):
            update = self._sign(b1 * mu + one_minus_b1 * g).astype(g.dtype)
            new_mu = b2 * mu + one_minus_b2 * g
            return update, new_mu.astype(mu.dtype)

        updates, mu = leafwise(step, updates, state.mu, n_out=2, elementwise=True)
        return updates, ScaleByLionState(count=safe_int32_increment(state.count), mu=mu)


@checked
def scale_by_lion(
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.99,
    mu_dtype: MomentDType = None,
    *,
    mode: Literal["hard", "smooth", "refined"] = "hard",
    smooth_beta: ScalarLike = 1.0,
) -> ScaleByLion:
    """Optax spelling of `eqopt.ScaleByLion`."""
    return ScaleByLion(
        b1=b1, b2=b2, mu_dtype=mu_dtype, mode=mode, smooth_beta=smooth_beta
    )


@checked
def lion(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.99,
    mu_dtype: MomentDType = None,
    weight_decay: ScalarOrSchedule = 1e-3,
    mask: FilterSpec | None = None,
    *,
    cautious_weight_decay: bool = False,
) -> Chain:
    r"""Lion: steps by the sign of an interpolation of momentum and gradient.

    $$
    \begin{aligned}
    u_t &= -\eta_t \big( \operatorname{sign}(\beta_1 m_{t-1} + (1 - \beta_1) g_t)
                         + \lambda\, \theta_{t-1} \big) \\
    m_t &= \beta_2 m_{t-1} + (1 - \beta_2)\, g_t
    \end{aligned}
    $$

    Every element moves by $\eta$ (plus decay), so use a learning rate 3-10
    times smaller, and a weight decay 3-10 times larger, than with AdamW. The
    chain is `eqopt.ScaleByLion`, `eqopt.AddDecayedWeights`,
    `eqopt.ScaleByLearningRate`; `mask` is a filter spec as in
    `eqopt.adamw`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `b1`, `b2`: $\beta_1, \beta_2$.
    - `mu_dtype`: dtype to store the momentum in (default: the params').
    - `weight_decay`: $\lambda$, a number or a schedule.
    - `mask`: the filter spec of the leaves to decay (default: all).
    - `cautious_weight_decay`: decay only the entries whose update agrees
      with them in sign (see `eqopt.AddDecayedWeights`).

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        # Lion's sign updates are larger than Adam's: use a smaller rate.
        opt = eqopt.lion(learning_rate=1e-4, weight_decay=1e-2)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
        ```

    **References:** Chen et al., *Symbolic Discovery of Optimization
    Algorithms*, NeurIPS 2023.
    """
    return Chain(
        ScaleByLion(b1=b1, b2=b2, mu_dtype=mu_dtype),
        AddDecayedWeights(
            weight_decay=weight_decay, mask=mask, cautious=cautious_weight_decay
        ),
        ScaleByLearningRate(learning_rate=learning_rate),
    )


@checked
def sign_sgd(learning_rate: ScalarOrSchedule) -> Chain:
    r"""signSGD: steps by the sign of each gradient element.

    $$ u_t = -\eta_t\, \operatorname{sign}(g_t) $$

    The chain is `eqopt.ScaleBySign`, then `eqopt.ScaleByLearningRate`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.

    **Returns:** an `eqopt.Chain`.

    **References:** Bernstein, Wang, Azizzadenesheli & Anandkumar, *signSGD:
    Compressed Optimisation for Non-Convex Problems*, ICML 2018.
    """
    return Chain(ScaleBySign(), ScaleByLearningRate(learning_rate=learning_rate))


@checked
def signum(
    learning_rate: ScalarOrSchedule,
    beta: ScalarLike = 0.9,
    accumulator_dtype: DTypeLike | None = None,
) -> Chain:
    r"""Signum: steps by the sign of the momentum.

    $$
    m_t = \beta\, m_{t-1} + (1 - \beta)\, g_t, \qquad
    u_t = -\eta_t\, \operatorname{sign}(m_t)
    $$

    The moving average is not debiased: the sign does not depend on the scale.
    The chain is `eqopt.Ema` (`debias=False`), `eqopt.ScaleBySign`,
    `eqopt.ScaleByLearningRate`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `beta`: $\beta \in [0, 1]$, the momentum decay.
    - `accumulator_dtype`: dtype to store the momentum in (default: the params').

    **Returns:** an `eqopt.Chain`.

    **References:** Bernstein, Wang, Azizzadenesheli & Anandkumar, *signSGD:
    Compressed Optimisation for Non-Convex Problems*, ICML 2018.
    """
    return Chain(
        Ema(decay=beta, debias=False, accumulator_dtype=accumulator_dtype),
        ScaleBySign(),
        ScaleByLearningRate(learning_rate=learning_rate),
    )
