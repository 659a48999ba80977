"""Tests for `eqopt.losses`, driven by a registry of cases.

Optax is the numerical oracle: every case calls the same-named function from
`optax.losses` and `eqopt.losses` on the same fixed random inputs, and the
generic tests here compare the values and the gradients of the summed loss with
respect to the floating inputs. The cases (`LOSS_CASES`) live beside each
submodule's own tests, in `test_losses_<submodule>.py`: the edges
(probabilities of exactly 0 or 1, `-inf` logits, all-padding labels, empty
`where` masks), bad inputs and documented differences from Optax. Tests that
span several submodules are here, with the docstring checks.
"""

import inspect
import warnings

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import optax
import pytest
import test_losses_classification
import test_losses_ctc
import test_losses_divergence
import test_losses_fenchel_young
import test_losses_ranking
import test_losses_regression
import test_losses_segmentation
import test_losses_self_supervised
from helpers import assert_tree_allclose
from loss_helpers import (
    EXTREME_LABELS,
    EXTREME_LOGITS,
    MASKED_LABELS,
    MASKED_LOGITS,
    Case,
    _finite_value_and_grads,
    _jit,
    _normal,
    _softmax_np,
)

import eqopt
import eqopt.losses as losses
from eqopt.losses._utils import ShapeMismatchError

PUBLIC_NAMES = (
    "l2_loss",
    "squared_error",
    "huber_loss",
    "log_cosh",
    "cosine_similarity",
    "cosine_distance",
    "softmax_cross_entropy",
    "softmax_cross_entropy_with_integer_labels",
    "safe_softmax_cross_entropy",
    "sigmoid_binary_cross_entropy",
    "sigmoid_focal_loss",
    "poly_loss_cross_entropy",
    "smooth_labels",
    "hinge_loss",
    "multiclass_hinge_loss",
    "perceptron_loss",
    "multiclass_perceptron_loss",
    "sparsemax_loss",
    "multiclass_sparsemax_loss",
    "make_fenchel_young_loss",
    "kl_divergence",
    "kl_divergence_with_log_targets",
    "convex_kl_divergence",
    "generalized_kl_divergence",
    "ctc_loss",
    "ctc_loss_with_forward_probs",
    "ntxent",
    "triplet_margin_loss",
    "ranking_softmax_loss",
    "dice_loss",
    "binary_dice_loss",
    "multiclass_generalized_dice_loss",
)


# Every submodule's cases, in the order of the package (a case's inputs are drawn
# from its position in this list).
CASES = [
    case
    for module in (
        test_losses_regression,
        test_losses_classification,
        test_losses_fenchel_young,
        test_losses_divergence,
        test_losses_ctc,
        test_losses_self_supervised,
        test_losses_ranking,
        test_losses_segmentation,
    )
    for case in module.LOSS_CASES
]

_ids = [case.id for case in CASES]
assert len(set(_ids)) == len(_ids), "duplicate case ids"


def _call(case: Case, namespace, args):
    fn = getattr(namespace, case.name)
    if case.build is not None:
        fn = case.build(fn)
    kwargs = case.kwargs(args) if callable(case.kwargs) else case.kwargs
    if namespace is optax.losses:
        # Some Optax losses rely on implicit rank promotion; one is deprecated.
        with jax.numpy_rank_promotion("allow"), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return fn(*args, **kwargs)
    return fn(*args, **kwargs)


def _args(case: Case, index: int):
    return case.inputs(jax.random.key(index))


def _grad_argnums(case: Case, args) -> tuple[int, ...]:
    if case.grad_argnums is not None:
        return case.grad_argnums
    return tuple(
        i
        for i, arg in enumerate(args)
        if hasattr(arg, "dtype") and jnp.issubdtype(arg.dtype, jnp.floating)
    )


