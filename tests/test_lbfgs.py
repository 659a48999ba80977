"""L-BFGS: registry cases, the full loop on whole models, convergence and parity with Optax."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _objectives import extra_args_with_gradient, jit_update
from helpers import assert_tree_allclose
from registry import Case

import eqopt

# Parity dtypes. In bfloat16, L-BFGS fed the parity test's random gradients
# (pairs with negative curvature) amplifies the last-bit differences of its
# inner products: Optax sums a tree's leaves in dict-key order, eqopt in the
# model's field order, and one bfloat16 ulp of difference grows to several over
# four steps. test_bfloat16_follows_optax compares bfloat16 on a convex problem,
# where it does not grow. Complex parameters: the line searches differ from
# Optax on purpose (see test_linesearch.py), so only the line-search-free
# configurations compare complex64.
REAL = ("float32",)
NO_LINESEARCH = ("float32", "complex64")

TRANSFORM_CASES = [
    Case("scale_by_lbfgs", eqopt.scale_by_lbfgs, optax.scale_by_lbfgs, NO_LINESEARCH),
    Case(
        "scale_by_lbfgs-memory2-unscaled",
        lambda: eqopt.scale_by_lbfgs(memory_size=2, scale_init_precond=False),
        lambda: optax.scale_by_lbfgs(memory_size=2, scale_init_precond=False),
        NO_LINESEARCH,
    ),
    Case(
        "lbfgs",
        eqopt.lbfgs,
        lambda: jit_update(optax.lbfgs()),
        REAL,
        extra_args=extra_args_with_gradient(),
    ),
    Case(
        "lbfgs-learning_rate-no_linesearch",
        lambda: eqopt.lbfgs(learning_rate=0.3, memory_size=3, linesearch=None),
        lambda: optax.lbfgs(learning_rate=0.3, memory_size=3, linesearch=None),
        NO_LINESEARCH,
    ),
    Case(
        "lbfgs-backtracking",
        lambda: eqopt.lbfgs(
            linesearch=eqopt.scale_by_backtracking_linesearch(15, store_grad=True)
        ),
        lambda: jit_update(
            optax.lbfgs(
                linesearch=optax.scale_by_backtracking_linesearch(15, store_grad=True)
            )
        ),
        REAL,
        extra_args=extra_args_with_gradient(),
    ),
]
