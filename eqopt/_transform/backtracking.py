r"""The backtracking line search (Armijo's sufficient decrease).

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
)
from .._entry import init_entry, update_entry
from .._hyper import (
    IntScalar,
    Scalar,
    ScalarLike,
    as_int_scalar,
    as_scalar,
    as_scalar_or_infinity,
    check_hyperparameter,
)
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._linesearch_common import (
    _along,
    _initial_grad,
    _objective_inputs,
    _real_dtype,
    _run_search,
    _scale,
    _slope,
    _value_and_grad_along,
)

# ---------------------------------------------------------------------------
# Backtracking line search (Armijo)
# ---------------------------------------------------------------------------


@checked
class BacktrackingLinesearchInfo(eqx.Module, OptaxTuple):
    """What the last backtracking line search did, for diagnosis.

    - `num_linesearch_steps`: the number of evaluations of the objective.
    - `decrease_error`: how far the chosen step is from sufficient decrease
      (at most `atol` when satisfied).
    """

    num_linesearch_steps: Int[Array, ""]
    decrease_error: Float[Array, ""]


@checked
class ScaleByBacktrackingLinesearchState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByBacktrackingLinesearch`.

    - `learning_rate`: the step size chosen by the last search (the next search
      starts from it times `increase_factor`); 1 before the first step.
    - `value`: the objective at the chosen step, i.e. at the new params
      ($+\\infty$ before the first step).
    - `grad`: the gradient there with `store_grad=True`, else `None`.
    - `info`: a `eqopt.BacktrackingLinesearchInfo`.
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


@checked
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

    **Global**: one step size over all the leaves, a stacked layer's slices included.

    **Arguments:**

    - `max_backtracking_steps`: the most reductions of the step per update.
    - `slope_rtol`: $c$, the fraction of the linear decrease required.
    - `decrease_factor`: $\gamma_\downarrow \in (0, 1)$.
    - `increase_factor`: $\gamma_\uparrow$; `1.0` restarts from the last step,
      `math.inf` from `max_learning_rate` every time.
    - `max_learning_rate`: $\eta_{\max}$, also the first guess.
    - `atol`, `rtol`: the tolerances $\epsilon$ and $\delta$.
    - `store_grad`: also compute the gradient at the chosen step and keep it in
      the state with the value, so that `eqopt.value_and_grad_from_state`
      can reuse both on deterministic objectives.
    - `verbose`: print a line when a search fails.

    **References:** Armijo, *Minimization of functions having Lipschitz
    continuous first partial derivatives*, Pacific J. Math. 1966; Nocedal &
    Wright, *Numerical Optimization*, 2nd ed., 2006, Alg. 3.1; Vaswani et al.,
    *Painless Stochastic Gradient: Interpolation, Line-Search, and Convergence
    Rates*, NeurIPS 2019.
    """

    max_backtracking_steps: IntScalar = eqx.field(converter=as_int_scalar)
    slope_rtol: Scalar = eqx.field(default=1e-4, converter=as_scalar)
    decrease_factor: Scalar = eqx.field(default=0.8, converter=as_scalar)
    increase_factor: Scalar = eqx.field(default=1.5, converter=as_scalar_or_infinity)
    max_learning_rate: Scalar = eqx.field(default=1.0, converter=as_scalar)
    atol: Scalar = eqx.field(default=0.0, converter=as_scalar)
    rtol: Scalar = eqx.field(default=0.0, converter=as_scalar)
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
        check_hyperparameter(
            "increase_factor", self.increase_factor, low=0.0, finite=False
        )
        check_hyperparameter(
            "max_learning_rate", self.max_learning_rate, low=0.0, low_inclusive=False
        )
        check_hyperparameter("atol", self.atol, low=0.0)
        check_hyperparameter("rtol", self.rtol, low=0.0)

    @init_entry
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

    @update_entry
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
            jnp.asarray(state.learning_rate, real) * self.increase_factor,
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


@checked
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
    """Optax spelling of `eqopt.ScaleByBacktrackingLinesearch`."""
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
