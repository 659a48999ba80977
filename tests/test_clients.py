"""eqopt in the libraries that expect Optax: Flax NNX, Flax's TrainState, Optimistix,
Orbax checkpoints, and Optax transforms inside eqopt.

Each test trains a small model for a few steps with an eqopt transform and with
the Optax one, and compares the numbers. A library that is not installed skips
its test (the `tests` extra installs them all).
"""

import pathlib
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqopt

# eqopt stores `b2` as a float32 leaf, so Adam's `1 - b2` differs from Optax's
# by a relative 1e-5 (see test_adam.py::test_adam_complement_rounding).
RTOL = 1e-5
ATOL = 1e-6
STEPS = 4


def _data():
    x = jax.random.normal(jax.random.key(1), (8, 3))
    y = jnp.sin(x @ jnp.array([[1.0], [-2.0], [0.5]]))
    return x, y


def test_flax_nnx_optimizer_with_to_optax():
    nnx = pytest.importorskip("flax.nnx")
    x, y = _data()

    def train(tx):
        model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

        @nnx.jit
        def step(model, optimizer):
            loss_fn = lambda m: jnp.mean((m(x) - y) ** 2)
            loss, grads = nnx.value_and_grad(loss_fn)(model)
            optimizer.update(model, grads)
            return loss

        losses = [step(model, optimizer) for _ in range(STEPS)]
        return jnp.stack(losses), model.kernel[...], model.bias[...]

    ours = train(eqopt.to_optax(eqopt.adam(1e-2)))
    theirs = train(optax.adam(1e-2))
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    # The eqopt transform itself holds arrays, which NNX refuses as a static
    # attribute: `to_optax` is the supported way.
    with pytest.raises(ValueError, match="static"):
        nnx.Optimizer(
            nnx.Linear(3, 1, rngs=nnx.Rngs(0)), eqopt.adam(1e-2), wrt=nnx.Param
        )


def test_flax_train_state_with_eqopt_transform():
    train_state = pytest.importorskip("flax.training.train_state")
    x, y = _data()
    params = {"w": jnp.zeros((3, 1)), "b": jnp.zeros(1)}
    apply_fn = lambda p, x: x @ p["w"] + p["b"][None]

    @jax.jit
    def step(state):
        loss_fn = lambda p: jnp.mean((state.apply_fn(p, x) - y) ** 2)
        grads = jax.grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads)

    def train(tx):
        state = train_state.TrainState.create(apply_fn=apply_fn, params=params, tx=tx)
        for _ in range(STEPS):
            state = step(state)
        return state

    ours = train(eqopt.adamw(1e-2, weight_decay=1e-2))
    theirs = train(optax.adamw(1e-2, weight_decay=1e-2))
    assert int(ours.step) == STEPS
    np.testing.assert_allclose(
        ours.params["w"], theirs.params["w"], rtol=RTOL, atol=ATOL
    )
    np.testing.assert_allclose(
        ours.params["b"], theirs.params["b"], rtol=RTOL, atol=ATOL
    )
    # The eqopt state is readable by name.
    assert int(ours.opt_state.scale_by_adam.count) == STEPS


def test_optimistix_optax_minimiser_with_eqopt_transform():
    optx = pytest.importorskip("optimistix")

    def rosenbrock(y, args):
        return (1 - y[0]) ** 2 + 100 * (y[1] - y[0] ** 2) ** 2

    def minimise(tx):
        solver = optx.OptaxMinimiser(tx, rtol=1e-12, atol=1e-12)
        return optx.minimise(
            rosenbrock, solver, jnp.array([-1.0, 1.0]), max_steps=50, throw=False
        ).value

    ours = minimise(eqopt.sgd(1e-3, momentum=0.9))
    theirs = minimise(optax.sgd(1e-3, momentum=0.9))
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=ATOL)
    assert rosenbrock(ours, None) < rosenbrock(jnp.array([-1.0, 1.0]), None)


