"""Shared by the loss tests: input builders, the registry's `Case`, and checks.

Random numbers come from `jax.random.key(seed)`, drawn as one fixed-size pool
(so the random kernel compiles once, not once per shape) and shaped in NumPy.
"""

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np

# The tests compile many small graphs, for which XLA's backend optimisations cost
# far more time than they save.
_jit = functools.partial(
    jax.jit,
    compiler_options={
        "xla_backend_optimization_level": 0,
        "xla_llvm_disable_expensive_passes": True,
    },
)


# ---------------------------------------------------------------------------
# Input builders. Each takes a key and returns the positional arguments.
#
# Random numbers come from `jax.random.key(seed)`, drawn as one fixed-size pool
# (so the random kernel compiles once, not once per shape) and shaped in NumPy.

_POOL_SIZE = 256


def _pool(key, kind: str) -> np.ndarray:
    draw = jax.random.normal if kind == "normal" else jax.random.uniform
    return np.asarray(draw(key, (_POOL_SIZE,)), np.float32)


def _split(key, num=2):
    return jax.random.split(key, num)


def _normal(key, shape, scale=1.0):
    return jnp.asarray(scale * _pool(key, "normal")[: math.prod(shape)].reshape(shape))


def _uniform_np(key, shape) -> np.ndarray:
    return _pool(key, "uniform")[: math.prod(shape)].reshape(shape)


def _randint_np(key, shape, low, high) -> np.ndarray:
    return (low + np.floor(_uniform_np(key, shape) * (high - low))).astype(np.int32)


def _softmax_np(x, axis=-1) -> np.ndarray:
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)


def _one_hot_np(indices, num_classes) -> np.ndarray:
    return np.eye(num_classes, dtype=np.float32)[indices]


def _regression(shape=(3, 4), scale=1.0):
    def make(key):
        k1, k2 = _split(key)
        return _normal(k1, shape, scale), _normal(k2, shape, scale)

    return make


def _logits_and_distribution(shape=(3, 5), axis=-1):
    def make(key):
        k1, k2 = _split(key)
        distribution = _softmax_np(_normal(k2, shape), axis=axis)
        return _normal(k1, shape, 2.0), jnp.asarray(distribution)

    return make


def _logits_and_indices(logits_shape, labels_shape, num_classes):
    def make(key):
        k1, k2 = _split(key)
        labels = _randint_np(k2, labels_shape, 0, num_classes)
        return _normal(k1, logits_shape, 2.0), jnp.asarray(labels)

    return make


def _logits_and_binary(shape=(3, 4), soft=True, integer=False, signed=False):
    def make(key):
        k1, k2 = _split(key)
        labels = _uniform_np(k2, shape)
        if not soft:
            labels = np.round(labels)
            if signed:
                labels = 2 * labels - 1
            if integer:
                labels = labels.astype(np.int32)
        return _normal(k1, shape, 2.0), jnp.asarray(labels)

    return make


def _log_predictions_and_targets(shape=(3, 5), normalised=True):
    def make(key):
        k1, k2 = _split(key)
        if normalised:
            log_predictions = np.log(_softmax_np(_normal(k1, shape)))
            return jnp.asarray(log_predictions), jnp.asarray(
                _softmax_np(_normal(k2, shape))
            )
        targets = np.exp(np.asarray(_normal(k2, shape, 0.5)))
        return _normal(k1, shape, 0.5), jnp.asarray(targets)

    return make


def _log_predictions_and_log_targets(key):
    k1, k2 = _split(key)
    return (
        jnp.asarray(np.log(_softmax_np(_normal(k1, (3, 5))))),
        jnp.asarray(np.log(_softmax_np(_normal(k2, (3, 5))))),
    )


def _smooth_inputs(key):
    return jnp.asarray(_one_hot_np(_randint_np(key, (3,), 0, 4), 4)), 0.1


def _ctc_inputs(key):
    batch, time, classes, num_labels = 3, 6, 4, 3
    k1, k2 = _split(key)
    logits = _normal(k1, (batch, time, classes))
    labels = _randint_np(k2, (batch, num_labels), 1, classes)
    labels[1, 1] = labels[1, 0]  # a repeated label
    logit_paddings = np.array([[0.0] * 6, [0.0] * 5 + [1.0], [0.0] * 4 + [1.0] * 2])
    label_paddings = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    return (
        logits,
        jnp.asarray(logit_paddings, jnp.float32),
        jnp.asarray(labels),
        jnp.asarray(label_paddings, jnp.float32),
    )


