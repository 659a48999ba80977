"""Optax's `optax.transforms`: the building blocks of optimisers, by Optax's names.

Each name is the same object as at eqopt's top level (`eqopt.transforms.clip`
is `eqopt.clip`), and the stateless transforms' state names are eqopt's
`EmptyState`, which their `init` returns. `unitwise_norm`, `unitwise_clip`,
`MaskedNode` and `ConditionFn` are defined here for Optax's spelling.
"""

from .._base import EmptyState as NonNegativeParamsState, MaskedNode as MaskedNode
from .._combine import (
    PartitionState as PartitionState,
    chain as chain,
    named_chain as named_chain,
    partition as partition,
)
from .._transform.block import (
    adaptive_grad_clip as adaptive_grad_clip,
    clip_by_block_rms as clip_by_block_rms,
)
from .._transform.clipping import (
    clip as clip,
    clip_by_global_norm as clip_by_global_norm,
)
from .._transform.decay import add_decayed_weights as add_decayed_weights
from .._transform.misc import (
    ZeroNansState as ZeroNansState,
    keep_params_nonnegative as keep_params_nonnegative,
    zero_nans as zero_nans,
)
from .._transform.momentum import (
    EmaState as EmaState,
    TraceState as TraceState,
    ema as ema,
    trace as trace,
)
from .._transform.noise import AddNoiseState as AddNoiseState, add_noise as add_noise
from .._transform.unitwise import (
    unitwise_clip as unitwise_clip,
    unitwise_norm as unitwise_norm,
)
from .._wrappers.accumulation import (
    MultiSteps as MultiSteps,
    MultiStepsState as MultiStepsState,
    ShouldSkipUpdateFunction as ShouldSkipUpdateFunction,
)
from .._wrappers.condition import ConditionFn as ConditionFn
from .._wrappers.conditional import (
    ConditionallyMaskState as ConditionallyMaskState,
    ConditionallyTransformState as ConditionallyTransformState,
    conditionally_mask as conditionally_mask,
    conditionally_transform as conditionally_transform,
)
from .._wrappers.finite import (
    ApplyIfFiniteState as ApplyIfFiniteState,
    apply_if_finite as apply_if_finite,
    skip_large_updates as skip_large_updates,
    skip_not_finite as skip_not_finite,
)
from .._wrappers.flatten import flatten as flatten
from .._wrappers.masked import (
    MaskedState as MaskedState,
    freeze as freeze,
    masked as masked,
    selective_transform as selective_transform,
)
from .._wrappers.monitor import (
    MonitorState as MonitorState,
    SnapshotState as SnapshotState,
    measure_with_ema as measure_with_ema,
    monitor as monitor,
    snapshot as snapshot,
)
from .._wrappers.privacy import (
    per_example_global_norm_clip as per_example_global_norm_clip,
    per_example_layer_norm_clip as per_example_layer_norm_clip,
)

__all__ = [
    "AddNoiseState",
    "ApplyIfFiniteState",
    "ConditionFn",
    "ConditionallyMaskState",
    "ConditionallyTransformState",
    "EmaState",
    "MaskedNode",
    "MaskedState",
    "MonitorState",
    "MultiSteps",
    "MultiStepsState",
    "NonNegativeParamsState",
    "PartitionState",
    "ShouldSkipUpdateFunction",
    "SnapshotState",
    "TraceState",
    "ZeroNansState",
    "adaptive_grad_clip",
    "add_decayed_weights",
    "add_noise",
    "apply_if_finite",
    "chain",
    "clip",
    "clip_by_block_rms",
    "clip_by_global_norm",
    "conditionally_mask",
    "conditionally_transform",
    "ema",
    "flatten",
    "freeze",
    "keep_params_nonnegative",
    "masked",
    "measure_with_ema",
    "monitor",
    "named_chain",
    "partition",
    "per_example_global_norm_clip",
    "per_example_layer_norm_clip",
    "selective_transform",
    "skip_large_updates",
    "skip_not_finite",
    "snapshot",
    "trace",
    "unitwise_clip",
    "unitwise_norm",
    "zero_nans",
]
