"""Divergences (`eqopt/losses/_divergence.py`): the registry cases, compared with Optax by the
generic tests of test_losses.py, and their edges, bad inputs and documented
differences from Optax."""

import jax.numpy as jnp
import optax
import pytest
from helpers import assert_tree_allclose
from loss_helpers import (
    Case,
    _finite_value_and_grads,
    _full_where,
    _log_predictions_and_log_targets,
    _log_predictions_and_targets,
    _with_where,
)

import eqopt.losses as losses

LOSS_CASES = [
    Case("kl_divergence", "kl_divergence", _log_predictions_and_targets()),
    Case(
        "kl_divergence-where-axis-none",
        "kl_divergence",
        _log_predictions_and_targets(),
        lambda args: {"where": _full_where(args), "axis": None},
    ),
    Case(
        "kl_divergence_with_log_targets-where",
        "kl_divergence_with_log_targets",
        _log_predictions_and_log_targets,
        _with_where(_full_where),
    ),
    Case(
        "generalized_kl_divergence",
        "generalized_kl_divergence",
        _log_predictions_and_targets(normalised=False),
    ),
    Case(
        "generalized_kl_divergence-where-axis0",
        "generalized_kl_divergence",
        _log_predictions_and_targets(normalised=False),
        lambda args: {"where": _full_where(args), "axis": 0},
    ),
    Case(
        "convex_kl_divergence",
        "convex_kl_divergence",
        _log_predictions_and_targets(normalised=False),
    ),
]


@pytest.mark.parametrize(
    "fn",
    [
        losses.kl_divergence,
        losses.generalized_kl_divergence,
        losses.convex_kl_divergence,
        losses.kl_divergence_with_log_targets,
    ],
    ids=["kl", "generalized", "convex", "log-targets"],
)
def test_zero_targets_in_divergences(fn):
    log_predictions = jnp.array([[jnp.log(0.4), jnp.log(0.6), -jnp.inf]])
    targets = jnp.array([[0.5, 0.5, 0.0]])
    if fn is losses.kl_divergence_with_log_targets:
        targets = jnp.log(targets)
    value, _ = _finite_value_and_grads(fn, log_predictions, targets, argnums=(0, 1))
    expected = 0.5 * jnp.log(0.5 / 0.4) + 0.5 * jnp.log(0.5 / 0.6)
    assert_tree_allclose(value, jnp.array([expected]))


def test_difference_kl_with_impossible_predictions():
    log_predictions = jnp.array([[jnp.log(0.4), jnp.log(0.6), -jnp.inf]])
    targets = jnp.array([[0.5, 0.5, 0.0]])
    assert jnp.isnan(optax.losses.kl_divergence(log_predictions, targets)[0])
    finite = jnp.array([[jnp.log(0.4), jnp.log(0.6)]])
    assert_tree_allclose(
        losses.kl_divergence(log_predictions, targets),
        optax.losses.kl_divergence(finite, targets[:, :2]),
    )
