r"""Line searches: zoom (strong Wolfe) and backtracking (Armijo), and reusing their values.

A line search is a transform whose `update` takes three extra keyword arguments
besides the direction `updates`: `value` and `grad`, the objective and its
gradient at `params`, and `value_fn`, the objective itself (a function of the
whole params, an Equinox model included). It evaluates the objective along the
direction, picks a step size $\eta$ and returns $\eta\,u$. Further extra
arguments whose names `value_fn` accepts (a batch, say) are passed on to it.
"""

import inspect
from collections.abc import Callable
from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .. import _sharding
from .._base import (
    AbstractGradientTransformation,
    Params,
    Updates,
    check_updates,
    is_none,
    path_str,
    zeros_like_trainable,
)
from .._hyper import (
    Scalar,
    ScalarLike,
    as_int_scalar,
    as_optional_scalar,
    as_scalar,
    check_hyperparameter,
)
from ..tree._state import get_all_with_path

# ---------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------


def as_scalar_or_infinity(value: ScalarLike) -> Scalar:
    """Field converter for a scalar hyperparameter that may be $+\\infty$.

    `check_fields` refuses infinite values for `as_scalar` fields, but an
    infinite `curv_rtol` (no curvature condition) or `increase_factor` (always
    start from the largest step) is meaningful; `_check_real_scalar` checks
    these fields instead.
    """
    return as_scalar(value)


def _check_real_scalar(module: eqx.Module, name: str) -> None:
    value = getattr(module, name)
    if (
        not eqx.is_array(value)
        or value.ndim != 0
        or not jnp.issubdtype(value.dtype, jnp.floating)
    ):
        raise TypeError(
            f"{type(module).__name__}: hyperparameter `{name}` must be a real number "
            f"(a Python number or a 0-d array), got {value!r}."
        )
    check_hyperparameter(name, value, low=0.0, finite=False)


def _real_dtype() -> Any:
    # float32, or float64 when x64 is enabled: the dtype of values, slopes and steps.
    return jax.dtypes.canonicalize_dtype(jnp.float64)


@no_type_check
def _real_inner(x, y):
    """$\\operatorname{Re} \\sum_\\ell \\langle x_\\ell, y_\\ell\\rangle$ over leaves present in both.

    Each leaf's product is in the leaves' dtype and the sum in their promoted
    dtype (as Optax computes it), so `bfloat16` params give `bfloat16` products.
    """
    total = None
    for a, b in zip(
        jax.tree.leaves(x, is_leaf=is_none),
        jax.tree.leaves(y, is_leaf=is_none),
        strict=False,
    ):
        if a is None or b is None:
            continue
        product = _sharding.inner(a, b)
        dtype = (
            product.dtype if total is None else jnp.promote_types(dtype, product.dtype)
        )
        wide = product.astype(jnp.promote_types(product.dtype, jnp.float32))
        total = wide if total is None else total + wide
    if total is None:
        return jnp.zeros([], _real_dtype())
    return jnp.real(total.astype(dtype))


@no_type_check
def _slope(grad, updates):
    r"""The derivative of $\eta \mapsto f(w + \eta u)$ at 0: $\operatorname{Re}\sum g\,u$.

    JAX's gradient of a real function of complex inputs is the conjugate of the
    ascent direction, so the directional derivative is $\operatorname{Re}\sum g u$
    (not $\sum \bar g u$); for real inputs both are $\langle g, u\rangle$.
    """
    conjugate = jax.tree.map(
        lambda g: None if g is None else jnp.conj(g), grad, is_leaf=is_none
    )
    return _real_inner(conjugate, updates).astype(_real_dtype())


@no_type_check
def _along(params, stepsize, updates):
    """The params moved by `stepsize * updates`, each leaf kept in its dtype."""

    def move(u, p):
        if u is None:
            return p
        return (p + stepsize.astype(u.real.dtype) * u).astype(p.dtype)

    return jax.tree.map(move, updates, params, is_leaf=is_none)


