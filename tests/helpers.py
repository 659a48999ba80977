"""Shared test helpers: tree comparison, the registry's `Case`, and the standard model."""

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Inexact, Int


def tree_allclose(x, y, *, rtol=1e-5, atol=1e-6, equal_nan=False) -> bool:
    """Whether two pytrees have the same structure and close array leaves."""
    x_leaves, x_def = jax.tree.flatten(x)
    y_leaves, y_def = jax.tree.flatten(y)
    if x_def != y_def:
        return False
    for a, b in zip(x_leaves, y_leaves):
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


def assert_tree_allclose(x, y, *, rtol=1e-5, atol=1e-6, equal_nan=False):
    """`tree_allclose` with a message showing the largest difference."""
    if tree_allclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan):
        return
    x_leaves = jax.tree.leaves(x)
    y_leaves = jax.tree.leaves(y)
    msg = [f"trees differ: {jax.tree.structure(x)} vs {jax.tree.structure(y)}"]
    for i, (a, b) in enumerate(zip(x_leaves, y_leaves)):
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
    #: Whether the transform needs `params` in `update`.
    needs_params: bool = True
    #: Whether the update is random (compared by statistics, not values): skip parity.
    random: bool = False
    #: Why parity is skipped, if it is.
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
