"""Self-supervised losses (`eqopt/losses/_self_supervised.py`): the registry cases, compared with Optax by the
generic tests of test_losses.py, and their edges, bad inputs and documented
differences from Optax."""

import jax
import jax.numpy as jnp
import optax
from helpers import assert_tree_allclose
from loss_helpers import (
    Case,
    _finite_value_and_grads,
    _jit,
    _normal,
    _ntxent_inputs,
    _triplet_inputs,
)

import eqopt.losses as losses

LOSS_CASES = [
    Case("ntxent", "ntxent", _ntxent_inputs, {"temperature": 0.5}),
    Case("triplet_margin_loss", "triplet_margin_loss", _triplet_inputs()),
    Case(
        "triplet_margin_loss-degree4-axis0",
        "triplet_margin_loss",
        _triplet_inputs((3, 4)),
        {"norm_degree": 4, "margin": 0.5, "axis": 0, "eps": 1e-3},
    ),
]


def test_ntxent_edges():
    embeddings = _normal(jax.random.key(0), (4, 3))
    loss = _finite_value_and_grads

    value, _ = loss(losses.ntxent, embeddings, jnp.arange(4))  # no positive pair
    assert value == 0
    value, _ = loss(losses.ntxent, embeddings, jnp.zeros(4, jnp.int32))  # no negative
    assert value == 0
    loss(losses.ntxent, embeddings.at[0].set(0.0), jnp.array([0, 0, 1, 1]))


def test_difference_ntxent_without_positive_pairs():
    embeddings = _normal(jax.random.key(0), (4, 3))
    assert jnp.isnan(_jit(optax.losses.ntxent)(embeddings, jnp.arange(4)))
    assert _jit(losses.ntxent)(embeddings, jnp.arange(4)) == 0


def test_difference_triplet_odd_degree():
    anchors, positives, negatives = _triplet_inputs()(jax.random.key(0))
    ours = losses.triplet_margin_loss(
        anchors, positives, negatives, norm_degree=1, eps=0.0
    )
    l1 = lambda x, y: jnp.sum(jnp.abs(x - y), axis=-1)
    expected = jax.nn.relu(l1(anchors, positives) - l1(anchors, negatives) + 1.0)
    assert_tree_allclose(ours, expected)
    theirs = optax.losses.triplet_margin_loss(
        anchors, positives, negatives, norm_degree=1, eps=0.0
    )
    assert not jnp.allclose(ours, theirs)


# ---------------------------------------------------------------------------
# Issue 7: triplet gradients.


def test_triplet_margin_loss_gradient_matches_optax_for_even_degrees():
    keys = jax.random.split(jax.random.key(3), 3)
    anchors, positives, negatives = (_normal(k, (8, 6)) for k in keys)

    def gradient(loss, **kwargs):
        total = lambda a, p, n: jnp.sum(loss(a, p, n, **kwargs))
        return jax.grad(total, argnums=(0, 1, 2))(anchors, positives, negatives)

    for kwargs in ({}, {"norm_degree": 4}, {"axis": 0, "margin": 0.5}):
        assert_tree_allclose(
            gradient(losses.triplet_margin_loss, **kwargs),
            gradient(optax.losses.triplet_margin_loss, **kwargs),
            rtol=1e-5,
            atol=1e-6,
        )


def test_difference_triplet_odd_degree_gradient():
    """The "max abs error 2" of issue 7: with `norm_degree=1` Optax differentiates
    the signed sum `sum(a - p)`, a gradient of +-1 per entry where the L1 distance
    has `sign(a - p)`."""
    keys = jax.random.split(jax.random.key(3), 3)
    anchors, positives, negatives = (_normal(k, (8, 6)) for k in keys)

    def gradient(loss):
        total = lambda a: jnp.sum(loss(a, positives, negatives, norm_degree=1, eps=0.0))
        return jax.grad(total)(anchors)

    ours = gradient(losses.triplet_margin_loss)
    theirs = gradient(optax.losses.triplet_margin_loss)
    l1 = lambda a: jnp.sum(
        jax.nn.relu(
            jnp.sum(jnp.abs(a - positives), -1)
            - jnp.sum(jnp.abs(a - negatives), -1)
            + 1
        )
    )
    assert_tree_allclose(ours, jax.grad(l1)(anchors))
    assert float(jnp.max(jnp.abs(ours - theirs))) == 2.0
