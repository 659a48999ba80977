"""Gradient accumulation: `MultiSteps` and `apply_every`, beyond the registry."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Case, assert_tree_allclose, make_model, random_grads

import eqopt


def _k_schedule(gradient_step):
    return gradient_step % 3 + 1


TRANSFORM_CASES = [
    Case(
        "multi_steps-3",
        lambda: eqopt.MultiSteps(eqopt.adam(1e-2), every_k_schedule=3),
        lambda: optax.MultiSteps(optax.adam(1e-2), every_k_schedule=3),
        steps=7,
    ),
    Case(
        "multi_steps-1",
        lambda: eqopt.MultiSteps(eqopt.adam(1e-2), every_k_schedule=1),
        lambda: optax.MultiSteps(optax.adam(1e-2), every_k_schedule=1),
    ),
    Case(
        "multi_steps-schedule-sum",
        lambda: eqopt.MultiSteps(
            eqopt.sgd(0.1, momentum=0.9), _k_schedule, use_grad_mean=False
        ),
        lambda: optax.MultiSteps(
            optax.sgd(0.1, momentum=0.9), _k_schedule, use_grad_mean=False
        ),
        steps=8,
    ),
    Case(
        "multi_steps-skip_not_finite",
        lambda: eqopt.MultiSteps(
            eqopt.adam(1e-2), 2, should_skip_update_fn=eqopt.skip_not_finite
        ),
        lambda: optax.MultiSteps(
            optax.adam(1e-2), 2, should_skip_update_fn=optax.skip_not_finite
        ),
    ),
    Case(
        "multi_steps-skip_large_updates",
        lambda: eqopt.MultiSteps(
            eqopt.sgd(0.1),
            2,
            should_skip_update_fn=functools.partial(
                eqopt.skip_large_updates, max_squared_norm=20.0
            ),
        ),
        lambda: optax.MultiSteps(
            optax.sgd(0.1),
            2,
            should_skip_update_fn=functools.partial(
                optax.skip_large_updates, max_squared_norm=20.0
            ),
        ),
        steps=6,
    ),
    Case(
        "apply_every-3",
        lambda: eqopt.apply_every(3),
        lambda: optax.apply_every(3),
        ("float32", "bfloat16", "complex64"),
        steps=7,
        needs_params=False,
    ),
]


# ---------------------------------------------------------------------------
# MultiSteps over k micro-batches equals one step on the whole batch
# ---------------------------------------------------------------------------


def _mlp():
    return eqx.nn.MLP(3, 2, width_size=8, depth=2, key=jax.random.key(0))


def _loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def _batch(seed, size):
    kx, ky = jax.random.split(jax.random.key(seed))
    return jax.random.normal(kx, (size, 3)), jax.random.normal(ky, (size, 2))


def test_multi_steps_equals_big_batch_adam():
    k, micro = 4, 5
    model = big = _mlp()
    opt = eqopt.MultiSteps(eqopt.adam(1e-2), every_k_schedule=k)
    reference = eqopt.adam(1e-2)
    state, reference_state = opt.init(model), reference.init(big)

    @eqx.filter_jit
    def step(opt, model, state, x, y):
        grads = eqx.filter_grad(_loss)(model, x, y)
        updates, state = opt.update(grads, state, model)
        return eqopt.apply_updates(model, updates), state, updates

    for round_ in range(2):
        x, y = _batch(round_, k * micro)
        for i in range(k):
            rows = slice(i * micro, (i + 1) * micro)
            model, state, updates = step(opt, model, state, x[rows], y[rows])
            assert bool(opt.has_updated(state)) == (i == k - 1)
            if i < k - 1:
                arrays = jax.tree.leaves(eqx.filter(updates, eqx.is_array))
                assert not any(bool(jnp.any(leaf)) for leaf in arrays)
        big, reference_state, _ = step(reference, big, reference_state, x, y)
        assert_tree_allclose(
            eqx.filter(model, eqx.is_array),
            eqx.filter(big, eqx.is_array),
            rtol=1e-5,
            atol=1e-6,
        )
    # The activation functions (non-array leaves) came through untouched.
    assert model.activation is big.activation
    assert int(state.gradient_step) == 2


def test_every_k_one_keeps_no_buffer():
    model = make_model()
    opt = eqopt.MultiSteps(eqopt.adam(1e-2), every_k_schedule=1)
    inner = eqopt.adam(1e-2)
    state, inner_state = opt.init(model), inner.init(model)
    assert state.acc_grads is None
    # Optax keeps a buffer the size of the params.
    optax_state = optax.MultiSteps(optax.adam(1e-2), 1).init({"w": model.w})
    assert optax_state.acc_grads["w"].shape == model.w.shape
    for step in range(2):
        grads = random_grads(model, step)
        updates, state = opt.update(grads, state, model)
        expected, inner_state = inner.update(grads, inner_state, model)
        assert state.acc_grads is None
        assert_tree_allclose(updates, expected, rtol=0, atol=0)
        assert bool(opt.has_updated(state))
    assert int(state.gradient_step) == 2 and int(state.mini_step) == 0


def test_jit_and_scan_without_retrace():
    model = make_model()
    opt = eqopt.MultiSteps(eqopt.adam(1e-2), every_k_schedule=3)
    traces = []

    @eqx.filter_jit
    def run(opt, model, state, grads):
        traces.append(None)

        arrays, static = eqx.partition(model, eqx.is_array)

        def body(carry, g):
            model = eqx.combine(carry[0], static)
            updates, state = opt.update(g, carry[1], model)
            model = eqopt.apply_updates(model, updates)
            carry = (eqx.filter(model, eqx.is_array), state)
            return carry, opt.has_updated(state)

        (arrays, state), updated = jax.lax.scan(body, (arrays, state), grads)
        return (eqx.combine(arrays, static), state), updated

    grads = jax.tree.map(
        lambda *xs: None if xs[0] is None else jnp.stack(xs),
        *[random_grads(model, i) for i in range(6)],
        is_leaf=lambda x: x is None,
    )
    state = opt.init(model)
    (model_a, state_a), updated = run(opt, model, state, grads)
    np.testing.assert_array_equal(updated, [False, False, True] * 2)
    faster = eqx.tree_at(lambda o: o.opt[-1].learning_rate, opt, eqopt.as_scalar(5e-2))
    (model_b, _), _ = run(faster, model_a, state_a, grads)
    assert len(traces) == 1
    assert not np.allclose(model_a.w, model_b.w)
    # The same numbers as stepping one at a time, outside jit.
    state = opt.init(model)
    for i in range(6):
        updates, state = opt.update(random_grads(model, i), state, model)
        model = eqopt.apply_updates(model, updates)
    assert_tree_allclose(
        eqx.filter(model, eqx.is_array), eqx.filter(model_a, eqx.is_array), rtol=1e-6
    )


@pytest.mark.parametrize(
    "bad", [2.5, 3.0, True, "4", jnp.asarray(2.0), np.float32(2.0)]
)
def test_non_integer_every_k_is_one_clear_error(bad):
    with pytest.raises(TypeError, match="`every_k_schedule` must be a positive int"):
        eqopt.MultiSteps(eqopt.adam(1e-2), every_k_schedule=bad)


def test_every_k_below_one_is_an_error():
    with pytest.raises(ValueError, match="at least 1"):
        eqopt.MultiSteps(eqopt.adam(1e-2), every_k_schedule=0)


def test_every_k_accepts_integer_arrays_and_schedules():
    assert eqopt.MultiSteps(eqopt.sgd(0.1), np.int64(4)).every_k_schedule == 4
    assert eqopt.MultiSteps(eqopt.sgd(0.1), jnp.asarray(2)).every_k_schedule == 2
    schedule = eqopt.schedules.constant_schedule(2)
    assert eqopt.MultiSteps(eqopt.sgd(0.1), schedule).every_k_schedule is schedule


def test_schedule_varies_the_number_of_mini_steps():
    # k = 1, 2, 3, 1, 2, 3... inner updates.
    opt = eqopt.MultiSteps(eqopt.sgd(1.0), _k_schedule)
    params = {"w": jnp.zeros(2)}
    state = opt.init(params)
    pattern = []
    for _ in range(12):
        _, state = opt.update({"w": jnp.ones(2)}, state, params)
        pattern.append(bool(opt.has_updated(state)))
    assert pattern == [True, False, True, False, False, True] * 2


def test_skipped_mini_step_is_ignored():
    opt = eqopt.MultiSteps(
        eqopt.sgd(1.0), 2, should_skip_update_fn=eqopt.skip_not_finite
    )
    params = {"w": jnp.zeros(3)}
    state = opt.init(params)
    assert int(state.skip_state["num_not_finite"]) == 0
    _, state = opt.update({"w": jnp.array([1.0, 2.0, 3.0])}, state, params)
    updates, skipped = opt.update({"w": jnp.array([1.0, jnp.nan, 3.0])}, state, params)
    np.testing.assert_array_equal(updates["w"], 0.0)
    assert int(skipped.mini_step) == 1 and int(skipped.gradient_step) == 0
    assert int(skipped.skip_state["num_not_finite"]) == 1
    np.testing.assert_array_equal(skipped.acc_grads["w"], state.acc_grads["w"])
    updates, state = opt.update({"w": jnp.array([3.0, 4.0, 5.0])}, skipped, params)
    np.testing.assert_allclose(updates["w"], [-2.0, -3.0, -4.0])


def test_complex_gradients_keep_their_imaginary_part():
    """A deliberate difference: Optax accumulates in float32 and drops the imaginary part."""
    opt = eqopt.MultiSteps(eqopt.sgd(1.0), 2)
    params = {"w": jnp.zeros(2, jnp.complex64)}
    state = opt.init(params)
    assert state.acc_grads["w"].dtype == jnp.complex64
    grads = {"w": jnp.array([1 + 2j, 3 - 1j], jnp.complex64)}
    _, state = opt.update(grads, state, params)
    updates, state = opt.update(grads, state, params)
    np.testing.assert_allclose(updates["w"], -grads["w"])


def test_accumulator_dtype():
    params = {"w": jnp.zeros(2, jnp.bfloat16)}
    state = eqopt.MultiSteps(eqopt.sgd(1.0), 2).init(params)
    assert state.acc_grads["w"].dtype == jnp.float32
    state = eqopt.MultiSteps(eqopt.sgd(1.0), 2, accumulator_dtype=None).init(params)
    assert state.acc_grads["w"].dtype == jnp.bfloat16


def test_gradient_transformation_is_the_wrapper():
    opt = eqopt.MultiSteps(eqopt.adam(1e-2), 2)
    assert opt.gradient_transformation() is opt
    assert isinstance(opt, eqopt.AbstractGradientTransformation)
    assert opt.elementwise
    skip = eqopt.MultiSteps(
        eqopt.adam(1e-2), 2, should_skip_update_fn=lambda *a: (False, ())
    )
    assert not skip.elementwise


def test_optax_inner_pair_and_extra_args():
    seen = []

    def update(updates, state, params=None, **extra):
        seen.append(sorted(extra))
        return updates, state

    opt = eqopt.MultiSteps(
        optax.GradientTransformationExtraArgs(lambda p: (), update), 2
    )
    params = {"w": jnp.ones(2)}
    state = opt.init(params)
    for _ in range(2):
        _, state = opt.update(params, state, params, loss=jnp.asarray(1.0))
    assert ["loss"] in seen


def test_state_from_elsewhere_is_a_clear_error():
    opt = eqopt.MultiSteps(eqopt.sgd(0.1), 2)
    params = {"w": jnp.ones(2)}
    with pytest.raises(TypeError, match="MultiStepsState"):
        opt.update(params, eqopt.sgd(0.1).init(params), params)
    one = eqopt.MultiSteps(eqopt.sgd(0.1), 1).init(params)
    with pytest.raises(ValueError, match="no accumulation buffer"):
        opt.update(params, one, params)


# ---------------------------------------------------------------------------
# apply_every
# ---------------------------------------------------------------------------


def test_apply_every_sums_and_emits_every_k():
    tx = eqopt.apply_every(k=3)
    params = {"w": jnp.zeros(2)}
    state = tx.init(params)
    emitted = []
    for step in range(6):
        updates, state = tx.update({"w": jnp.full(2, step + 1.0)}, state)
        emitted.append(float(updates["w"][0]))
    assert emitted == [0.0, 0.0, 6.0, 0.0, 0.0, 15.0]
    assert isinstance(state, eqopt.ApplyEveryState)


def test_apply_every_k_is_a_dynamic_leaf_and_checked():
    tx = eqopt.apply_every(2)
    assert eqx.is_array(tx.k)
    with pytest.raises(ValueError, match="`k`"):
        eqopt.apply_every(0)
    with pytest.raises(TypeError):
        eqopt.apply_every(1.5)  # pyright: ignore[reportArgumentType]


def test_every_k_one_with_a_skip_rule_and_a_float_schedule():
    params = {"w": jnp.zeros(2)}
    opt = eqopt.MultiSteps(
        eqopt.sgd(1.0), 1, should_skip_update_fn=eqopt.skip_not_finite
    )
    state = opt.init(params)
    assert state.acc_grads is None
    updates, state = opt.update({"w": jnp.array([jnp.nan, 1.0])}, state, params)
    np.testing.assert_array_equal(updates["w"], 0.0)
    assert int(state.gradient_step) == 0
    updates, state = opt.update({"w": jnp.array([2.0, 1.0])}, state, params)
    np.testing.assert_array_equal(updates["w"], [-2.0, -1.0])
    # eqopt's schedules return floats: 2.0 mini-steps per update.
    opt = eqopt.MultiSteps(eqopt.sgd(1.0), eqopt.schedules.constant_schedule(2))
    state = opt.init(params)
    pattern = []
    for _ in range(4):
        _, state = opt.update({"w": jnp.ones(2)}, state, params)
        pattern.append(bool(opt.has_updated(state)))
    assert pattern == [False, True, False, True]


def test_a_leaf_without_gradient_on_a_mini_step():
    # Found by test_properties: a param with an array but a `None` gradient gave
    # branches of different structures (the skip branch kept the buffer's array,
    # accumulating gave `None`). A missing gradient adds zero to the buffer, and
    # the update is `None` there.
    params = {"w": jnp.ones(3), "extra": jnp.asarray(1.5)}
    opt = eqopt.MultiSteps(
        eqopt.sgd(1.0),
        every_k_schedule=2,
        should_skip_update_fn=eqopt.skip_not_finite,
    )
    state = opt.init(params)
    step = eqx.filter_jit(opt.update)
    updates, state = step({"w": jnp.ones(3), "extra": jnp.asarray(2.0)}, state, params)
    assert updates["extra"] is not None
    updates, state = step({"w": jnp.ones(3), "extra": None}, state, params)
    assert updates["extra"] is None
    np.testing.assert_allclose(updates["w"], -jnp.ones(3))
    np.testing.assert_allclose(state.acc_grads["extra"], 0.0)
