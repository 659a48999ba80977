"""Fenchel-Young losses and sparsemax (`eqopt/losses/_fenchel_young.py`): the registry cases, compared with Optax by the
generic tests of test_losses.py, and their edges, bad inputs and documented
differences from Optax."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
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


# ---------------------------------------------------------------------------
# Issue 7 and 9: labels Optax accepts, large logits.


def test_sparsemax_loss_accepts_float_and_bool_labels_like_optax():
    logits = jnp.array([-2.0, -0.5, 0.0, 0.3, 1.5, jnp.inf, -jnp.inf])
    integer = jnp.array([0, 1, 0, 1, 1, 1, 0])
    for labels in (integer, integer.astype(jnp.float32), integer.astype(bool)):
        assert_tree_allclose(
            losses.sparsemax_loss(logits, labels),
            losses.sparsemax_loss(logits, integer),
        )
    assert_tree_allclose(
        losses.sparsemax_loss(logits, integer),
        jnp.array([0, 0.5625, 0.25, 0.1225, 0, 0, 0]),
    )
    finite = logits[:5]
    # Optax counts any non-zero label as 1: so do we.
    for labels in (
        integer[:5].astype(jnp.float32),
        jnp.array([0.25, 0.0, 1.0, 0.0, 0.75]),
    ):
        ours, theirs = (
            jax.value_and_grad(lambda x, f=f, y=labels: jnp.sum(f(x, y)))(finite)
            for f in (losses.sparsemax_loss, optax.losses.sparsemax_loss)
        )
        assert_tree_allclose(ours, theirs)


def _multiclass_sparsemax_reference(scores, labels):
    # Float64 NumPy, from the definition: <p, z> - |p|^2 / 2 + 1/2 - z_k.
    scores = np.asarray(scores, np.float64)
    losses_, grads = [], []
    for z, k in zip(
        scores.reshape(-1, scores.shape[-1]), np.ravel(labels), strict=True
    ):
        descending = np.sort(z)[::-1]
        cumulative = np.cumsum(descending)
        ranks = np.arange(1, z.size + 1)
        support = ranks[1 + ranks * descending > cumulative][-1]
        tau = (cumulative[support - 1] - 1) / support
        p = np.maximum(z - tau, 0)
        losses_.append(p @ z - 0.5 * p @ p + 0.5 - z[k])
        grads.append(p - np.eye(z.size)[k])
    return np.array(losses_).reshape(scores.shape[:-1]), np.array(grads).reshape(
        scores.shape
    )


@pytest.mark.parametrize("scale", [1e4, 1e5, 1e8])
def test_multiclass_sparsemax_loss_large_logits(scale):
    base = _normal(jax.random.key(0), (4, 5))
    cases = {
        "correct class far ahead": (base.at[:, 0].add(scale), jnp.zeros(4, jnp.int32)),
        "wrong class far ahead": (base.at[:, 0].add(scale), jnp.arange(1, 5)),
        "all scores large": (base * scale, jnp.array([0, 1, 2, 3])),
        "near tie at the top": (
            base.at[:, 0].add(scale).at[:, 1].add(scale - 0.5),
            jnp.array([0, 1, 0, 1]),
        ),
    }
    value_and_grad = lambda f, scores, labels: jax.value_and_grad(
        lambda s: jnp.sum(f(s, labels))
    )(scores)
    for name, (scores, labels) in cases.items():
        ours = _jit(losses.multiclass_sparsemax_loss)(scores, labels)
        _, ours_grad = value_and_grad(losses.multiclass_sparsemax_loss, scores, labels)
        expected, expected_grad = _multiclass_sparsemax_reference(scores, labels)
        # Exact up to float32's rounding of the scores themselves.
        np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=2e-6, err_msg=name)
        np.testing.assert_allclose(ours_grad, expected_grad, atol=1e-6, err_msg=name)
        assert jnp.all(ours >= 0)
        if name != "near tie at the top":  # Optax loses the tie to rounding
            theirs = optax.losses.multiclass_sparsemax_loss(scores, labels)
            _, theirs_grad = value_and_grad(
                optax.losses.multiclass_sparsemax_loss, scores, labels
            )
            np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6, err_msg=name)
            np.testing.assert_allclose(ours_grad, theirs_grad, atol=1e-6, err_msg=name)
    # The case of issue 9: the correct class at 1e5 gives 0, not a negative loss.
    scores = jnp.array([[scale, 0.3, -0.2, 0.1]])
    assert float(losses.multiclass_sparsemax_loss(scores, jnp.array([0]))[0]) == 0.0
