"""Shared test helpers: tree comparison, the registry's `Case`, the standard models and
the small fixtures several test files use."""

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Inexact, Int

import eqopt


def tree_allclose(x, y, *, rtol=1e-5, atol=1e-6, equal_nan=False) -> bool:
    """Whether two pytrees have the same structure and close array leaves."""
    x_leaves, x_def = jax.tree.flatten(x)
    y_leaves, y_def = jax.tree.flatten(y)
    if x_def != y_def:
        return False
    for a, b in zip(x_leaves, y_leaves, strict=True):
        if eqx.is_array_like(a) and eqx.is_array_like(b):
            a = np.asarray(
                jnp.asarray(a).astype(
                    jnp.promote_types(jnp.asarray(a).dtype, jnp.float32)
                )
            )
            b = np.asarray(
                jnp.asarray(b).astype(
                    jnp.promote_types(jnp.asarray(b).dtype, jnp.float32)
                )
            )
            if a.shape != b.shape:
                return False
            if not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan):
                return False
        elif a != b:
            return False
    return True


def compare_trees(ours: Any, theirs: Any) -> bool:
    """Whether eqopt's result has Optax's structure, shapes and dtypes, and close values."""
    ours = eqopt.tree.unwrap_random_key_data(ours)
    theirs = optax.tree.unwrap_random_key_data(theirs)
    if eqx.is_array(theirs) or eqx.is_array(ours):
        if jnp.shape(ours) != jnp.shape(theirs):
            return False
    ours_leaves, ours_def = jax.tree.flatten(ours)
    theirs_leaves, theirs_def = jax.tree.flatten(theirs)
    if ours_def != theirs_def:
        return False
    for a, b in zip(ours_leaves, theirs_leaves, strict=True):
        if (
            eqx.is_array(a)
            and eqx.is_array(b)
            and jnp.asarray(a).dtype != jnp.asarray(b).dtype
        ):
            return False
    return tree_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def assert_tree_allclose(x, y, *, rtol=1e-5, atol=1e-6, equal_nan=False):
    """`tree_allclose` with a message showing the largest difference."""
    if tree_allclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan):
        return
    x_leaves = jax.tree.leaves(x)
    y_leaves = jax.tree.leaves(y)
    msg = [f"trees differ: {jax.tree.structure(x)} vs {jax.tree.structure(y)}"]
    for i, (a, b) in enumerate(zip(x_leaves, y_leaves, strict=False)):
        a = np.asarray(
            jnp.asarray(a, dtype=jnp.complex64 if jnp.iscomplexobj(a) else jnp.float32)
        )
        b = np.asarray(
            jnp.asarray(b, dtype=jnp.complex64 if jnp.iscomplexobj(b) else jnp.float32)
        )
        if a.shape == b.shape and a.size:
            msg.append(f"leaf {i}: max abs diff {np.max(np.abs(a - b))}")
        else:
            msg.append(f"leaf {i}: shapes {a.shape} vs {b.shape}")
    raise AssertionError("\n".join(msg))


# ---------------------------------------------------------------------------
# The registry's case type (see registry.py)
# ---------------------------------------------------------------------------

#: Parameter dtypes for the parity test: every one Optax supports, or the real ones.
ALL_DTYPES = ("float32", "bfloat16", "complex64")
REAL_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Case:
    #: Test id, e.g. "scale_by_adam-nesterov".
    name: str
    #: Builds the eqopt transform: no argument, or `p`, the params it will train (to
    #: build masks and label trees shaped like them with `spec_like`).
    make: Callable[..., Any]
    #: Builds the Optax transform to compare against (same convention; its params
    #: are a dict of the trainable arrays), or None when there is no oracle.
    optax: Callable[..., Any] | None = None
    #: Parameter dtypes for the parity test. Complex only where Optax supports it.
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    #: Extra keyword arguments for `update`, built from `(model, grads)` at each step and
    #: passed to every generic test's `update`; Optax gets a model-shaped value (a
    #: line search's `grad`) as its dict params.
    extra_args: Callable[[Any, Any], dict] | None = None
    #: Tolerances for float32 parity; bfloat16 uses loose ones. eqopt keeps
    #: hyperparameters as float32 leaves, so `1 - b2` is rounded in float32 where
    #: Optax computes it in Python's float64 (a relative 1e-5 in Adam's second
    #: moment; see test_adam_complement_rounding), hence rtol 5e-5.
    rtol: float = 5e-5
    atol: float = 1e-5
    #: Number of steps to compare.
    steps: int = 4
    #: Whether the transform may need `params` in `update`; with False,
    #: `test_update_without_params` checks it gives the same updates without them.
    needs_params: bool = True
    #: Whether the update is random (compared by statistics, not values): skip parity.
    random: bool = False
    #: Why there is no parity test (required when `optax` is None or `random`):
    #: the parity test reports it as its skip reason.
    no_parity_reason: str | None = None


