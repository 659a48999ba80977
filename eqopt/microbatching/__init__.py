"""Micro-batching: evaluate a function over a batch in sequential pieces (Optax's `optax.microbatching`)."""

from .._wrappers.micro import (
    micro_grad as micro_grad,
    micro_vmap as micro_vmap,
    reshape_batch_axis as reshape_batch_axis,
)
from .._wrappers.microbatch import (
    AccumulationType as AccumulationType,
    Accumulator as Accumulator,
    microbatch as microbatch,
)
