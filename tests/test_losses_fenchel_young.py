"""Fenchel-Young losses and sparsemax (`eqopt/losses/_fenchel_young.py`): the registry cases, compared with Optax by the
generic tests of test_losses.py, and their edges, bad inputs and documented
differences from Optax."""

import jax
import jax.numpy as jnp
import pytest
from helpers import assert_tree_allclose
from loss_helpers import (
    Case,
    _fenchel_young,
    _jit,
    _logits_and_distribution,
    _logits_and_indices,
    _normal,
)

import eqopt.losses as losses

LOSS_CASES = [
    Case(
        "sparsemax_loss",
        "sparsemax_loss",
        lambda k: (_normal(k, (4, 5), 1.5), jnp.arange(20).reshape(4, 5) % 2),
    ),
    Case(  # Optax's supports a single batch axis only.
        "multiclass_sparsemax_loss",
        "multiclass_sparsemax_loss",
        _logits_and_indices((6, 5), (6,), 5),
    ),
    Case(
        "make_fenchel_young_loss",
        "make_fenchel_young_loss",
        _logits_and_distribution((2, 3, 4)),
        build=_fenchel_young,
    ),
]


def test_fenchel_young_loss_is_a_module():
    first = losses.make_fenchel_young_loss(jax.nn.logsumexp)
    second = losses.make_fenchel_young_loss(jax.nn.logsumexp)
    assert first == second and hash(first) == hash(second)
    scores = jnp.array([[1.0, 2.0, 0.5]])
    targets = jnp.array([[0.0, 1.0, 0.0]])
    assert_tree_allclose(
        first(scores, targets), losses.softmax_cross_entropy(scores, targets)
    )
    with pytest.raises(ValueError, match="must map a vector to a scalar"):
        losses.make_fenchel_young_loss(lambda x: x)(scores, targets)


def test_sparsemax_many_batch_axes():
    scores, labels = _logits_and_indices((2, 3, 5), (2, 3), 5)(jax.random.key(0))
    loss = _jit(losses.multiclass_sparsemax_loss)
    flat = loss(scores.reshape(6, 5), labels.reshape(6))
    assert_tree_allclose(loss(scores, labels), flat.reshape(2, 3))