def build(factory: Callable[..., Any], params: Any) -> Any:
    """Calls a case's factory, passing the params if it takes an argument named `p`."""
    if "p" in inspect.signature(factory).parameters:
        return factory(params)
    return factory()


def spec_like(params: Any, default: Any = False, **values: Any) -> Any:
    """A tree shaped like `params` whose leaf under the field or key `name` is `values[name]`.

    Works for the dict params given to Optax and the Equinox model given to eqopt,
    so one case can state a mask or a label tree once for both.
    """

    def value(path, leaf):
        key = path[-1]
        name = getattr(key, "name", getattr(key, "key", None))
        return values.get(name, default)

    return jax.tree_util.tree_map_with_path(value, params, is_leaf=lambda x: x is None)


# ---------------------------------------------------------------------------
# The standard model: the leaves Equinox users have
# ---------------------------------------------------------------------------


class Model(eqx.Module):
    """A small model with arrays, functions, ints and strings as leaves."""

    w: Inexact[Array, "4 3"]
    b: Inexact[Array, "3"]
    s: Inexact[Array, ""]
    indices: Int[Array, "2"]
    activation: Callable = jax.nn.relu
    depth: int = 2
    name: str = "model"


def make_model(dtype=jnp.float32, seed=0) -> Model:
    """A `Model` with random trainable leaves of `dtype` (complex ones too)."""
    keys = jax.random.split(jax.random.key(seed), 6)

    def draw(key, shape):
        if jnp.issubdtype(dtype, jnp.complexfloating):
            real, imag = jax.random.normal(key, (2, *shape))
            return (real + 1j * imag).astype(dtype)
        return jax.random.normal(key, shape).astype(dtype)

    return Model(
        draw(keys[0], (4, 3)), draw(keys[1], (3,)), draw(keys[2], ()), jnp.array([0, 1])
    )


def model_loss(model: Model) -> jax.Array:
    """A loss of the standard model that uses its non-array leaves too."""
    x = jnp.arange(4.0)
    y = model.activation(jnp.real(x @ model.w + model.b)) * jnp.real(model.s)
    return jnp.sum(y**2) + model.depth


def as_dict(model: Model) -> dict:
    """The trainable leaves of a `Model` as the dict of params given to Optax."""
    return {"w": model.w, "b": model.b, "s": model.s}


def random_grads(model: Model, step: int):
    """Gradients shaped like eqx.filter_grad's output: None at non-trainable leaves."""
    other = make_model(model.w.dtype, seed=1000 + step)
    return eqx.tree_at(
        lambda m: (m.indices, m.activation, m.depth, m.name),
        other,
        (None, None, None, None),
        is_leaf=lambda x: x is None,
    )


def filtered(tree: Any) -> Any:
    """The arrays of a tree, `None` elsewhere: what Optax users pass to Optax."""
    return eqx.filter(tree, eqx.is_array)


@functools.cache
def make_mlp(
    seed: int = 0,
    *,
    in_size: int = 2,
    out_size: int = 2,
    width_size: int = 4,
    depth: int = 1,
) -> eqx.nn.MLP:
    """An `eqx.nn.MLP`: array leaves plus activation functions and int fields."""
    return eqx.nn.MLP(in_size, out_size, width_size, depth, key=jax.random.key(seed))


