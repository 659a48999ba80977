"""Cosine decay, warmup-cosine decay and SGDR (warm restarts)."""

from collections.abc import Iterable
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Real

from .._hyper import Scalar, as_scalar
from .._typecheck import checked
from ._base import AbstractSchedule, as_static_int
from ._basic import _linear
from ._join import JoinSchedules


def _cosine_decay(init_value, decay_steps, alpha, exponent, count):
    # Python integers are made floats before meeting JAX values, as Optax does;
    # this decides the dtype (weak or not) of the result.
    if isinstance(decay_steps, int):
        decay_steps = float(decay_steps)
    if isinstance(count, int):
        count = float(count)
    progress = jnp.minimum(count, decay_steps)
    cosine = 0.5 * (1 + jnp.cos(jnp.pi * progress / decay_steps))
    return init_value * ((1 - alpha) * cosine**exponent + alpha)


def _check_positive_steps(name: str, value) -> None:
    if not value > 0:
        raise ValueError(f"`{name}` must be positive, got {value}.")


@checked
class CosineDecaySchedule(AbstractSchedule):
    r"""Cosine decay of `init_value` over `decay_steps` steps.

    With $I$ = `init_value`, $T$ = `decay_steps`, $\alpha$ = `alpha` and
    $p$ = `exponent`:

    $$
    \eta_t = I\left((1 - \alpha)\left[\tfrac{1}{2}\left(1 + \cos\frac{\pi \min(t, T)}{T}\right)\right]^{p} + \alpha\right)
    $$

    The value goes from $I$ at step 0 to $\alpha I$ at step $T$ and stays there.

    **Arguments:**

    - `init_value`: the value $I$ at step 0.
    - `decay_steps`: the length $T$ of the decay (static, positive).
    - `alpha`: the final value as a fraction of `init_value`.
    - `exponent`: the power $p$ applied to the cosine factor.

    **References:**

    Loshchilov & Hutter, *SGDR: Stochastic Gradient Descent with Warm Restarts*,
    ICLR 2017, [arXiv:1608.03983](https://arxiv.org/abs/1608.03983).
    """

    init_value: Scalar = eqx.field(converter=as_scalar)
    decay_steps: int = eqx.field(static=True, converter=as_static_int)
    alpha: Scalar = eqx.field(default=0.0, converter=as_scalar)
    exponent: Scalar = eqx.field(default=1.0, converter=as_scalar)

    def __check_init__(self):
        _check_positive_steps("decay_steps", self.decay_steps)

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        return jnp.asarray(
            _cosine_decay(
                self.init_value, self.decay_steps, self.alpha, self.exponent, count
            )
        )


@checked
def cosine_decay_schedule(
    init_value: Real[ArrayLike, ""],
    decay_steps: int,
    alpha: Real[ArrayLike, ""] = 0.0,
    exponent: Real[ArrayLike, ""] = 1.0,
) -> CosineDecaySchedule:
    """Cosine decay of `init_value` over `decay_steps` steps (Optax's spelling).

    Builds a `eqopt.schedules.CosineDecaySchedule`; the arguments, their names
    and defaults are Optax's, and the class documents them.

    **Returns:**

    A `eqopt.schedules.CosineDecaySchedule`.
    """
    return CosineDecaySchedule(
        init_value=init_value, decay_steps=decay_steps, alpha=alpha, exponent=exponent
    )


