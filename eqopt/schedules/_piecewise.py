"""Piecewise schedules (constant and interpolated) and the one-cycle policies."""

import math
from typing import Literal

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Real

from .._hyper import Scalar, as_scalar, check_hyperparameter
from .._typecheck import checked
from ._base import (
    AbstractSchedule,
    _as_static_ints,
    as_static_int,
    broadcast_to_count,
)


def _as_scales(scales) -> tuple:
    return tuple(as_scalar(scale) for scale in scales)


def _split(boundaries_and_scales) -> tuple[tuple, tuple]:
    # Optax's `{step: scale}` dictionary, sorted by step.
    if not boundaries_and_scales:
        return (), ()
    boundaries, scales = zip(*sorted(boundaries_and_scales.items()), strict=True)
    return boundaries, scales


def _check_boundaries_and_scales(schedule) -> None:
    if len(schedule.boundaries) != len(schedule.scales):
        raise ValueError(
            f"`boundaries` and `scales` must have the same length, got "
            f"{len(schedule.boundaries)} and {len(schedule.scales)}."
        )
    if any(
        b >= c
        for b, c in zip(schedule.boundaries, schedule.boundaries[1:], strict=False)
    ):
        raise ValueError(
            f"`boundaries` must be strictly increasing, got {schedule.boundaries}."
        )
    for index, scale in enumerate(schedule.scales):
        # Negative scales are an error in Optax too.
        check_hyperparameter(f"scales[{index}]", scale, low=0)


@checked
class PiecewiseConstantSchedule(AbstractSchedule):
    r"""A constant value, multiplied by a scale factor at each boundary.

    With $I$ = `init_value`, boundaries $b_i$ and scales $s_i$:

    $$ \eta_t = I \prod_{i\,:\,b_i \le t} s_i $$

    **Arguments:**

    - `init_value`: the value $I$ before the first boundary.
    - `boundaries`: strictly increasing integer steps $b_i$ (static).
    - `scales`: the non-negative factors $s_i$, one per boundary, each applied
        from step $b_i$ on (dynamic leaves).

    `eqopt.schedules.piecewise_constant_schedule` builds this from Optax's
    `{step: scale}` dictionary.
    """

    init_value: Scalar = eqx.field(converter=as_scalar)
    boundaries: tuple[int, ...] = eqx.field(
        static=True, converter=_as_static_ints, default=()
    )
    scales: tuple[Float[Array, ""], ...] = eqx.field(converter=_as_scales, default=())

    def __check_init__(self):
        _check_boundaries_and_scales(self)

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        value = self.init_value
        for boundary, scale in zip(self.boundaries, self.scales, strict=True):
            # 1 strictly before the boundary, 0 from it on.
            before = jnp.maximum(jnp.sign(boundary - count), 0.0)
            value = value * (before + (1 - before) * scale)
        return broadcast_to_count(value, count)


@checked
def piecewise_constant_schedule(
    init_value: Real[ArrayLike, ""],
    boundaries_and_scales: dict[int, Real[ArrayLike, ""]] | None = None,
) -> PiecewiseConstantSchedule:
    """A constant value scaled at given steps (Optax's spelling).

    Builds a `eqopt.schedules.PiecewiseConstantSchedule` from Optax's arguments.

    **Arguments:**

    - `init_value`: the value before the first boundary.
    - `boundaries_and_scales`: a dictionary `{step: scale}`; from each `step` on,
        the value is multiplied by `scale` (non-negative). `None` gives a
        constant schedule.

    **Returns:**

    A `eqopt.schedules.PiecewiseConstantSchedule`.
    """
    boundaries, scales = _split(boundaries_and_scales)
    return PiecewiseConstantSchedule(
        init_value=init_value, boundaries=boundaries, scales=scales
    )


def _interpolate_linear(start, end, fraction):
    return (end - start) * fraction + start


def _interpolate_cosine(start, end, fraction):
    return end + (start - end) / 2.0 * (jnp.cos(jnp.pi * fraction) + 1)


