"""RMSProp's scalings (`eqopt/_transform/rms.py`): scale_by_rms, scale_by_stddev, scale_by_rss."""

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import optax
import pytest
from helpers import as_dict, make_model, random_grads

import eqopt


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
