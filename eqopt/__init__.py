"""eqopt: gradient processing and optimisation for JAX, the Equinox way."""

import importlib.metadata

import jaxtyping as _jaxtyping

# Every public function, method and Module of eqopt carries jaxtyping annotations.
# Importing its modules under this hook checks them with beartype (at trace time
# under jit). Setting JAXTYPING_DISABLE=1 turns the checks off.
with _jaxtyping.install_import_hook("eqopt", "beartype.beartype"):
    from ._base import (
        AbstractGradientTransformation as AbstractGradientTransformation,
        EmptyState as EmptyState,
        GradientTransformation as GradientTransformation,
        GradientTransformationExtraArgs as GradientTransformationExtraArgs,
        OptState as OptState,
        Params as Params,
        Updates as Updates,
        apply_updates as apply_updates,
        incremental_update as incremental_update,
        periodic_update as periodic_update,
    )
    from ._combine import (
        Chain as Chain,
        ChainState as ChainState,
        Partition as Partition,
        PartitionState as PartitionState,
        chain as chain,
        multi_transform as multi_transform,
        named_chain as named_chain,
        partition as partition,
    )
    from ._filters import FilterSpec as FilterSpec
    from ._hyper import ScalarOrSchedule as ScalarOrSchedule
    from ._numerics import (
        bias_correction as bias_correction,
        global_norm as global_norm,
        safe_increment as safe_increment,
        safe_int32_increment as safe_int32_increment,
        safe_norm as safe_norm,
        safe_root_mean_squares as safe_root_mean_squares,
        update_infinity_moment as update_infinity_moment,
        update_moment as update_moment,
        update_moment_per_elem_norm as update_moment_per_elem_norm,
    )
    from ._train_state import TrainState as TrainState
    from ._transform.adam import (
        ScaleByAdam as ScaleByAdam,
        ScaleByAdamax as ScaleByAdamax,
        ScaleByAdamaxState as ScaleByAdamaxState,
        ScaleByAdamState as ScaleByAdamState,
        ScaleByAmsgrad as ScaleByAmsgrad,
        ScaleByAmsgradState as ScaleByAmsgradState,
        scale_by_adam as scale_by_adam,
        scale_by_adamax as scale_by_adamax,
        scale_by_amsgrad as scale_by_amsgrad,
    )
    from ._transform.basic import (
        Identity as Identity,
        Scale as Scale,
        ScaleByLearningRate as ScaleByLearningRate,
        ScaleBySchedule as ScaleBySchedule,
        ScaleByScheduleState as ScaleByScheduleState,
        SetToZero as SetToZero,
        Stateless as Stateless,
        StatelessWithTreeMap as StatelessWithTreeMap,
        identity as identity,
        init_empty_state as init_empty_state,
        scale as scale,
        scale_by_learning_rate as scale_by_learning_rate,
        scale_by_schedule as scale_by_schedule,
        set_to_zero as set_to_zero,
        stateless as stateless,
        stateless_with_tree_map as stateless_with_tree_map,
        with_extra_args_support as with_extra_args_support,
    )
    from ._transform.clipping import (
        Clip as Clip,
        ClipByGlobalNorm as ClipByGlobalNorm,
        clip as clip,
        clip_by_global_norm as clip_by_global_norm,
    )
    from ._transform.decay import (
        AddDecayedWeights as AddDecayedWeights,
        add_decayed_weights as add_decayed_weights,
    )
    from ._transform.momentum import (
        Ema as Ema,
        EmaState as EmaState,
        Trace as Trace,
        TraceState as TraceState,
        ema as ema,
        trace as trace,
    )
    from ._wrappers.masked import (
        Masked as Masked,
        MaskedState as MaskedState,
        SelectiveTransform as SelectiveTransform,
        freeze as freeze,
        masked as masked,
        selective_transform as selective_transform,
    )
    from ._wrappers.inject import (
        AbstractStatefulSchedule as AbstractStatefulSchedule,
        InjectHyperparams as InjectHyperparams,
        InjectHyperparamsState as InjectHyperparamsState,
        InjectStatefulHyperparams as InjectStatefulHyperparams,
        InjectStatefulHyperparamsState as InjectStatefulHyperparamsState,
        ScheduleCountState as ScheduleCountState,
        inject_hyperparams as inject_hyperparams,
        inject_stateful_hyperparams as inject_stateful_hyperparams,
    )

try:
    __version__ = importlib.metadata.version("eqopt")
except importlib.metadata.PackageNotFoundError:  # running from a checkout
    __version__ = "0.1.0"
