"""Regression losses (`eqopt/losses/_regression.py`): the registry cases, compared with Optax by the
generic tests of test_losses.py, and their edges, bad inputs and documented
differences from Optax."""

import jax
import jax.numpy as jnp
import optax
from loss_helpers import (
    Case,
    _full_where,
    _jit,
    _normal,
    _regression,
    _with_where,
)

import eqopt.losses as losses

LOSS_CASES = [
    Case("l2_loss", "l2_loss", _regression()),
    Case("l2_loss-no-targets", "l2_loss", lambda k: (_normal(k, (3, 4)),)),
    Case("squared_error", "squared_error", _regression()),
    Case("huber_loss-delta", "huber_loss", _regression(scale=2.0), {"delta": 0.5}),
    Case("log_cosh", "log_cosh", _regression(scale=5.0)),
    Case("cosine_similarity", "cosine_similarity", _regression()),
    Case(
        "cosine_similarity-epsilon-axis0",
        "cosine_similarity",
        _regression(scale=0.2),
        {"epsilon": 0.3, "axis": 0},
    ),
    Case(
        "cosine_similarity-where",
        "cosine_similarity",
        _regression(),
        _with_where(_full_where),
    ),
    Case("cosine_distance-axis-none", "cosine_distance", _regression(), {"axis": None}),
    Case(
        "cosine_distance-where-axes",
        "cosine_distance",
        _regression((2, 3, 4)),
        lambda args: {"where": _full_where(args), "axis": (0, 2)},
    ),
]


def test_difference_cosine_similarity_zero_vector():
    zeros, other = jnp.zeros((1, 3)), jnp.ones((1, 3))
    assert jnp.isnan(_jit(optax.losses.cosine_similarity)(zeros, other)[0])
    assert _jit(losses.cosine_similarity)(zeros, other)[0] == 0
    where = jnp.zeros((1, 3), bool)
    optax_grad = _jit(
        jax.grad(lambda x: optax.losses.cosine_similarity(x, other, where=where).sum())
    )(other)
    assert jnp.any(jnp.isnan(optax_grad))
