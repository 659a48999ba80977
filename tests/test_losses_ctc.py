"""The CTC loss (`eqopt/losses/_ctc.py`): the registry cases, compared with Optax by the
generic tests of test_losses.py, and their edges, bad inputs and documented
differences from Optax."""

import jax
import jax.numpy as jnp
import numpy as np
from helpers import assert_tree_allclose
from loss_helpers import (
    Case,
    _ctc_inputs,
    _finite_value_and_grads,
)

import eqopt.losses as losses

LOSS_CASES = [
    Case(
        "ctc_loss-blank-epsilon",
        "ctc_loss",
        _ctc_inputs,
        {"blank_id": 2, "log_epsilon": -1e4},
        grad_argnums=(0,),
    ),
    Case(
        "ctc_loss_with_forward_probs",
        "ctc_loss_with_forward_probs",
        _ctc_inputs,
        grad_argnums=(0,),
    ),
]


def test_ctc_padding():
    logits, logit_paddings, labels, label_paddings = _ctc_inputs(jax.random.key(0))

    def loss(logits, logit_paddings, label_paddings):
        return losses.ctc_loss(logits, logit_paddings, labels, label_paddings)

    # Labels that are all padding: the probability of blanks on every frame.
    no_labels = jnp.ones(labels.shape)
    value, _ = _finite_value_and_grads(loss, logits, logit_paddings, no_labels)
    log_blank = jax.nn.log_softmax(logits)[..., 0]
    expected = -jnp.sum(jnp.where(logit_paddings > 0.5, 0, log_blank), axis=1)
    assert_tree_allclose(value, expected, rtol=1e-5, atol=1e-5)
    # Frames that are all padding, given as booleans.
    no_frames = jnp.ones(logits.shape[:2], bool)
    value, _ = _finite_value_and_grads(loss, logits, no_frames, label_paddings > 0.5)
    assert_tree_allclose(value, jnp.array([1e5 - np.log(2)] * 3), rtol=1e-6)


def test_ctc_against_brute_force():
    """Sums the probabilities of every alignment of a tiny problem."""
    import itertools

    logits, _, labels, _ = _ctc_inputs(jax.random.key(3))
    logits, labels = logits[:1, :4], labels[:1, :2]
    log_probs = np.asarray(jax.nn.log_softmax(logits[0]), np.float64)
    target = list(np.asarray(labels[0]))
    total = 0.0
    for path in itertools.product(range(logits.shape[-1]), repeat=4):
        collapsed = [
            s for i, s in enumerate(path) if s != 0 and (i == 0 or s != path[i - 1])
        ]
        if collapsed == target:
            total += np.exp(sum(log_probs[t, s] for t, s in enumerate(path)))
    loss = losses.ctc_loss(logits, jnp.zeros((1, 4)), labels, jnp.zeros((1, 2)))
    assert_tree_allclose(loss, jnp.array([-np.log(total)]), rtol=1e-5)


def test_ctc_label_out_of_range_is_nan():
    # A label that is not padding must be a class: -1 (which Optax reads as the
    # last class) and a label past the last class give NaN for their sequence.
    import optax

    logits, logit_paddings, _, _ = _ctc_inputs(jax.random.key(0))
    num_classes = logits.shape[-1]
    labels = jnp.array([[1, 2], [1, -1], [1, num_classes]])
    label_paddings = jnp.zeros(labels.shape)
    loss, logalpha_blank, logalpha_label = losses.ctc_loss_with_forward_probs(
        logits, logit_paddings, labels, label_paddings
    )
    assert bool(jnp.isfinite(loss[0])) and bool(jnp.all(jnp.isnan(loss[1:])))
    assert bool(jnp.all(jnp.isnan(logalpha_blank[:, 1:])))
    assert bool(jnp.all(jnp.isnan(logalpha_label[:, 1:])))
    expected = optax.losses.ctc_loss(
        logits[:1], logit_paddings[:1], labels[:1], label_paddings[:1]
    )
    assert_tree_allclose(loss[:1], expected, rtol=1e-5, atol=1e-5)
    # Padded labels may be anything: as Optax, with a finite gradient.
    padded = jnp.array([[0, 0], [0, 1], [0, 1]])

    def total(logits):
        return jnp.sum(losses.ctc_loss(logits, logit_paddings, labels, padded))

    value, grad = jax.value_and_grad(total)(logits)
    theirs = optax.losses.ctc_loss(logits, logit_paddings, labels, padded)
    assert_tree_allclose(value, jnp.sum(theirs), rtol=1e-5, atol=1e-5)
    assert bool(jnp.all(jnp.isfinite(grad)))
