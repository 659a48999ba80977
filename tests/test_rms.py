"""RMSProp's scalings (`eqopt/_transform/rms.py`): scale_by_rms, scale_by_stddev and
scale_by_rss (Adagrad)."""

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import optax
import pytest
from helpers import (
    ALL_DTYPES,
    REAL_DTYPES,
    Case,
    as_dict,
    assert_state_stays_bfloat16,
    complex_normal,
    make_model,
    random_grads,
)

import eqopt

TRANSFORM_CASES = [
    Case(
        "scale_by_rms",
        eqopt.scale_by_rms,
        optax.scale_by_rms,
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_rms-eps_outside-bias_correction",
        lambda: eqopt.scale_by_rms(decay=0.8, eps_in_sqrt=False, bias_correction=True),
        lambda: optax.scale_by_rms(decay=0.8, eps_in_sqrt=False, bias_correction=True),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_rms-initial_scale",
        lambda: eqopt.scale_by_rms(decay=0.5, eps=1e-3, initial_scale=1.0),
        lambda: optax.scale_by_rms(decay=0.5, eps=1e-3, initial_scale=1.0),
        REAL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_stddev",
        eqopt.scale_by_stddev,
        optax.scale_by_stddev,
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        # At the first step the debiased variance is 0 up to rounding: eps keeps
        # the comparison away from 1/sqrt(rounding noise).
        "scale_by_stddev-bias_correction",
        lambda: eqopt.scale_by_stddev(
            decay=0.75, eps=1e-2, initial_scale=0.5, bias_correction=True
        ),
        lambda: optax.scale_by_stddev(
            decay=0.75, eps=1e-2, initial_scale=0.5, bias_correction=True
        ),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_rss",
        eqopt.scale_by_rss,
        optax.scale_by_rss,
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_rss-zero_init",
        lambda: eqopt.scale_by_rss(initial_accumulator_value=0.0, eps=1e-4),
        lambda: optax.scale_by_rss(initial_accumulator_value=0.0, eps=1e-4),
        REAL_DTYPES,
        needs_params=False,
    ),
]


@pytest.mark.parametrize(
    "make,moment",
    [
        (eqopt.scale_by_rms, lambda s: s.nu),
        (eqopt.scale_by_stddev, lambda s: s.nu),
        (eqopt.scale_by_rss, lambda s: s.sum_of_squares),
    ],
    ids=["rms", "stddev", "rss"],
)
def test_squared_moments_of_complex_params_are_real(make, moment):
    """Difference from Optax (which stores them complex): half the memory, same updates."""
    params = {"z": complex_normal((3, 2))}
    tx = make()
    state = tx.init(params)
    _, state = tx.update({"z": complex_normal((3, 2), 1)}, state)
    assert moment(state)["z"].dtype == jnp.float32


@pytest.mark.parametrize(
    "make",
    [
        lambda: eqopt.scale_by_rms(bias_correction=True),
        eqopt.scale_by_stddev,
        eqopt.scale_by_rss,
        lambda: eqopt.rmsprop(0.1, momentum=0.9),
    ],
    ids=["rms", "stddev", "rss", "rmsprop"],
)
def test_bfloat16_state_stays_bfloat16(make):
    assert_state_stays_bfloat16(make())


def test_rms_with_bias_correction_is_adam_without_first_moment():
    params = {"w": jnp.linspace(-1.0, 1.0, 6)}
    rms = eqopt.scale_by_rms(
        decay=0.75, eps=1e-3, eps_in_sqrt=False, bias_correction=True
    )
    adam = eqopt.scale_by_adam(b1=0.0, b2=0.75, eps=1e-3)
    rms_state, adam_state = rms.init(params), adam.init(params)
    for step in range(3):
        grads = {"w": jnp.cos(params["w"] * (step + 1))}
        rms_updates, rms_state = rms.update(grads, rms_state)
        adam_updates, adam_state = adam.update(grads, adam_state)
        np.testing.assert_allclose(rms_updates["w"], adam_updates["w"], rtol=1e-6)


def test_adagrad_zero_accumulator_gives_zero_update():
    tx = eqopt.scale_by_rss(initial_accumulator_value=0.0)
    params = {"w": jnp.zeros(3)}
    updates, _ = tx.update({"w": jnp.array([0.0, 1.0, -2.0])}, tx.init(params))
    np.testing.assert_allclose(updates["w"], [0.0, 1.0, -1.0], rtol=1e-6)
    assert np.all(np.isfinite(updates["w"]))


def test_centred_rmsprop_first_step_with_bias_correction():
    """The centred variance is zero at the first step with bias correction; never NaN.

    In exact arithmetic $\\hat v_1 - |\\hat m_1|^2 = |g_1|^2 - |g_1|^2 = 0$. Rounding
    makes the computed difference slightly negative or positive: eqopt floors it
    at zero (update $g / \\sqrt{\\epsilon}$), so wherever Optax's first update is
    finite eqopt's is too, and eqopt's is never NaN (Optax's is, where its
    rounding goes negative).
    """
    arguments = dict(centered=True, momentum=0.9, nesterov=True, bias_correction=True)
    # The standard model in float32: Optax is finite on every leaf (eqopt used to
    # give NaN on the bias).
    model = make_model()
    tx, reference = eqopt.rmsprop(1e-2, **arguments), optax.rmsprop(1e-2, **arguments)
    grads = random_grads(model, 0)
    updates, _ = tx.update(grads, tx.init(model), model)
    reference_updates, _ = reference.update(
        as_dict(grads), reference.init(as_dict(model)), as_dict(model)
    )
    for name, reference_leaf in reference_updates.items():
        assert np.all(np.isfinite(reference_leaf)), name
        assert np.all(np.isfinite(getattr(updates, name))), name
    # Many elements, both precisions.
    for dtype in (jnp.float32, jnp.bfloat16):
        params = {"b": jax.random.normal(jax.random.key(0), (10_000,)).astype(dtype)}
        for eps_in_sqrt in (True, False):
            tx = eqopt.rmsprop(1e-2, eps_in_sqrt=eps_in_sqrt, **arguments)
            reference = optax.rmsprop(1e-2, eps_in_sqrt=eps_in_sqrt, **arguments)
            ours = tx.update(params, tx.init(params), params)[0]["b"]
            theirs = reference.update(params, reference.init(params), params)[0]["b"]
            ours = np.asarray(ours.astype(jnp.float32))
            theirs = np.asarray(theirs.astype(jnp.float32))
            assert np.all(np.isfinite(ours))
            assert np.all(np.isfinite(ours)[np.isfinite(theirs)])


def test_centred_variance_floor_is_optax_where_optax_rounds_exactly():
    """With a decay exact in float32, Optax's first-step variance is exactly zero too."""
    params = {"b": jax.random.normal(jax.random.key(1), (1000,))}
    tx = eqopt.scale_by_stddev(decay=0.75, bias_correction=True)
    reference = optax.scale_by_stddev(decay=0.75, bias_correction=True)
    ours = tx.update(params, tx.init(params))[0]["b"]
    theirs = reference.update(params, reference.init(params))[0]["b"]
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_allclose(ours, params["b"] / np.sqrt(1e-8), rtol=1e-6)


def test_rms_state_fields_are_type_checked():
    with pytest.raises(jaxtyping.TypeCheckError, match="count"):
        eqopt.ScaleByRmsState(count=jnp.zeros(()), nu=None)  # a float count