@no_type_check
def _scale(stepsize, updates):
    def scale(u):
        return (
            None if u is None else (stepsize.astype(u.real.dtype) * u).astype(u.dtype)
        )

    return jax.tree.map(scale, updates, is_leaf=is_none)


@no_type_check
def _kwargs_for(value_fn, extra_args):
    """The extra arguments `value_fn` accepts by name (all of them if it takes `**kwargs`)."""
    try:
        parameters = inspect.signature(value_fn).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(extra_args)
    return {k: v for k, v in extra_args.items() if k in parameters}


@no_type_check
def _objective_inputs(owner, updates, params, extra_args):
    """Reads and checks `value`, `grad` and `value_fn` from the extra arguments."""
    missing = [k for k in ("value", "grad", "value_fn") if extra_args.get(k) is None]
    if missing or params is None:
        what = ", ".join(
            f"`{k}`" for k in missing + ([] if params is not None else ["params"])
        )
        raise TypeError(
            f"{owner} is a line search: its `update` needs the objective, but {what} "
            "was not given. Call `update(updates, state, params, value=value, "
            "grad=grad, value_fn=loss_fn)`, with `value, grad` the loss and its "
            "gradient at `params` (e.g. `eqx.filter_value_and_grad(loss_fn)(model)`) "
            "and `loss_fn(params)` returning the loss."
        )
    value, grad, value_fn = (
        extra_args["value"],
        extra_args["grad"],
        extra_args["value_fn"],
    )
    if not callable(value_fn):
        raise TypeError(
            f"{owner}: `value_fn` must be a function of the params returning the "
            f"loss, got {type(value_fn).__name__}."
        )
    value = jnp.asarray(value)
    if value.size != 1 or jnp.iscomplexobj(value):
        raise ValueError(
            f"{owner}: `value` must be the (real, scalar) loss at `params`, got an "
            f"array of dtype {value.dtype} and shape {tuple(value.shape)}."
        )
    check_updates(updates, params)
    check_updates(grad, params, name="grad", reference_name="params")
    update_leaves = jax.tree.leaves(updates, is_leaf=is_none)
    grad_leaves = jax.tree.leaves(grad, is_leaf=is_none)
    paths = jax.tree_util.tree_flatten_with_path(updates, is_leaf=is_none)[0]
    for (path, u), g in zip(paths, grad_leaves, strict=True):
        if u is not None and g is None:
            raise ValueError(
                f"{owner}: `grad` at {path_str(path)} is None but `updates` there is "
                "not: the gradient is needed wherever the line search moves."
            )
    del update_leaves
    rest = {
        k: v for k, v in extra_args.items() if k not in ("value", "grad", "value_fn")
    }
    return (
        value.reshape(()).astype(_real_dtype()),
        grad,
        value_fn,
        _kwargs_for(value_fn, rest),
    )


@no_type_check
def _value_and_grad_along(value_fn, fn_kwargs, params, updates, grad_like):
    """`stepsize -> (value, grad, slope)` of the objective at `params + stepsize * updates`.

    The gradient is kept where `grad_like` has a leaf, in its dtypes, so that it
    has the structure of the `grad` the caller gave.
    """
    value_and_grad = eqx.filter_value_and_grad(lambda p: value_fn(p, **fn_kwargs))

    def evaluate(stepsize):
        value, grad = value_and_grad(_along(params, stepsize, updates))
        grad = jax.tree.map(
            lambda ref, g: None if ref is None else jnp.asarray(g).astype(ref.dtype),
            grad_like,
            grad,
            is_leaf=is_none,
        )
        value = jnp.asarray(value).reshape(()).astype(_real_dtype())
        return value, grad, _slope(grad, updates)

    return evaluate


def _initial_grad(params: Params) -> Updates:
    return zeros_like_trainable(params)


