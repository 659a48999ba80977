"""Classification losses (`eqopt/losses/_classification.py`): the registry cases, compared with Optax by the
generic tests of test_losses.py, and their edges, bad inputs and documented
differences from Optax."""

import jax
import jax.numpy as jnp
import optax
import pytest
from helpers import assert_tree_allclose
from loss_helpers import (
    EXTREME_LABELS,
    EXTREME_LOGITS,
    MASKED_LABELS,
    MASKED_LOGITS,
    Case,
    _finite_value_and_grads,
    _full_where,
    _jit,
    _logits_and_binary,
    _logits_and_distribution,
    _logits_and_indices,
    _row_where,
    _smooth_inputs,
    _with_where,
)

import eqopt.losses as losses

LOSS_CASES = [
    Case("softmax_cross_entropy", "softmax_cross_entropy", _logits_and_distribution()),
    Case(
        "softmax_cross_entropy-axes",
        "softmax_cross_entropy",
        _logits_and_distribution((2, 3, 4), axis=(0, 2)),
        {"axis": (0, 2)},
    ),
    Case(
        "softmax_cross_entropy-axis-none",
        "softmax_cross_entropy",
        _logits_and_distribution(axis=None),
        {"axis": None},
    ),
    # Optax's gradient with respect to the labels of left-out classes is NaN.
    Case(
        "softmax_cross_entropy-where",
        "softmax_cross_entropy",
        _logits_and_distribution(),
        _with_where(_full_where),
        optax_nan_gradient=True,
    ),
    Case(
        "softmax_cross_entropy-where-rows",
        "softmax_cross_entropy",
        _logits_and_distribution(),
        _with_where(_row_where),
        optax_nan_gradient=True,
    ),
    Case(
        "softmax_cross_entropy_with_integer_labels",
        "softmax_cross_entropy_with_integer_labels",
        _logits_and_indices((2, 3, 5), (2, 3), 5),
    ),
    Case(
        "softmax_cross_entropy_with_integer_labels-axis0",
        "softmax_cross_entropy_with_integer_labels",
        _logits_and_indices((5, 3), (3,), 5),
        {"axis": 0},
    ),
    Case(  # A label is a row-major index into the slice, axes in the order given.
        "softmax_cross_entropy_with_integer_labels-axes",
        "softmax_cross_entropy_with_integer_labels",
        _logits_and_indices((2, 3, 4), (3,), 8),
        {"axis": (2, 0)},
    ),
    Case(
        "softmax_cross_entropy_with_integer_labels-where",
        "softmax_cross_entropy_with_integer_labels",
        _logits_and_indices((3, 5), (3,), 5),
        _with_where(_full_where),
    ),
    Case(
        "softmax_cross_entropy_with_integer_labels-where-rows",
        "softmax_cross_entropy_with_integer_labels",
        _logits_and_indices((4, 5), (4,), 5),
        _with_where(_row_where),
    ),
    Case(
        "safe_softmax_cross_entropy",
        "safe_softmax_cross_entropy",
        _logits_and_distribution((2, 2, 4)),
    ),
    Case(
        "sigmoid_binary_cross_entropy",
        "sigmoid_binary_cross_entropy",
        _logits_and_binary(),
    ),
    Case(
        "sigmoid_binary_cross_entropy-int",
        "sigmoid_binary_cross_entropy",
        _logits_and_binary(soft=False, integer=True),
    ),
    Case("sigmoid_focal_loss", "sigmoid_focal_loss", _logits_and_binary()),
    Case(
        "sigmoid_focal_loss-int-alpha-gamma",
        "sigmoid_focal_loss",
        _logits_and_binary(soft=False, integer=True),
        {"alpha": 0.25, "gamma": 0.5},
    ),
    Case(
        "poly_loss_cross_entropy",
        "poly_loss_cross_entropy",
        _logits_and_distribution(),
    ),
    Case(
        "poly_loss_cross_entropy-where-epsilon-axis0",
        "poly_loss_cross_entropy",
        _logits_and_distribution(axis=0),
        lambda args: {"where": _full_where(args), "epsilon": -1.0, "axis": 0},
        optax_nan_gradient=True,
    ),
    Case("smooth_labels", "smooth_labels", _smooth_inputs),
    Case("smooth_labels-axis0", "smooth_labels", _smooth_inputs, {"axis": 0}),
    Case(
        "hinge_loss",
        "hinge_loss",
        _logits_and_binary(soft=False, signed=True, integer=True),
    ),
    Case(
        "perceptron_loss",
        "perceptron_loss",
        _logits_and_binary(soft=False, signed=True),
    ),
    Case(
        "multiclass_hinge_loss",
        "multiclass_hinge_loss",
        _logits_and_indices((2, 3, 5), (2, 3), 5),
    ),
    Case(
        "multiclass_perceptron_loss",
        "multiclass_perceptron_loss",
        _logits_and_indices((4, 5), (4,), 5),
    ),
]


