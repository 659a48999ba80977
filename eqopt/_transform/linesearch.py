r"""The zoom line search (strong Wolfe conditions) of Nocedal & Wright.

See `eqopt/_transform/_linesearch_common.py` for the protocol all line searches share.
"""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .._base import (
    AbstractGradientTransformation,
    Params,
    Updates,
    is_none,
)
from .._entry import init_entry, update_entry
from .._hyper import (
    IntScalar,
    Scalar,
    ScalarLike,
    as_int_scalar,
    as_optional_scalar,
    as_scalar,
    as_scalar_or_infinity,
    check_hyperparameter,
)
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._linesearch_common import (
    _initial_grad,
    _objective_inputs,
    _real_dtype,
    _run_search,
    _scale,
    _slope,
    _value_and_grad_along,
)

# ---------------------------------------------------------------------------
# Zoom line search (strong Wolfe)
# ---------------------------------------------------------------------------


@checked
class ZoomLinesearchInfo(eqx.Module, OptaxTuple):
    """What the last zoom line search did, for diagnosis.

    - `num_linesearch_steps`: the number of evaluations of the objective.
    - `decrease_error`: how far the chosen step is from sufficient decrease
      (0 when satisfied).
    - `curvature_error`: how far it is from the curvature condition (0 when
      satisfied; a positive value can come from a too small `max_learning_rate`).
    """

    num_linesearch_steps: Int[Array, ""]
    decrease_error: Float[Array, ""]
    curvature_error: Float[Array, ""]