def _piecewise_interpolate(interpolate_type, init_value, boundaries, scales, count):
    interpolate = {"linear": _interpolate_linear, "cosine": _interpolate_cosine}[
        interpolate_type
    ]
    # The value at each boundary: the scales accumulate.
    values = [init_value]
    for scale in scales:
        values.append(values[-1] * scale)
    points = (0, *boundaries)
    # Zero before step 0 (as in Optax), the last value from the last boundary on.
    # The boundaries are static, so each piece is selected with `where`, and an
    # array of counts gets an array of values.
    # Steps are int32 arrays and the zero a float array, not Python numbers: the
    # result is strongly typed, as in Optax.
    zero = jnp.zeros((), jnp.result_type(float))
    result = jnp.where(points[-1] <= count, values[-1], zero)
    for start, end, start_value, end_value in zip(
        points[:-1], points[1:], values[:-1], values[1:], strict=True
    ):
        start_step = jnp.asarray(start, jnp.int32)
        length = jnp.asarray(max(end - start, 1), jnp.int32)
        fraction = (count - start_step) / length
        piece = interpolate(start_value, end_value, fraction)
        result = jnp.where((start <= count) & (count < end), piece, result)
    return broadcast_to_count(result, count)


@checked
class PiecewiseInterpolateSchedule(AbstractSchedule):
    r"""Interpolates, linearly or along a cosine, between values scaled at boundaries.

    The values at the boundaries are $v_0 = I$ (`init_value`) at step $b_0 = 0$
    and $v_i = v_{i-1} s_i$ at step $b_i$: the scales accumulate. Between two
    boundaries, with $f = (t - b_{i-1}) / \max(b_i - b_{i-1}, 1)$,

    $$
    \eta_t = \begin{cases}
        v_{i-1} + (v_i - v_{i-1})\, f & \text{linear} \\
        v_i + \tfrac{1}{2}(v_{i-1} - v_i)\,(1 + \cos \pi f) & \text{cosine}
    \end{cases}
    \qquad b_{i-1} \le t < b_i,
    $$

    and $\eta_t = v_n$ from the last boundary on. As in Optax, the value is $0$ for
    negative $t$.

    **Arguments:**

    - `interpolate_type`: `"linear"` or `"cosine"` (static).
    - `init_value`: the value $I$ at step 0.
    - `boundaries`: strictly increasing integer steps $b_i$ (static).
    - `scales`: the non-negative factors $s_i$, one per boundary (dynamic leaves).

    `eqopt.schedules.piecewise_interpolate_schedule` builds this from Optax's
    `{step: scale}` dictionary.
    """

    interpolate_type: Literal["linear", "cosine"] = eqx.field(static=True)
    init_value: Scalar = eqx.field(converter=as_scalar)
    boundaries: tuple[int, ...] = eqx.field(
        static=True, converter=_as_static_ints, default=()
    )
    scales: tuple[Float[Array, ""], ...] = eqx.field(converter=_as_scales, default=())

    def __check_init__(self):
        if self.interpolate_type not in ("linear", "cosine"):
            raise ValueError(
                "`interpolate_type` must be 'linear' or 'cosine', got "
                f"{self.interpolate_type!r}."
            )
        _check_boundaries_and_scales(self)

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        return _piecewise_interpolate(
            self.interpolate_type, self.init_value, self.boundaries, self.scales, count
        )


@checked
def piecewise_interpolate_schedule(
    interpolate_type: Literal["linear", "cosine"],
    init_value: Real[ArrayLike, ""],
    boundaries_and_scales: dict[int, Real[ArrayLike, ""]] | None = None,
) -> PiecewiseInterpolateSchedule:
    """Interpolation between values scaled at given steps (Optax's spelling).

    Builds a `eqopt.schedules.PiecewiseInterpolateSchedule` from Optax's
    arguments.

    **Arguments:**

    - `interpolate_type`: `"linear"` or `"cosine"`.
    - `init_value`: the value at step 0.
    - `boundaries_and_scales`: a dictionary `{step: scale}`; the value reached at
        `step` is the previous boundary's value times `scale` (non-negative).

    **Returns:**

    A `eqopt.schedules.PiecewiseInterpolateSchedule`.
    """
    if interpolate_type not in ("linear", "cosine"):
        raise ValueError(
            f"`interpolate_type` must be 'linear' or 'cosine', got {interpolate_type!r}."
        )
    boundaries, scales = _split(boundaries_and_scales)
    return PiecewiseInterpolateSchedule(
        interpolate_type=interpolate_type,
        init_value=init_value,
        boundaries=boundaries,
        scales=scales,
    )