@pytest.mark.parametrize(
    "name",
    ["softmax_cross_entropy", "safe_softmax_cross_entropy", "poly_loss_cross_entropy"],
)
def test_minus_inf_logits_with_zero_label(name):
    fn = getattr(losses, name)
    value, grads = _finite_value_and_grads(
        fn, MASKED_LOGITS, MASKED_LABELS, argnums=(0, 1)
    )
    assert grads[0][0, 2] == 0
    # The masked class changes nothing: same as dropping it.
    dropped = _jit(fn)(MASKED_LOGITS[:1, :2], MASKED_LABELS[:1, :2])
    assert_tree_allclose(value[0], dropped[0])


@pytest.mark.parametrize(
    "fn",
    [
        losses.sigmoid_binary_cross_entropy,
        losses.sigmoid_focal_loss,
        lambda x, y: losses.sigmoid_focal_loss(x, y, gamma=0.5, alpha=0.25),
        lambda x, y: losses.sigmoid_focal_loss(x, y, gamma=0.0),
        lambda x, y: losses.sparsemax_loss(x, y.astype(jnp.int32)),
    ],
    ids=["bce", "focal", "focal-gamma0.5", "focal-gamma0", "sparsemax"],
)
def test_saturated_binary_predictions(fn):
    value, _ = _finite_value_and_grads(fn, EXTREME_LOGITS, EXTREME_LABELS)
    assert_tree_allclose(value[:4], jnp.zeros(4))


def test_focal_gamma_zero_is_cross_entropy():
    logits, labels = _logits_and_binary()(jax.random.key(0))
    assert_tree_allclose(
        losses.sigmoid_focal_loss(logits, labels, gamma=0.0),
        losses.sigmoid_binary_cross_entropy(logits, labels),
    )


def test_smooth_labels_where_selecting_nothing():
    labels = jnp.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    where = jnp.array([[True, True, False], [False, False, False]])
    smoothed = losses.smooth_labels(labels, 0.1, where=where)
    assert_tree_allclose(smoothed[0], jnp.array([0.05, 0.95, 0.0]))
    assert_tree_allclose(smoothed[1], labels[1])


@pytest.mark.parametrize(
    "name",
    [
        "softmax_cross_entropy_with_integer_labels",
        "multiclass_hinge_loss",
        "multiclass_perceptron_loss",
        "multiclass_sparsemax_loss",
    ],
)
def test_integer_label_out_of_range_is_nan(name):
    # Optax reads -1 as the last class (or some class) and gives a finite loss;
    # eqopt gives NaN for that example, and for a label past the last class.
    ours, theirs = getattr(losses, name), getattr(optax.losses, name)
    logits = jax.random.normal(jax.random.key(0), (4, 5))
    labels = jnp.array([0, -1, 5, 2])
    value = _jit(ours)(logits, labels)
    assert bool(jnp.isnan(value[1])) and bool(jnp.isnan(value[2]))
    # Valid labels: as before, and as Optax.
    valid = jnp.array([0, 3])
    assert_tree_allclose(value[valid], theirs(logits[valid], labels[valid]))

    # The gradient of the NaN examples is zero, so masking them out afterwards
    # leaves the gradient of the rest finite and equal to Optax's.
    def masked_mean(fn, x):
        return jnp.mean(jnp.where((labels >= 0) & (labels < 5), fn(x, labels), 0))

    grad = jax.grad(lambda x: masked_mean(ours, x))(logits)
    assert bool(jnp.all(jnp.isfinite(grad)))
    assert_tree_allclose(grad[1:3], jnp.zeros((2, 5)))
    expected = jax.grad(lambda x: jnp.sum(theirs(x[valid], labels[valid])) / 4)(logits)
    assert_tree_allclose(grad, expected)


def test_integer_labels_left_out_by_where_are_zero():
    # Padding examples often carry the label -1: left out by `where`, they are 0.
    logits = jax.random.normal(jax.random.key(1), (3, 4))
    labels = jnp.array([1, -1, 7])
    where = jnp.array([True, False, False])
    value = losses.softmax_cross_entropy_with_integer_labels(
        logits, labels, where=where
    )
    assert_tree_allclose(value[1:], jnp.zeros(2))
    assert bool(jnp.isfinite(value[0]))