@checked
class WarmupCosineDecaySchedule(AbstractSchedule):
    r"""A linear warmup from `init_value` to `peak_value`, then cosine decay to `end_value`.

    With $I$ = `init_value`, $P$ = `peak_value`, $E$ = `end_value`,
    $W$ = `warmup_steps`, $T$ = `decay_steps` (the total length, warmup
    included) and $p$ = `exponent`:

    $$
    \eta_t = \begin{cases}
        I + (P - I)\,\frac{\max(t, 0)}{W} & t < W \\
        E + (P - E)\left[\tfrac{1}{2}\left(1 + \cos\frac{\pi \min(t - W,\ T - W)}{T - W}\right)\right]^{p} & t \ge W
    \end{cases}
    $$

    computed, as in Optax, as a `eqopt.schedules.LinearSchedule` joined at
    step $W$ with a `eqopt.schedules.CosineDecaySchedule` of initial value
    $P$ and $\alpha = E / P$ ($\alpha = 0$ when $P = 0$).

    **Arguments:**

    - `init_value`: the value $I$ at step 0.
    - `peak_value`: the value $P$ at the end of the warmup.
    - `warmup_steps`: the length $W$ of the warmup (static).
    - `decay_steps`: the total length $T$ of the schedule, warmup included
        (static); the cosine decay lasts $T - W > 0$ steps.
    - `end_value`: the value $E$ at step $T$ and after.
    - `exponent`: the power $p$ applied to the cosine factor.

    **References:**

    Loshchilov & Hutter, *SGDR: Stochastic Gradient Descent with Warm Restarts*,
    ICLR 2017, [arXiv:1608.03983](https://arxiv.org/abs/1608.03983) (cosine
    decay); Goyal et al., *Accurate, Large Minibatch SGD: Training ImageNet in
    1 Hour*, 2017, [arXiv:1706.02677](https://arxiv.org/abs/1706.02677) (warmup).
    """

    init_value: Scalar = eqx.field(converter=as_scalar)
    peak_value: Scalar = eqx.field(converter=as_scalar)
    warmup_steps: int = eqx.field(static=True, converter=as_static_int)
    decay_steps: int = eqx.field(static=True, converter=as_static_int)
    end_value: Scalar = eqx.field(default=0.0, converter=as_scalar)
    exponent: Scalar = eqx.field(default=1.0, converter=as_scalar)

    def __check_init__(self):
        if not self.decay_steps - self.warmup_steps > 0:
            raise ValueError(
                "`decay_steps` counts the warmup and must be greater than "
                f"`warmup_steps`, got decay_steps={self.decay_steps} and "
                f"warmup_steps={self.warmup_steps}."
            )

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        peak = self.peak_value
        is_zero_peak = peak == 0
        alpha = jnp.where(
            is_zero_peak, 0.0, self.end_value / jnp.where(is_zero_peak, 1, peak)
        )
        warmup = _linear(self.init_value, peak, self.warmup_steps, 0, count)
        decay = _cosine_decay(
            peak,
            self.decay_steps - self.warmup_steps,
            alpha,
            self.exponent,
            count - self.warmup_steps,
        )
        return jnp.where(jnp.asarray(count) < self.warmup_steps, warmup, decay)


@checked
def warmup_cosine_decay_schedule(
    init_value: Real[ArrayLike, ""],
    peak_value: Real[ArrayLike, ""],
    warmup_steps: int,
    decay_steps: int,
    end_value: Real[ArrayLike, ""] = 0.0,
    exponent: Real[ArrayLike, ""] = 1.0,
) -> WarmupCosineDecaySchedule:
    """A linear warmup, then cosine decay to `end_value` (Optax's spelling).

    Builds a `eqopt.schedules.WarmupCosineDecaySchedule`; the arguments, their
    names and defaults are Optax's, and the class documents them.

    **Returns:**

    A `eqopt.schedules.WarmupCosineDecaySchedule`.
    """
    return WarmupCosineDecaySchedule(
        init_value=init_value,
        peak_value=peak_value,
        warmup_steps=warmup_steps,
        decay_steps=decay_steps,
        end_value=end_value,
        exponent=exponent,
    )


@checked
def sgdr_schedule(cosine_kwargs: Iterable[dict[str, Any]]) -> JoinSchedules:
    r"""Stochastic gradient descent with warm restarts: cosine cycles one after another.

    Each element of `cosine_kwargs` holds the arguments of one
    `eqopt.schedules.WarmupCosineDecaySchedule` cycle (`init_value`,
    `peak_value`, `warmup_steps`, `decay_steps`, and optionally `end_value`,
    `exponent`); cycle $k$ starts where cycle $k - 1$ ends, after its
    `decay_steps` steps, and restarts from its own warmup.

    **Arguments:**

    - `cosine_kwargs`: an iterable of keyword-argument dictionaries, one per cycle.

    **Returns:**

    A `eqopt.schedules.JoinSchedules` of
    `eqopt.schedules.WarmupCosineDecaySchedule`s, with boundaries at the
    cumulative cycle lengths.

    **References:**

    Loshchilov & Hutter, *SGDR: Stochastic Gradient Descent with Warm Restarts*,
    ICLR 2017, [arXiv:1608.03983](https://arxiv.org/abs/1608.03983).
    """
    schedules = []
    boundaries = []
    start = 0
    for kwargs in cosine_kwargs:
        schedules.append(WarmupCosineDecaySchedule(**kwargs))
        start += kwargs["decay_steps"]
        boundaries.append(start)
    return JoinSchedules(schedules=schedules, boundaries=boundaries[:-1])
