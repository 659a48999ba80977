r"""Monte Carlo estimators of $\nabla_\theta \mathbb E_{p(x;\theta)} f(x)$ and
control variates for them (the `optax.monte_carlo` of older Optax releases)."""

from ._control_variates import (
    AbstractControlVariate as AbstractControlVariate,
    ControlDeltaMethod as ControlDeltaMethod,
    MovingAvgBaseline as MovingAvgBaseline,
    control_delta_method as control_delta_method,
    control_variates_jacobians as control_variates_jacobians,
    estimate_control_variate_coefficients as estimate_control_variate_coefficients,
    moving_avg_baseline as moving_avg_baseline,
)
from ._distributions import (
    MultiNormalDiagFromLogScale as MultiNormalDiagFromLogScale,
    multi_normal as multi_normal,
)
from ._estimators import (
    measure_valued_estimation_mean as measure_valued_estimation_mean,
    measure_valued_estimation_std as measure_valued_estimation_std,
    measure_valued_jacobians as measure_valued_jacobians,
    pathwise_jacobians as pathwise_jacobians,
    score_function_jacobians as score_function_jacobians,
)
