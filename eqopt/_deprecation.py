"""Optax's deprecated names: they work as in Optax, and say what replaces them."""

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, no_type_check

_Function = TypeVar("_Function", bound=Callable[..., Any])


# Not type-checked: the warning must point at the caller, with no checking
# wrapper between.
@no_type_check
def deprecated(
    replacement: str, optax_says: str | None = None
) -> Callable[[_Function], _Function]:
    """Makes a function warn, as Optax's does, that `replacement` replaces it.

    A `DeprecationWarning` on each call, pointing at the caller's line. The name
    keeps working with the same numbers: eqopt ports Optax code that still uses it.
    `optax_says` is how Optax's own warning names the replacement (code and
    tests that match Optax's sentence keep matching); eqopt's name follows it.
    """

    def decorate(function: _Function) -> _Function:
        said = f"`{function.__name__}` is deprecated (as in Optax): use"
        if optax_says is None:
            message = f"{said} {replacement} instead."
        else:
            message = f"{said} {optax_says} instead ({replacement})."

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            return function(*args, **kwargs)

        return wrapper  # pyright: ignore[reportReturnType]

    return decorate
