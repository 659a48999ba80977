"""SAM (`eqopt.contrib.sam`) and `eqopt.contrib.normalize`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import mse, regression_data, train
from helpers import Case, make_model, random_grads

import eqopt

ALL_DTYPES = ("float32", "bfloat16", "complex64")


def _loss(w, b, s):
    return jnp.sum(jnp.abs(jnp.tanh(jnp.arange(4.0) @ w + b)) ** 2 * jnp.abs(s) ** 2)


def _grad_fn(params, i):
    """`grad_fn(params, i)` for opaque SAM: on the model for eqopt, the dict for Optax."""
    if isinstance(params, dict):
        return jax.grad(lambda p: _loss(p["w"], p["b"], p["s"]))(params)
    return eqx.filter_grad(lambda m: _loss(m.w, m.b, m.s))(params)


def _sam_pair(optimizer, adv_optimizer, **kwargs):
    return (
        lambda: eqopt.contrib.sam(optimizer(eqopt), adv_optimizer(eqopt), **kwargs),
        lambda: optax.contrib.sam(optimizer(optax), adv_optimizer(optax), **kwargs),
    )


def _normalized_sgd(rho):
    def build(library):
        normalize = (
            eqopt.contrib.normalize if library is eqopt else optax.contrib.normalize
        )
        return library.chain(normalize(), library.sgd(rho))

    return build


TRANSFORM_CASES = [
    Case(
        "contrib.normalize",
        eqopt.contrib.normalize,
        optax.contrib.normalize,
        ALL_DTYPES,
    ),
    # Five steps: adversarial, outer, adversarial, outer, adversarial.
    Case(
        "contrib.sam",
        *_sam_pair(lambda lib: lib.sgd(0.1), _normalized_sgd(0.05)),
        ALL_DTYPES,
        steps=5,
    ),
    Case(
        "contrib.sam-adam-period-3-keep-state",
        *_sam_pair(
            lambda lib: lib.adam(0.1),
            lambda lib: lib.adam(0.05),
            sync_period=3,
            reset_state=False,
        ),
        ALL_DTYPES,
        steps=6,
    ),
    Case(
        "contrib.sam-opaque",
        *_sam_pair(
            lambda lib: lib.sgd(0.1, momentum=0.9),
            _normalized_sgd(0.05),
            sync_period=3,
            opaque_mode=True,
        ),
        ALL_DTYPES,
        extra_args=lambda model, grads: {"grad_fn": _grad_fn},
    ),
]


def _quadratic_grad(model):
    return eqx.filter_grad(lambda m: _loss(m.w, m.b, m.s))(model)


def test_transparent_mode_steps_to_the_adversary_then_back():
    rho, learning_rate = 0.05, 0.1
    model = make_model()
    opt = eqopt.contrib.sam(
        eqopt.sgd(learning_rate),
        eqopt.chain(eqopt.contrib.normalize(), eqopt.sgd(rho)),
    )
    state = opt.init(model)
    grads = _quadratic_grad(model)
    # Step 1 (adversarial): ascend by rho along the normalised gradient.
    updates, state = opt.update(grads, state, model)
    norm = eqopt.global_norm(grads)
    np.testing.assert_allclose(updates.w, rho * grads.w / norm, rtol=1e-5)
    adversary = eqopt.apply_updates(model, updates)
    np.testing.assert_array_equal(state.cache.w, model.w)
    # Step 2 (outer): from the original params, with the gradient at the adversary.
    adversarial_grads = _quadratic_grad(adversary)
    updates, state = opt.update(adversarial_grads, state, adversary)
    new_model = eqopt.apply_updates(adversary, updates)
    np.testing.assert_allclose(
        new_model.w, model.w - learning_rate * adversarial_grads.w, rtol=1e-5, atol=1e-6
    )
    assert int(state.steps_since_sync) == 0


def test_opaque_mode_equals_two_transparent_steps():
    model = make_model()
    outer = eqopt.adam(0.05)
    adversary = eqopt.chain(eqopt.contrib.normalize(), eqopt.sgd(0.05))
    transparent = eqopt.contrib.sam(outer, adversary)
    opaque = eqopt.contrib.sam(outer, adversary, opaque_mode=True)
    state, opaque_state = transparent.init(model), opaque.init(model)
    assert opaque_state.cache is None
    transparent_model, opaque_model = model, model
    for _ in range(2):
        for _ in range(2):
            updates, state = transparent.update(
                _quadratic_grad(transparent_model), state, transparent_model
            )
            transparent_model = eqopt.apply_updates(transparent_model, updates)
        updates, opaque_state = opaque.update(
            _quadratic_grad(opaque_model),
            opaque_state,
            opaque_model,
            grad_fn=lambda m, i: _quadratic_grad(m),
        )
        opaque_model = eqopt.apply_updates(opaque_model, updates)
        np.testing.assert_allclose(
            transparent_model.w, opaque_model.w, rtol=1e-5, atol=1e-6
        )


def test_sam_trains_small_model():
    x, y = regression_data()
    opt = eqopt.contrib.sam(
        eqopt.adam(1e-2),
        eqopt.chain(eqopt.contrib.normalize(), eqopt.sgd(0.02)),
        opaque_mode=True,
    )
    grad_fn = lambda model, i: eqx.filter_grad(mse)(model, x, y)  # noqa: E731
    first, last, _, _ = train(
        opt, 100, extra=lambda m, x, y, loss: {"grad_fn": grad_fn}
    )
    assert last < 0.1 * first


def test_errors():
    model = make_model()
    opaque = eqopt.contrib.sam(eqopt.sgd(0.1), eqopt.sgd(0.1), opaque_mode=True)
    with pytest.raises(ValueError, match="grad_fn"):
        opaque.update(random_grads(model, 0), opaque.init(model), model)
    transparent = eqopt.contrib.sam(eqopt.sgd(0.1), eqopt.sgd(0.1))
    with pytest.raises(ValueError, match="params"):
        transparent.update(random_grads(model, 0), transparent.init(model))
    with pytest.raises(ValueError, match="sync_period"):
        eqopt.contrib.sam(eqopt.sgd(0.1), eqopt.sgd(0.1), sync_period=0)


def test_normalize_gives_unit_global_norm():
    model = make_model()
    normalize = eqopt.contrib.normalize()
    updates, _ = normalize.update(random_grads(model, 0), normalize.init(model))
    assert float(eqopt.global_norm(updates)) == pytest.approx(1.0, rel=1e-6)
    assert updates.activation is None
