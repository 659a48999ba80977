"""Aggregating per-element updates (Optax's `optax.experimental.aggregating`).

An aggregator takes one update per element of a batch, stacked on a
per-element axis (`jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)`
gives them), and returns updates shaped like the params; `process` runs a
preprocessor on the per-element updates, an aggregator, and an optimiser on
the result. Each name is Optax's, with Optax's arguments and numerics, and
each transform is an eqopt Module with a typed state.
"""

from ._aggregate import (
    AccumulateAvgUpdates as AccumulateAvgUpdates,
    AccumulateAvgUpdatesState as AccumulateAvgUpdatesState,
    AggregatedUpdates as AggregatedUpdates,
    Aggregator as Aggregator,
    AggregatorUpdateFn as AggregatorUpdateFn,
    AveragePerElementUpdates as AveragePerElementUpdates,
    MaybeAxis as MaybeAxis,
    PerElementUpdates as PerElementUpdates,
    Process as Process,
    ProcessState as ProcessState,
    accumulate_avg_updates as accumulate_avg_updates,
    average_incrementally_updates as average_incrementally_updates,
    average_per_element_updates as average_per_element_updates,
    get_batch_size_from_per_elt_updates as get_batch_size_from_per_elt_updates,
    process as process,
)
from ._moments import (
    PerElementMeanAndSumSqDiffGrads as PerElementMeanAndSumSqDiffGrads,
    PerElementMeanAndSumSqDiffGradsState as PerElementMeanAndSumSqDiffGradsState,
    PerElementMeanAndVarianceEMAState as PerElementMeanAndVarianceEMAState,
    TrackPerElementMeanAndVarianceWithEMA as TrackPerElementMeanAndVarianceWithEMA,
    add_mean_variance_to_opt as add_mean_variance_to_opt,
    get_per_element_mean_and_sum_sq_diff_grads as get_per_element_mean_and_sum_sq_diff_grads,
    get_unbiased_mean_and_variance_ema as get_unbiased_mean_and_variance_ema,
    track_per_element_mean_and_variance_with_ema as track_per_element_mean_and_variance_with_ema,
)
