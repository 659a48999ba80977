"""Micro-batching: evaluate a function over a batch in sequential pieces (Optax's `optax.microbatching`)."""

from .._wrappers.microbatch import (
    AccumulationType as AccumulationType,
    Accumulator as Accumulator,
    microbatch as microbatch,
)
