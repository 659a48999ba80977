"""Mechanic: a learning-rate tuner around any optimiser (Cutkosky, Defazio & Mehta, 2023)."""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    OptState,
    Params,
    Updates,
)
from .._entry import init_entry, update_entry
from .._hyper import Scalar, ScalarLike, as_scalar, check_hyperparameter
from .._interop import as_transform
from .._leafwise import leafwise, zeros_like_trainable
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._reductions import (
    cast_to,
    real_inner,
    require_params,
    scalar_dtype,
    total,
    trainable_part,
    tree_squared_norm,
)


@checked
class MechanicState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.Mechanize`: the base optimiser's state,
    the sum $\\Delta_t$ of its updates, and Mechanic's per-$\\beta$ statistics
    $r, m, v$ and scales $s$ (each of shape `(num_betas,)`)."""

    base_optimizer_state: OptState
    count: Int[Array, ""]
    r: Float[Array, " num_betas"]
    m: Float[Array, " num_betas"]
    v: Float[Array, " num_betas"]
    s: Float[Array, " num_betas"]
    delta: Updates


@checked
class Mechanize(AbstractWrapper):
    r"""Learns the scale of another optimiser's updates online (Mechanic).

    The base optimiser's updates $u_t$ are summed into $\Delta_{t+1} = \Delta_t +
    u_t$ and applied with a learned scale, $x_{t+1} = x_0 + S_{t+1}
    \Delta_{t+1}$ with $S = \sum_i s_i$. For each $\beta_i = 1 - 10^{-i}$,
    $i = 1..n$:

    $$
    \begin{aligned}
    h_t &= \Big\langle \Delta_t,\ g_t + \lambda S_t \frac{\|g_t\|}{\|x_t\| + \epsilon} x_t \Big\rangle \\
    m_{t,i} &= \max(\beta_i m_{t-1,i},\ |h_t| + \epsilon), \qquad
    v_{t,i} = \beta_i^2 v_{t-1,i} + h_t^2 \\
    r_{t,i} &= \beta_i r_{t-1,i} - s_{t,i}\, \operatorname{clip}(h_t, \pm m_{t-1,i}) \\
    s_{t+1,i} &= \frac{\tfrac{s_\text{init}}{n} m_{t,i} + \max(r_{t,i}, 0)}{\sqrt{v_{t,i}} + \epsilon}
    \end{aligned}
    $$

    and the update is $x_{t+1} - x_t = (S_{t+1} - S_t) \Delta_t + S_{t+1} u_t$.
    The inner products and norms are over the whole model, so the update is
    elementwise exactly when the base optimiser's is.

    The learning rate (or schedule) stays in the base optimiser, with base
    value 1 or any constant: Mechanic learns the scale on top of it.

    !!! note "Differences from Optax"
        The state keeps $\Delta_t$ (field `delta`) where Optax keeps $x_0$ and
        recovers $\Delta_t = (x_t - x_0) / S_t$ from the parameters; the maths is
        the same, without the cancellation in $x_t - x_0$ (which loses most of
        $\Delta$ in `bfloat16` while $S$ is small).

    **Global**: one learned scale over all the leaves, a stacked layer's slices
    included. The base optimiser's own kind is kept.

    **Arguments:**

    - `base_optimizer`: the optimiser whose updates are scaled (an eqopt
      transform, or an Optax one, which is wrapped).
    - `weight_decay`: $\lambda$, Mechanic's own decay (independent of any in the
      base optimiser).
    - `eps`: $\epsilon$.
    - `s_init`: $s_\text{init}$, the initial total scale.
    - `num_betas`: $n$, the number of decay rates (static).

    **References:** Cutkosky, Defazio & Mehta, *Mechanic: A Learning Rate
    Tuner*, NeurIPS 2023 (arXiv:2306.00144).
    """

    base_optimizer: AbstractGradientTransformation = eqx.field(converter=as_transform)
    weight_decay: Scalar = eqx.field(default=0.01, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    s_init: Scalar = eqx.field(default=1e-6, converter=as_scalar)
    num_betas: int = eqx.field(default=6, static=True)

    @property
    def inner(self) -> AbstractGradientTransformation:  # pyright: ignore[reportIncompatibleVariableOverride]
        """The base optimiser, whose capabilities (a `freeze` in it...) are these."""
        return self.base_optimizer

    def __check_init__(self):
        if not isinstance(self.num_betas, int) or self.num_betas < 1:
            raise ValueError(
                f"mechanize: `num_betas` must be a positive int, got {self.num_betas!r}."
            )
        check_hyperparameter("weight_decay", self.weight_decay, low=0.0)
        check_hyperparameter("eps", self.eps, low=0.0)
        check_hyperparameter("s_init", self.s_init, low=0.0, low_inclusive=False)

    def _betas(self, dtype: Any) -> Float[Array, " num_betas"]:
        return jnp.asarray([1 - 0.1 ** (i + 1) for i in range(self.num_betas)], dtype)

    @init_entry
    def init(self, params: Params) -> MechanicState:
        dtype = scalar_dtype(params)
        shape = [self.num_betas]
        # Separate buffers for each field, so the state can be donated.
        return MechanicState(
            base_optimizer_state=self.base_optimizer.init(params),
            count=jnp.zeros([], jnp.int32),
            r=jnp.zeros(shape, dtype),
            m=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            s=jnp.full(shape, self.s_init, dtype),
            delta=zeros_like_trainable(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: MechanicState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, MechanicState]:
        require_params(params, "mechanize")
        base_updates, base_state = self.base_optimizer.update(
            updates, state.base_optimizer_state, params, **extra_args
        )
        dtype = state.s.dtype
        eps = self.eps
        betas = self._betas(dtype)
        total_scale = jnp.sum(state.s)
        grad_norm = jnp.sqrt(tree_squared_norm(updates))
        param_norm = jnp.sqrt(tree_squared_norm(trainable_part(params, updates)))

        along_grads = total(
            leafwise(
                lambda g, d: real_inner(d, g), updates, state.delta, per_layer=False
            )
        )
        along_params = total(
            leafwise(
                lambda g, d, p: real_inner(d, p),
                updates,
                state.delta,
                params,
                per_layer=False,
            )
        )
        decay = self.weight_decay * total_scale * grad_norm / (param_norm + eps)
        h = along_grads + decay * along_params
        m = jnp.maximum(betas * state.m, jnp.abs(h) + eps)
        v = betas**2 * state.v + h**2
        r = betas * state.r - state.s * jnp.clip(h, -state.m, state.m)
        wealth = self.s_init / self.num_betas * m + jnp.maximum(r, 0)
        s = wealth / (jnp.sqrt(v) + eps)
        new_scale = jnp.sum(s)
        change = new_scale - total_scale

        @no_type_check
        def step(g, delta, u):
            if u is None:
                return None, delta
            update = change * delta + new_scale * u
            return cast_to(update, g.dtype), cast_to(delta + u, delta.dtype)

        # The state tree comes first: where an update is None, it is kept.
        new_updates, delta = leafwise(step, updates, state.delta, base_updates, n_out=2)
        return new_updates, MechanicState(
            base_optimizer_state=base_state,
            count=safe_int32_increment(state.count),
            r=r.astype(dtype),
            m=m.astype(dtype),
            v=v.astype(dtype),
            s=jnp.asarray(s, dtype),
            delta=delta,
        )


@checked
def mechanize(
    base_optimizer: Any,
    weight_decay: ScalarLike = 0.01,
    eps: ScalarLike = 1e-8,
    s_init: ScalarLike = 1e-6,
    num_betas: int = 6,
) -> Mechanize:
    """Optax spelling of `eqopt.contrib.Mechanize`."""
    return Mechanize(  # pyright: ignore[reportCallIssue] (`inner` is a property)
        base_optimizer=base_optimizer,
        weight_decay=weight_decay,
        eps=eps,
        s_init=s_init,
        num_betas=num_betas,
    )
