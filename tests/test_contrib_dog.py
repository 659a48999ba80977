"""DoG and DoWG: registry cases against `optax.contrib`, their step sizes, training."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case, spec_like

import eqopt

ALL_DTYPES = ("float32", "bfloat16", "complex64")

TRANSFORM_CASES = [
    Case(
        "contrib.dog",
        lambda: eqopt.contrib.dog(),
        lambda: optax.contrib.dog(),
        ALL_DTYPES,
    ),
    Case(
        "contrib.dog-distance",
        lambda: eqopt.contrib.dog(0.5, init_step=("distance", 0.3)),
        lambda: optax.contrib.dog(0.5, init_step=("distance", 0.3)),
        ALL_DTYPES,
    ),
    Case(
        "contrib.dog-learning_rate-decay-mask",
        lambda p: eqopt.contrib.dog(
            init_step=("learning_rate", 0.1),
            weight_decay=0.1,
            mask=spec_like(p, False, w=True),
        ),
        lambda p: optax.contrib.dog(
            init_step=("learning_rate", 0.1),
            weight_decay=0.1,
            mask=spec_like(p, False, w=True),
        ),
        ALL_DTYPES,
    ),
    Case(
        "contrib.dowg",
        lambda: eqopt.contrib.dowg(),
        lambda: optax.contrib.dowg(),
        ALL_DTYPES,
    ),
    Case(
        "contrib.dowg-options",
        lambda: eqopt.contrib.dowg(0.5, init_estim_sq_dist=0.3, weight_decay=0.1),
        lambda: optax.contrib.dowg(0.5, init_estim_sq_dist=0.3, weight_decay=0.1),
        ALL_DTYPES,
    ),
]


def test_heuristic_initial_distance_uses_the_whole_model():
    params = {"a": jnp.full(3, 2.0), "b": jnp.full((2, 2), -1.0)}
    state = eqopt.contrib.dog(init_step=("heuristic", 1e-3)).init(params)
    norm = np.sqrt(3 * 4.0 + 4 * 1.0)
    assert float(state[1].max_dist) == pytest.approx(1e-3 * (1 + norm))
    assert bool(state[1].is_init_step)


def test_first_step_with_learning_rate_kind_is_that_learning_rate():
    tx = eqopt.contrib.dog(init_step=("learning_rate", 0.25))
    params = {"x": jnp.ones(4)}
    grads = {"x": jnp.arange(4.0)}
    updates, state = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates["x"], -0.25 * grads["x"])
    assert not bool(state[1].is_init_step)


def test_dog_step_size_grows_with_distance():
    tx = eqopt.contrib.dog()
    params = {"x": jnp.zeros(5)}
    state = tx.init(params)
    distances = []
    for _ in range(30):
        distances.append(float(jnp.linalg.norm(params["x"])))
        updates, state = tx.update({"x": params["x"] - 3.0}, state, params)
        params = eqopt.apply_updates(params, updates)
    # r-bar grew from its tiny start (1e-6) to the largest distance travelled.
    assert float(state[1].max_dist) == pytest.approx(max(distances), rel=1e-5)
    assert float(state[1].max_dist) > 1e3 * 1e-6


def test_bad_init_step_tag_is_named():
    with pytest.raises(ValueError, match="init_step"):
        eqopt.contrib.dog(init_step=("distanse", 1.0))


def test_dog_needs_params():
    tx = eqopt.contrib.dowg()
    params = {"x": jnp.ones(2)}
    with pytest.raises(ValueError, match="needs the current parameters"):
        tx.update(params, tx.init(params))


def test_chain_layout_matches_optax():
    assert isinstance(eqopt.contrib.dog()[0], eqopt.Identity)
    assert isinstance(eqopt.contrib.dog(weight_decay=0.1)[0], eqopt.AddDecayedWeights)
    assert isinstance(eqopt.contrib.dowg()[1], eqopt.contrib.ScaleByDoWG)


@pytest.mark.parametrize(
    "make",
    [lambda: eqopt.contrib.dog(), lambda: eqopt.contrib.dowg()],
    ids=["dog", "dowg"],
)
def test_training_reduces_loss(make):
    # DoG starts from a step of 1e-6 times the parameter norm and warms up.
    initial, final, _, _ = train(make(), steps=100, problem="mlp-4-1")
    assert final < 0.6 * initial
