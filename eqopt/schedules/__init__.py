"""Schedules: `equinox.Module`s mapping a step count to a hyperparameter value.

Every Optax schedule exists here as a final CamelCase class (the canonical form)
and under its Optax lowercase name, a function with Optax's arguments and
defaults returning that class.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from .._hyper import Schedule as Schedule
from ._base import (
    AbstractSchedule as AbstractSchedule,
    ConstantSchedule as ConstantSchedule,
    FunctionSchedule as FunctionSchedule,
    as_schedule as as_schedule,
    constant_schedule as constant_schedule,
)
from ._basic import (
    LinearSchedule as LinearSchedule,
    PolynomialSchedule as PolynomialSchedule,
    WarmupConstantSchedule as WarmupConstantSchedule,
    linear_schedule as linear_schedule,
    polynomial_schedule as polynomial_schedule,
    warmup_constant_schedule as warmup_constant_schedule,
)
from ._cosine import (
    CosineDecaySchedule as CosineDecaySchedule,
    WarmupCosineDecaySchedule as WarmupCosineDecaySchedule,
    cosine_decay_schedule as cosine_decay_schedule,
    sgdr_schedule as sgdr_schedule,
    warmup_cosine_decay_schedule as warmup_cosine_decay_schedule,
)
from ._exponential import (
    ExponentialDecaySchedule as ExponentialDecaySchedule,
    WarmupExponentialDecaySchedule as WarmupExponentialDecaySchedule,
    exponential_decay as exponential_decay,
    warmup_exponential_decay_schedule as warmup_exponential_decay_schedule,
)
from ._join import JoinSchedules as JoinSchedules, join_schedules as join_schedules
from ._piecewise import (
    CosineOnecycleSchedule as CosineOnecycleSchedule,
    LinearOnecycleSchedule as LinearOnecycleSchedule,
    PiecewiseConstantSchedule as PiecewiseConstantSchedule,
    PiecewiseInterpolateSchedule as PiecewiseInterpolateSchedule,
    cosine_onecycle_schedule as cosine_onecycle_schedule,
    linear_onecycle_schedule as linear_onecycle_schedule,
    piecewise_constant_schedule as piecewise_constant_schedule,
    piecewise_interpolate_schedule as piecewise_interpolate_schedule,
)
from ._stateful import (
    AbstractStatefulSchedule as AbstractStatefulSchedule,
    AbstractStatefulSchedule as StatefulSchedule,  # noqa: F401 (Optax's name)
    WrappedSchedule as WrappedSchedule,
)

# Optax's `optax.schedules` also holds the injection wrappers. They are wrappers
# (a layer above the schedules, which they use), so this namespace names them
# only for type checkers and loads them on first use (PEP 562): importing
# `eqopt.schedules` never imports `eqopt._wrappers`, which is what lets the
# wrappers import the schedules in any order (docs/development.md, "Layers").
if _TYPE_CHECKING:
    from .._wrappers.inject import (
        InjectHyperparamsState as InjectHyperparamsState,
        InjectStatefulHyperparamsState as InjectStatefulHyperparamsState,
        inject_hyperparams as inject_hyperparams,
        inject_stateful_hyperparams as inject_stateful_hyperparams,
    )

_FROM_WRAPPERS = (
    "InjectHyperparamsState",
    "InjectStatefulHyperparamsState",
    "inject_hyperparams",
    "inject_stateful_hyperparams",
)


def __getattr__(name: str):
    if name in _FROM_WRAPPERS:
        from .._wrappers import inject

        value = globals()[name] = getattr(inject, name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FROM_WRAPPERS))