def _check_onecycle(schedule, *names: str) -> None:
    if not schedule.transition_steps > 0:
        raise ValueError(
            f"`transition_steps` must be positive, got {schedule.transition_steps}."
        )
    for fraction in ("pct_start", "pct_final"):
        value = getattr(schedule, fraction, 0.0)
        if not math.isfinite(value):
            raise ValueError(f"`{fraction}` must be finite, got {value}.")
    for name in names:
        check_hyperparameter(name, getattr(schedule, name), low=0, low_inclusive=False)


@checked
class CosineOnecycleSchedule(AbstractSchedule):
    r"""The one-cycle policy: a cosine rise to `peak_value`, then a cosine fall.

    With $P$ = `peak_value`, $T$ = `transition_steps`, $d$ = `div_factor` and
    $D$ = `final_div_factor`, the value starts at $P / d$, rises to $P$ at step
    $\lfloor p_\text{start} T \rfloor$ and falls to $P / (d D)$ at step $T$, each
    half along a cosine (a `eqopt.schedules.PiecewiseInterpolateSchedule` of
    type `"cosine"` through these three points):

    $$
    \eta_t = v_{i} + \tfrac{1}{2}(v_{i-1} - v_{i})\left(1 + \cos \pi \frac{t - b_{i-1}}{b_i - b_{i-1}}\right),
    \quad (b, v) \in \{(0, \tfrac{P}{d}),\ (\lfloor p_\text{start} T \rfloor, P),\ (T, \tfrac{P}{d D})\}
    $$

    **Arguments:**

    - `transition_steps`: the length $T$ of the cycle (static, positive).
    - `peak_value`: the largest value $P$.
    - `pct_start`: the fraction $p_\text{start}$ of the cycle spent rising
        (static: it sets a boundary).
    - `div_factor`: the initial value is `peak_value / div_factor` (positive).
    - `final_div_factor`: the final value is `peak_value / (div_factor *
        final_div_factor)` (positive).

    **References:**

    Smith & Topin, *Super-Convergence: Very Fast Training of Neural Networks
    Using Large Learning Rates*, 2017,
    [arXiv:1708.07120](https://arxiv.org/abs/1708.07120).
    """

    transition_steps: int = eqx.field(static=True, converter=as_static_int)
    peak_value: Scalar = eqx.field(converter=as_scalar)
    pct_start: float | int = eqx.field(static=True, default=0.3)
    div_factor: Scalar = eqx.field(default=25.0, converter=as_scalar)
    final_div_factor: Scalar = eqx.field(default=1e4, converter=as_scalar)

    def __check_init__(self):
        _check_onecycle(self, "div_factor", "final_div_factor")

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        # A dictionary, so that coinciding boundaries collapse as in Optax.
        boundaries_and_scales = {
            int(self.pct_start * self.transition_steps): self.div_factor,
            int(self.transition_steps): 1.0 / (self.div_factor * self.final_div_factor),
        }
        boundaries, scales = _split(boundaries_and_scales)
        return _piecewise_interpolate(
            "cosine", self.peak_value / self.div_factor, boundaries, scales, count
        )


