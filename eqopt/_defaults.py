"""Default transforms in signatures, built when the function is called.

Optax writes some defaults as transforms (`lbfgs`'s line search, Sophia's
Hessian estimator). An eqopt transform made at import time would initialise
JAX's backend and the type checker while `import eqopt` runs; a
`DefaultTransform` stands in the signature
instead, shows the call it stands for, and is replaced by a fresh transform
when the function runs.
"""

from collections.abc import Callable
from typing import Any, no_type_check


class DefaultTransform:
    """A transform's recipe, used as a default argument. `build()` makes it."""

    @no_type_check  # runs at import time
    def __init__(self, factory: Callable[..., Any], **kwargs: Any):
        self.factory = factory
        self.kwargs = kwargs

    def build(self) -> Any:
        return self.factory(**self.kwargs)

    def __repr__(self) -> str:
        arguments = ", ".join(f"{key}={value!r}" for key, value in self.kwargs.items())
        return f"{self.factory.__name__}({arguments})"


def resolve(value: Any) -> Any:
    """`value`, or the transform it describes if it is a `DefaultTransform`."""
    return value.build() if isinstance(value, DefaultTransform) else value
