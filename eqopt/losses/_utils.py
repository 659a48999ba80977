"""Private helpers shared by the losses: shape checks, axes, masks and safe logarithms."""

import functools
import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, no_type_check

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Shaped

_Function = TypeVar("_Function", bound=Callable[..., Any])


class ShapeMismatchError(ValueError, TypeError):
    """Inputs of a loss that must share a shape do not.

    A `ValueError`, as a bad value is (and as Optax raises where it checks
    shapes), and a `TypeError`, as JAX's own broadcasting errors are (what Optax
    raises where it does not check): code written for either catches it, as
    NumPy's `AxisError` is both a `ValueError` and an `IndexError`.
    """


_SPEC = re.compile(r"^(\w+)(?:\[(-?\d*):(-?\d*)\])?$")


@no_type_check
def _parse(spec: str) -> tuple[str, slice]:
    match = _SPEC.match(spec)
    if match is None:
        raise ValueError(f"Bad shape specification {spec!r}.")
    name, start, stop = match.groups()
    return name, slice(int(start) if start else None, int(stop) if stop else None)


@no_type_check
def _describe_part(name: str, part: slice) -> str:
    if part == slice(None, None):
        return f"`{name}`"
    if part == slice(None, -1):
        return f"`{name}` without its last axis"
    if part == slice(None, 1):
        return f"the batch size of `{name}`"
    return f"`{name}` (axes {part.start}:{part.stop})"


@no_type_check  # runs at import time, when the losses are decorated
def same_shapes(*specs: str) -> Callable[[_Function], _Function]:
    """Decorates a loss: the named arguments must have the same shape.

    Each spec is an argument name, optionally with a slice of its shape:
    `"scores[:-1]"` (the shape without the last axis), `"logits[:1]"` (the
    batch size). Arguments that are `None` are skipped. A mismatch raises one
    `ShapeMismatchError` naming the arguments and their shapes, before the
    type checker (which would raise a `TypeCheckError`) sees the call.
    """
    parts = [_parse(spec) for spec in specs]

    @no_type_check
    def decorate(function: _Function) -> _Function:
        signature = inspect.signature(function)

        @functools.wraps(function)
        @no_type_check
        def checked(*args, **kwargs):
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                return function(*args, **kwargs)  # let the call report it
            reference = None
            for name, part in parts:
                value = bound.arguments.get(name)
                if value is None:
                    continue
                shape = tuple(jnp.shape(value))[part]
                if reference is None:
                    reference = (name, part, shape)
                elif shape != reference[2]:
                    ref_name, ref_part, ref_shape = reference
                    raise ShapeMismatchError(
                        f"{function.__name__}: {_describe_part(name, part)} has shape "
                        f"{shape} but {_describe_part(ref_name, ref_part)} has shape "
                        f"{ref_shape}; they must be equal (broadcast explicitly if "
                        "that is meant)."
                    )
            return function(*args, **kwargs)

        return checked  # pyright: ignore[reportReturnType]

    return decorate


@no_type_check  # runs at import time, when the losses are decorated
def one_of(**choices: tuple[str, ...]) -> Callable[[_Function], _Function]:
    """Decorates a function: each named string argument must be one of its choices.

    An invalid choice is a bad value: it raises a `ValueError` naming the
    argument (as Optax does), before the type checker would raise a
    `TypeCheckError` for a `Literal` annotation.
    """

    @no_type_check
    def decorate(function: _Function) -> _Function:
        signature = inspect.signature(function)

        @functools.wraps(function)
        @no_type_check
        def checked(*args, **kwargs):
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                return function(*args, **kwargs)
            for name, allowed in choices.items():
                value = bound.arguments.get(name)
                # Other types are left to the type checker: a `TypeError`.
                if isinstance(value, str) and value not in allowed:
                    raise ValueError(
                        f"{function.__name__}: `{name}` must be one of {allowed}, got "
                        f"{bound.arguments[name]!r}."
                    )
            return function(*args, **kwargs)

        return checked  # pyright: ignore[reportReturnType]

    return decorate


def normalize_axes(
    axis: int | Sequence[int] | None, ndim: int, name: str = "axis"
) -> tuple[int, ...]:
    """`axis` as a tuple of distinct non-negative ints; `None` means every axis."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    normalized = []
    for a in axes:
        if not isinstance(a, int) or isinstance(a, bool):
            raise TypeError(
                f"`{name}` must be an int or a tuple of ints, got {axis!r}."
            )
        if not -ndim <= a < ndim:
            raise ValueError(
                f"`{name}`={axis!r} is out of range for an array with {ndim} "
                "dimensions."
            )
        normalized.append(a % ndim)
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"`{name}`={axis!r} repeats an axis.")
    return tuple(normalized)


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` with the dimensions in `axes` removed."""
    return tuple(size for i, size in enumerate(shape) if i not in axes)