def test_orbax_round_trip_continues_bit_identically(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    x, y = _data()
    model = eqx.nn.MLP(3, 1, 4, 1, key=jax.random.key(0))
    opt = eqopt.chain(eqopt.clip_by_global_norm(1.0), eqopt.adam(1e-2))

    @eqx.filter_jit
    def step(model, state):
        loss_fn = lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2)
        grads = eqx.filter_grad(loss_fn)(model)
        updates, state = opt.update(grads, state, model)
        return eqopt.apply_updates(model, updates), state

    def train(model, state, steps):
        for _ in range(steps):
            model, state = step(model, state)
        return model, state

    state = opt.init(model)
    model, state = train(model, state, 2)
    # Save the arrays of the model and the optimiser state mid-training.
    arrays = eqx.filter((model, state), eqx.is_array)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "checkpoint", arrays)
    checkpointer.wait_until_finished()
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, arrays)
    restored = checkpointer.restore(tmp_path / "checkpoint", target)
    restored_model, restored_state = eqx.combine(
        restored, eqx.filter((model, state), eqx.is_array, inverse=True)
    )
    assert isinstance(restored_state, eqopt.ChainState)
    assert int(restored_state.chain.scale_by_adam.count) == 2

    continued, _ = train(restored_model, restored_state, 2)
    uninterrupted, _ = train(model, state, 2)
    for a, b in zip(
        jax.tree.leaves(eqx.filter(continued, eqx.is_array)),
        jax.tree.leaves(eqx.filter(uninterrupted, eqx.is_array)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)

    # And the run matches Optax's on the same (filtered) model.
    reference = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    params = eqx.filter(eqx.nn.MLP(3, 1, 4, 1, key=jax.random.key(0)), eqx.is_array)
    reference_state = reference.init(params)
    static = eqx.filter(model, eqx.is_array, inverse=True)
    for _ in range(4):
        loss_fn = lambda p: jnp.mean((jax.vmap(eqx.combine(p, static))(x) - y) ** 2)
        grads = jax.grad(loss_fn)(params)
        updates, reference_state = reference.update(grads, reference_state, params)
        params = optax.apply_updates(params, updates)
    for a, b in zip(
        jax.tree.leaves(eqx.filter(continued, eqx.is_array)),
        jax.tree.leaves(params),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_optax_stateful_transform_in_eqopt_chain_with_from_optax():
    x, y = _data()
    model = eqx.nn.MLP(3, 1, 4, 1, key=jax.random.key(0))  # functions among its leaves
    loss_fn = lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2)
    opt = eqopt.chain(
        eqopt.clip_by_global_norm(1.0), eqopt.from_optax(optax.adam(1e-2))
    )
    reference = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))

    @eqx.filter_jit
    def step(model, state):
        grads = eqx.filter_grad(loss_fn)(model)
        updates, state = opt.update(grads, state, model)
        return eqopt.apply_updates(model, updates), state

    params = eqx.filter(model, eqx.is_array)
    static = eqx.filter(model, eqx.is_array, inverse=True)
    state, reference_state = opt.init(model), reference.init(params)
    for _ in range(STEPS):
        model, state = step(model, state)
        grads = jax.grad(lambda p: loss_fn(eqx.combine(p, static)))(params)
        updates, reference_state = reference.update(grads, reference_state, params)
        params = optax.apply_updates(params, updates)
    # The same transform and the same arithmetic: identical numbers.
    for a, b in zip(
        jax.tree.leaves(eqx.filter(model, eqx.is_array)),
        jax.tree.leaves(params),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # Optax's own state is kept inside, with its count.
    inner = state.from_optax.inner_state
    assert int(inner[0].count) == STEPS
    assert model.activation is jax.nn.relu


def test_coming_from_optax_nnx_example_runs():
    """The Flax NNX example of docs/coming-from-optax.md runs as written."""
    pytest.importorskip("flax.nnx")
    page = pathlib.Path(__file__).parent.parent / "docs" / "coming-from-optax.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    (example,) = [block for block in blocks if "nnx.Optimizer(" in block]
    namespace = {}
    exec(compile(example, str(page), "exec"), namespace)
    assert isinstance(namespace["optimizer"].opt_state, eqopt.ChainState)


def test_optax_combinators_take_eqopt_transforms():
    """`optax.chain` unpacks each part as `(init, update)`: eqopt transforms allow it."""
    params = {"a": jnp.linspace(-1.0, 1.0, 3)}
    grads = {"a": jnp.array([0.5, -2.0, 1.0])}

    def run(inner):
        tx = optax.chain(optax.clip(1.0), inner)
        state = tx.init(params)
        for _ in range(STEPS):
            updates, state = tx.update(grads, state, params)
        return updates

    ours, theirs = run(eqopt.adam(1e-2)), run(optax.adam(1e-2))
    np.testing.assert_allclose(ours["a"], theirs["a"], rtol=RTOL, atol=ATOL)