def _value_and_grad(case: Case, namespace, args, argnums):
    """The loss and the gradient of its sum, computed under one `jit`."""

    def summed(*args):
        value = _call(case, namespace, args)
        loss = value[0] if isinstance(value, tuple) else value  # ctc forward probs
        return jnp.sum(loss), value

    def value_and_grad(*args):
        (_, value), grads = jax.value_and_grad(summed, argnums=argnums, has_aux=True)(
            *args
        )
        return value, grads

    # One compilation is much cheaper than dispatching the graph op by op.
    if case.jit or namespace is losses:
        value_and_grad = _jit(value_and_grad)
    return value_and_grad(*args)


# ---------------------------------------------------------------------------
# Generic tests.


def test_registry_covers_every_public_name():
    assert {case.name for case in CASES} == set(PUBLIC_NAMES)
    for name in PUBLIC_NAMES:
        assert hasattr(losses, name), name
        assert hasattr(optax.losses, name), name


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_parity_with_optax(case):
    """Same values, and same gradients of the summed loss wrt the floating inputs."""
    args = _args(case, CASES.index(case))
    argnums = _grad_argnums(case, args)
    ours, our_grads = _value_and_grad(case, losses, args, argnums)
    theirs, their_grads = _value_and_grad(case, optax.losses, args, argnums)
    if isinstance(theirs, tuple):
        theirs = tuple(theirs)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        assert a.shape == b.shape
        assert jnp.all(jnp.isfinite(a))
    assert_tree_allclose(ours, theirs, rtol=case.rtol, atol=case.atol)

    for leaf in jax.tree.leaves(our_grads):
        assert jnp.all(jnp.isfinite(leaf))
    finite = jax.tree.map(jnp.isfinite, their_grads)
    all_finite = all(bool(jnp.all(f)) for f in jax.tree.leaves(finite))
    assert all_finite != case.optax_nan_gradient
    if case.optax_nan_gradient:
        our_grads = jax.tree.map(lambda x, f: jnp.where(f, x, 0), our_grads, finite)
        their_grads = jax.tree.map(lambda x, f: jnp.where(f, x, 0), their_grads, finite)
    assert_tree_allclose(
        our_grads, their_grads, rtol=case.grad_rtol, atol=case.grad_atol
    )


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_signature_matches_optax(name):
    ours = inspect.signature(getattr(losses, name)).parameters
    theirs = inspect.signature(getattr(optax.losses, name)).parameters
    assert list(ours) == list(theirs)
    for parameter, other in zip(ours.values(), theirs.values(), strict=True):
        assert parameter.kind == other.kind, parameter.name
        assert parameter.default == other.default, parameter.name


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_docstring(name):
    doc = inspect.getdoc(getattr(losses, name))
    assert doc, name
    first_line = doc.splitlines()[0]
    assert first_line.endswith("."), first_line
    for section in ("$$", "**Arguments:**", "**Returns:**", "**References:**"):
        assert section in doc, (name, section)


def test_no_optax_import():
    import pathlib
    import re

    package = pathlib.Path(losses.__file__).parent
    for path in package.glob("*.py"):
        assert not re.search(r"^\s*(import|from)\s+optax", path.read_text(), re.M), path


def test_jit_and_vmap():
    logits = jnp.arange(12.0).reshape(4, 3) / 5
    labels = jnp.array([0, 2, 1, 1])
    expected = losses.softmax_cross_entropy_with_integer_labels(logits, labels)
    jitted = jax.jit(losses.softmax_cross_entropy_with_integer_labels)(logits, labels)
    mapped = jax.vmap(losses.softmax_cross_entropy_with_integer_labels)(logits, labels)
    assert_tree_allclose(jitted, expected)
    assert_tree_allclose(mapped, expected)


# ---------------------------------------------------------------------------
# Edges and differences spanning several submodules.


