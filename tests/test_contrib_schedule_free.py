"""Schedule-free optimisation (`eqopt.contrib.schedule_free*`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import mse, regression_data, train
from helpers import Case, as_dict, make_model, random_grads

import eqopt

ALL_DTYPES = ("float32", "bfloat16", "complex64")

TRANSFORM_CASES = [
    Case(
        "contrib.schedule_free_adamw",
        lambda: eqopt.contrib.schedule_free_adamw(0.1, weight_decay=0.01),
        lambda: optax.contrib.schedule_free_adamw(0.1, weight_decay=0.01),
        ALL_DTYPES,
    ),
    Case(
        "contrib.schedule_free_adamw-warmup",
        lambda: eqopt.contrib.schedule_free_adamw(0.1, warmup_steps=3, b1=0.8),
        lambda: optax.contrib.schedule_free_adamw(0.1, warmup_steps=3, b1=0.8),
        ALL_DTYPES,
    ),
    Case(
        "contrib.schedule_free_sgd",
        lambda: eqopt.contrib.schedule_free_sgd(0.1, weight_decay=0.01),
        lambda: optax.contrib.schedule_free_sgd(0.1, weight_decay=0.01),
        ALL_DTYPES,
    ),
    Case(
        "contrib.schedule_free-adam-state-dtype",
        lambda: eqopt.contrib.schedule_free(
            eqopt.adam(0.1), 0.1, b1=0.75, weight_lr_power=1.0, state_dtype="float32"
        ),
        lambda: optax.contrib.schedule_free(
            optax.adam(0.1), 0.1, b1=0.75, weight_lr_power=1.0, state_dtype="float32"
        ),
    ),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_eval_params_match_optax(dtype):
    model = make_model(jnp.dtype(dtype))
    params = as_dict(model)
    tx = eqopt.contrib.schedule_free_adamw(0.1, warmup_steps=2)
    reference = optax.contrib.schedule_free_adamw(0.1, warmup_steps=2)
    state, reference_state = tx.init(model), reference.init(params)
    for step in range(4):
        grads = random_grads(model, step)
        updates, state = tx.update(grads, state, model)
        reference_updates, reference_state = reference.update(
            as_dict(grads), reference_state, params
        )
        model = eqopt.apply_updates(model, updates)
        params = optax.apply_updates(params, reference_updates)
    ours = eqopt.contrib.schedule_free_eval_params(state, model)
    theirs = optax.contrib.schedule_free_eval_params(reference_state, params)
    tolerance = 2e-2 if dtype == "bfloat16" else 1e-5
    for name in ("w", "b", "s"):
        np.testing.assert_allclose(
            np.asarray(getattr(ours, name), np.float32),
            np.asarray(theirs[name], np.float32),
            rtol=tolerance,
            atol=tolerance,
        )
    # The non-array leaves of the model come back untouched.
    assert ours.activation is model.activation and ours.name == model.name
    assert ours.w.dtype == model.w.dtype


def test_eval_params_differ_from_train_params_and_are_what_you_evaluate():
    x, y = regression_data()
    opt = eqopt.contrib.schedule_free_adamw(1e-2, warmup_steps=10)
    first, _, model, state = train(opt, 150)
    evaluation = eqopt.contrib.schedule_free_eval_params(state, model)
    # x_t and y_t are different points ...
    difference = jax.tree.leaves(
        jax.tree.map(
            lambda a, b: float(jnp.max(jnp.abs(a - b))),
            eqx.filter(evaluation, eqx.is_inexact_array),
            eqx.filter(model, eqx.is_inexact_array),
        )
    )
    assert max(difference) > 1e-3
    # ... and x_t, the average, is a trained model.
    assert float(mse(evaluation, x, y)) < 0.1 * first
    # y = b1 x + (1 - b1) z, the interpolation the gradients are taken at.
    z = state.z
    for y_leaf, x_leaf, z_leaf in zip(
        jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)),
        jax.tree.leaves(eqx.filter(evaluation, eqx.is_inexact_array)),
        jax.tree.leaves(z),
        strict=True,
    ):
        np.testing.assert_allclose(y_leaf, 0.9 * x_leaf + 0.1 * z_leaf, atol=1e-5)


def test_first_step_is_the_base_step():
    """At the first step c = 1, so x = z and y moves by the base optimiser's update."""
    model = make_model()
    grads = random_grads(model, 0)
    tx = eqopt.contrib.schedule_free_sgd(0.1)
    updates, state = tx.update(grads, tx.init(model), model)
    np.testing.assert_allclose(updates.w, -0.1 * grads.w, rtol=1e-5, atol=1e-6)
    assert int(state.step_count) == 2 and float(state.weight_sum) == pytest.approx(0.01)


def test_eval_params_found_inside_a_chain():
    model = make_model()
    opt = eqopt.chain(
        eqopt.clip_by_global_norm(1.0), eqopt.contrib.schedule_free_sgd(0.1)
    )
    state = opt.init(model)
    updates, state = opt.update(random_grads(model, 0), state, model)
    model = eqopt.apply_updates(model, updates)
    evaluation = eqopt.contrib.schedule_free_eval_params(state, model)
    direct = eqopt.contrib.schedule_free_eval_params(state[1], model)
    np.testing.assert_array_equal(evaluation.w, direct.w)
    with pytest.raises(ValueError, match="ScheduleFreeState"):
        eqopt.contrib.schedule_free_eval_params(eqopt.adam(0.1).init(model), model)


def test_learning_rate_schedule_weights_the_average():
    """With a schedule the largest learning rate so far sets the averaging weight."""
    model = make_model()
    schedule = eqopt.linear_schedule(0.0, 1.0, 4)
    tx = eqopt.contrib.schedule_free(eqopt.sgd(0.1), schedule, weight_lr_power=2.0)
    state = tx.init(model)
    weights = []
    for step in range(3):
        _, state = tx.update(random_grads(model, step), state, model)
        weights.append(float(state.weight_sum))
    # step_count starts at 1: the rates are 0.25, 0.5, 0.75.
    np.testing.assert_allclose(
        weights, np.cumsum([0.25**2, 0.5**2, 0.75**2]), rtol=1e-6
    )


def test_schedule_free_trains_small_model():
    first, last, _, _ = train(eqopt.contrib.schedule_free_sgd(0.1), 150)
    assert last < 0.6 * first
    first, last, _, _ = train(eqopt.contrib.schedule_free_adamw(1e-2), 150)
    assert last < 0.1 * first


def test_needs_params():
    model = make_model()
    tx = eqopt.contrib.schedule_free_sgd()
    with pytest.raises(ValueError, match="params"):
        tx.update(random_grads(model, 0), tx.init(model))
