"""Schedules: `equinox.Module`s mapping a step count to a hyperparameter value.

Every Optax schedule exists here as a final CamelCase class (the canonical form)
and under its Optax lowercase name, a function with Optax's arguments and
defaults returning that class.
"""

# Optax's `optax.schedules` also holds the injection wrappers.
from .._wrappers.inject import (  # noqa: E402
    InjectHyperparamsState as InjectHyperparamsState,
    InjectStatefulHyperparamsState as InjectStatefulHyperparamsState,
    inject_hyperparams as inject_hyperparams,
    inject_stateful_hyperparams as inject_stateful_hyperparams,
)
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
    WrappedSchedule as WrappedSchedule,
)
