"""The linear assignment problem (Optax's `optax.assignment`)."""

from ._hungarian import (
    base_hungarian_algorithm as base_hungarian_algorithm,
    hungarian_algorithm as hungarian_algorithm,
)
