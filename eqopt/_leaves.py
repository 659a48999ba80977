"""What a leaf is: the two predicates every module uses (a leaf module, no imports)."""

from typing import Any, no_type_check

import equinox as eqx


# Called once per leaf (often as `is_leaf`): exempt from the type-check wrapper.
@no_type_check
def is_none(x: Any) -> bool:
    """Whether a leaf is `None` (an absent gradient or state)."""
    return x is None


@no_type_check
def is_trainable(x: Any) -> bool:
    """Whether a leaf is trained: an inexact (floating or complex) JAX array."""
    return eqx.is_inexact_array(x)