def expand_where(
    where: Bool[ArrayLike, "..."] | None,
    shape: tuple[int, ...],
    axes: tuple[int, ...],
    *,
    allow_batch_shape: bool,
) -> Bool[Array, "..."] | None:
    """Checks a `where` mask and broadcasts it to `shape`.

    The mask has the shape of the input, or (if `allow_batch_shape`) the shape of
    the output, in which case it selects whole slices along `axes`.
    """
    if where is None:
        return None
    where = jnp.asarray(where)
    if where.shape == shape:
        return where
    batch_shape = reduced_shape(shape, axes)
    if allow_batch_shape and where.shape == batch_shape:
        return jnp.broadcast_to(jnp.expand_dims(where, axes), shape)
    expected = f"{shape}" + (f" or {batch_shape}" if allow_batch_shape else "")
    raise ValueError(f"`where` must have shape {expected}, got {where.shape}.")


def masked_log_softmax(
    logits: Float[Array, "..."],
    axes: tuple[int, ...],
    where: Bool[Array, "..."] | None,
) -> Float[Array, "..."]:
    """`log_softmax` over `axes`, normalised over the entries selected by `where`.

    Unselected entries are excluded from the normaliser (their value, even NaN,
    never reaches the result or the gradient). A slice with nothing selected is
    normalised over all its entries instead, so that it stays finite; callers
    zero its contribution.
    """
    if where is None:
        return jax.nn.log_softmax(logits, axis=axes)
    anything = jnp.any(where, axis=axes, keepdims=True)
    computed = where | ~anything
    return jax.nn.log_softmax(jnp.where(computed, logits, -jnp.inf), axis=axes)


def cross_entropy_terms(
    logits: Float[Array, "..."],
    labels: Float[Array, "..."],
    axes: tuple[int, ...],
    where: Bool[Array, "..."] | None,
) -> tuple[Float[Array, "..."], Float[Array, "..."]]:
    """$-\\sum y \\log \\mathrm{softmax}(x)$ over `axes` and `where`, and the log-probabilities.

    Classes left out by `where` contribute nothing, with a zero gradient; a slice
    with nothing selected has loss 0.
    """
    log_probs = masked_log_softmax(logits, axes, where)
    if where is None:
        terms = weighted_log(labels, log_probs)
    else:
        safe_log_probs = jnp.where(where, log_probs, 0)
        terms = jnp.where(where, weighted_log(labels, safe_log_probs), 0)
    return -jnp.sum(terms, axis=axes), log_probs


def weighted_log(
    weight: Float[Array, "*shape"], log_value: Float[Array, "*shape"]
) -> Float[Array, "*shape"]:
    r"""$w \log v$ with the convention $0 \cdot \log 0 = 0$.

    Where the weight is zero and the log is $-\infty$ (a probability of exactly
    zero, such as a masked logit), the product is zero and its gradient finite.
    """
    vanishes = (weight == 0) & jnp.isneginf(log_value)
    return jnp.where(vanishes, 0, weight * jnp.where(vanishes, 0, log_value))


def safe_log(x: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
    """`log(x)` for `x >= 0`, with $\\log 0 = -\\infty$ and a finite gradient at 0."""
    positive = x > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, x, 1)), -jnp.inf)


def safe_logaddexp(
    a: Float[Array, "*shape"], b: Float[Array, "*shape"]
) -> Float[Array, "*shape"]:
    """`logaddexp` whose gradient stays finite where both arguments are $-\\infty$."""
    both = jnp.isneginf(a) & jnp.isneginf(b)
    result = jnp.logaddexp(jnp.where(both, 0, a), jnp.where(both, 0, b))
    return jnp.where(both, -jnp.inf, result)


def as_float(
    x: Shaped[ArrayLike, "..."], like: Float[Array, "..."]
) -> Float[Array, "..."]:
    """`x` as a floating array: integer and boolean arrays take the dtype of `like`."""
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(like.dtype)


def class_indices(
    labels: Int[Array, "*batch"], num_classes: int
) -> tuple[Int[Array, "*batch"], Bool[Array, "*batch"]]:
    """Integer class labels made safe to index with, and where they were out of range.

    A label outside `[0, num_classes)` (`-1` included: it is not read as the last
    class) is replaced by 0, and flagged so that `nan_where` can make its loss NaN.
    """
    out_of_range = (labels < 0) | (labels >= num_classes)
    return jnp.where(out_of_range, 0, labels), out_of_range


def nan_where(
    bad: Bool[ArrayLike, "*batch"], loss: Float[Array, "*batch"]
) -> Float[Array, "*batch"]:
    """`loss`, NaN where `bad`.

    The gradient there is 0, not NaN, so an example masked out afterwards (with
    `jnp.where`) leaves no NaN in the gradient of the rest.
    """
    return jnp.where(bad, jnp.nan, loss).astype(loss.dtype)