def complex_normal(shape: tuple[int, ...], seed: int = 0) -> jax.Array:
    """A `complex64` array of standard normal real and imaginary parts."""
    real, imag = jax.random.normal(jax.random.key(seed), (2, *shape))
    return (real + 1j * imag).astype(jnp.complex64)


# ---------------------------------------------------------------------------
# Small fixtures of the registry cases
# ---------------------------------------------------------------------------


def decaying_schedule(count):
    """A plain-function schedule, $0.1 / (1 + t)$."""
    return 0.1 / (1.0 + count)


def is_matrix(x) -> bool:
    """A per-leaf predicate (eqopt's kind of mask): the leaves of two or more axes."""
    return x.ndim > 1


def optax_matrices(params: dict) -> dict:
    """Optax's kind of mask for `is_matrix`: a function of the whole (dict) params."""
    return {k: v.ndim > 1 for k, v in params.items()}


def assert_state_stays_bfloat16(tx: Any) -> None:
    """Two updates on `bfloat16` params keep the updates and the state `bfloat16`."""
    params = {"w": jnp.ones((2, 2), jnp.bfloat16)}
    grads = {"w": jnp.full((2, 2), 0.5, jnp.bfloat16)}
    state = tx.init(params)
    for _ in range(2):
        updates, state = tx.update(grads, state)
    assert updates["w"].dtype == jnp.bfloat16, tx
    for leaf in jax.tree.leaves(state):
        assert leaf.dtype in (jnp.bfloat16, jnp.int32), (tx, leaf.dtype)


# ---------------------------------------------------------------------------
# inject_hyperparams: factories, small params, eqopt and Optax side by side
# ---------------------------------------------------------------------------


# Factories are module-level so that each case's transform keeps the same
# (hashable, static) factory across calls.
def adam_b1_then_rate(learning_rate, b1=0.9):
    return eqopt.chain(
        eqopt.scale_by_adam(b1=b1), eqopt.scale_by_learning_rate(learning_rate)
    )


def optax_adam_b1_then_rate(learning_rate, b1=0.9):
    return optax.chain(
        optax.scale_by_adam(b1=b1), optax.scale_by_learning_rate(learning_rate)
    )


# `b2` is injected too, so both sides compute `1 - b2` from the same float32 value
# and agree to rounding (see test_adam_complement_rounding in test_adam.py).
def adam_then_rate(learning_rate, b1=0.9, b2=0.999):
    return eqopt.chain(
        eqopt.scale_by_adam(b1=b1, b2=b2), eqopt.scale_by_learning_rate(learning_rate)
    )


def optax_adam_then_rate(learning_rate, b1=0.9, b2=0.999):
    return optax.chain(
        optax.scale_by_adam(b1=b1, b2=b2), optax.scale_by_learning_rate(learning_rate)
    )


def small_params() -> dict:
    return {
        "w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3),
        "b": jnp.array([0.5, -0.25, 2.0]),
    }


def small_grads(step: int) -> dict:
    key = jax.random.key(step)
    return {
        "w": jax.random.normal(key, (2, 3)),
        "b": jax.random.normal(jax.random.split(key)[0], (3,)),
    }


def run_both(tx, reference, steps, params=None, change=None, extra_args=None):
    """Runs both transforms side by side; `change(step, state)` may edit both states."""
    params = small_params() if params is None else params
    state, reference_state = tx.init(params), reference.init(params)
    for step in range(steps):
        if change is not None:
            state = change(step, state)
            reference_state = change(step, reference_state)
        grads = small_grads(step)
        extra = {} if extra_args is None else extra_args(step)
        updates, state = tx.update(grads, state, params, **extra)
        reference_updates, reference_state = reference.update(
            grads, reference_state, params, **extra
        )
        # Optax computes `1 - b2**t` under jit (a general power), eqopt eagerly
        # (repeated multiplication for a concrete integer `t`): up to 1e-5 apart.
        assert_tree_allclose(updates, reference_updates, rtol=5e-5, atol=1e-7)
        assert_tree_allclose(
            state.hyperparams, dict(reference_state.hyperparams), rtol=1e-6, atol=0
        )
    return state, reference_state
