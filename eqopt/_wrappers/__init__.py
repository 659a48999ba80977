"""Wrappers around transforms; `eqopt/__init__.py` re-exports the public names."""

from .accumulation import (
    ApplyEvery as ApplyEvery,
    ApplyEveryState as ApplyEveryState,
    MultiSteps as MultiSteps,
    MultiStepsState as MultiStepsState,
    ShouldSkipUpdateFunction as ShouldSkipUpdateFunction,
    apply_every as apply_every,
)
from .cautious import (
    Cautious as Cautious,
    CautiousState as CautiousState,
    cautious as cautious,
)
from .conditional import (
    ConditionallyMask as ConditionallyMask,
    ConditionallyMaskState as ConditionallyMaskState,
    ConditionallyTransform as ConditionallyTransform,
    ConditionallyTransformState as ConditionallyTransformState,
    conditionally_mask as conditionally_mask,
    conditionally_transform as conditionally_transform,
)
from .finite import (
    ApplyIfFinite as ApplyIfFinite,
    ApplyIfFiniteState as ApplyIfFiniteState,
    apply_if_finite as apply_if_finite,
    skip_large_updates as skip_large_updates,
    skip_not_finite as skip_not_finite,
)
from .flatten import (
    Flatten as Flatten,
    FlattenState as FlattenState,
    flatten as flatten,
)
from .lookahead import (
    Lookahead as Lookahead,
    LookaheadParams as LookaheadParams,
    LookaheadState as LookaheadState,
    lookahead as lookahead,
)
from .microbatch import (
    AccumulationType as AccumulationType,
    Accumulator as Accumulator,
    microbatch as microbatch,
)
from .monitor import (
    MeasureWithEma as MeasureWithEma,
    MeasureWithEmaState as MeasureWithEmaState,
    Monitor as Monitor,
    MonitorState as MonitorState,
    Snapshot as Snapshot,
    SnapshotState as SnapshotState,
    measure_with_ema as measure_with_ema,
    monitor as monitor,
    snapshot as snapshot,
)
from .privacy import (
    DifferentiallyPrivateAggregate as DifferentiallyPrivateAggregate,
    DifferentiallyPrivateAggregateState as DifferentiallyPrivateAggregateState,
    differentially_private_aggregate as differentially_private_aggregate,
    dpsgd as dpsgd,
    per_example_global_norm_clip as per_example_global_norm_clip,
    per_example_layer_norm_clip as per_example_layer_norm_clip,
)
