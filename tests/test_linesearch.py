"""Line searches: registry cases, parity with Optax's searches, and their errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _objectives import extra_args_with_gradient, jit_update
from helpers import Case, make_model


import eqopt

# Complex parameters are not compared: the slope along the direction differs
# from Optax's on purpose (test_complex_slope_is_the_directional_derivative).
REAL = ("float32", "bfloat16")

# The registry feeds a bare line search the step's gradients as its direction;
# the objective's gradient there is minus them, so the direction is one of descent.
DESCENT = extra_args_with_gradient(sign=-1.0)

TRANSFORM_CASES = [
    Case(
        "scale_by_zoom_linesearch",
        lambda: eqopt.scale_by_zoom_linesearch(15),
        lambda: jit_update(optax.scale_by_zoom_linesearch(15)),
        REAL,
        extra_args=DESCENT,
    ),
    Case(
        "scale_by_zoom_linesearch-one-max_learning_rate-no_curvature",
        lambda: eqopt.scale_by_zoom_linesearch(
            8,
            max_learning_rate=0.5,
            curv_rtol=jnp.inf,
            approx_dec_rtol=None,
            initial_guess_strategy="one",
        ),
        lambda: jit_update(
            optax.scale_by_zoom_linesearch(
                8,
                max_learning_rate=0.5,
                curv_rtol=jnp.inf,
                approx_dec_rtol=None,
                initial_guess_strategy="one",
            )
        ),
        ("float32",),
        extra_args=DESCENT,
    ),
    Case(
        "scale_by_backtracking_linesearch",
        lambda: eqopt.scale_by_backtracking_linesearch(15),
        lambda: jit_update(optax.scale_by_backtracking_linesearch(15)),
        REAL,
        extra_args=DESCENT,
    ),
    Case(
        "scale_by_backtracking_linesearch-store_grad",
        lambda: eqopt.scale_by_backtracking_linesearch(
            4,
            decrease_factor=0.5,
            increase_factor=jnp.inf,
            max_learning_rate=2.0,
            store_grad=True,
        ),
        lambda: jit_update(
            optax.scale_by_backtracking_linesearch(
                4,
                decrease_factor=0.5,
                increase_factor=jnp.inf,
                max_learning_rate=2.0,
                store_grad=True,
            )
        ),
        ("float32",),
        extra_args=DESCENT,
    ),
]
