"""Line searches: registry cases, parity with Optax's searches, and their errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _objectives import extra_args_with_gradient, jit_update
from helpers import Case, assert_tree_allclose, make_model

import eqopt

# Complex parameters are not compared: the slope along the direction differs
# from Optax's on purpose (test_complex_slope_is_the_directional_derivative).
REAL = ("float32", "bfloat16")

# The registry feeds a bare line search the step's gradients as its direction;
# the objective's gradient there is minus them, so the direction is one of descent.
DESCENT = extra_args_with_gradient(sign=-1.0)

TRANSFORM_CASES = [
    Case(
        "scale_by_zoom_linesearch",
        lambda: eqopt.scale_by_zoom_linesearch(15),
        lambda: jit_update(optax.scale_by_zoom_linesearch(15)),
        REAL,
        extra_args=DESCENT,
    ),
    Case(
        "scale_by_zoom_linesearch-one-max_learning_rate-no_curvature",
        lambda: eqopt.scale_by_zoom_linesearch(
            8,
            max_learning_rate=0.5,
            curv_rtol=jnp.inf,
            approx_dec_rtol=None,
            initial_guess_strategy="one",
        ),
        lambda: jit_update(
            optax.scale_by_zoom_linesearch(
                8,
                max_learning_rate=0.5,
                curv_rtol=jnp.inf,
                approx_dec_rtol=None,
                initial_guess_strategy="one",
            )
        ),
        ("float32",),
        extra_args=DESCENT,
    ),
    Case(
        "scale_by_backtracking_linesearch",
        lambda: eqopt.scale_by_backtracking_linesearch(15),
        lambda: jit_update(optax.scale_by_backtracking_linesearch(15)),
        REAL,
        extra_args=DESCENT,
    ),
    Case(
        "scale_by_backtracking_linesearch-store_grad",
        lambda: eqopt.scale_by_backtracking_linesearch(
            4,
            decrease_factor=0.5,
            increase_factor=jnp.inf,
            max_learning_rate=2.0,
            store_grad=True,
        ),
        lambda: jit_update(
            optax.scale_by_backtracking_linesearch(
                4,
                decrease_factor=0.5,
                increase_factor=jnp.inf,
                max_learning_rate=2.0,
                store_grad=True,
            )
        ),
        ("float32",),
        extra_args=DESCENT,
    ),
]


# ---------------------------------------------------------------------------
# One search at a time, against Optax's, on problems that take every branch
# ---------------------------------------------------------------------------


class Problem(eqx.Module):
    r"""$f(x) = \tfrac12 \sum a x^2 + q \sum x^4 + r\,\mathrm{Rosenbrock}(x) - \langle b, x\rangle$.

    A Module, so that each search compiles once for every problem of the family.
    """

    scales: jax.Array
    quartic: jax.Array
    rosenbrock: jax.Array
    linear: jax.Array

    def __call__(self, params):
        x = params["x"]
        rosenbrock = jnp.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)
        return (
            0.5 * jnp.sum(self.scales * x**2)
            + self.quartic * jnp.sum(x**4)
            + self.rosenbrock * rosenbrock
            - jnp.sum(self.linear * x)
        )


def problem(scales=(1.0, 10.0, 100.0), quartic=0.0, rosenbrock=0.0, linear=0.0):
    return Problem(
        jnp.asarray(scales),
        jnp.asarray(quartic),
        jnp.asarray(rosenbrock),
        jnp.broadcast_to(jnp.asarray(linear), (3,)),
    )


QUADRATIC = problem()
ROSENBROCK = problem(scales=(0.0, 0.0, 0.0), rosenbrock=1.0)
QUARTIC = problem(scales=(0.0, 0.0, 0.0), quartic=1.0, linear=1.0)
START = {"x": jnp.array([-1.2, 1.0, 0.5])}


def direction(objective, kind, factor=1.0):
    grad = jax.grad(objective)(START)["x"]
    if kind == "normalised":
        grad = grad / jnp.linalg.norm(grad)
    sign = 1.0 if kind == "ascent" else -1.0
    return {"x": sign * factor * grad}


# (objective, direction, arguments of the search, learning rate in the state)
ZOOM_SCENARIOS = {
    "quadratic-bisects-then-interpolates": (QUADRATIC, ("gradient",), {}, None),
    "quadratic-short-direction-extrapolates": (
        QUADRATIC,
        ("gradient", 1e-3),
        {},
        None,
    ),
    "rosenbrock-cubic": (ROSENBROCK, ("gradient",), {}, None),
    "rosenbrock-normalised": (ROSENBROCK, ("normalised",), {}, None),
    "ascent-fails-without-safe-step": (ROSENBROCK, ("ascent",), {}, None),
    "too-few-steps": (ROSENBROCK, ("gradient",), {"max_linesearch_steps": 3}, None),
    "max-learning-rate": (
        ROSENBROCK,
        ("normalised", 1e-3),
        {"max_learning_rate": 2.0},
        None,
    ),
    "keep-previous-guess": (QUARTIC, ("gradient",), {}, 37.0),
    "one-ignores-previous": (
        QUARTIC,
        ("gradient",),
        {"initial_guess_strategy": "one"},
        37.0,
    ),
    "no-curvature-condition": (ROSENBROCK, ("gradient",), {"curv_rtol": jnp.inf}, None),
    "armijo-only": (QUARTIC, ("gradient",), {"approx_dec_rtol": None}, None),
    "tiny-steps-safe-step": (
        QUARTIC,
        ("gradient", 1e-4),
        {"max_linesearch_steps": 2, "increase_factor": 1.5},
        None,
    ),
}


def _search_once(library, make, objective, updates, learning_rate):
    search = make(library)
    state = search.init(START)
    if learning_rate is not None:
        state = (
            state._replace(learning_rate=jnp.asarray(learning_rate))
            if library is optax
            else eqx.tree_at(
                lambda s: s.learning_rate, state, jnp.asarray(learning_rate)
            )
        )
    value, grad = jax.value_and_grad(objective)(START)
    update = jax.jit(search.update) if library is optax else search.update
    return update(updates, state, START, value=value, grad=grad, value_fn=objective)


def _assert_same_search(make, objective, updates, learning_rate):
    ours, state = _search_once(eqopt, make, objective, updates, learning_rate)
    theirs, reference = _search_once(optax, make, objective, updates, learning_rate)
    assert int(state.info.num_linesearch_steps) == int(
        reference.info.num_linesearch_steps
    )
    np.testing.assert_allclose(state.learning_rate, reference.learning_rate, rtol=1e-5)
    assert_tree_allclose(ours, theirs, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(state.value, reference.value, rtol=1e-5, atol=1e-7)
    assert (state.grad is None) == (reference.grad is None)
    if state.grad is not None:
        assert_tree_allclose(state.grad, reference.grad, rtol=1e-5, atol=1e-5)
    for field in reference.info._fields:
        np.testing.assert_allclose(
            getattr(state.info, field),
            getattr(reference.info, field),
            rtol=1e-4,
            atol=1e-6,
            err_msg=field,
        )
    return state


@pytest.mark.parametrize("scenario", list(ZOOM_SCENARIOS), ids=list(ZOOM_SCENARIOS))
def test_zoom_matches_optax(scenario):
    objective, (kind, *factor), arguments, learning_rate = ZOOM_SCENARIOS[scenario]
    arguments = {"max_linesearch_steps": 15, **arguments}

    def make(library):
        return library.scale_by_zoom_linesearch(**arguments)

    _assert_same_search(
        make, objective, direction(objective, kind, *factor), learning_rate
    )


BACKTRACKING_SCENARIOS = {
    "rosenbrock-fails": (ROSENBROCK, ("gradient",), {}, None),
    "rosenbrock-normalised": (ROSENBROCK, ("normalised",), {}, None),
    "grows-from-previous": (ROSENBROCK, ("normalised",), {}, 0.1),
    "restarts-at-max": (
        ROSENBROCK,
        ("normalised",),
        {"increase_factor": jnp.inf, "max_learning_rate": 3.0, "decrease_factor": 0.5},
        0.1,
    ),
    "ascent-one-step": (ROSENBROCK, ("ascent",), {"max_backtracking_steps": 1}, None),
    "tolerances": (QUARTIC, ("gradient",), {"atol": 0.5, "rtol": 0.1}, None),
    "store-grad": (QUADRATIC, ("gradient",), {"store_grad": True}, None),
}


@pytest.mark.parametrize(
    "scenario", list(BACKTRACKING_SCENARIOS), ids=list(BACKTRACKING_SCENARIOS)
)
def test_backtracking_matches_optax(scenario):
    objective, (kind, *factor), arguments, learning_rate = BACKTRACKING_SCENARIOS[
        scenario
    ]
    arguments = {"max_backtracking_steps": 15, **arguments}

    def make(library):
        return library.scale_by_backtracking_linesearch(**arguments)

    _assert_same_search(
        make, objective, direction(objective, kind, *factor), learning_rate
    )


def test_zoom_result_satisfies_strong_wolfe():
    key_matrix, key_start = jax.random.split(jax.random.key(1))
    matrix = jax.random.normal(key_matrix, (6, 6))

    def objective(params):
        return jnp.sum(jnp.log(jnp.cosh(matrix @ params["x"] - 1.0)))

    params = {"x": jax.random.normal(key_start, (6,))}
    value, grad = jax.value_and_grad(objective)(params)
    updates = jax.tree.map(lambda g: -10.0 * g, grad)
    search = eqopt.scale_by_zoom_linesearch(30)
    scaled, state = search.update(
        updates, search.init(params), params, value=value, grad=grad, value_fn=objective
    )
    eta = state.learning_rate
    slope = jnp.vdot(grad["x"], updates["x"])
    new_params = eqopt.apply_updates(params, scaled)
    new_slope = jnp.vdot(jax.grad(objective)(new_params)["x"], updates["x"])
    assert slope < 0
    assert objective(new_params) <= value + 1e-4 * eta * slope
    assert jnp.abs(new_slope) <= 0.9 * jnp.abs(slope)
    assert float(state.info.decrease_error) == 0.0
    assert float(state.info.curvature_error) == 0.0
    # The state holds the value and gradient at the new params.
    np.testing.assert_allclose(state.value, objective(new_params), rtol=1e-6)
    assert_tree_allclose(state.grad, jax.grad(objective)(new_params), rtol=1e-5)


# ---------------------------------------------------------------------------
# The examples of Optax's documentation, and extra arguments
# ---------------------------------------------------------------------------


def _data_fn(params, x, y):
    return 0.5 * (x @ params - y) ** 2


@pytest.mark.parametrize("search", ["zoom", "backtracking"])
def test_extra_arguments_reach_value_fn_as_in_optax_example(search):
    """A function of the params and a batch, the batch passed as extra arguments."""
    xs = jnp.tile(jnp.array([3.0, 2.0, 1.0]), (5, 1))
    ys = jnp.zeros(5)

    def run(library):
        line_search = (
            library.scale_by_zoom_linesearch(max_linesearch_steps=15)
            if search == "zoom"
            else library.scale_by_backtracking_linesearch(max_backtracking_steps=15)
        )
        solver = library.chain(library.sgd(learning_rate=1.0), line_search)
        params = jnp.array([1.0, 2.0, 3.0])
        state = solver.init(params)
        values = []
        for x, y in zip(xs, ys, strict=False):
            value, grad = jax.value_and_grad(_data_fn)(params, x, y)
            # eqopt ignores an extra argument that the function does not take (a
            # chain forwards every extra argument to every part); Optax raises.
            unused = {} if library is optax else {"unused": None}
            updates, state = solver.update(
                grad,
                state,
                params,
                value=value,
                grad=grad,
                value_fn=_data_fn,
                x=x,
                y=y,
                **unused,
            )
            params = library.apply_updates(params, updates)
            values.append(_data_fn(params, x, y))
        return np.array(values)

    ours = run(eqopt)
    np.testing.assert_allclose(ours, run(optax), rtol=1e-5, atol=1e-12)
    assert ours[-1] < ours[0] or ours[0] < 1e-10


def test_value_and_grad_from_state_reuses_the_search():
    def objective(params):
        return jnp.sum(params**2)

    solver = eqopt.chain(
        eqopt.sgd(learning_rate=1.0),
        eqopt.scale_by_backtracking_linesearch(
            max_backtracking_steps=15, store_grad=True
        ),
    )
    reference = optax.chain(
        optax.sgd(learning_rate=1.0),
        optax.scale_by_backtracking_linesearch(
            max_backtracking_steps=15, store_grad=True
        ),
    )
    value_and_grad = eqopt.value_and_grad_from_state(objective)
    reference_value_and_grad = optax.value_and_grad_from_state(objective)
    params = reference_params = jnp.array([1.0, 2.0, 3.0])
    state, reference_state = solver.init(params), reference.init(params)
    for step in range(5):
        value, grad = value_and_grad(params, state=state)
        if step == 0:  # nothing stored yet: computed
            np.testing.assert_allclose(value, objective(params))
        else:  # the stored ones
            np.testing.assert_array_equal(value, state[1].value)
            np.testing.assert_array_equal(grad, state[1].grad)
        updates, state = solver.update(
            grad, state, params, value=value, grad=grad, value_fn=objective
        )
        params = eqopt.apply_updates(params, updates)
        reference_value, reference_grad = reference_value_and_grad(
            reference_params, state=reference_state
        )
        reference_updates, reference_state = reference.update(
            reference_grad,
            reference_state,
            reference_params,
            value=reference_value,
            grad=reference_grad,
            value_fn=objective,
        )
        reference_params = optax.apply_updates(reference_params, reference_updates)
        np.testing.assert_allclose(params, reference_params, rtol=1e-6)


def test_value_and_grad_from_state_errors():
    def objective(params):
        return jnp.sum(params**2)

    params = jnp.ones(3)
    value_and_grad = eqopt.value_and_grad_from_state(objective)
    with pytest.raises(ValueError, match="one `value` and one `grad`.*found 0 and 0"):
        value_and_grad(params, state=eqopt.adam(0.1).init(params))
    no_grad = eqopt.scale_by_backtracking_linesearch(5).init(params)
    with pytest.raises(ValueError, match="store_grad=True"):
        value_and_grad(params, state=no_grad)
    two = eqopt.chain(
        eqopt.scale_by_backtracking_linesearch(5, store_grad=True),
        eqopt.scale_by_backtracking_linesearch(5, store_grad=True),
    ).init(params)
    for error in (KeyError, ValueError):  # Optax raises a KeyError there
        with pytest.raises(error, match="found 2 and 2"):
            value_and_grad(params, state=two)
    with pytest.raises(KeyError) as caught:
        jax.jit(value_and_grad)(params, state=two)
    assert str(caught.value).startswith("value_and_grad_from_state: expected one")


# ---------------------------------------------------------------------------
# Whole models, complex parameters, errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: eqopt.scale_by_zoom_linesearch(10),
        lambda: eqopt.scale_by_backtracking_linesearch(10, store_grad=True),
    ],
    ids=["zoom", "backtracking"],
)
def test_whole_model_with_frozen_leaf(make):
    model = make_model()

    def loss(model):
        return (
            jnp.sum((model.w - 1.0) ** 2)
            + jnp.sum(model.b**2)
            + model.s**2
            + model.depth
        )

    search = make()
    state = search.init(model)
    value, grad = eqx.filter_value_and_grad(loss)(model)
    updates = jax.tree.map(
        lambda g: None if g is None else -g, grad, is_leaf=lambda x: x is None
    )
    updates = eqx.tree_at(lambda u: u.s, updates, None, is_leaf=lambda x: x is None)
    scaled, state = eqx.filter_jit(search.update)(
        updates, state, model, value=value, grad=grad, value_fn=loss
    )
    assert scaled.s is None and scaled.activation is None
    new_model = eqopt.apply_updates(model, scaled)
    assert new_model.s == model.s and new_model.activation is jax.nn.relu
    assert loss(new_model) < value
    np.testing.assert_allclose(state.value, loss(new_model), rtol=1e-6)


def test_complex_slope_is_the_directional_derivative():
    """A deliberate difference from Optax.

    For a real objective of complex parameters, JAX's gradient $g$ is the
    conjugate of the ascent direction, so the slope along $u$ is
    $\\operatorname{Re}\\sum g u$. Optax uses $\\operatorname{Re}\\sum \\bar g u$,
    which is not the derivative: along the steepest descent direction
    $-\\bar g$ of $|z|^2$ it reads a slope of 0 and cannot certify the exact
    minimiser that eqopt finds at once.
    """

    def objective(z):
        return jnp.sum(jnp.abs(z) ** 2)

    z = jnp.array([1.0 + 1.0j])
    value, grad = jax.value_and_grad(objective)(z)
    descent = -jnp.conj(grad)
    eps = 1e-3
    finite_difference = (
        objective(z + eps * descent) - objective(z - eps * descent)
    ) / (2 * eps)

    search = eqopt.scale_by_zoom_linesearch(10, initial_guess_strategy="one")
    _, state = search.update(
        descent, search.init(z), z, value=value, grad=grad, value_fn=objective
    )
    np.testing.assert_allclose(
        jnp.real(jnp.sum(grad * descent)), finite_difference, rtol=1e-3
    )
    np.testing.assert_allclose(state.learning_rate, 0.5, rtol=1e-6)
    assert float(state.info.decrease_error) == 0.0
    assert float(state.info.curvature_error) == 0.0
    assert int(state.info.num_linesearch_steps) <= 3

    reference = optax.scale_by_zoom_linesearch(10, initial_guess_strategy="one")
    _, reference_state = reference.update(
        descent, reference.init(z), z, value=value, grad=grad, value_fn=objective
    )
    # Optax's slope at 0 is Re(conj(g) u) = 0 here: no step can show a
    # curvature decrease relative to it, and the search runs out of steps.
    assert int(reference_state.info.num_linesearch_steps) == 10


def test_verbose_reports_a_failed_search(capfd):
    search = eqopt.scale_by_zoom_linesearch(3, verbose=True)
    updates = direction(ROSENBROCK, "ascent")
    value, grad = jax.value_and_grad(ROSENBROCK)(START)
    search.update(
        updates, search.init(START), START, value=value, grad=grad, value_fn=ROSENBROCK
    )
    jax.effects_barrier()
    assert "not a descent direction" in capfd.readouterr().out


def test_errors():
    params = {"x": jnp.ones(3)}
    value, grad = jax.value_and_grad(QUADRATIC)(params)
    for search in [
        eqopt.scale_by_zoom_linesearch(5),
        eqopt.scale_by_backtracking_linesearch(5),
    ]:
        state = search.init(params)
        with pytest.raises(TypeError, match=r"`value_fn` was not given"):
            search.update(grad, state, params, value=value, grad=grad)
        with pytest.raises(TypeError, match=r"`params` was not given"):
            search.update(grad, state, value=value, grad=grad, value_fn=QUADRATIC)
        with pytest.raises(ValueError, match="`value` must be the"):
            search.update(
                grad, state, params, value=jnp.ones(3), grad=grad, value_fn=QUADRATIC
            )
        with pytest.raises(ValueError, match=r"`grad` at \['x'\] has shape \(2,\)"):
            search.update(
                grad,
                state,
                params,
                value=value,
                grad={"x": jnp.ones(2)},
                value_fn=QUADRATIC,
            )
        with pytest.raises(TypeError, match="`value_fn` must be a function"):
            search.update(grad, state, params, value=value, grad=grad, value_fn=3.0)
    with pytest.raises(ValueError, match="initial_guess_strategy"):
        eqopt.scale_by_zoom_linesearch(5, initial_guess_strategy="two")
    with pytest.raises(ValueError, match="max_linesearch_steps"):
        eqopt.scale_by_zoom_linesearch(0)
    with pytest.raises(TypeError, match="curv_rtol"):
        eqopt.scale_by_zoom_linesearch(5, curv_rtol="0.9")
    with pytest.raises(ValueError, match="decrease_factor"):
        eqopt.scale_by_backtracking_linesearch(5, decrease_factor=0.0)


@pytest.mark.parametrize(
    "search",
    [
        lambda: eqopt.scale_by_zoom_linesearch(max_linesearch_steps=20),
        lambda: eqopt.scale_by_backtracking_linesearch(max_backtracking_steps=20),
    ],
)
def test_a_learning_rate_set_as_a_number_is_read(search):
    """The initial step set in the state as a Python number (as Optax's tests do
    with `tree.set(state, learning_rate=1.0)`) is read in the value's dtype."""
    opt = search()
    params = jnp.array([1.0, 2.0])
    state = eqopt.tree.set(opt.init(params), learning_rate=1.0)
    fn = lambda x: jnp.sum(x**2)  # noqa: E731
    value, grad = jax.value_and_grad(fn)(params)
    updates, _ = opt.update(-grad, state, params, value=value, grad=grad, value_fn=fn)
    assert float(fn(params + updates)) < float(value)