def test_minus_inf_logits_integer_labels_and_ranking():
    labels = jnp.array([1, 0])
    value, _ = _finite_value_and_grads(
        losses.softmax_cross_entropy_with_integer_labels, MASKED_LOGITS, labels
    )
    assert_tree_allclose(
        value,
        losses.safe_softmax_cross_entropy(MASKED_LOGITS, jax.nn.one_hot(labels, 3)),
    )
    _finite_value_and_grads(
        lambda x, y: losses.ranking_softmax_loss(x, y, reduce_fn=None),
        MASKED_LOGITS,
        MASKED_LABELS,
        argnums=(0, 1),
    )


def _empty_where_cases():
    logits = jnp.array([[1.0, 2.0, 0.5], [0.3, -1.0, 2.0]])
    distribution = _softmax_np(np.array([[0.1, 0.2, 0.3], [1.0, 0.0, -1.0]]))
    log_distribution = jnp.asarray(np.log(distribution))
    distribution = jnp.asarray(distribution)
    return [
        ("cosine_similarity", (logits, distribution), {}),
        ("cosine_distance", (logits, distribution), {}),
        ("softmax_cross_entropy", (logits, distribution), {}),
        ("softmax_cross_entropy_with_integer_labels", (logits, jnp.array([0, 2])), {}),
        ("poly_loss_cross_entropy", (logits, distribution), {}),
        ("kl_divergence", (log_distribution, distribution), {}),
        ("kl_divergence_with_log_targets", (log_distribution, log_distribution), {}),
        ("generalized_kl_divergence", (logits, distribution), {}),
        ("convex_kl_divergence", (logits, distribution), {}),
        ("ranking_softmax_loss", (logits, distribution), {"reduce_fn": None}),
        ("ranking_softmax_loss", (logits, distribution), {}),
    ]


@pytest.mark.parametrize(
    "name, args, kwargs",
    _empty_where_cases(),
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_where_selecting_nothing(name, args, kwargs):
    fn = getattr(losses, name)
    nothing = jnp.zeros(args[0].shape, bool)
    floating = tuple(
        i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating)
    )
    value, grads = _finite_value_and_grads(
        lambda *a: fn(*a, where=nothing, **kwargs), *args, argnums=floating
    )
    expected = 1.0 if name == "cosine_distance" else 0.0
    assert_tree_allclose(value, jnp.full_like(value, expected))
    for leaf in jax.tree.leaves(grads):
        assert_tree_allclose(leaf, jnp.zeros_like(leaf))
    # First row selected, second empty.
    partly = nothing.at[0].set(True)
    _finite_value_and_grads(
        lambda *a: fn(*a, where=partly, **kwargs), *args, argnums=floating
    )


def test_coincident_or_zero_vectors():
    anchors = _normal(jax.random.key(0), (3, 4))
    _finite_value_and_grads(lambda a: losses.triplet_margin_loss(a, a, -a), anchors)
    zeros = jnp.zeros((3, 4))
    value, _ = _finite_value_and_grads(
        losses.cosine_similarity, zeros, anchors, argnums=(0, 1)
    )
    assert_tree_allclose(value, jnp.zeros(3))


# ---------------------------------------------------------------------------
# Bad inputs.

_TYPE_ERROR = jaxtyping.TypeCheckError
_SHAPE_ERROR = ShapeMismatchError  # a ValueError (and a TypeError, as JAX's are)

Z = jnp.zeros


