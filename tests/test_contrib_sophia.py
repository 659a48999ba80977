"""Sophia (`eqopt.contrib.sophia`) and `hutchinson_estimator_diag_hessian`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import mse, train
from helpers import Case, make_model, random_grads

import eqopt

REAL_DTYPES = ("float32", "bfloat16")


def _separable_loss(w, b, s):
    return jnp.sum(jnp.cosh(w)) + jnp.sum(jnp.exp(b)) + s**4


def _objective(params):
    """The objective, on the model for eqopt and on the dict of arrays for Optax.

    Its Hessian is diagonal, so Hutchinson's estimate is exact whatever the
    random signs: the model's leaves (w, b, s) and the dict's (b, s, w) are in
    different orders and so get different subkeys. The key splitting itself is
    tested in `test_same_seed_gives_optax_estimate_on_a_whole_model`.
    """
    if isinstance(params, dict):
        return _separable_loss(params["w"], params["b"], params["s"])
    return _separable_loss(params.w, params.b, params.s)


def _coupled_objective(params):
    return jnp.sum(
        jnp.tanh(jnp.arange(4.0) @ params.w + params.b) ** 2 * params.s**2
    ) + jnp.sum(jnp.cos(params.w))


def _with_objective(model, grads):
    return {"obj_fn": _objective}


TRANSFORM_CASES = [
    Case(
        "contrib.hutchinson_estimator_diag_hessian",
        eqopt.contrib.hutchinson_estimator_diag_hessian,
        optax.contrib.hutchinson_estimator_diag_hessian,
        REAL_DTYPES,
        extra_args=_with_objective,
    ),
    # The Hessian estimate is refreshed at steps 0 and 2 of the 4.
    Case(
        "contrib.sophia",
        lambda: eqopt.contrib.sophia(0.1, update_interval=2),
        lambda: optax.contrib.sophia(0.1, update_interval=2),
        REAL_DTYPES,
        extra_args=_with_objective,
    ),
    Case(
        "contrib.sophia-seed-mask-no-clip",
        lambda: eqopt.contrib.sophia(
            0.1,
            eps=0.1,
            gamma=0.5,
            clip_threshold=None,
            update_interval=1,
            weight_decay=0.1,
            weight_decay_mask=lambda x: x.ndim > 1,
            hessian_diagonal_fn=eqopt.contrib.hutchinson_estimator_diag_hessian(
                jax.random.PRNGKey(3)
            ),
        ),
        lambda: optax.contrib.sophia(
            0.1,
            eps=0.1,
            gamma=0.5,
            clip_threshold=None,
            update_interval=1,
            weight_decay=0.1,
            weight_decay_mask=lambda p: {k: v.ndim > 1 for k, v in p.items()},
            hessian_diagonal_fn=optax.contrib.hutchinson_estimator_diag_hessian(
                jax.random.PRNGKey(3)
            ),
        ),
        REAL_DTYPES,
        extra_args=_with_objective,
    ),
]


def test_same_seed_gives_optax_estimate_on_a_whole_model():
    """The key is split as Optax splits it, one subkey per trained leaf in order.

    Optax is given the model's arrays (`eqx.filter`), so the leaves are in the
    same order; the objective couples the leaves, so the estimate is random.
    """
    model = make_model()
    params = eqx.filter(model, eqx.is_inexact_array)
    seed = jax.random.PRNGKey(7)
    estimator = eqopt.contrib.hutchinson_estimator_diag_hessian(seed)
    reference = optax.contrib.hutchinson_estimator_diag_hessian(seed)
    state, reference_state = estimator.init(model), reference.init(params)
    for _ in range(3):
        estimate, state = estimator.update(
            None, state, model, obj_fn=_coupled_objective
        )
        reference_estimate, reference_state = reference.update(
            None, reference_state, params, obj_fn=_coupled_objective
        )
        for name in ("w", "b", "s"):
            np.testing.assert_allclose(
                getattr(estimate, name),
                getattr(reference_estimate, name),
                rtol=1e-6,
                atol=1e-7,
            )
        # The model's non-trainable leaves (an int array among them) get no estimate.
        assert estimate.indices is None and estimate.activation is None
        np.testing.assert_array_equal(state.key, reference_state.key)


def test_estimator_is_unbiased_for_a_quadratic():
    """E[v * (H v)] = diag(H): the average over many keys is close to the diagonal."""
    matrix = jax.random.normal(jax.random.key(0), (5, 5))
    hessian = matrix @ matrix.T + jnp.eye(5)
    params = {"x": jnp.zeros(5)}

    def objective(p):
        return 0.5 * p["x"] @ hessian @ p["x"]

    def estimate(key):
        estimator = eqopt.contrib.hutchinson_estimator_diag_hessian(key)
        state = estimator.init(params)
        return estimator.update(None, state, params, obj_fn=objective)[0]["x"]

    keys = jax.random.split(jax.random.PRNGKey(1), 4000)
    average = jnp.mean(jax.vmap(estimate)(keys), axis=0)
    np.testing.assert_allclose(average, jnp.diag(hessian), rtol=0.15)


def test_hessian_refreshed_every_update_interval():
    model = make_model()
    opt = eqopt.contrib.sophia(0.1, update_interval=3)
    state = opt.init(model)
    nus = []
    for step in range(4):
        _, state = opt.update(
            random_grads(model, step), state, model, obj_fn=_objective
        )
        nus.append(np.asarray(state[0].nu.w))
    # Refreshed at steps 0 and 3 (count 0 and 3 before the step).
    assert np.any(nus[0] != 0)
    np.testing.assert_array_equal(nus[0], nus[1])
    np.testing.assert_array_equal(nus[1], nus[2])
    assert not np.array_equal(nus[2], nus[3])


def test_updates_are_clipped():
    model = make_model()
    tx = eqopt.contrib.ScaleBySophia(clip_threshold=0.5, gamma=1e-6)
    updates, _ = tx.update(
        random_grads(model, 0), tx.init(model), model, obj_fn=_objective
    )
    assert float(jnp.max(jnp.abs(updates.w))) == pytest.approx(0.5)


def test_sophia_trains_small_model():
    opt = eqopt.contrib.sophia(3e-3, update_interval=2)
    first, last, _, _ = train(
        opt, 150, extra=lambda model, x, y, loss: {"obj_fn": lambda m: mse(m, x, y)}
    )
    assert last < 0.3 * first


def test_errors():
    model = make_model()
    estimator = eqopt.contrib.hutchinson_estimator_diag_hessian()
    with pytest.raises(ValueError, match="obj_fn"):
        estimator.update(None, estimator.init(model), model)
    opt = eqopt.contrib.sophia(0.1)
    with pytest.raises(ValueError, match="params"):
        opt.update(random_grads(model, 0), opt.init(model), obj_fn=_objective)
