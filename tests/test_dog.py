"""DoG (distance over gradients): registry cases and behaviour."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case, make_model, random_grads

import eqopt

REAL = ("float32", "bfloat16")  # Optax keeps the initial params in a real dtype


def _descending_dog(library, **kwargs):
    return library.chain(
        library.scale_by_distance_over_gradients(**kwargs),
        library.scale_by_learning_rate(1.0),
    )


class _RankPromoting:
    """Runs an Optax transform with implicit rank promotion allowed.

    Optax keeps DoG's sum of squares with shape (1,) and broadcasts it against
    each leaf, which the suite's `jax_numpy_rank_promotion="raise"` refuses, and
    which turns a scalar leaf's update into shape (1,): reshaped back here.
    """

    def __init__(self, transform):
        self.transform = transform

    def init(self, params):
        return self.transform.init(params)

    def update(self, updates, state, params=None, **extra_args):
        with jax.numpy_rank_promotion("allow"):
            new, state = self.transform.update(updates, state, params, **extra_args)
        return jax.tree.map(lambda u, g: u.reshape(g.shape), new, updates), state


TRANSFORM_CASES = [
    Case(
        "scale_by_distance_over_gradients",
        lambda: _descending_dog(eqopt, reps_rel=1e-2),
        lambda: _RankPromoting(_descending_dog(optax, reps_rel=1e-2)),
        REAL,
    ),
    Case(
        "scale_by_distance_over_gradients-options",
        lambda: eqopt.scale_by_distance_over_gradients(
            reps_rel=0.1, eps=1e-3, param_dtype=jnp.bfloat16, global_scale=-1.0
        ),
        lambda: _RankPromoting(
            optax.scale_by_distance_over_gradients(
                reps_rel=0.1, eps=1e-3, param_dtype=jnp.bfloat16, global_scale=-1.0
            )
        ),
        REAL,
    ),
]


def test_dog_first_step_and_growth():
    params = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([0.0, 0.0, 1.0])}
    grads = {"a": jnp.array([1.0, 0.0]), "b": jnp.array([0.0, 2.0, 0.0])}
    tx = eqopt.scale_by_distance_over_gradients(reps_rel=0.1, eps=0.0)
    state = tx.init(params)
    # r_0 = reps_rel (1 + |x_0|), per leaf.
    np.testing.assert_allclose(state.max_dist["a"], 0.6)
    np.testing.assert_allclose(state.max_dist["b"], 0.2)
    updates, state = tx.update(grads, state, params)
    # Step r / |g|, per leaf: a normalised gradient times r.
    np.testing.assert_allclose(updates["a"], [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(updates["b"], [0.0, 0.2, 0.0], rtol=1e-6)
    # Once the params have moved further than r, the distance sets the step.
    moved = {"a": params["a"] + jnp.array([0.0, 2.0]), "b": params["b"]}
    updates, state = tx.update(grads, state, moved)
    np.testing.assert_allclose(state.max_dist["a"], 2.0)
    np.testing.assert_allclose(updates["a"], [2.0 / np.sqrt(2.0), 0.0], rtol=1e-6)
    np.testing.assert_allclose(state.max_dist["b"], 0.2)


def test_dog_needs_params():
    params = {"a": jnp.ones(2)}
    tx = eqopt.scale_by_distance_over_gradients()
    with pytest.raises(ValueError, match="needs `params`"):
        tx.update(params, tx.init(params))


def test_dog_complex_params_need_a_complex_param_dtype():
    model = make_model(jnp.complex64)
    with pytest.raises(ValueError, match=r"\.w is complex.*param_dtype"):
        eqopt.scale_by_distance_over_gradients().init(model)
    state = eqopt.scale_by_distance_over_gradients(param_dtype=jnp.complex64).init(
        model
    )
    assert state.max_dist.w.dtype == jnp.float32 and state.max_dist.w.shape == ()


def test_dog_state_dtypes_are_stable():
    model = make_model(jnp.bfloat16)
    tx = eqopt.scale_by_distance_over_gradients()
    state = tx.init(model)
    assert state.init_params.w.dtype == jnp.float32
    assert state.max_dist.w.dtype == jnp.float32
    _, new_state = tx.update(random_grads(model, 0), state, model)
    assert new_state.max_dist.w.dtype == state.max_dist.w.dtype
    assert new_state.grad_sum_of_squares.w.dtype == jnp.float32


def test_dog_trains():
    first, last, _, _ = train(_descending_dog(eqopt, reps_rel=1e-4), problem="mlp-2-1")
    assert last < 0.5 * first


def test_dog_scalar_parameter_keeps_its_shape():
    params = {"s": jnp.asarray(2.0), "v": jnp.ones(3)}
    grads = {"s": jnp.asarray(0.5), "v": jnp.ones(3)}
    tx = eqopt.scale_by_distance_over_gradients()
    updates, _ = tx.update(grads, tx.init(params), params)
    assert updates["s"].shape == ()
    reference = optax.scale_by_distance_over_gradients()
    with jax.numpy_rank_promotion("allow"):
        reference_updates, _ = reference.update(grads, reference.init(params), params)
    assert reference_updates["s"].shape == (1,)  # Optax's, fixed here
    np.testing.assert_allclose(updates["s"], reference_updates["s"][0], rtol=1e-6)
    np.testing.assert_allclose(updates["v"], reference_updates["v"], rtol=1e-6)