@checked
class ScaleByZoomLinesearchState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByZoomLinesearch`.

    - `learning_rate`: the step size chosen by the last search (the next
      guess with `initial_guess_strategy="keep"`).
    - `value`, `grad`: the objective and its gradient at the chosen step, i.e.
      at the new params; `eqopt.value_and_grad_from_state` reuses them.
      `value` is $+\\infty$ before the first step.
    - `info`: a `eqopt.ZoomLinesearchInfo`.
    """

    learning_rate: Float[Array, ""]
    value: Float[Array, ""]
    grad: Updates
    info: ZoomLinesearchInfo


class _ZoomSearch(eqx.Module):
    """The loop state of one zoom line search (private)."""

    count: Int[Array, ""]
    # The last step tried, its value, gradient and slope, and its errors.
    stepsize: Float[Array, ""]
    value: Float[Array, ""]
    grad: Any
    slope: Float[Array, ""]
    decrease_error: Float[Array, ""]
    curvature_error: Float[Array, ""]
    succeeded: Bool[Array, ""]
    done: Bool[Array, ""]
    # The bracket [low, high] (unordered) once found, and the previous end
    # point used for cubic interpolation.
    interval_found: Bool[Array, ""]
    low: Float[Array, ""]
    value_low: Float[Array, ""]
    slope_low: Float[Array, ""]
    high: Float[Array, ""]
    value_high: Float[Array, ""]
    slope_high: Float[Array, ""]
    has_cubic_ref: Bool[Array, ""]
    cubic_ref: Float[Array, ""]
    value_cubic_ref: Float[Array, ""]
    # The best step with sufficient decrease seen so far, if any (step > 0).
    safe_stepsize: Float[Array, ""]
    safe_value: Float[Array, ""]
    safe_grad: Any
    safe_slope: Float[Array, ""]


@no_type_check
def _cubic_minimiser(a, value_a, slope_a, b, value_b, c, value_c):
    """The minimiser of the cubic through $(a, f_a, f'_a)$, $(b, f_b)$, $(c, f_c)$.

    Nocedal & Wright, eq. (3.59); NaN when there is none.
    """
    db, dc = b - a, c - a
    denominator = (db * dc) ** 2 * (db - dc)
    rb = value_b - value_a - slope_a * db
    rc = value_c - value_a - slope_a * dc
    cubic = (dc**2 * rb - db**2 * rc) / denominator
    quadratic = (-(dc**3) * rb + db**3 * rc) / denominator
    radical = quadratic**2 - 3 * cubic * slope_a
    return a + (-quadratic + jnp.sqrt(radical)) / (3 * cubic)


@no_type_check
def _quadratic_minimiser(a, value_a, slope_a, b, value_b):
    """The minimiser of the quadratic through $(a, f_a, f'_a)$ and $(b, f_b)$ (eq. 3.58)."""
    db = b - a
    curvature = (value_b - value_a - slope_a * db) / (db * db)
    return a - slope_a / (2 * curvature)


@no_type_check
def _inside(x, low, high, margin):
    return jnp.isfinite(x) & (x >= low + margin) & (x <= high - margin)


@no_type_check
def _zoom_trial(s):
    """The next step inside the bracket: cubic, else quadratic, else bisection.

    Interpolants too close to an end of the bracket are refused (within 20% of
    its width for the cubic, 10% for the quadratic), as in Nocedal & Wright §3.5.
    """
    width = s.high - s.low
    left, right = jnp.minimum(s.low, s.high), jnp.maximum(s.low, s.high)
    cubic = _cubic_minimiser(
        s.low,
        s.value_low,
        s.slope_low,
        s.high,
        s.value_high,
        s.cubic_ref,
        s.value_cubic_ref,
    )
    use_cubic = s.has_cubic_ref & _inside(cubic, left, right, 0.2 * jnp.abs(width))
    quadratic = _quadratic_minimiser(
        s.low, s.value_low, s.slope_low, s.high, s.value_high
    )
    use_quadratic = _inside(quadratic, left, right, 0.1 * jnp.abs(width))
    bisection = s.low + 0.5 * width
    return jnp.where(use_cubic, cubic, jnp.where(use_quadratic, quadratic, bisection))


@checked
class ScaleByZoomLinesearch(AbstractGradientTransformation):
    r"""Scales the updates by a step size satisfying the strong Wolfe conditions.

    With $\phi(\eta) = f(w + \eta u)$ along the direction $u$ (the incoming
    updates), a step size $\eta$ is accepted when it gives sufficient decrease
    and small curvature,

    $$
    \phi(\eta) \le \phi(0) + c_1 \eta\, \phi'(0) + \epsilon, \qquad
    |\phi'(\eta)| \le c_2 |\phi'(0)| + \epsilon,
    $$

    and the updates become $\eta\, u$. The search first brackets such a step
    (trying $\eta_0$, then multiplying by `increase_factor`), then shrinks the
    bracket by safeguarded cubic or quadratic interpolation, falling back to
    bisection (Nocedal & Wright, Alg. 3.5 and 3.6). Near a minimum, where
    rounding hides the decrease, sufficient decrease may instead be met by Hager
    and Zhang's approximate Wolfe condition
    $\phi'(\eta) \le (2 c_1 - 1)\, \phi'(0) + \epsilon$, used only while
    $\phi(\eta) \le \phi(0) + c_3 |\phi(0)|$.

    If no step meets both conditions within `max_linesearch_steps` evaluations
    (or the bracket becomes narrower than `stepsize_precision`), the best step
    with sufficient decrease is taken if there is one, else the last step tried;
    `state.info` says how far it is from the conditions.

    `update` needs the extra keyword arguments `value` and `grad` (the objective
    and its gradient at `params`) and `value_fn` (the objective, a function of
    the whole params); other extra arguments that `value_fn` accepts by name are
    passed to it. The state keeps the value and gradient at the new params, for
    `eqopt.value_and_grad_from_state`.

    **Global**: one step size over all the leaves, a stacked layer's slices included.

    **Arguments:**

    - `max_linesearch_steps`: the most evaluations of the objective per step.
    - `max_learning_rate`: the largest step size, or `None` for no bound.
    - `tol`: the tolerance $\epsilon$ on both conditions.
    - `increase_factor`: the factor by which the step grows while bracketing.
    - `slope_rtol`: $c_1$, of the sufficient decrease condition.
    - `curv_rtol`: $c_2$, of the curvature condition (`jnp.inf` drops it,
      leaving an interpolating backtracking search).
    - `approx_dec_rtol`: $c_3$, or `None` to use only the Armijo condition.
    - `stepsize_precision`: the bracket width below which the search stops with
      the best step with sufficient decrease found.
    - `initial_guess_strategy`: `"one"` starts each search at $\eta_0 = 1$
      (right for quasi-Newton directions such as L-BFGS), `"keep"` at the last
      step size (right for gradient descent).
    - `verbose`: print a line when a search fails.

    **References:** Nocedal & Wright, *Numerical Optimization*, 2nd ed., 2006,
    Alg. 3.5 and 3.6; Hager & Zhang, *Algorithm 851: CG_DESCENT, a Conjugate
    Gradient Method with Guaranteed Descent*, ACM TOMS 2006.
    """

    max_linesearch_steps: IntScalar = eqx.field(converter=as_int_scalar)
    max_learning_rate: Scalar | None = eqx.field(
        default=None, converter=as_optional_scalar
    )
    tol: Scalar = eqx.field(default=0.0, converter=as_scalar)
    increase_factor: Scalar = eqx.field(default=2.0, converter=as_scalar)
    slope_rtol: Scalar = eqx.field(default=1e-4, converter=as_scalar)
    curv_rtol: Scalar = eqx.field(default=0.9, converter=as_scalar_or_infinity)
    approx_dec_rtol: Scalar | None = eqx.field(
        default=1e-6, converter=as_optional_scalar
    )
    stepsize_precision: Scalar = eqx.field(default=1e-5, converter=as_scalar)
    initial_guess_strategy: str = eqx.field(default="keep", static=True)
    verbose: bool = eqx.field(default=False, static=True)

    @property
    def elementwise(self) -> bool:
        return False

    def __check_init__(self):
        if self.initial_guess_strategy not in ("one", "keep"):
            raise ValueError(
                "ScaleByZoomLinesearch: `initial_guess_strategy` must be 'one' or "
                f"'keep', got {self.initial_guess_strategy!r}."
            )
        check_hyperparameter("max_linesearch_steps", self.max_linesearch_steps, low=1)
        check_hyperparameter(
            "max_learning_rate", self.max_learning_rate, low=0.0, low_inclusive=False
        )
        check_hyperparameter("tol", self.tol, low=0.0)
        check_hyperparameter("increase_factor", self.increase_factor, low=1.0)
        check_hyperparameter("slope_rtol", self.slope_rtol, low=0.0, high=1.0)
        check_hyperparameter("curv_rtol", self.curv_rtol, low=0.0, finite=False)
        check_hyperparameter("approx_dec_rtol", self.approx_dec_rtol, low=0.0)
        check_hyperparameter("stepsize_precision", self.stepsize_precision, low=0.0)

    @init_entry
    def init(self, params: Params) -> ScaleByZoomLinesearchState:
        real = _real_dtype()
        return ScaleByZoomLinesearchState(
            learning_rate=jnp.ones([], real),
            value=jnp.full([], jnp.inf, real),
            grad=_initial_grad(params),
            info=ZoomLinesearchInfo(
                num_linesearch_steps=jnp.zeros([], jnp.int32),
                decrease_error=jnp.full([], jnp.inf, real),
                curvature_error=jnp.full([], jnp.inf, real),
            ),
        )

    @no_type_check
    def _errors(self, stepsize, value, slope, value_init, slope_init):
        decrease_error = value - (value_init + self.slope_rtol * stepsize * slope_init)
        if self.approx_dec_rtol is not None:
            # Hager & Zhang (2006), eq. (23), trusted only close to phi(0).
            approx_error = slope - (2 * self.slope_rtol - 1) * slope_init
            near = value - value_init - self.approx_dec_rtol * jnp.abs(value_init)
            decrease_error = jnp.minimum(
                decrease_error, jnp.maximum(approx_error, near)
            )
        decrease_error = jnp.maximum(decrease_error, 0.0)
        curvature_error = jnp.maximum(
            jnp.abs(slope) - self.curv_rtol * jnp.abs(slope_init), 0.0
        )
        # An infinite curv_rtol times a zero slope is NaN: no condition then.
        curvature_error = jnp.where(jnp.isinf(self.curv_rtol), 0.0, curvature_error)
        return decrease_error.astype(value.dtype), curvature_error.astype(value.dtype)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByZoomLinesearchState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByZoomLinesearchState]:
        value_init, grad, value_fn, fn_kwargs = _objective_inputs(
            "scale_by_zoom_linesearch", updates, params, extra_args
        )
        return _run_search(
            self, updates, state, params, value_init, grad, value_fn, fn_kwargs
        )

    @no_type_check
    def _search(self, updates, state, params, value_init, grad, value_fn, fn_kwargs):
        real = value_init.dtype
        evaluate = _value_and_grad_along(value_fn, fn_kwargs, params, updates, grad)
        slope_init = _slope(grad, updates)
        tol = self.tol
        guess = (
            jnp.ones([], real)
            if self.initial_guess_strategy == "one"
            # (a number a user set with `eqopt.tree.set` is read as well)
            else jnp.asarray(state.learning_rate, real)
        )
        zero, false = jnp.zeros([], real), jnp.zeros([], bool)
        inf = jnp.full([], jnp.inf, real)
        start = _ZoomSearch(
            count=jnp.zeros([], jnp.int32),
            stepsize=zero,
            value=value_init,
            grad=grad,
            slope=slope_init,
            decrease_error=inf,
            curvature_error=inf,
            succeeded=false,
            done=false,
            interval_found=false,
            low=zero,
            value_low=value_init,
            slope_low=slope_init,
            high=zero,
            value_high=value_init,
            slope_high=slope_init,
            has_cubic_ref=false,
            cubic_ref=zero,
            value_cubic_ref=value_init,
            safe_stepsize=zero,
            safe_value=value_init,
            safe_grad=grad,
            safe_slope=slope_init,
        )

        @no_type_check
        def step(s):
            # Bracketing (Alg. 3.5): eta_0, then growing; zooming (Alg. 3.6): interpolate.
            grown = jnp.where(s.count == 0, guess, s.stepsize * self.increase_factor)
            at_max = false
            if self.max_learning_rate is not None:
                at_max = grown >= self.max_learning_rate
                grown = jnp.minimum(grown, self.max_learning_rate)
            stepsize = jnp.where(s.interval_found, _zoom_trial(s), grown).astype(real)
            value, new_grad, slope = evaluate(stepsize)
            decrease_error, curvature_error = self._errors(
                stepsize, value, slope, value_init, slope_init
            )
            succeeded = jnp.maximum(decrease_error, curvature_error) <= tol
            decreases = decrease_error <= tol

            # Bracketing: the bracket is [previous, new] if the new step fails
            # the decrease or is no better than the previous one, [new, previous]
            # if the slope has turned non-negative.
            new_is_high = ~decreases | ((value >= s.value) & (s.count > 0))
            previous_is_high = ~new_is_high & (slope >= 0)
            bracketed = new_is_high | previous_is_high
            # Zooming: which end the new step replaces.
            zoom_high = ~decreases | (value >= s.value_low)
            flip = ~zoom_high & (slope * (s.high - s.low) >= 0)

            searching = ~s.interval_found
            previous = (s.stepsize, s.value, s.slope)
            new = (stepsize, value, slope)
            low = (s.low, s.value_low, s.slope_low)
            high = (s.high, s.value_high, s.slope_high)

            def choose(*pairs):
                # pairs: (condition, triple)..., last is the default triple.
                *conditional, default = pairs
                out = default
                for condition, triple in reversed(conditional):
                    out = tuple(
                        jnp.where(condition, a, b)
                        for a, b in zip(triple, out, strict=False)
                    )
                return out

            new_low = choose(
                (searching & new_is_high, previous),
                (searching & previous_is_high, new),
                (searching, low),
                (zoom_high, low),
                new,
            )
            new_high = choose(
                (searching & new_is_high, new),
                (searching & previous_is_high, previous),
                (searching, high),
                (zoom_high, new),
                (flip, low),
                high,
            )
            # Cubic reference: the end point just replaced (none on entering the bracket).
            ref = choose(
                (searching, (s.cubic_ref, s.value_cubic_ref)),
                (zoom_high | flip, high[:2]),
                low[:2],
            )
            has_cubic_ref = ~searching

            safer = (
                decreases
                & (stepsize > 0)
                & ((s.safe_stepsize <= 0) | (value < s.safe_value))
            )
            safe_stepsize = jnp.where(safer, stepsize, s.safe_stepsize)
            safe_value = jnp.where(safer, value, s.safe_value)
            safe_slope = jnp.where(safer, slope, s.safe_slope)
            safe_grad = jax.tree.map(
                lambda a, b: None if a is None else jnp.where(safer, a, b),
                new_grad,
                s.safe_grad,
                is_leaf=is_none,
            )

            interval_found = s.interval_found | bracketed
            hit_max = searching & at_max & ~bracketed
            narrow = (
                interval_found
                & (jnp.abs(new_high[0] - new_low[0]) <= self.stepsize_precision)
                & (safe_stepsize > 0)
            )
            count = s.count + 1
            done = succeeded | hit_max | narrow
            return _ZoomSearch(
                count=count,
                stepsize=stepsize,
                value=value,
                grad=new_grad,
                slope=slope,
                decrease_error=decrease_error,
                curvature_error=curvature_error,
                succeeded=succeeded,
                done=done,
                interval_found=interval_found,
                low=new_low[0],
                value_low=new_low[1],
                slope_low=new_low[2],
                high=new_high[0],
                value_high=new_high[1],
                slope_high=new_high[2],
                has_cubic_ref=has_cubic_ref,
                cubic_ref=ref[0],
                value_cubic_ref=ref[1],
                safe_stepsize=safe_stepsize,
                safe_value=safe_value,
                safe_grad=safe_grad,
                safe_slope=safe_slope,
            )

        @no_type_check
        def keep_going(s):
            return ~s.done & (s.count < self.max_linesearch_steps)

        final = jax.lax.while_loop(keep_going, step, start)

        # Without a step meeting both conditions, fall back to the best one with
        # sufficient decrease, if any.
        use_safe = ~final.succeeded & (final.safe_stepsize > 0)
        stepsize = jnp.where(use_safe, final.safe_stepsize, final.stepsize)
        value = jnp.where(use_safe, final.safe_value, final.value)
        slope = jnp.where(use_safe, final.safe_slope, final.slope)
        new_grad = jax.tree.map(
            lambda a, b: None if a is None else jnp.where(use_safe, a, b),
            final.safe_grad,
            final.grad,
            is_leaf=is_none,
        )
        decrease_error, curvature_error = self._errors(
            stepsize, value, slope, value_init, slope_init
        )
        if self.verbose:
            jax.debug.callback(
                _report_zoom,
                final.succeeded,
                final.count,
                slope_init,
                decrease_error,
                curvature_error,
            )
        info = ZoomLinesearchInfo(
            num_linesearch_steps=final.count,
            decrease_error=decrease_error,
            curvature_error=curvature_error,
        )
        new_state = ScaleByZoomLinesearchState(
            learning_rate=stepsize, value=value, grad=new_grad, info=info
        )
        return _scale(stepsize, updates), new_state


def _report_zoom(succeeded, count, slope_init, decrease_error, curvature_error):
    if bool(succeeded):
        return
    reasons = []
    if float(slope_init) >= 0:
        reasons.append("the updates are not a descent direction (slope >= 0)")
    reasons.append(
        f"after {int(count)} evaluations: decrease error {float(decrease_error):.3g}, "
        f"curvature error {float(curvature_error):.3g}"
    )
    print("scale_by_zoom_linesearch failed: " + "; ".join(reasons) + ".")


@checked
def scale_by_zoom_linesearch(
    max_linesearch_steps: int,
    max_learning_rate: ScalarLike | None = None,
    tol: ScalarLike = 0.0,
    increase_factor: ScalarLike = 2.0,
    slope_rtol: ScalarLike = 1e-4,
    curv_rtol: ScalarLike = 0.9,
    approx_dec_rtol: ScalarLike | None = 1e-6,
    stepsize_precision: ScalarLike = 1e-5,
    initial_guess_strategy: str = "keep",
    verbose: bool = False,
) -> ScaleByZoomLinesearch:
    """Optax spelling of `eqopt.ScaleByZoomLinesearch`."""
    return ScaleByZoomLinesearch(
        max_linesearch_steps=max_linesearch_steps,
        max_learning_rate=max_learning_rate,
        tol=tol,
        increase_factor=increase_factor,
        slope_rtol=slope_rtol,
        curv_rtol=curv_rtol,
        approx_dec_rtol=approx_dec_rtol,
        stepsize_precision=stepsize_precision,
        initial_guess_strategy=initial_guess_strategy,
        verbose=verbose,
    )