def _ntxent_inputs(key):
    return _normal(key, (7, 3)), jnp.array([0, 0, 0, 1, 1, 2, 3])


def _triplet_inputs(shape=(4, 3)):
    def make(key):
        k1, k2, k3 = _split(key, 3)
        anchors = np.asarray(_normal(k1, shape))
        positives = anchors + np.asarray(_normal(k2, shape, 0.5))
        return jnp.asarray(anchors), jnp.asarray(positives), _normal(k3, shape)

    return make


def _ranking_inputs(key):
    k1, k2 = _split(key)
    labels = _randint_np(k2, (3, 5), 0, 3).astype(np.float32)
    return _normal(k1, (3, 5)), jnp.asarray(labels)


def _segmentation_inputs(shape=(2, 3, 3, 3), probabilities=False):
    def make(key):
        k1, k2 = _split(key)
        predictions = _normal(k1, shape)
        if probabilities:
            predictions = jnp.asarray(_softmax_np(predictions, axis=-1))
        classes = _randint_np(k2, shape[:-1], 0, shape[-1])
        return predictions, jnp.asarray(_one_hot_np(classes, shape[-1]))

    return make


def _binary_segmentation_inputs(shape):
    def make(key):
        k1, k2 = _split(key)
        return _normal(k1, shape), jnp.asarray(np.round(_uniform_np(k2, shape)))

    return make


# ---------------------------------------------------------------------------
# The registry.


@dataclasses.dataclass(frozen=True)
class Case:
    #: Test id.
    id: str
    #: The function's name in both `optax.losses` and `eqopt.losses`.
    name: str
    #: key -> positional arguments.
    inputs: Callable[[Any], tuple]
    #: Keyword arguments for both calls; a callable gets the positional arguments.
    kwargs: dict | Callable[[tuple], dict] = dataclasses.field(default_factory=dict)
    #: Positions of the arguments to differentiate; `None`: every floating one.
    grad_argnums: tuple[int, ...] | None = None
    #: Turns the namespace's function into the loss to call (for factories).
    build: Callable[[Callable], Callable] | None = None
    rtol: float = 1e-5
    atol: float = 1e-6
    grad_rtol: float = 1e-4
    grad_atol: float = 1e-5
    #: Optax's gradient has NaNs here (ours must be finite); compared elsewhere.
    optax_nan_gradient: bool = False
    #: Whether Optax's function can be jitted.
    jit: bool = True


def _with_where(make_where):
    return lambda args: {"where": make_where(args)}


# Drawn now: masks are built inside `jit`, where random numbers would be traced.
_WHERE_POOL = _pool(jax.random.key(99), "uniform")


def _full_where(args):
    """A mask of the first argument's shape selecting about 2/3 of the entries,
    at least one per row."""
    shape = jnp.shape(args[0])
    mask = _WHERE_POOL[: math.prod(shape)].reshape(shape) < 0.66
    mask[..., 0] = True
    return jnp.asarray(mask)


def _row_where(args):
    shape = jnp.shape(args[0])[:-1]
    return jnp.asarray(np.arange(math.prod(shape)).reshape(shape) % 2 == 0)


def _fenchel_young(factory):
    return factory(jax.nn.logsumexp)


# ---------------------------------------------------------------------------
# Checks shared by the edge tests.


def _finite_value_and_grads(fn, *args, argnums=0):
    """`fn(*args)` and the gradient of its sum (one `jit`), both checked finite."""

    def summed(*a):
        value = fn(*a)
        return jnp.sum(value), value

    (_, value), grads = _jit(jax.value_and_grad(summed, argnums=argnums, has_aux=True))(
        *args
    )
    for leaf in jax.tree.leaves((value, grads)):
        assert jnp.all(jnp.isfinite(leaf)), (value, grads)
    return value, grads


MASKED_LOGITS = jnp.array([[1.0, 2.0, -jnp.inf], [0.5, -1.0, 2.0]])


MASKED_LABELS = jnp.array([[0.3, 0.7, 0.0], [0.0, 1.0, 0.0]])


EXTREME_LOGITS = jnp.array([jnp.inf, -jnp.inf, 50.0, -50.0, 0.0])


EXTREME_LABELS = jnp.array([1.0, 0.0, 1.0, 0.0, 1.0])


_TYPE_ERROR = jaxtyping.TypeCheckError
