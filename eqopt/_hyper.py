"""Hyperparameters as dynamic leaves (DESIGN §4)."""

from collections.abc import Callable
from typing import Any, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

Scalar: TypeAlias = Float[Array, ""]
ScalarLike: TypeAlias = Float[ArrayLike, ""]
#: A number, or a schedule / callable mapping the step count to a number.
# `int` too: `sgd(1)` is valid Optax code (the value becomes a weakly-typed scalar).
ScalarOrSchedule: TypeAlias = Float[ArrayLike, ""] | int | Callable[[Int[ArrayLike, ""]], Any]


def as_hyperparameter(value):
    """Field converter: a Python or NumPy number becomes a weakly-typed JAX scalar.

    Weak typing keeps `bfloat16` moments in `bfloat16` when multiplied by the
    hyperparameter, exactly as a Python float would. Arrays, tracers, schedules
    and other callables are stored unchanged.
    """
    if isinstance(value, bool):
        raise TypeError("A numeric hyperparameter cannot be a bool.")
    if isinstance(value, (int, float, complex, np.number)):
        if isinstance(value, np.number):
            value = value.item()
        return jnp.asarray(value)  # Python scalars give weakly-typed arrays.
    if isinstance(value, np.ndarray):
        return jnp.asarray(value)
    return value


def is_concrete(x) -> bool:
    """Whether `x` is a concrete (not traced) array, so Python checks apply."""
    return eqx.is_array(x) and not isinstance(x, jax.core.Tracer)


def check_hyperparameter(name: str, value, *, low=None, high=None,
                         low_inclusive=True, high_inclusive=False,
                         finite=True) -> None:
    """Raises a `ValueError` naming `name` if a concrete hyperparameter is out of range.

    Traced values and schedules are not checked (they have no value yet).
    """
    if not is_concrete(value) or value.ndim != 0:
        return
    v = complex(value.item()) if jnp.iscomplexobj(value) else float(value.item())
    if isinstance(v, complex):
        return
    if finite and not np.isfinite(v):
        raise ValueError(f"Hyperparameter `{name}` must be finite, got {v}.")
    if low is not None and (v < low or (v == low and not low_inclusive)):
        bracket = "[" if low_inclusive else "("
        raise ValueError(f"Hyperparameter `{name}` must be in {bracket}{low}, "
                         f"{high if high is not None else 'inf'}), got {v}.")
    if high is not None and (v > high or (v == high and not high_inclusive)):
        bracket = "]" if high_inclusive else ")"
        raise ValueError(f"Hyperparameter `{name}` must be in [{low if low is not None else '-inf'}, "
                         f"{high}{bracket}, got {v}.")


def evaluate(value, count):
    """The value of a hyperparameter at step `count`: calls it if it is a schedule."""
    if callable(value):
        return jnp.asarray(value(count))
    return value


def hyperparameter(**kwargs):
    """An `eqx.field` holding a numeric hyperparameter or a schedule."""
    return eqx.field(converter=as_hyperparameter, **kwargs)
