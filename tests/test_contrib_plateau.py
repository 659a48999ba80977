"""`eqopt.contrib.reduce_on_plateau`."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case, make_model, random_grads

import eqopt

ALL_DTYPES = ("float32", "bfloat16", "complex64")


def _constant_value(model, grads):
    return {"value": jnp.asarray(1.0)}


def _value_from_grads(model, grads):
    return {"value": jnp.sum(jnp.real(grads.w) if hasattr(grads, "w") else 0.0)}


TRANSFORM_CASES = [
    # A flat value: best at step 1, then a reduction every `patience` steps
    # outside the cooldown.
    Case(
        "contrib.reduce_on_plateau",
        lambda: eqopt.contrib.reduce_on_plateau(factor=0.5, patience=1, cooldown=1),
        lambda: optax.contrib.reduce_on_plateau(factor=0.5, patience=1, cooldown=1),
        ALL_DTYPES,
        extra_args=_constant_value,
        steps=6,
        needs_params=False,
    ),
    Case(
        "contrib.reduce_on_plateau-accumulate",
        lambda: eqopt.contrib.reduce_on_plateau(
            patience=1, accumulation_size=2, rtol=0.0, atol=0.1, min_scale=0.05
        ),
        lambda: optax.contrib.reduce_on_plateau(
            patience=1, accumulation_size=2, rtol=0.0, atol=0.1, min_scale=0.05
        ),
        extra_args=_value_from_grads,
        steps=8,
        needs_params=False,
    ),
]

# Improvements, then plateaus (flat and noisy-but-not-better), then improvement.
LOSSES = [
    5.0, 4.0, 3.0, 3.0, 3.0, 3.0, 2.9999, 3.1, 3.0, 2.0, 2.0, 2.0, 2.0, 2.0,
    1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5,
]  # fmt: skip


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(factor=0.5, patience=2),
        dict(factor=0.5, patience=2, cooldown=2, rtol=0.1),
        dict(factor=0.1, patience=1, accumulation_size=2, min_scale=0.01),
        dict(factor=0.8, patience=3, rtol=0.0, atol=0.05, cooldown=1),
    ],
)
def test_parity_over_a_loss_sequence_with_plateaus(kwargs):
    params = {"w": jnp.ones(3)}
    tx = eqopt.contrib.reduce_on_plateau(**kwargs)
    reference = optax.contrib.reduce_on_plateau(**kwargs)
    state, reference_state = tx.init(params), reference.init(params)
    update, reference_update = jax.jit(tx.update), jax.jit(reference.update)
    scales = []
    for loss in LOSSES:
        updates, state = update(params, state, value=jnp.asarray(loss))
        reference_updates, reference_state = reference_update(
            params, reference_state, value=jnp.asarray(loss)
        )
        np.testing.assert_allclose(updates["w"], reference_updates["w"], rtol=1e-6)
        for field in (
            "scale",
            "best_value",
            "plateau_count",
            "cooldown_count",
            "count",
            "avg_value",
        ):
            np.testing.assert_allclose(
                getattr(state, field), getattr(reference_state, field), rtol=1e-6
            )
        scales.append(float(state.scale))
    assert min(scales) < 1.0  # the sequence does reduce the scale


def test_scale_drops_after_patience_flat_steps():
    params = {"w": jnp.ones(2)}
    tx = eqopt.contrib.reduce_on_plateau(factor=0.5, patience=3)
    state = tx.init(params)
    update = jax.jit(tx.update)
    scales = []
    for loss in [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]:
        updates, state = update(params, state, value=loss)
        scales.append(float(state.scale))
        np.testing.assert_allclose(updates["w"], scales[-1])
    # Step 1 sets the best value; steps 2, 3, 4 are flat: the third flat step
    # (= patience) halves the scale; three more flat steps halve it again.
    assert scales == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25]


def test_cooldown_and_min_scale():
    params = {"w": jnp.ones(2)}
    tx = eqopt.contrib.reduce_on_plateau(
        factor=0.5, patience=1, cooldown=2, min_scale=0.2
    )
    state, update = tx.init(params), jax.jit(tx.update)
    scales = []
    for _ in range(9):
        _, state = update(params, state, value=1.0)
        scales.append(float(state.scale))
    # Reduce, then two evaluations of cooldown, then reduce again, floored at 0.2.
    np.testing.assert_allclose(scales, [1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.2, 0.2])


def test_improvement_resets_the_count():
    params = {"w": jnp.ones(2)}
    tx = eqopt.contrib.reduce_on_plateau(factor=0.5, patience=2)
    state, update = tx.init(params), jax.jit(tx.update)
    for loss in [3.0, 3.0, 2.0, 2.0, 1.0, 1.0]:
        _, state = update(params, state, value=loss)
    assert float(state.scale) == 1.0 and float(state.best_value) == 1.0


def test_chained_after_adam_on_a_whole_model_under_jit():
    """The scale lives in the state; the loss is passed as `value` through the chain."""
    opt = eqopt.chain(
        eqopt.adam(1e-2), eqopt.contrib.reduce_on_plateau(factor=0.5, patience=5)
    )
    first, last, _, state = train(
        opt, 120, extra=lambda model, x, y, loss: {"value": loss}
    )
    assert last < 0.1 * first
    plateau_state = state[1]
    assert 0.0 < float(plateau_state.scale) <= 1.0


def test_scale_reduces_while_training_stalls():
    model = make_model()
    opt = eqopt.chain(
        eqopt.sgd(0.0), eqopt.contrib.reduce_on_plateau(factor=0.5, patience=2)
    )
    state = opt.init(model)
    step = jax.jit(lambda g, s, v: opt.update(g, s, model, value=v))
    for i in range(7):
        _, state = step(random_grads(model, i), state, jnp.asarray(1.0))
    assert float(state.reduce_on_plateau.scale) == 0.125


def test_errors():
    params = {"w": jnp.ones(2)}
    tx = eqopt.contrib.reduce_on_plateau()
    with pytest.raises(ValueError, match="value"):
        tx.update(params, tx.init(params))
    with pytest.raises(ValueError, match="factor"):
        eqopt.contrib.reduce_on_plateau(factor=1.5)
    with pytest.raises(ValueError, match="rtol"):
        eqopt.contrib.reduce_on_plateau(rtol=0.0, atol=0.0)
    with pytest.raises(ValueError, match="rtol"):
        eqopt.contrib.reduce_on_plateau(rtol=2.0)