@checked
def cosine_onecycle_schedule(
    transition_steps: int,
    peak_value: Real[ArrayLike, ""],
    pct_start: float | int = 0.3,
    div_factor: Real[ArrayLike, ""] = 25.0,
    final_div_factor: Real[ArrayLike, ""] = 1e4,
) -> CosineOnecycleSchedule:
    """The one-cycle policy with cosine phases (Optax's spelling).

    Builds a `eqopt.schedules.CosineOnecycleSchedule`; the arguments, their
    names and defaults are Optax's, and the class documents them.

    **Returns:**

    A `eqopt.schedules.CosineOnecycleSchedule`.
    """
    return CosineOnecycleSchedule(
        transition_steps=transition_steps,
        peak_value=peak_value,
        pct_start=pct_start,
        div_factor=div_factor,
        final_div_factor=final_div_factor,
    )


@checked
class LinearOnecycleSchedule(AbstractSchedule):
    r"""The one-cycle policy with three linear phases.

    With $P$ = `peak_value`, $T$ = `transition_steps`, $d$ = `div_factor` and
    $D$ = `final_div_factor`, a `eqopt.schedules.PiecewiseInterpolateSchedule`
    of type `"linear"` through the points

    $$
    (0, \tfrac{P}{d}),\quad (\lfloor p_\text{start} T \rfloor, P),\quad
    (\lfloor p_\text{final} T \rfloor, \tfrac{P}{d}),\quad (T, \tfrac{P}{d D})
    $$

    rises linearly from $P/d$ to $P$, falls back to $P/d$, then anneals to
    $P/(dD)$, and stays there.

    **Arguments:**

    - `transition_steps`: the length $T$ of the cycle (static, positive).
    - `peak_value`: the largest value $P$.
    - `pct_start`: the fraction $p_\text{start}$ of the cycle spent rising (static).
    - `pct_final`: the fraction $p_\text{final}$ of the cycle at which the fall
        back to `peak_value / div_factor` ends (static).
    - `div_factor`: the initial value is `peak_value / div_factor` (positive).
    - `final_div_factor`: the final value is `peak_value / (div_factor *
        final_div_factor)` (positive).

    **References:**

    Smith & Topin, *Super-Convergence: Very Fast Training of Neural Networks
    Using Large Learning Rates*, 2017,
    [arXiv:1708.07120](https://arxiv.org/abs/1708.07120).
    """

    transition_steps: int = eqx.field(static=True, converter=as_static_int)
    peak_value: Scalar = eqx.field(converter=as_scalar)
    pct_start: float | int = eqx.field(static=True, default=0.3)
    pct_final: float | int = eqx.field(static=True, default=0.85)
    div_factor: Scalar = eqx.field(default=25.0, converter=as_scalar)
    final_div_factor: Scalar = eqx.field(default=1e4, converter=as_scalar)

    def __check_init__(self):
        _check_onecycle(self, "div_factor", "final_div_factor")

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        boundaries_and_scales = {
            int(self.pct_start * self.transition_steps): self.div_factor,
            int(self.pct_final * self.transition_steps): 1.0 / self.div_factor,
            int(self.transition_steps): 1.0 / self.final_div_factor,
        }
        boundaries, scales = _split(boundaries_and_scales)
        return _piecewise_interpolate(
            "linear", self.peak_value / self.div_factor, boundaries, scales, count
        )


@checked
def linear_onecycle_schedule(
    transition_steps: int,
    peak_value: Real[ArrayLike, ""],
    pct_start: float | int = 0.3,
    pct_final: float | int = 0.85,
    div_factor: Real[ArrayLike, ""] = 25.0,
    final_div_factor: Real[ArrayLike, ""] = 1e4,
) -> LinearOnecycleSchedule:
    """The one-cycle policy with linear phases (Optax's spelling).

    Builds a `eqopt.schedules.LinearOnecycleSchedule`; the arguments, their
    names and defaults are Optax's, and the class documents them.

    **Returns:**

    A `eqopt.schedules.LinearOnecycleSchedule`.
    """
    return LinearOnecycleSchedule(
        transition_steps=transition_steps,
        peak_value=peak_value,
        pct_start=pct_start,
        pct_final=pct_final,
        div_factor=div_factor,
        final_div_factor=final_div_factor,
    )
