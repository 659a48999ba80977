"""Segmentation losses (`eqopt/losses/_segmentation.py`): the registry cases, compared with Optax by the
generic tests of test_losses.py, and their edges, bad inputs and documented
differences from Optax."""

import jax
import jax.numpy as jnp
import optax
import pytest
from helpers import assert_tree_allclose
from loss_helpers import (
    Case,
    _binary_segmentation_inputs,
    _finite_value_and_grads,
    _jit,
    _segmentation_inputs,
)

import eqopt.losses as losses

LOSS_CASES = [
    Case("dice_loss", "dice_loss", _segmentation_inputs()),
    Case(
        "dice_loss-none-tversky",
        "dice_loss",
        _segmentation_inputs(),
        {"reduction": "none", "alpha": 0.3, "beta": 0.7, "smooth": 0.5},
    ),
    Case(
        "dice_loss-weights-sum-background",
        "dice_loss",
        _segmentation_inputs(),
        {
            "class_weights": jnp.array([1.0, 2.0, 3.0]),
            "reduction": "sum",
            "ignore_background": True,
        },
    ),
    Case(  # Optax checks the probabilities by value, so it cannot be jitted.
        "dice_loss-probabilities-axis",
        "dice_loss",
        _segmentation_inputs(probabilities=True),
        {"apply_softmax": False, "axis": (1,)},
        jit=False,
    ),
    Case("dice_loss-single-class", "dice_loss", _binary_segmentation_inputs((2, 3, 1))),
    Case(  # A single class is the foreground: `ignore_background` keeps it.
        "dice_loss-single-class-ignore-background",
        "dice_loss",
        _binary_segmentation_inputs((2, 3, 1)),
        {"ignore_background": True},
    ),
    Case(
        "binary_dice_loss", "binary_dice_loss", _binary_segmentation_inputs((2, 3, 3))
    ),
    Case(
        "binary_dice_loss-class-axis",
        "binary_dice_loss",
        _binary_segmentation_inputs((2, 3, 1)),
        {"smooth": 0.1},
    ),
    Case(
        "multiclass_generalized_dice_loss",
        "multiclass_generalized_dice_loss",
        _segmentation_inputs(),
    ),
    Case(
        "multiclass_generalized_dice_loss-background",
        "multiclass_generalized_dice_loss",
        _segmentation_inputs((2, 4, 3)),
        {"ignore_background": True, "smooth": 0.5},
    ),
]


def test_generalized_dice_absent_class():
    predictions, targets = _segmentation_inputs()(jax.random.key(0))
    targets = targets.at[..., 2].set(0.0)
    _finite_value_and_grads(
        losses.multiclass_generalized_dice_loss, predictions, targets, argnums=(0, 1)
    )


def test_difference_dice_without_activation():
    predictions, targets = _binary_segmentation_inputs((2, 3, 3))(jax.random.key(0))
    probabilities = jax.nn.sigmoid(predictions)
    with pytest.raises(ValueError):
        optax.losses.binary_dice_loss(probabilities, targets, apply_sigmoid=False)
    assert_tree_allclose(
        losses.binary_dice_loss(probabilities, targets, apply_sigmoid=False),
        losses.binary_dice_loss(predictions, targets),
    )
    multiclass, one_hot = _segmentation_inputs(probabilities=True)(jax.random.key(1))
    jitted = _jit(lambda p: losses.dice_loss(p, one_hot, apply_softmax=False))(
        multiclass
    )
    assert_tree_allclose(
        jitted, optax.losses.dice_loss(multiclass, one_hot, apply_softmax=False)
    )


@pytest.mark.parametrize(
    "name", ["dice_loss", "multiclass_generalized_dice_loss", "binary_dice_loss"]
)
def test_boolean_targets_are_taken_as_floats(name):
    """One-hot masks are often boolean: they are accepted, as Optax accepts them."""
    logits = jax.random.normal(jax.random.key(0), (2, 6, 6, 3))
    masks = jax.nn.one_hot(jax.random.randint(jax.random.key(1), (2, 6, 6), 0, 3), 3)
    if name == "binary_dice_loss":
        logits, masks = logits[..., 0], masks[..., 0]
    ours = getattr(losses, name)(logits, masks > 0.5)
    assert_tree_allclose(ours, getattr(losses, name)(logits, masks))
    if name != "multiclass_generalized_dice_loss":  # Optax's promotes ranks
        assert_tree_allclose(ours, getattr(optax.losses, name)(logits, masks > 0.5))
