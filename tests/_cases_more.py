"""Registry cases for the RMS, sign, noise and small corrective transforms."""

import jax
import jax.numpy as jnp
import optax
from registry import Case

import eqopt

ALL_F32 = ("float32", "bfloat16", "complex64")
REAL = ("float32", "bfloat16")


def _nan_where_negative(updates, params):
    """Puts NaNs into the updates (where the real part is negative), to be zeroed."""
    return jax.tree.map(
        lambda g: None if g is None else jnp.where(jnp.real(g) < 0, jnp.nan, g),
        updates,
        is_leaf=lambda x: x is None,
    )


TRANSFORM_CASES = [
    # rms.py
    Case(
        "scale_by_rms",
        eqopt.scale_by_rms,
        optax.scale_by_rms,
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_rms-eps_outside-bias_correction",
        lambda: eqopt.scale_by_rms(decay=0.8, eps_in_sqrt=False, bias_correction=True),
        lambda: optax.scale_by_rms(decay=0.8, eps_in_sqrt=False, bias_correction=True),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_rms-initial_scale",
        lambda: eqopt.scale_by_rms(decay=0.5, eps=1e-3, initial_scale=1.0),
        lambda: optax.scale_by_rms(decay=0.5, eps=1e-3, initial_scale=1.0),
        REAL,
        needs_params=False,
    ),
    Case(
        "scale_by_stddev",
        eqopt.scale_by_stddev,
        optax.scale_by_stddev,
        ALL_F32,
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
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_rss",
        eqopt.scale_by_rss,
        optax.scale_by_rss,
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_rss-zero_init",
        lambda: eqopt.scale_by_rss(initial_accumulator_value=0.0, eps=1e-4),
        lambda: optax.scale_by_rss(initial_accumulator_value=0.0, eps=1e-4),
        REAL,
        needs_params=False,
    ),
    # sign.py
    Case(
        "scale_by_sign",
        eqopt.scale_by_sign,
        optax.scale_by_sign,
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_lion",
        eqopt.scale_by_lion,
        optax.scale_by_lion,
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_lion-mu_dtype",
        lambda: eqopt.scale_by_lion(b1=0.5, mu_dtype=jnp.bfloat16),
        lambda: optax.scale_by_lion(b1=0.5, mu_dtype=jnp.bfloat16),
        ("float32",),
        needs_params=False,
    ),
    Case(
        # Complex is left out on purpose: eqopt saturates the modulus (test_misc.py).
        "scale_by_lion-smooth",
        lambda: eqopt.scale_by_lion(b2=0.9, mode="smooth", smooth_beta=2.0),
        lambda: optax.scale_by_lion(b2=0.9, mode="smooth", smooth_beta=2.0),
        REAL,
        needs_params=False,
    ),
    Case(
        "scale_by_lion-refined",
        lambda: eqopt.scale_by_lion(mode="refined"),
        lambda: optax.scale_by_lion(mode="refined"),
        ALL_F32,
        needs_params=False,
    ),
    # noise.py: the generic parity test compares an Equinox model with Optax's
    # dict, whose leaves are in another order, so each leaf gets another key.
    Case(
        "add_noise",
        lambda: eqopt.add_noise(0.1, 0.55, jax.random.key(0)),
        lambda: optax.add_noise(0.1, 0.55, jax.random.key(0)),
        ALL_F32,
        needs_params=False,
        random=True,
        no_parity_reason="random; bit-exact parity on equal trees in test_noise.py",
    ),
    # misc.py
    Case("centralize", eqopt.centralize, optax.centralize, ALL_F32, needs_params=False),
    Case("zero_nans", eqopt.zero_nans, optax.zero_nans, ALL_F32, needs_params=False),
    Case(
        "zero_nans-with_nans",
        lambda: eqopt.chain(eqopt.stateless(_nan_where_negative), eqopt.zero_nans()),
        lambda: optax.chain(optax.stateless(_nan_where_negative), optax.zero_nans()),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "keep_params_nonnegative",
        lambda: eqopt.chain(eqopt.scale(-0.5), eqopt.keep_params_nonnegative()),
        lambda: optax.chain(optax.scale(-0.5), optax.keep_params_nonnegative()),
        REAL,
    ),
]
