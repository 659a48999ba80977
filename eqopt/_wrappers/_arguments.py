"""Binding a transform factory's arguments by name, and sorting them for `inject_hyperparams`.

Optax's `inject_hyperparams` takes the arguments of a factory (`adam`,
`scale_by_adam`...), keeps the numeric ones and the schedules in the state, and
calls the factory again with their current values every step. This module
binds the arguments to the factory's signature (defaults included), sorts them
into numeric hyperparameters, schedules and the rest, and calls the factory
back with arguments given by name.
"""

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._base import AbstractGradientTransformation
from .._hyper import Schedule, as_number
from .._interop import as_transform
from ..schedules._stateful import is_stateful_schedule


def factory_name(factory: Callable) -> str:
    return getattr(factory, "__qualname__", None) or type(factory).__name__


def factory_signature(factory: Callable) -> inspect.Signature:
    if not callable(factory):
        raise TypeError(
            f"`inner_factory` must be callable, got {type(factory).__name__}."
        )
    try:
        return inspect.signature(factory)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"Cannot read the signature of `inner_factory` {factory_name(factory)}: {error}"
        ) from None


def static_names(static_args: str | Iterable[str]) -> frozenset[str]:
    if isinstance(static_args, str):
        return frozenset({static_args})
    return frozenset(static_args)


def _var_keyword(signature: inspect.Signature) -> str | None:
    return next(
        (
            p.name
            for p in signature.parameters.values()
            if p.kind is inspect.Parameter.VAR_KEYWORD
        ),
        None,
    )


def check_static_names(
    factory: Callable, signature: inspect.Signature, names: frozenset[str]
) -> None:
    if _var_keyword(signature) is not None:
        return
    unknown = sorted(names - set(signature.parameters))
    if unknown:
        raise ValueError(
            f"`static_args` names {unknown}, which are not arguments of "
            f"{factory_name(factory)}; its arguments are {list(signature.parameters)}."
        )


def is_numeric(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    return isinstance(value, (int, float, np.number, np.ndarray, jax.Array))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def bind_arguments(
    factory: Callable,
    signature: inspect.Signature,
    args: tuple,
    kwargs: Mapping[str, Any],
) -> dict[str, Any]:
    """Every argument of the factory by name, defaults included; `**kwargs` entries spread out."""
    parameters = signature.parameters
    var_keyword = _var_keyword(signature)
    if var_keyword is None:
        for name in kwargs:
            if name not in parameters:
                raise TypeError(
                    f"{name!r} is not an argument of {factory_name(factory)}; its "
                    f"arguments are {list(parameters)}."
                )
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:
        raise TypeError(
            f"Cannot call {factory_name(factory)} with these arguments: {error}."
        ) from None
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    if var_keyword is not None:
        arguments.update(arguments.pop(var_keyword))
    return arguments


def _is_static_by_signature(parameter: inspect.Parameter | None, value: Any) -> bool:
    """An argument that cannot be a leaf, as the factory's signature says.

    An argument annotated `int` (a number of iterations, a rank) decides a shape
    or a loop, and an argument whose default is a function (`clip_value_fn`) is a
    function, not a schedule of the step count: both are passed through
    unchanged, as if listed in `static_args`.
    """
    if parameter is None:
        return False
    if parameter.annotation in (int, "int") and isinstance(value, (int, np.integer)):
        return True
    default = parameter.default
    return (
        callable(value)
        and default is not inspect.Parameter.empty
        and callable(default)
        and not is_stateful_schedule(default)
    )


def _sort_arguments(
    factory: Callable,
    signature: inspect.Signature,
    arguments: Mapping[str, Any],
    static: frozenset[str],
    *,
    allow_stateful: bool,
) -> tuple[
    dict[str, Array | np.ndarray], dict[str, Schedule], dict[str, Any], dict[str, str]
]:
    """Splits the arguments into numeric hyperparameters, schedules and the rest,
    with the dtype of each hyperparameter given as a strongly-typed JAX array."""
    hyperparams, schedules, other_args, strong = {}, {}, {}, {}
    parameters = signature.parameters
    for name, value in arguments.items():
        parameter = parameters.get(name)
        if (
            name in static
            or isinstance(value, (bool, np.bool_))
            or _is_static_by_signature(parameter, value)
        ):
            other_args[name] = value
        elif is_stateful_schedule(value):
            if not allow_stateful:
                raise TypeError(
                    f"`{name}` is a stateful schedule; use `eqopt.inject_stateful_hyperparams` "
                    "(or `eqopt.inject_hyperparams`, which switches to it) instead of "
                    "`InjectHyperparams`."
                )
            schedules[name] = value
        elif callable(value):
            schedules[name] = value
        elif isinstance(value, jax.Array) and jnp.issubdtype(
            value.dtype, jax.dtypes.prng_key
        ):
            # A typed PRNG key is data for the factory, not a number to inject.
            other_args[name] = value
        elif is_numeric(value):
            if isinstance(value, jax.Array) and not value.weak_type:
                strong[name] = value.dtype.name
            hyperparams[name] = as_number(value)
        else:
            default = (
                parameters[name].default
                if name in parameters
                else inspect.Parameter.empty
            )
            if value is not None and _is_number(default):
                raise TypeError(
                    f"Hyperparameter `{name}` of {factory_name(factory)} must be a number, an "
                    f"array or a schedule, got {type(value).__name__} {value!r}. (List it in "
                    "`static_args` if it is meant to be passed through unchanged.)"
                )
            other_args[name] = value
    return hyperparams, schedules, other_args, strong


def sorted_arguments(
    factory: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None,
    static_args: str | Iterable[str],
    *,
    allow_stateful: bool,
) -> tuple[
    dict[str, Array | np.ndarray], dict[str, Schedule], dict[str, Any], dict[str, str]
]:
    """Binds the factory's arguments and sorts them into hyperparameters, schedules and the rest."""
    signature = factory_signature(factory)
    static = static_names(static_args)
    check_static_names(factory, signature, static)
    arguments = bind_arguments(factory, signature, tuple(args), dict(kwargs or {}))
    return _sort_arguments(
        factory, signature, arguments, static, allow_stateful=allow_stateful
    )


def call_factory(
    factory: Callable, arguments: Mapping[str, Any]
) -> AbstractGradientTransformation:
    """Calls the factory with arguments given by name (positional-only and `*args` included)."""
    signature = inspect.signature(factory)
    parameters = signature.parameters
    bound = signature.bind_partial()
    spread = {}
    var_keyword = _var_keyword(signature)
    for name, value in arguments.items():
        if name in parameters and name != var_keyword:
            bound.arguments[name] = value
        else:
            spread[name] = value
    if var_keyword is not None:
        bound.arguments[var_keyword] = spread
    return as_transform(factory(*bound.args, **bound.kwargs))
