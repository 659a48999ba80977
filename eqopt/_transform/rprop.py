"""Rprop: per-element step sizes adapted from the sign of successive gradients."""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp

from .._base import AbstractGradientTransformation, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._hyper import Scalar, ScalarLike, as_scalar, check_hyperparameter
from .._leafwise import leafwise, zeros_like_trainable
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._layerwise import check_real, map_trainable
from .basic import Scale


@checked
class ScaleByRpropState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByRprop`: each element's step size and last step.

    `prev_updates` holds the last step $\\operatorname{sign}(g)\\,\\Delta$ (zero
    after a sign change), whose sign stands for the previous gradient's.
    """

    step_sizes: Updates
    prev_updates: Updates


@checked
class ScaleByRprop(AbstractGradientTransformation):
    r"""Steps by the sign of the gradient, with a step size per element.

    Each element's step size grows while its gradient keeps its sign and shrinks
    when the sign changes (the last step jumped over a minimum); after a change
    the element pauses for one step (the iRprop$^-$ variant, as in PyTorch):

    $$
    \begin{aligned}
    s_t &= g_t \cdot \operatorname{sign}(u_{t-1}) \\
    \Delta_t &= \begin{cases}
        \operatorname{clip}(\eta^+ \Delta_{t-1}, \Delta_{\min}, \Delta_{\max}) & s_t > 0 \\
        \operatorname{clip}(\eta^- \Delta_{t-1}, \Delta_{\min}, \Delta_{\max}) & s_t < 0 \\
        \Delta_{t-1} & s_t = 0
    \end{cases} \\
    u_t &= \begin{cases} 0 & s_t < 0 \\ \operatorname{sign}(g_t)\, \Delta_t & \text{otherwise} \end{cases}
    \end{aligned}
    $$

    with $\Delta_0$ the `learning_rate` and $u_0 = 0$. The output points up the
    gradient: `eqopt.rprop` negates it. Parameters must be real.

    !!! note "Differs from Optax"
        Optax 0.2.8 computes the same $u_t$ and keeps it in its state, but
        returns $u_{t-1}$ (zeroed where $s_t < 0$): its updates lag one step
        behind and its first update is zero (see optax pull request #1725).
        eqopt returns $u_t$. The states of the two agree at every step.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `learning_rate`: $\Delta_0$, the initial step size (read by `init`).
    - `eta_minus`: $\eta^- \in (0, 1)$, the factor after a sign change.
    - `eta_plus`: $\eta^+ > 1$, the factor while the sign holds.
    - `min_step_size`, `max_step_size`: $\Delta_{\min}, \Delta_{\max}$.

    **References:** Riedmiller & Braun, *A Direct Adaptive Method for Faster
    Backpropagation Learning: The RPROP Algorithm*, IEEE ICNN 1993; Igel &
    Hüsken, *Improving the Rprop Learning Algorithm*, NC 2000 (iRprop$^-$).
    """

    learning_rate: Scalar = eqx.field(converter=as_scalar)
    eta_minus: Scalar = eqx.field(default=0.5, converter=as_scalar)
    eta_plus: Scalar = eqx.field(default=1.2, converter=as_scalar)
    min_step_size: Scalar = eqx.field(default=1e-6, converter=as_scalar)
    max_step_size: Scalar = eqx.field(default=50.0, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_hyperparameter("learning_rate", self.learning_rate, low=0.0)
        check_hyperparameter("eta_minus", self.eta_minus, low=0.0)
        check_hyperparameter("eta_plus", self.eta_plus, low=0.0)
        check_hyperparameter("min_step_size", self.min_step_size, low=0.0)
        check_hyperparameter("max_step_size", self.max_step_size, low=0.0)

    @init_entry
    def init(self, params: Params) -> ScaleByRpropState:
        # The sign of a complex number is a phase: successive signs do not
        # simply agree or disagree.
        check_real(params, "scale_by_rprop")
        learning_rate = self.learning_rate
        return ScaleByRpropState(
            step_sizes=map_trainable(lambda p: jnp.full_like(p, learning_rate), params),
            prev_updates=zeros_like_trainable(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByRpropState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByRpropState]:
        eta_minus, eta_plus = self.eta_minus, self.eta_plus
        low, high = self.min_step_size, self.max_step_size

        @no_type_check
        def step(g, step_size, previous):
            agreement = jnp.sign(g) * jnp.sign(previous)
            factor = jnp.where(agreement > 0, eta_plus, eta_minus)
            step_size = jnp.where(
                agreement == 0, step_size, jnp.clip(step_size * factor, low, high)
            )
            update = jnp.where(agreement < 0, 0, jnp.sign(g) * step_size)
            return update, step_size.astype(g.dtype), update.astype(g.dtype)

        updates, step_sizes, prev_updates = leafwise(
            step, updates, state.step_sizes, state.prev_updates, n_out=3
        )
        return updates, ScaleByRpropState(
            step_sizes=step_sizes, prev_updates=prev_updates
        )


@checked
def scale_by_rprop(
    learning_rate: ScalarLike,
    eta_minus: ScalarLike = 0.5,
    eta_plus: ScalarLike = 1.2,
    min_step_size: ScalarLike = 1e-6,
    max_step_size: ScalarLike = 50.0,
) -> ScaleByRprop:
    """Optax spelling of `eqopt.ScaleByRprop`."""
    return ScaleByRprop(
        learning_rate=learning_rate,
        eta_minus=eta_minus,
        eta_plus=eta_plus,
        min_step_size=min_step_size,
        max_step_size=max_step_size,
    )


@checked
def rprop(
    learning_rate: ScalarLike,
    eta_minus: ScalarLike = 0.5,
    eta_plus: ScalarLike = 1.2,
    min_step_size: ScalarLike = 1e-6,
    max_step_size: ScalarLike = 50.0,
) -> Chain:
    r"""Rprop: descends by a per-element step size adapted to the gradient's sign.

    $$ u_t = -\operatorname{sign}(g_t)\, \Delta_t $$

    (zero for one step after a sign change), with $\Delta_t$ as in
    `eqopt.ScaleByRprop`. Only the sign of the gradient is used, so Rprop
    suits full-batch training. The chain is `eqopt.ScaleByRprop`, then
    `eqopt.Scale` by $-1$. Unlike Optax 0.2.8, the updates do not lag one
    step behind (see `eqopt.ScaleByRprop`).

    **Arguments:** as `eqopt.ScaleByRprop`; `learning_rate` is the initial
    step size.

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        # Rprop adapts a step per parameter from gradient signs: for full batches.
        opt = eqopt.rprop(learning_rate=1e-3)
        state = opt.init(model)
        for _ in range(3):
            grads = eqx.filter_grad(loss_fn)(model, x, y)
            updates, state = opt.update(grads, state, model)
            model = eqopt.apply_updates(model, updates)
        ```

    **References:** Riedmiller & Braun, *A Direct Adaptive Method for Faster
    Backpropagation Learning: The RPROP Algorithm*, IEEE ICNN 1993.
    """
    return Chain(
        ScaleByRprop(
            learning_rate=learning_rate,
            eta_minus=eta_minus,
            eta_plus=eta_plus,
            min_step_size=min_step_size,
            max_step_size=max_step_size,
        ),
        Scale(step_size=-1.0),
    )