@pytest.mark.parametrize(
    "call, error, match",
    [
        # Wrong dtypes are type errors.
        (
            lambda: losses.softmax_cross_entropy_with_integer_labels(
                Z((2, 3)), jnp.array([0.0, 2.0])
            ),
            _TYPE_ERROR,
            "argument `labels`",
        ),
        (
            lambda: losses.softmax_cross_entropy_with_integer_labels(
                Z((2, 3), jnp.int32), jnp.array([0, 1])
            ),
            _TYPE_ERROR,
            "argument `logits`",
        ),
        (
            lambda: losses.multiclass_hinge_loss(Z((2, 4)), Z(2)),
            _TYPE_ERROR,
            "argument `labels`",
        ),
        (
            lambda: losses.kl_divergence(Z((2, 3)), Z((2, 3)), where=jnp.ones((2, 3))),
            _TYPE_ERROR,
            "argument `where`",
        ),
        (
            lambda: losses.ctc_loss(Z((2, 5, 3)), Z((2, 5)), Z((2, 2)), Z((2, 2))),
            _TYPE_ERROR,
            "argument `labels`",
        ),
        # Bad values (shapes that do not agree, unknown choices) are value errors;
        # any value outside a choice's options is one, as in Optax.
        (
            lambda: losses.dice_loss(Z((2, 3, 3)), Z((2, 3, 3)), reduction=1),
            eqopt.ArgumentValueError,
            "argument `reduction` must be one of 'mean', 'sum', 'none', got int 1",
        ),
        (
            lambda: losses.softmax_cross_entropy(Z((2, 3)), jnp.array([0, 2])),
            _SHAPE_ERROR,
            r"`labels` has shape \(2,\) but `logits` has shape \(2, 3\)",
        ),
        (
            lambda: losses.softmax_cross_entropy(Z((2, 3)), Z((2, 4))),
            _SHAPE_ERROR,
            r"`labels` has shape \(2, 4\)",
        ),
        (
            lambda: losses.softmax_cross_entropy_with_integer_labels(
                Z((2, 3)), jnp.array([0, 1, 2])
            ),
            ValueError,
            r"`labels` must have the shape of `logits` \(2, 3\) without axis -1",
        ),
        (
            lambda: losses.multiclass_sparsemax_loss(Z((2, 4)), jnp.array([0, 1, 2])),
            _SHAPE_ERROR,
            "`labels` has shape \\(3,\\) but `scores` without its last axis",
        ),
        (
            lambda: losses.sigmoid_binary_cross_entropy(Z((4, 1)), Z(4)),
            _SHAPE_ERROR,
            "`labels`",
        ),
        (
            lambda: losses.squared_error(Z((4, 1)), Z(4)),
            _SHAPE_ERROR,
            r"squared_error: `targets` has shape \(4,\)",
        ),
        (
            lambda: losses.l2_loss(Z((2, 3)), Z((3, 3))),
            _SHAPE_ERROR,
            "`targets`",
        ),
        (
            lambda: losses.softmax_cross_entropy(
                Z((2, 3)), Z((2, 3)), where=jnp.ones(3, bool)
            ),
            ValueError,
            r"`where` must have shape \(2, 3\) or \(2,\)",
        ),
        (
            lambda: losses.cosine_similarity(Z((2, 3)), Z((2, 3)), axis=2),
            ValueError,
            "out of range",
        ),
        (
            lambda: losses.ctc_loss(
                Z((2, 5, 3)), Z((2, 4)), Z((2, 2), jnp.int32), Z((2, 2))
            ),
            _SHAPE_ERROR,
            "`logit_paddings`",
        ),
        (
            lambda: losses.ctc_loss(
                Z((2, 5)), Z((2, 5)), Z((2, 2), jnp.int32), Z((2, 2))
            ),
            _SHAPE_ERROR,
            "`logit_paddings`",
        ),
        (
            lambda: losses.ntxent(Z((4, 3)), jnp.array([0, 0, 1])),
            _SHAPE_ERROR,
            "`labels`",
        ),
        (
            lambda: losses.dice_loss(Z((2, 3, 3)), Z((2, 3, 3)), reduction="avg"),
            ValueError,
            "`reduction` must be one of",
        ),
        (
            lambda: losses.dice_loss(Z((2, 3, 3)), Z((2, 3, 4))),
            _SHAPE_ERROR,
            "`targets`",
        ),
        (
            lambda: losses.dice_loss(Z((2, 3, 3)), Z((2, 3, 3)), axis=(1, 2)),
            ValueError,
            "includes the class axis",
        ),
        (
            lambda: losses.triplet_margin_loss(Z((2, 3)), Z((2, 3)), Z((3, 3))),
            _SHAPE_ERROR,
            "`negatives`",
        ),
    ],
)
def test_bad_inputs(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_shape_errors_are_value_and_type_errors():
    """Optax raises `ValueError` where it checks shapes and JAX's `TypeError` where
    it broadcasts: code catching either catches ours."""
    for error in (ValueError, TypeError):
        with pytest.raises(error):
            losses.squared_error(Z((4, 1)), Z(4))
    for name, arguments in (
        ("squared_error", (Z((4, 1)), Z(4))),
        ("l2_loss", (Z((2, 3)), Z((3, 3)))),
        ("perceptron_loss", (Z((2, 3)), Z((2, 4)))),
        ("dice_loss", (Z((2, 3, 3)), Z((2, 3, 4)))),
        ("ctc_loss", (Z((2, 5)), Z((2, 5)), Z((2, 2), jnp.int32), Z((2, 2)))),
    ):
        with pytest.raises(ValueError):
            getattr(optax.losses, name)(*arguments)
        with pytest.raises(ValueError):
            getattr(losses, name)(*arguments)
    with pytest.raises(ValueError):
        optax.losses.dice_loss(Z((2, 3, 3)), Z((2, 3, 3)), reduction="avg")


def test_bad_inputs_raise_under_jit():
    fn = jax.jit(losses.softmax_cross_entropy)
    with pytest.raises(_SHAPE_ERROR, match="`labels`"):
        fn(Z((2, 3)), jnp.array([0, 2]))
    with pytest.raises(_TYPE_ERROR, match="argument `labels`"):
        fn(Z((2, 3)), jnp.zeros((2, 3), jnp.int32))


# ---------------------------------------------------------------------------
# Documented differences from Optax.


def test_difference_softmax_cross_entropy_minus_inf():
    assert jnp.all(
        jnp.isnan(optax.losses.softmax_cross_entropy(MASKED_LOGITS, MASKED_LABELS)[0])
    )
    assert_tree_allclose(
        losses.softmax_cross_entropy(MASKED_LOGITS, MASKED_LABELS),
        optax.losses.safe_softmax_cross_entropy(MASKED_LOGITS, MASKED_LABELS),
    )


def test_difference_saturated_sigmoid_cross_entropy():
    assert jnp.any(
        jnp.isnan(
            optax.losses.sigmoid_binary_cross_entropy(EXTREME_LOGITS, EXTREME_LABELS)
        )
    )
    assert jnp.all(
        jnp.isfinite(
            losses.sigmoid_binary_cross_entropy(EXTREME_LOGITS, EXTREME_LABELS)
        )
    )


def test_difference_smooth_labels_where():
    labels = jnp.array([[0.0, 1.0, 0.0, 0.0]])
    where = jnp.array([[True, True, True, False]])
    ours = losses.smooth_labels(labels, 0.3, where=where)
    theirs = optax.losses.smooth_labels(labels, 0.3, where=where)
    assert_tree_allclose(ours[:, :3], theirs[:, :3])  # same on the selected classes
    assert ours[0, 3] == 0 and theirs[0, 3] > 0  # left-out class kept as is
    assert_tree_allclose(jnp.sum(ours), jnp.array(1.0))


@pytest.mark.parametrize(
    "name",
    [
        "huber_loss",
        "log_cosh",
        "sigmoid_binary_cross_entropy",
        "sigmoid_focal_loss",
        "hinge_loss",
    ],
)
def test_difference_no_implicit_broadcasting(name):
    predictions, targets = jnp.zeros((4, 1)), jnp.arange(4.0)
    ours, theirs = getattr(losses, name), getattr(optax.losses, name)
    with jax.numpy_rank_promotion("allow"):
        assert jax.eval_shape(theirs, predictions, targets).shape == (4, 4)
    with pytest.raises(_SHAPE_ERROR):
        jax.eval_shape(ours, predictions, targets)
    assert jax.eval_shape(ours, predictions[:, 0], targets).shape == (4,)
