"""L-BFGS: registry cases, the full loop on whole models, convergence and parity with Optax."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _objectives import extra_args_with_gradient, jit_update
from helpers import Case

import eqopt

# Parity dtypes. In bfloat16, L-BFGS fed the parity test's random gradients
# (pairs with negative curvature) amplifies the last-bit differences of its
# inner products: Optax sums a tree's leaves in dict-key order, eqopt in the
# model's field order, and one bfloat16 ulp of difference grows to several over
# four steps. test_bfloat16_follows_optax compares bfloat16 on a convex problem,
# where it does not grow. Complex parameters: the line searches differ from
# Optax on purpose (see test_linesearch.py), so only the line-search-free
# configurations compare complex64.
REAL = ("float32",)
NO_LINESEARCH = ("float32", "complex64")

TRANSFORM_CASES = [
    Case("scale_by_lbfgs", eqopt.scale_by_lbfgs, optax.scale_by_lbfgs, NO_LINESEARCH),
    Case(
        "scale_by_lbfgs-memory2-unscaled",
        lambda: eqopt.scale_by_lbfgs(memory_size=2, scale_init_precond=False),
        lambda: optax.scale_by_lbfgs(memory_size=2, scale_init_precond=False),
        NO_LINESEARCH,
    ),
    Case(
        "lbfgs",
        eqopt.lbfgs,
        lambda: jit_update(optax.lbfgs()),
        REAL,
        extra_args=extra_args_with_gradient(),
    ),
    Case(
        "lbfgs-learning_rate-no_linesearch",
        lambda: eqopt.lbfgs(learning_rate=0.3, memory_size=3, linesearch=None),
        lambda: optax.lbfgs(learning_rate=0.3, memory_size=3, linesearch=None),
        NO_LINESEARCH,
        # Random gradients make curvature pairs with a small y.s, and a fixed
        # rate 0.3 without a line search moves the parameters to ~10 in four
        # steps: the two-loop recursion carries each step's rounding into the
        # next (3.5e-4 absolute on entries of ~14 when the order of the sums
        # changes with XLA's optimisation level, as the test suite's compile
        # settings do; the other L-BFGS cases keep the default tolerances).
        atol=1e-3,
    ),
    Case(
        "lbfgs-backtracking",
        lambda: eqopt.lbfgs(
            linesearch=eqopt.scale_by_backtracking_linesearch(15, store_grad=True)
        ),
        lambda: jit_update(
            optax.lbfgs(
                linesearch=optax.scale_by_backtracking_linesearch(15, store_grad=True)
            )
        ),
        REAL,
        extra_args=extra_args_with_gradient(),
    ),
]


# ---------------------------------------------------------------------------
# The full loop of Optax's documentation, on whole Equinox models
# ---------------------------------------------------------------------------


class Rosenbrock(eqx.Module):
    """A model with a non-array leaf, as Equinox models have."""

    x: jax.Array
    activation: Callable = jax.nn.relu
    name: str = "rosenbrock"


def rosenbrock(model: Rosenbrock) -> jax.Array:
    x = model.x
    return jnp.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


START = Rosenbrock(jnp.array([-1.2, 1.0]))


def make_step(opt, loss):
    """One iteration of the documented loop, jitted, counting its traces."""
    value_and_grad = eqopt.value_and_grad_from_state(loss)
    traces = []

    @eqx.filter_jit
    def step(model, state):
        traces.append(None)
        value, grad = value_and_grad(model, state=state)
        updates, state = opt.update(
            grad, state, model, value=value, grad=grad, value_fn=loss
        )
        return eqopt.apply_updates(model, updates), state

    return step, traces


def iterations_to_reach(opt, loss, model, target, max_iterations):
    step, traces = make_step(opt, loss)
    state = opt.init(model)
    for iteration in range(1, max_iterations + 1):  # noqa: B007 (returned)
        model, state = step(model, state)
        if loss(model) < target:
            break
    assert len(traces) == 1, "the jitted loop retraced"
    return iteration, model, state


def test_loop_converges_on_rosenbrock():
    iterations, model, state = iterations_to_reach(
        eqopt.lbfgs(), rosenbrock, START, 1e-10, 60
    )
    assert rosenbrock(model) < 1e-10, rosenbrock(model)
    np.testing.assert_allclose(model.x, [1.0, 1.0], atol=1e-4)
    assert model.activation is jax.nn.relu and model.name == "rosenbrock"
    # The line search's state holds the value at the new params.
    np.testing.assert_allclose(
        state.scale_by_zoom_linesearch.value, rosenbrock(model), rtol=1e-5, atol=1e-12
    )


class Regression(eqx.Module):
    linear: eqx.nn.Linear
    activation: Callable = jax.nn.tanh


def test_loop_solves_least_squares_on_an_equinox_model():
    keys = jax.random.split(jax.random.key(0), 4)
    inputs = jax.random.normal(keys[0], (32, 5))
    targets = inputs @ jax.random.normal(keys[1], (5, 2)) + 0.1 * jax.random.normal(
        keys[2], (32, 2)
    )
    model = Regression(eqx.nn.Linear(5, 2, key=keys[3]))

    def loss(model):
        predictions = jax.vmap(model.linear)(inputs)
        return 0.5 * jnp.mean(jnp.sum((predictions - targets) ** 2, axis=-1))

    _, model, _ = iterations_to_reach(eqopt.lbfgs(), loss, model, -1.0, 25)
    design = jnp.concatenate([inputs, jnp.ones((32, 1))], axis=1)
    solution = jnp.linalg.lstsq(design, targets)[0]
    np.testing.assert_allclose(model.linear.weight, solution[:5].T, atol=1e-4)
    np.testing.assert_allclose(model.linear.bias, solution[5], atol=1e-4)


def test_fewer_iterations_than_adam_on_rosenbrock():
    target = 1e-6
    lbfgs_iterations, model, _ = iterations_to_reach(
        eqopt.lbfgs(), rosenbrock, START, target, 100
    )
    assert rosenbrock(model) < target and lbfgs_iterations < 50

    arrays, static = eqx.partition(START, eqx.is_array)
    steps = 1000

    def adam_losses(learning_rate):
        opt = eqopt.adam(learning_rate)

        def body(carry, _):
            arrays, state = carry
            model = eqx.combine(arrays, static)
            value, grads = eqx.filter_value_and_grad(rosenbrock)(model)
            updates, state = opt.update(grads, state, model)
            model = eqopt.apply_updates(model, updates)
            return (eqx.filter(model, eqx.is_array), state), value

        return jax.lax.scan(body, (arrays, opt.init(START)), length=steps)[1]

    # A sweep over learning rates in one program: the learning rate is a leaf.
    losses = eqx.filter_jit(jax.vmap(adam_losses))(jnp.array([1e-3, 1e-2, 1e-1]))
    reached = np.asarray(losses) < target
    adam_iterations = [int(np.argmax(row)) if row.any() else steps for row in reached]
    assert min(adam_iterations) > 10 * lbfgs_iterations, adam_iterations


# ---------------------------------------------------------------------------
# Parity with Optax's loop
# ---------------------------------------------------------------------------


def _optax_trajectory(opt, loss, params, steps):
    value_and_grad = optax.value_and_grad_from_state(loss)

    @jax.jit
    def step(params, state):
        value, grad = value_and_grad(params, state=state)
        updates, state = opt.update(
            grad, state, params, value=value, grad=grad, value_fn=loss
        )
        return optax.apply_updates(params, updates), state

    state, trajectory = opt.init(params), []
    for _ in range(steps):
        params, state = step(params, state)
        trajectory.append(params["x"])
    return np.array(trajectory)


def _eqopt_trajectory(opt, loss, model, steps):
    step, _ = make_step(opt, loss)
    state, trajectory = opt.init(model), []
    for _ in range(steps):
        model, state = step(model, state)
        trajectory.append(model.x)
    return np.array(trajectory)


@pytest.mark.parametrize(
    "configuration",
    [
        {},
        {"memory_size": 3},
        {"scale_init_precond": False},
        {"linesearch": "backtracking"},
    ],
    ids=["default", "memory3", "unscaled", "backtracking"],
)
def test_same_iterates_as_optax(configuration):
    def build(library):
        arguments = dict(configuration)
        if arguments.get("linesearch") == "backtracking":
            arguments["linesearch"] = library.scale_by_backtracking_linesearch(
                15, store_grad=True
            )
        return library.lbfgs(**arguments)

    model = Rosenbrock(jnp.array([-1.2, 1.0, 0.5, -0.3]))
    steps = 10
    ours = _eqopt_trajectory(build(eqopt), rosenbrock, model, steps)
    theirs = _optax_trajectory(
        build(optax), lambda p: rosenbrock(Rosenbrock(p["x"])), {"x": model.x}, steps
    )
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_bfloat16_follows_optax():
    """In bfloat16, on a convex problem with true gradients, the iterates stay
    within a few ulps of Optax's (see the note on the registry's dtypes)."""
    scales = jnp.array([1.0, 2.0, 5.0, 10.0])

    def loss(params):
        x = params["x"].astype(jnp.float32)
        return 0.5 * jnp.sum(scales * x**2) + jnp.sum(x) + 0.1 * jnp.sum(x**4)

    def trajectory(library):
        opt = library.lbfgs()
        params = {"x": jnp.array([1.0, -2.0, 0.5, 3.0], jnp.bfloat16)}

        @jax.jit
        def step(params, state):
            value, grad = jax.value_and_grad(loss)(params)
            updates, state = opt.update(
                grad, state, params, value=value, grad=grad, value_fn=loss
            )
            return library.apply_updates(params, updates), state

        state, out = opt.init(params), []
        for _ in range(6):
            params, state = step(params, state)
            assert params["x"].dtype == jnp.bfloat16
            out.append(params["x"].astype(jnp.float32))
        return np.array(out)

    np.testing.assert_allclose(trajectory(eqopt), trajectory(optax), atol=2e-2)


# ---------------------------------------------------------------------------
# Structure, frozen leaves and errors
# ---------------------------------------------------------------------------


def test_chain_matches_optax_positions_and_default_linesearch():
    opt = eqopt.lbfgs()
    assert isinstance(opt, eqopt.Chain)
    assert opt.names == ("scale_by_lbfgs", "scale", "scale_by_zoom_linesearch")
    search = opt.scale_by_zoom_linesearch
    assert isinstance(search, eqopt.ScaleByZoomLinesearch)
    assert int(search.max_linesearch_steps) == 20
    assert search.initial_guess_strategy == "one"
    assert isinstance(eqopt.lbfgs(linesearch=None)[2], eqopt.Identity)
    assert isinstance(eqopt.lbfgs(0.1)[1], eqopt.ScaleByLearningRate)
    state = opt.init(START)
    assert isinstance(state.scale_by_lbfgs, eqopt.ScaleByLBFGSState)
    assert state.scale_by_lbfgs.diff_params_memory.x.shape == (10, 2)
    assert state.scale_by_lbfgs.diff_params_memory.activation is None


def test_memory_is_a_ring_of_the_latest_pairs():
    opt = eqopt.scale_by_lbfgs(memory_size=2)
    params = {"x": jnp.array([1.0, 2.0, 3.0])}
    state = opt.init(params)
    history = []
    for _ in range(4):
        history.append(params["x"])
        grads = {"x": params["x"] * jnp.array([1.0, 2.0, 3.0])}
        updates, state = opt.update(grads, state, params)
        params = eqopt.apply_updates(params, eqopt.tree.scale(-0.1, updates))
    # The pairs of steps 1, 2 and 3 went to slots 0, 1, 0: slot 0 holds the newest.
    assert int(state.count) == 4
    memory = state.diff_params_memory["x"]
    np.testing.assert_allclose(memory[0], history[3] - history[2], rtol=1e-6)
    np.testing.assert_allclose(memory[1], history[2] - history[1], rtol=1e-6)
    # A convex quadratic gives positive curvature pairs.
    assert np.all(np.asarray(state.weights_memory) > 0)


def test_frozen_leaf_is_left_alone():
    class TwoPart(eqx.Module):
        x: jax.Array
        frozen: jax.Array

    def loss(model):
        return rosenbrock(Rosenbrock(model.x)) + jnp.sum(model.frozen**2)

    model = TwoPart(jnp.array([-1.2, 1.0]), jnp.array([3.0]))
    opt = eqopt.lbfgs()
    state = opt.init(model)

    @eqx.filter_jit
    def step(model, state):
        value, grad = eqx.filter_value_and_grad(loss)(model)
        grad = eqx.tree_at(lambda g: g.frozen, grad, None)
        updates, state = opt.update(
            grad, state, model, value=value, grad=grad, value_fn=loss
        )
        assert updates.frozen is None
        return eqopt.apply_updates(model, updates), state

    for _ in range(40):
        model, state = step(model, state)
    np.testing.assert_array_equal(model.frozen, [3.0])
    np.testing.assert_allclose(model.x, [1.0, 1.0], atol=1e-3)


def test_linesearch_without_value_fn_is_one_clear_error():
    opt = eqopt.lbfgs()
    state = opt.init(START)
    value, grad = eqx.filter_value_and_grad(rosenbrock)(START)
    with pytest.raises(TypeError, match=r"`value_fn` was not given.*value_fn=loss_fn"):
        opt.update(grad, state, START, value=value, grad=grad)
    with pytest.raises(TypeError, match="`value`, `grad`, `value_fn`"):
        opt.update(grad, state, START)


def test_mismatched_grad_names_the_leaf():
    opt = eqopt.lbfgs()
    state = opt.init(START)
    value, grad = eqx.filter_value_and_grad(rosenbrock)(START)
    wrong = eqx.tree_at(lambda g: g.x, grad, jnp.zeros(3))
    with pytest.raises(ValueError, match=r"`grad` at \.x has shape \(3,\)"):
        opt.update(grad, state, START, value=value, grad=wrong, value_fn=rosenbrock)


def test_scale_by_lbfgs_needs_params_and_a_positive_memory():
    opt = eqopt.scale_by_lbfgs()
    grads = eqx.filter_grad(rosenbrock)(START)
    with pytest.raises(TypeError, match="needs `params`"):
        opt.update(grads, opt.init(START))
    with pytest.raises(ValueError, match="memory_size"):
        eqopt.scale_by_lbfgs(memory_size=0)