@eqx.filter_jit
@no_type_check
def _run_search(
    transform, updates, state, params, value_init, grad, value_fn, fn_kwargs
):
    # Compiled once per transform, params structure and `value_fn`, so that a
    # loop run eagerly (as in Optax's examples) does not recompile the search
    # at every step; under an outer `jit` this is inlined.
    return transform._search(
        updates, state, params, value_init, grad, value_fn, fn_kwargs
    )


# ---------------------------------------------------------------------------
# Zoom line search (strong Wolfe)
# ---------------------------------------------------------------------------


class ZoomLinesearchInfo(eqx.Module):
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


class ScaleByZoomLinesearchState(eqx.Module):
    """The state of [`eqopt.ScaleByZoomLinesearch`][].

    - `learning_rate`: the step size chosen by the last search (the next
      guess with `initial_guess_strategy="keep"`).
    - `value`, `grad`: the objective and its gradient at the chosen step, i.e.
      at the new params; [`eqopt.value_and_grad_from_state`][] reuses them.
      `value` is $+\\infty$ before the first step.
    - `info`: a [`eqopt.ZoomLinesearchInfo`][].
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
    [`eqopt.value_and_grad_from_state`][].

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

    max_linesearch_steps: Int[Array, ""] = eqx.field(converter=as_int_scalar)
    max_learning_rate: Scalar | None = eqx.field(
        default=None, converter=as_optional_scalar
    )
    tol: Float[Array, ""] = eqx.field(default=0.0, converter=as_scalar)
    increase_factor: Float[Array, ""] = eqx.field(default=2.0, converter=as_scalar)
    slope_rtol: Float[Array, ""] = eqx.field(default=1e-4, converter=as_scalar)
    curv_rtol: Float[Array, ""] = eqx.field(
        default=0.9, converter=as_scalar_or_infinity
    )
    approx_dec_rtol: Scalar | None = eqx.field(
        default=1e-6, converter=as_optional_scalar
    )
    stepsize_precision: Float[Array, ""] = eqx.field(default=1e-5, converter=as_scalar)
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
        _check_real_scalar(self, "curv_rtol")
        check_hyperparameter("approx_dec_rtol", self.approx_dec_rtol, low=0.0)
        check_hyperparameter("stepsize_precision", self.stepsize_precision, low=0.0)

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
            else state.learning_rate.astype(real)
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
    """Optax spelling of [`eqopt.ScaleByZoomLinesearch`][]."""
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


# ---------------------------------------------------------------------------
# Backtracking line search (Armijo)
# ---------------------------------------------------------------------------


class BacktrackingLinesearchInfo(eqx.Module):
    """What the last backtracking line search did, for diagnosis.

    - `num_linesearch_steps`: the number of evaluations of the objective.
    - `decrease_error`: how far the chosen step is from sufficient decrease
      (at most `atol` when satisfied).
    """

    num_linesearch_steps: Int[Array, ""]
    decrease_error: Float[Array, ""]


class ScaleByBacktrackingLinesearchState(eqx.Module):
    """The state of [`eqopt.ScaleByBacktrackingLinesearch`][].

    - `learning_rate`: the step size chosen by the last search (the next search
      starts from it times `increase_factor`); 1 before the first step.
    - `value`: the objective at the chosen step, i.e. at the new params
      ($+\\infty$ before the first step).
    - `grad`: the gradient there with `store_grad=True`, else `None`.
    - `info`: a [`eqopt.BacktrackingLinesearchInfo`][].
    """

    learning_rate: Float[Array, ""]
    value: Float[Array, ""]
    grad: Updates | None
    info: BacktrackingLinesearchInfo


class _BacktrackingSearch(eqx.Module):
    """The loop state of one backtracking search (private)."""

    count: Int[Array, ""]
    stepsize: Float[Array, ""]
    value: Float[Array, ""]
    grad: Any
    decrease_error: Float[Array, ""]
    done: Bool[Array, ""]


class ScaleByBacktrackingLinesearch(AbstractGradientTransformation):
    r"""Scales the updates by a step size found by backtracking (Armijo's rule).

    With $\phi(\eta) = f(w + \eta u)$ along the direction $u$ (the incoming
    updates), the search starts from
    $\eta_0 = \min(\eta_{\text{prev}} \cdot \gamma_{\uparrow}, \eta_{\max})$
    ($\eta_{\text{prev}}$ is the last step size, 1 at first) and multiplies by `decrease_factor` $\gamma_\downarrow$ until

    $$
    \phi(\eta) \le (1 + \delta)\, \phi(0) + c\, \eta\, \phi'(0) + \epsilon,
    $$

    or `max_backtracking_steps` reductions were made (then the last step is
    taken; `state.info.decrease_error` is positive). The updates become
    $\eta\, u$. The direction must be one of descent ($\phi'(0) < 0$) for the
    condition to be reachable.

    `update` needs the extra keyword arguments `value` and `grad` (the objective
    and its gradient at `params`) and `value_fn` (the objective, a function of
    the whole params); other extra arguments that `value_fn` accepts by name are
    passed to it.

    **Arguments:**

    - `max_backtracking_steps`: the most reductions of the step per update.
    - `slope_rtol`: $c$, the fraction of the linear decrease required.
    - `decrease_factor`: $\gamma_\downarrow \in (0, 1)$.
    - `increase_factor`: $\gamma_\uparrow$; `1.0` restarts from the last step,
      `math.inf` from `max_learning_rate` every time.
    - `max_learning_rate`: $\eta_{\max}$, also the first guess.
    - `atol`, `rtol`: the tolerances $\epsilon$ and $\delta$.
    - `store_grad`: also compute the gradient at the chosen step and keep it in
      the state with the value, so that [`eqopt.value_and_grad_from_state`][]
      can reuse both on deterministic objectives.
    - `verbose`: print a line when a search fails.

    **References:** Armijo, *Minimization of functions having Lipschitz
    continuous first partial derivatives*, Pacific J. Math. 1966; Nocedal &
    Wright, *Numerical Optimization*, 2nd ed., 2006, Alg. 3.1; Vaswani et al.,
    *Painless Stochastic Gradient: Interpolation, Line-Search, and Convergence
    Rates*, NeurIPS 2019.
    """

    max_backtracking_steps: Int[Array, ""] = eqx.field(converter=as_int_scalar)
    slope_rtol: Float[Array, ""] = eqx.field(default=1e-4, converter=as_scalar)
    decrease_factor: Float[Array, ""] = eqx.field(default=0.8, converter=as_scalar)
    increase_factor: Float[Array, ""] = eqx.field(
        default=1.5, converter=as_scalar_or_infinity
    )
    max_learning_rate: Float[Array, ""] = eqx.field(default=1.0, converter=as_scalar)
    atol: Float[Array, ""] = eqx.field(default=0.0, converter=as_scalar)
    rtol: Float[Array, ""] = eqx.field(default=0.0, converter=as_scalar)
    store_grad: bool = eqx.field(default=False, static=True)
    verbose: bool = eqx.field(default=False, static=True)

    @property
    def elementwise(self) -> bool:
        return False

    def __check_init__(self):
        check_hyperparameter(
            "max_backtracking_steps", self.max_backtracking_steps, low=0
        )
        check_hyperparameter("slope_rtol", self.slope_rtol, low=0.0, high=1.0)
        check_hyperparameter(
            "decrease_factor", self.decrease_factor, low=0.0, low_inclusive=False
        )
        _check_real_scalar(self, "increase_factor")
        check_hyperparameter(
            "max_learning_rate", self.max_learning_rate, low=0.0, low_inclusive=False
        )
        check_hyperparameter("atol", self.atol, low=0.0)
        check_hyperparameter("rtol", self.rtol, low=0.0)

    def init(self, params: Params) -> ScaleByBacktrackingLinesearchState:
        real = _real_dtype()
        return ScaleByBacktrackingLinesearchState(
            learning_rate=jnp.ones([], real),
            value=jnp.full([], jnp.inf, real),
            grad=_initial_grad(params) if self.store_grad else None,
            info=BacktrackingLinesearchInfo(
                num_linesearch_steps=jnp.zeros([], jnp.int32),
                decrease_error=jnp.full([], jnp.inf, real),
            ),
        )

    def update(
        self,
        updates: Updates,
        state: ScaleByBacktrackingLinesearchState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByBacktrackingLinesearchState]:
        value_init, grad, value_fn, fn_kwargs = _objective_inputs(
            "scale_by_backtracking_linesearch", updates, params, extra_args
        )
        return _run_search(
            self, updates, state, params, value_init, grad, value_fn, fn_kwargs
        )

    @no_type_check
    def _search(self, updates, state, params, value_init, grad, value_fn, fn_kwargs):
        real = value_init.dtype
        slope_init = _slope(grad, updates)
        if self.store_grad:
            evaluate = _value_and_grad_along(value_fn, fn_kwargs, params, updates, grad)
        else:
            fn = lambda p: value_fn(p, **fn_kwargs)  # noqa: E731

            @no_type_check
            def evaluate(stepsize):
                value = jnp.asarray(fn(_along(params, stepsize, updates)))
                return value.reshape(()).astype(real), None, None

        guess = jnp.minimum(
            state.learning_rate.astype(real) * self.increase_factor,
            self.max_learning_rate,
        ).astype(real)

        @no_type_check
        def step(s):
            stepsize = jnp.where(
                s.count == 0, guess, s.stepsize * self.decrease_factor
            ).astype(real)
            value, new_grad, _ = evaluate(stepsize)
            decrease_error = (
                value
                - (1 + self.rtol) * value_init
                - stepsize * self.slope_rtol * slope_init
            )
            decrease_error = jnp.maximum(decrease_error, 0.0).astype(real)
            return _BacktrackingSearch(
                count=s.count + 1,
                stepsize=stepsize,
                value=value,
                grad=new_grad,
                decrease_error=decrease_error,
                done=decrease_error <= self.atol,
            )

        @no_type_check
        def keep_going(s):
            return ~s.done & (s.count <= self.max_backtracking_steps)

        start = _BacktrackingSearch(
            count=jnp.zeros([], jnp.int32),
            stepsize=guess,
            value=value_init,
            grad=grad if self.store_grad else None,
            decrease_error=jnp.full([], jnp.inf, real),
            done=jnp.zeros([], bool),
        )
        final = jax.lax.while_loop(keep_going, step, start)
        if self.verbose:
            jax.debug.callback(
                _report_backtracking,
                final.done,
                final.count,
                slope_init,
                final.decrease_error,
            )
        new_state = ScaleByBacktrackingLinesearchState(
            learning_rate=final.stepsize,
            value=final.value,
            grad=final.grad,
            info=BacktrackingLinesearchInfo(
                num_linesearch_steps=final.count,
                decrease_error=final.decrease_error,
            ),
        )
        return _scale(final.stepsize, updates), new_state


def _report_backtracking(done, count, slope_init, decrease_error):
    if bool(done):
        return
    reason = (
        "the updates are not a descent direction (slope >= 0); "
        if float(slope_init) >= 0
        else ""
    )
    print(
        f"scale_by_backtracking_linesearch failed: {reason}after {int(count)} "
        f"evaluations the decrease error is {float(decrease_error):.3g}."
    )


def scale_by_backtracking_linesearch(
    max_backtracking_steps: int,
    slope_rtol: ScalarLike = 1e-4,
    decrease_factor: ScalarLike = 0.8,
    increase_factor: ScalarLike = 1.5,
    max_learning_rate: ScalarLike = 1.0,
    atol: ScalarLike = 0.0,
    rtol: ScalarLike = 0.0,
    store_grad: bool = False,
    verbose: bool = False,
) -> ScaleByBacktrackingLinesearch:
    """Optax spelling of [`eqopt.ScaleByBacktrackingLinesearch`][]."""
    return ScaleByBacktrackingLinesearch(
        max_backtracking_steps=max_backtracking_steps,
        slope_rtol=slope_rtol,
        decrease_factor=decrease_factor,
        increase_factor=increase_factor,
        max_learning_rate=max_learning_rate,
        atol=atol,
        rtol=rtol,
        store_grad=store_grad,
        verbose=verbose,
    )


# ---------------------------------------------------------------------------
# Reusing the line search's value and gradient
# ---------------------------------------------------------------------------


def value_and_grad_from_state(
    value_fn: Callable[..., Any],
) -> Callable[..., tuple[Float[Array, ""], Updates]]:
    r"""Like `eqx.filter_value_and_grad(value_fn)`, but reuses what a line search stored.

    A line search evaluates the objective and its gradient at the step it
    accepts, which are the value and gradient at the next params. The returned
    function `value_and_grad(params, *args, state, **kwargs)` reads them from
    the optimiser state (the one `value` and `grad` found in it, at any depth,
    e.g. in [`eqopt.ScaleByZoomLinesearchState`][] inside an L-BFGS chain) and
    computes them with `eqx.filter_value_and_grad` only when the stored value
    is not finite (before the first step). Use it for deterministic objectives
    only: with a new batch each step the stored values are stale.

    **Arguments:**

    - `value_fn`: the objective, a function of the params (a whole model is
      fine) and optionally further arguments, returning a scalar.

    **Returns:** `value_and_grad(params, *args, state, **kwargs) -> (value, grad)`,
    `grad` shaped like `params` with `None` where a leaf is not trainable.

    **Raises:** `ValueError` if the state holds no `value`/`grad` or several,
    or if its `grad` is `None` (a backtracking search without `store_grad=True`).

    !!! example

        ```python
        def loss(model):
            return loss_fn(model, x, y)

        opt = eqopt.lbfgs()
        state = opt.init(model)
        value_and_grad = eqopt.value_and_grad_from_state(loss)
        value, grad = value_and_grad(model, state=state)
        updates, state = opt.update(grad, state, model, value=value, grad=grad, value_fn=loss)
        ```
    """
    computed = eqx.filter_value_and_grad(value_fn)

    def value_and_grad(
        params: Params, *fn_args: Any, state: Any, **fn_kwargs: Any
    ) -> tuple[Float[Array, ""], Updates]:
        values = get_all_with_path(state, "value")
        grads = get_all_with_path(state, "grad")
        if len(values) != 1 or len(grads) != 1:
            raise ValueError(
                "value_and_grad_from_state: expected one `value` and one `grad` in "
                f"the state, found {len(values)} and {len(grads)}. The state should "
                "come from an optimiser with one line search "
                "(e.g. `eqopt.lbfgs()` or a chain ending in `scale_by_zoom_linesearch`)."
            )
        (_, value), (_, grad) = values[0], grads[0]
        if grad is None:
            raise ValueError(
                "value_and_grad_from_state: the line search stored no gradient; "
                "build it with `scale_by_backtracking_linesearch(..., "
                "store_grad=True)`."
            )

        @no_type_check
        def compute():
            new_value, new_grad = computed(params, *fn_args, **fn_kwargs)
            try:
                new_grad = jax.tree.map(
                    lambda ref, g: None if ref is None else g.astype(ref.dtype),
                    grad,
                    new_grad,
                    is_leaf=is_none,
                )
            except ValueError:
                raise ValueError(
                    "value_and_grad_from_state: the gradient of `value_fn` at "
                    "`params` does not have the structure of the `grad` in the "
                    "state: was the state made for these params?"
                ) from None
            return jnp.asarray(new_value).reshape(()).astype(value.dtype), new_grad

        @no_type_check
        def stored():
            return value, grad

        return jax.lax.cond(jnp.isfinite(value), stored, compute)

    return value_and_grad
