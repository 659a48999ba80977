"""Sophia: a clipped, diagonal-Hessian-preconditioned momentum method."""

from collections.abc import Callable
from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, Int, PRNGKeyArray

from .._base import (
    AbstractGradientTransformation,
    OptState,
    Params,
    Updates,
    is_none,
    is_trainable,
)
from .._combine import Chain
from .._defaults import DefaultTransform, resolve
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
from .._interop import as_transform
from .._leafwise import leafwise, require_params, zeros_like_trainable
from .._numerics import debias, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ..tree._creation import random_like


@checked
class HutchinsonState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.HutchinsonEstimatorDiagHessian`: the random key."""

    key: PRNGKeyArray


@checked
class HutchinsonEstimatorDiagHessian(AbstractGradientTransformation):
    r"""Estimates the diagonal of the Hessian with Hutchinson's estimator.

    With a Rademacher vector $v$ (independent $\pm 1$ entries, fresh each call):

    $$ \widehat{\operatorname{diag}(H)} = v \odot (H v), \qquad
       \mathbb{E}\big[v \odot (H v)\big] = \operatorname{diag}(H) $$

    where $H v$ is one Hessian-vector product (forward-over-reverse), so the
    Hessian is never formed. The estimate is unbiased but noisy. It is
    returned as the updates, shaped like the params (`None` at leaves that
    are not trained); the incoming updates are ignored.

    `update` needs `params` and the objective as `obj_fn=`: a function of the
    params (a whole Equinox model is fine) returning a scalar loss. The key is
    split as Optax splits it, and one subkey per trained leaf in leaf order,
    so the same seed gives the same estimate.

    **Global**: one Hessian-vector product over all the leaves, a stacked layer's slices
    included.

    **Arguments:**

    - `random_seed`: the random key (default: `jax.random.PRNGKey(0)`).

    **References:** Hutchinson, *A stochastic estimator of the trace of the
    influence matrix for Laplacian smoothing splines*, 1990; Liu et al.,
    *Sophia: A Scalable Stochastic Second-order Optimizer for Language Model
    Pre-training*, ICLR 2024.
    """

    # `update` ignores its `updates` (Optax passes `None`): nothing to compare with
    # the params.
    params_like_updates = False

    random_seed: PRNGKeyArray | np.ndarray | None = None

    @property
    def elementwise(self) -> bool:
        return False

    @init_entry
    def init(self, params: Params) -> HutchinsonState:
        if self.random_seed is None:
            return HutchinsonState(key=jax.random.PRNGKey(0))
        # A copy: a step that donates the optimiser and the state cannot take one
        # buffer twice.
        return HutchinsonState(key=jnp.array(self.random_seed, copy=True))

    @update_entry
    def update(
        self,
        updates: Updates,
        state: HutchinsonState,
        params: Params | None = None,
        *,
        obj_fn: Callable[[Params], Any] | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, HutchinsonState]:
        require_params(
            params,
            "hutchinson_estimator_diag_hessian",
            call="update(updates, state, params, obj_fn=...)",
        )
        if obj_fn is None:
            raise ValueError(
                "hutchinson_estimator_diag_hessian needs the objective: call "
                "`update(updates, state, params, obj_fn=loss)` with `loss(params)` a "
                "scalar."
            )
        key, subkey = jax.random.split(state.key)
        trainable, static = eqx.partition(params, is_trainable)
        signs = random_like(subkey, trainable, jax.random.rademacher, dtype=jnp.float32)
        signs = jax.tree.map(lambda s, p: s.astype(p.dtype), signs, trainable)

        def gradient(diff):
            return jax.grad(lambda d: obj_fn(eqx.combine(d, static)))(diff)

        hessian_times_signs = jax.jvp(gradient, (trainable,), (signs,))[1]
        estimate = jax.tree.map(lambda h, s: h * s, hessian_times_signs, signs)
        return estimate, HutchinsonState(key=key)


@checked
def hutchinson_estimator_diag_hessian(
    random_seed: PRNGKeyArray | None = None,
) -> HutchinsonEstimatorDiagHessian:
    """Optax spelling of `eqopt.contrib.HutchinsonEstimatorDiagHessian`."""
    return HutchinsonEstimatorDiagHessian(random_seed=random_seed)


@checked
class SophiaState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleBySophia`: moments and the estimator's state.

    `nu` is the exponential average of the Hessian-diagonal estimates.
    """

    count: Int[Array, ""]
    mu: Updates
    nu: Updates
    hessian_fn_state: OptState


@checked
class ScaleBySophia(AbstractGradientTransformation):
    r"""Scales momentum by a diagonal Hessian estimate, elementwise clipped (Sophia).

    $$
    \begin{aligned}
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t, \qquad \hat m_t = m_t / (1 - \beta_1^t) \\
    u_t &= \operatorname{clip}\!\Big(\frac{\hat m_t}{\max(\gamma\, h_{t-1}, \epsilon)},
           \; -c,\; c\Big) \\
    h_t &= \beta_2 h_{t-1} + (1 - \beta_2)\, \hat H_t \quad
           \text{every } k \text{ steps (when } (t - 1) \bmod k = 0\text{)}
    \end{aligned}
    $$

    where $\hat H_t$ is the output of `hessian_diagonal_fn` (Hutchinson's
    estimator by default). Where the curvature estimate is small or negative
    the clip bounds the step, so Sophia behaves like sign momentum there.
    Extra arguments of `update` (for the default estimator, `obj_fn=`) are
    passed to `hessian_diagonal_fn`.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `b1`: the momentum decay $\beta_1$.
    - `b2`: the decay $\beta_2$ of the Hessian average (effectively
      $1 - (1 - \beta_2)/k$ per step).
    - `eps`: the floor $\epsilon$ of the denominator.
    - `gamma`: $\gamma$, scaling the Hessian estimate.
    - `clip_threshold`: $c$, or `None` not to clip.
    - `update_interval`: $k$ (static).
    - `hessian_diagonal_fn`: the transform estimating $\operatorname{diag}(H)$,
      called as `update(grads, state, params=params, **extra_args)`.
    - `mu_dtype`: dtype to store $m$ in (default: the params').
    - `verbose`: print the fraction of unclipped entries (the "win rate")
      every `print_win_rate_every_n_steps` steps, with `jax.debug.print`.
    - `print_win_rate_every_n_steps`: see `verbose` (static).

    **References:** Liu, Li, Hall, Liang & Ma, *Sophia: A Scalable Stochastic
    Second-order Optimizer for Language Model Pre-training*, ICLR 2024.
    """

    b1: Scalar = eqx.field(default=0.965, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.99, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    gamma: Scalar = eqx.field(default=0.01, converter=as_scalar)
    clip_threshold: Scalar | None = eqx.field(default=1.0, converter=as_optional_scalar)
    update_interval: int = eqx.field(default=10, static=True)
    hessian_diagonal_fn: AbstractGradientTransformation = eqx.field(
        default_factory=HutchinsonEstimatorDiagHessian, converter=as_transform
    )
    mu_dtype: DTypeLike | None = eqx.field(default=None, static=True)
    verbose: bool = eqx.field(default=False, static=True)
    print_win_rate_every_n_steps: int = eqx.field(default=0, static=True)

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("gamma", self.gamma, low=0.0)
        check_hyperparameter("clip_threshold", self.clip_threshold, low=0.0)
        if not isinstance(self.update_interval, int) or self.update_interval < 1:
            raise ValueError(
                "ScaleBySophia: `update_interval` must be a positive int, got "
                f"{self.update_interval!r}."
            )

    @property
    def elementwise(self) -> bool:
        return False

    @init_entry
    def init(self, params: Params) -> SophiaState:
        return SophiaState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params, self.mu_dtype),
            nu=zeros_like_trainable(params),
            hessian_fn_state=self.hessian_diagonal_fn.init(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: SophiaState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, SophiaState]:
        require_params(
            params, "sophia", call="update(updates, state, params, obj_fn=...)"
        )
        b1, b2, eps, gamma = self.b1, self.b2, self.eps, self.gamma
        count = safe_int32_increment(state.count)
        one_minus_b1, correction = 1 - b1, 1 - b1**count

        @no_type_check
        def step(g, mu, nu):
            mu_dtype = mu.dtype
            mu = b1 * mu + one_minus_b1 * g
            update = debias(mu, correction) / jnp.maximum(gamma * nu, eps)
            if self.clip_threshold is not None:
                update = jnp.clip(update, -self.clip_threshold, self.clip_threshold)
            return update, mu.astype(self.mu_dtype or mu_dtype)

        new_updates, mu = leafwise(step, updates, state.mu, state.nu, n_out=2)

        if self.verbose and self.clip_threshold is not None:
            leaves = [u for u in jax.tree.leaves(new_updates)]
            unclipped = sum(jnp.sum(jnp.abs(u) < self.clip_threshold) for u in leaves)
            win_rate = unclipped / sum(u.size for u in leaves)
            every = max(self.print_win_rate_every_n_steps, 1)
            jax.lax.cond(
                count % every == 0,
                lambda: jax.debug.print("Sophia optimizer win rate: {}", win_rate),
                lambda: None,
            )

        def refresh(hessian_state, nu):
            estimate, hessian_state = self.hessian_diagonal_fn.update(
                updates, hessian_state, params=params, **extra_args
            )
            nu = jax.tree.map(
                lambda h, n: n if h is None else (1 - b2) * h + b2 * n,
                estimate,
                nu,
                is_leaf=is_none,
            )
            return hessian_state, nu

        hessian_state, nu = jax.lax.cond(
            state.count % self.update_interval == 0,
            refresh,
            lambda h, n: (h, n),
            state.hessian_fn_state,
            state.nu,
        )
        return new_updates, SophiaState(
            count=count, mu=mu, nu=nu, hessian_fn_state=hessian_state
        )


@checked
def sophia(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.965,
    b2: ScalarLike = 0.99,
    eps: ScalarLike = 1e-8,
    weight_decay: ScalarOrSchedule = 1e-4,
    weight_decay_mask: FilterSpec | None = None,
    gamma: ScalarLike = 0.01,
    clip_threshold: ScalarLike | None = 1.0,
    update_interval: int = 10,
    hessian_diagonal_fn: Any = DefaultTransform(HutchinsonEstimatorDiagHessian),
    mu_dtype: DTypeLike | None = None,
    verbose: bool = False,
    print_win_rate_every_n_steps: int = 0,
) -> Chain:
    r"""Sophia with decoupled weight decay.

    $$
    u_t = -\eta_t \Big( \operatorname{clip}\!\Big(\frac{\hat m_t}{\max(\gamma h_{t-1}, \epsilon)}, -c, c\Big)
          + \lambda\, \theta_{t-1} \Big)
    $$

    with $\hat m_t$ and $h_t$ as in `eqopt.contrib.ScaleBySophia`. The chain
    is `scale_by_sophia`, `add_decayed_weights`, `scale_by_learning_rate`.
    With the default Hutchinson estimator, call
    `update(grads, state, params, obj_fn=lambda model: loss(model, batch))`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - `b1`, `b2`, `eps`, `gamma`, `clip_threshold`, `update_interval`,
      `hessian_diagonal_fn`, `mu_dtype`, `verbose`,
      `print_win_rate_every_n_steps`: as for `eqopt.contrib.ScaleBySophia`.
    - `weight_decay`: $\lambda$.
    - `weight_decay_mask`: a filter spec of the leaves to decay.

    **Returns:** an `eqopt.Chain`.

    **References:** Liu, Li, Hall, Liang & Ma, *Sophia: A Scalable Stochastic
    Second-order Optimizer for Language Model Pre-training*, ICLR 2024.
    """
    return Chain(
        ScaleBySophia(
            b1=b1,
            b2=b2,
            eps=eps,
            gamma=gamma,
            clip_threshold=clip_threshold,
            update_interval=update_interval,
            hessian_diagonal_fn=resolve(hessian_diagonal_fn),
            mu_dtype=mu_dtype,
            verbose=verbose,
            print_win_rate_every_n_steps=print_win_rate_every_n_steps,
        ),
        AddDecayedWeights(weight_decay, weight_decay_mask),
        ScaleByLearningRate(learning_rate),
    )
