"""Optax's deprecated names: they work as in Optax, and say what replaces them."""

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, no_type_check

_Function = TypeVar("_Function", bound=Callable[..., Any])


# Not type-checked: the warning must point at the caller, with no checking
# wrapper between.
@no_type_check
def deprecated(replacement: str) -> Callable[[_Function], _Function]:
    """Makes a function warn, as Optax's does, that `replacement` replaces it.

    A `DeprecationWarning` on each call, pointing at the caller's line. The name
    keeps working with the same numbers: eqopt ports Optax code that still uses it.
    """

    def decorate(function: _Function) -> _Function:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            warnings.warn(
                f"`{function.__name__}` is deprecated (as in Optax): use "
                f"{replacement} instead.",
                DeprecationWarning,
                stacklevel=2,
            )
            return function(*args, **kwargs)

        return wrapper  # pyright: ignore[reportReturnType]

    return decorate
