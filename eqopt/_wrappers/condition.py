"""`ConditionFn`: the signature of a condition of `eqopt.conditionally_transform`."""

from typing import Any, Protocol

from jaxtyping import Array, ArrayLike, Bool


class ConditionFn(Protocol):
    """The signature of `should_transform_fn` in `eqopt.conditionally_transform`
    and `eqopt.conditionally_mask`.

    Called as `should_transform_fn(step, **extra_args)` with the step count (an
    `int32` scalar) and, when the wrapper forwards them, the extra arguments of
    `update`; returns a boolean scalar, `True` where the inner transform runs.
    """

    def __call__(self, step: ArrayLike, **extra_args: Any) -> Bool[Array, ""]: ...
