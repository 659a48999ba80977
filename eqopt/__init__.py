"""eqopt: gradient processing and optimisation for JAX, the Equinox way."""

import importlib
import importlib.metadata
from typing import TYPE_CHECKING as _TYPE_CHECKING

# Every public function, method and Module of eqopt carries jaxtyping annotations,
# checked with beartype (at trace time under jit) by the decorators `@checked`,
# `@init_entry` and `@update_entry` where each is defined (eqopt/_typecheck.py,
# eqopt/_entry.py). Setting JAXTYPING_DISABLE=1 turns the checks off.
from ._typecheck import (
    ArgumentTypeError as ArgumentTypeError,
    ArgumentValueError as ArgumentValueError,
)

# Every public name loads on first use (PEP 562), which keeps `import eqopt` close
# to `import jax, equinox` (benchmarks/import_time.py): `eqopt.adam` imports the
# modules it needs the first time it is read, and then it is a plain attribute.
# Where each name lives is the plain table of `eqopt/_exports.py`; the
# `_TYPE_CHECKING` block below imports the same names for type checkers and the
# docs (tests/test_import.py checks that the two agree).
if _TYPE_CHECKING:
    from . import (
        assignment as assignment,
        contrib as contrib,
        experimental as experimental,
        losses as losses,
        microbatching as microbatching,
        monte_carlo as monte_carlo,
        perturbations as perturbations,
        projections as projections,
        schedules as schedules,
        second_order as second_order,
        transforms as transforms,
        tree as tree,
        tree_utils as tree_utils,
    )
    from ._alias import (
        adagrad as adagrad,
        adam as adam,
        adamax as adamax,
        adamaxw as adamaxw,
        adamw as adamw,
        amsgrad as amsgrad,
        lars as lars,
        nadam as nadam,
        nadamw as nadamw,
        rmsprop as rmsprop,
        sgd as sgd,
    )
    from ._apply import (
        apply_updates as apply_updates,
        incremental_update as incremental_update,
        periodic_update as periodic_update,
    )
    from ._base import (
        AbstractGradientTransformation as AbstractGradientTransformation,
        AbstractWrapper as AbstractWrapper,
        EmptyState as AdaptiveGradClipState,  # noqa: F401 (Optax's name)
        EmptyState as AddDecayedWeightsState,  # noqa: F401
        EmptyState as ClipByGlobalNormState,  # noqa: F401
        EmptyState as ClipState,  # noqa: F401
        EmptyState as EmptyState,
        EmptyState as NonNegativeParamsState,  # noqa: F401
        EmptyState as ScaleByTrustRatioState,  # noqa: F401
        EmptyState as ScaleState,  # noqa: F401
        GradientTransformation as GradientTransformation,
        GradientTransformationExtraArgs as GradientTransformationExtraArgs,
        MaskedNode as MaskedNode,
        OptState as OptState,
        Params as Params,
        Updates as Updates,
    )
    from ._combine import (
        Chain as Chain,
        ChainState as ChainState,
        Partition as Partition,
        PartitionState as MultiTransformState,  # noqa: F401
        PartitionState as PartitionState,
        chain as chain,
        multi_transform as multi_transform,
        named_chain as named_chain,
        partition as partition,
    )
    from ._current import current_hyperparams as current_hyperparams
    from ._entry import (
        PerformanceHint as PerformanceHint,
        init_entry as init_entry,
        update_entry as update_entry,
    )
    from ._filters import FilterSpec as FilterSpec
    from ._fused._bucketed import (
        Bucketed as Bucketed,
        BucketedState as BucketedState,
        bucketed as bucketed,
    )
    from ._fused._pack import Packed as Packed, pack as pack
    from ._groups import (
        Group as Group,
        InLayer as InLayer,
        LayerDecay as LayerDecay,
        in_layer as in_layer,
        layer_decay as layer_decay,
    )
    from ._groups_report import (
        GroupReport as GroupReport,
        param_groups_report as param_groups_report,
    )
    from ._hyper import (
        Scalar as Scalar,
        ScalarLike as ScalarLike,
        ScalarOrSchedule as ScalarOrSchedule,
        as_scalar as as_scalar,
        as_scalar_or_schedule as as_scalar_or_schedule,
        on_host as on_host,
    )
    from ._interop import (
        FromOptax as FromOptax,
        FromOptaxState as FromOptaxState,
        OptaxTransformation as OptaxTransformation,
        from_optax as from_optax,
        to_optax as to_optax,
    )
    from ._leafwise import (
        leafwise as leafwise,
        zeros_like_trainable as zeros_like_trainable,
    )
    from ._linalg import (
        matrix_inverse_pth_root as matrix_inverse_pth_root,
        nnls as nnls,
        power_iteration as power_iteration,
        scale_gradient as scale_gradient,
    )
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
    from ._param_groups import (
        ParamGroups as ParamGroups,
        ParamGroupsState as ParamGroupsState,
        param_groups as param_groups,
    )
    from ._quantize import Quantized as Quantized, QuantizedArray as QuantizedArray
    from ._scheduled import (
        current_value as current_value,
        init_count_if_scheduled as init_count_if_scheduled,
    )
    from ._train_state import TrainState as TrainState
    from ._transform._linesearch_common import (
        value_and_grad_from_state as value_and_grad_from_state,
    )
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
    from ._transform.backtracking import (
        BacktrackingLinesearchInfo as BacktrackingLinesearchInfo,
        ScaleByBacktrackingLinesearch as ScaleByBacktrackingLinesearch,
        ScaleByBacktrackingLinesearchState as ScaleByBacktrackingLinesearchState,
        scale_by_backtracking_linesearch as scale_by_backtracking_linesearch,
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

    # L-BFGS and line searches.
    from ._transform.lbfgs import (
        ScaleByLBFGS as ScaleByLBFGS,
        ScaleByLBFGSState as ScaleByLBFGSState,
        lbfgs as lbfgs,
        scale_by_lbfgs as scale_by_lbfgs,
    )
    from ._transform.linesearch import (
        ScaleByZoomLinesearch as ScaleByZoomLinesearch,
        ScaleByZoomLinesearchState as ScaleByZoomLinesearchState,
        ZoomLinesearchInfo as ZoomLinesearchInfo,
        scale_by_zoom_linesearch as scale_by_zoom_linesearch,
    )
    from ._transform.misc import (
        Centralize as Centralize,
        KeepParamsNonnegative as KeepParamsNonnegative,
        ZeroNans as ZeroNans,
        ZeroNansState as ZeroNansState,
        centralize as centralize,
        keep_params_nonnegative as keep_params_nonnegative,
        zero_nans as zero_nans,
    )
    from ._transform.momentum import (
        Ema as Ema,
        EmaState as EmaState,
        Trace as Trace,
        TraceState as TraceState,
        ema as ema,
        trace as trace,
    )
    from ._transform.noise import (
        AddNoise as AddNoise,
        AddNoiseState as AddNoiseState,
        add_noise as add_noise,
        noisy_sgd as noisy_sgd,
    )
    from ._transform.rms import (
        ScaleByRms as ScaleByRms,
        ScaleByRmsState as ScaleByRmsState,
        ScaleByRss as ScaleByRss,
        ScaleByRssState as ScaleByRssState,
        ScaleByStddev as ScaleByStddev,
        ScaleByStddevState as ScaleByRStdDevState,  # noqa: F401
        ScaleByStddevState as ScaleByStddevState,
        scale_by_rms as scale_by_rms,
        scale_by_rss as scale_by_rss,
        scale_by_stddev as scale_by_stddev,
    )
    from ._transform.sign import (
        ScaleByLion as ScaleByLion,
        ScaleByLionState as ScaleByLionState,
        ScaleBySign as ScaleBySign,
        lion as lion,
        scale_by_lion as scale_by_lion,
        scale_by_sign as scale_by_sign,
        sign_sgd as sign_sgd,
        signum as signum,
    )
    from ._typing import (
        MaskOrFn as MaskOrFn,
        Schedule as Schedule,
        TransformInitFn as TransformInitFn,
        TransformUpdateExtraArgsFn as TransformUpdateExtraArgsFn,
        TransformUpdateFn as TransformUpdateFn,
    )
    from ._wrappers.accumulation import (
        ApplyEvery as ApplyEvery,
        ApplyEveryState as ApplyEveryState,
        MultiSteps as MultiSteps,
        MultiStepsState as MultiStepsState,
        ShouldSkipUpdateFunction as ShouldSkipUpdateFunction,
        apply_every as apply_every,
    )
    from ._wrappers.cautious import (
        Cautious as Cautious,
        CautiousState as CautiousState,
        cautious as cautious,
    )
    from ._wrappers.conditional import (
        ConditionallyMask as ConditionallyMask,
        ConditionallyMaskState as ConditionallyMaskState,
        ConditionallyTransform as ConditionallyTransform,
        ConditionallyTransformState as ConditionallyTransformState,
        conditionally_mask as conditionally_mask,
        conditionally_transform as conditionally_transform,
    )
    from ._wrappers.finite import (
        ApplyIfFinite as ApplyIfFinite,
        ApplyIfFiniteState as ApplyIfFiniteState,
        apply_if_finite as apply_if_finite,
        skip_large_updates as skip_large_updates,
        skip_not_finite as skip_not_finite,
    )
    from ._wrappers.flatten import (
        Flatten as Flatten,
        FlattenState as FlattenState,
        flatten as flatten,
    )
    from ._wrappers.inject import (
        InjectHyperparams as InjectHyperparams,
        InjectHyperparamsState as InjectHyperparamsState,
        InjectStatefulHyperparams as InjectStatefulHyperparams,
        InjectStatefulHyperparamsState as InjectStatefulHyperparamsState,
        inject_hyperparams as inject_hyperparams,
        inject_stateful_hyperparams as inject_stateful_hyperparams,
    )
    from ._wrappers.lookahead import (
        Lookahead as Lookahead,
        LookaheadParams as LookaheadParams,
        LookaheadState as LookaheadState,
        lookahead as lookahead,
    )
    from ._wrappers.masked import (
        Freeze as Freeze,
        Masked as Masked,
        MaskedState as MaskedState,
        SelectiveTransform as SelectiveTransform,
        freeze as freeze,
        masked as masked,
        selective_transform as selective_transform,
    )
    from ._wrappers.master import (
        MasterWeights as MasterWeights,
        MasterWeightsState as MasterWeightsState,
        StochasticRounding as StochasticRounding,
        StochasticRoundingState as StochasticRoundingState,
        master_weights as master_weights,
        stochastic_round as stochastic_round,
        stochastic_rounding as stochastic_rounding,
    )
    from ._wrappers.microbatch import (
        microbatch as microbatch,
    )
    from ._wrappers.monitor import (
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
    from ._wrappers.offload import (
        Offload as Offload,
        offload as offload,
    )
    from ._wrappers.privacy import (
        DifferentiallyPrivateAggregate as DifferentiallyPrivateAggregate,
        DifferentiallyPrivateAggregateState as DifferentiallyPrivateAggregateState,
        differentially_private_aggregate as differentially_private_aggregate,
        dpsgd as dpsgd,
        per_example_global_norm_clip as per_example_global_norm_clip,
        per_example_layer_norm_clip as per_example_layer_norm_clip,
    )
    from ._wrappers.stack_axes import (
        WithStackAxes as WithStackAxes,
        with_stack_axes as with_stack_axes,
    )
    from ._zero import (
        shard_state as shard_state,
        zero_shardings as zero_shardings,
        zero_unsplit as zero_unsplit,
    )
    from ._zero_plan import (
        ZeroPlan as ZeroPlan,
        zero_plan as zero_plan,
    )
    from .losses import (
        convex_kl_divergence as convex_kl_divergence,
        cosine_distance as cosine_distance,
        cosine_similarity as cosine_similarity,
        ctc_loss as ctc_loss,
        ctc_loss_with_forward_probs as ctc_loss_with_forward_probs,
        generalized_kl_divergence as generalized_kl_divergence,
        hinge_loss as hinge_loss,
        huber_loss as huber_loss,
        kl_divergence as kl_divergence,
        l2_loss as l2_loss,
        log_cosh as log_cosh,
        ntxent as ntxent,
        safe_softmax_cross_entropy as safe_softmax_cross_entropy,
        sigmoid_binary_cross_entropy as sigmoid_binary_cross_entropy,
        sigmoid_focal_loss as sigmoid_focal_loss,
        smooth_labels as smooth_labels,
        softmax_cross_entropy as softmax_cross_entropy,
        softmax_cross_entropy_with_integer_labels as softmax_cross_entropy_with_integer_labels,
        squared_error as squared_error,
    )
    from .monte_carlo import multi_normal as multi_normal
    from .schedules import (
        AbstractSchedule as AbstractSchedule,
        ConstantSchedule as ConstantSchedule,
        CosineDecaySchedule as CosineDecaySchedule,
        CosineOnecycleSchedule as CosineOnecycleSchedule,
        ExponentialDecaySchedule as ExponentialDecaySchedule,
        FunctionSchedule as FunctionSchedule,
        JoinSchedules as JoinSchedules,
        LinearOnecycleSchedule as LinearOnecycleSchedule,
        LinearSchedule as LinearSchedule,
        PiecewiseConstantSchedule as PiecewiseConstantSchedule,
        PiecewiseInterpolateSchedule as PiecewiseInterpolateSchedule,
        PolynomialSchedule as PolynomialSchedule,
        WarmupConstantSchedule as WarmupConstantSchedule,
        WarmupCosineDecaySchedule as WarmupCosineDecaySchedule,
        WarmupExponentialDecaySchedule as WarmupExponentialDecaySchedule,
        as_schedule as as_schedule,
        constant_schedule as constant_schedule,
        cosine_decay_schedule as cosine_decay_schedule,
        cosine_onecycle_schedule as cosine_onecycle_schedule,
        exponential_decay as exponential_decay,
        join_schedules as join_schedules,
        linear_onecycle_schedule as linear_onecycle_schedule,
        linear_schedule as linear_schedule,
        piecewise_constant_schedule as piecewise_constant_schedule,
        piecewise_interpolate_schedule as piecewise_interpolate_schedule,
        polynomial_schedule as polynomial_schedule,
        sgdr_schedule as sgdr_schedule,
        warmup_constant_schedule as warmup_constant_schedule,
        warmup_cosine_decay_schedule as warmup_cosine_decay_schedule,
        warmup_exponential_decay_schedule as warmup_exponential_decay_schedule,
    )
    from .schedules._stateful import (
        AbstractStatefulSchedule as AbstractStatefulSchedule,
        ScheduleCountState as ScheduleCountState,
        WrappedSchedule as WrappedSchedule,
    )
    from .tree import map_params as tree_map_params  # noqa: F401 (Optax's name)

    # isort: split
    # Adafactor, trust ratios and per-block scaling.
    from ._transform.block import (
        AdaptiveGradClip as AdaptiveGradClip,
        ClipByBlockRms as ClipByBlockRms,
        NormalizeByUpdateNorm as NormalizeByUpdateNorm,
        ScaleByParamBlockNorm as ScaleByParamBlockNorm,
        ScaleByParamBlockRms as ScaleByParamBlockRms,
        adaptive_grad_clip as adaptive_grad_clip,
        clip_by_block_rms as clip_by_block_rms,
        normalize_by_update_norm as normalize_by_update_norm,
        scale_by_param_block_norm as scale_by_param_block_norm,
        scale_by_param_block_rms as scale_by_param_block_rms,
    )
    from ._transform.factored import (
        ScaleByFactoredRms as ScaleByFactoredRms,
        ScaleByFactoredRmsState as FactoredState,  # noqa: F401
        ScaleByFactoredRmsState as ScaleByFactoredRmsState,
        adafactor as adafactor,
        scale_by_factored_rms as scale_by_factored_rms,
    )
    from ._transform.trust_ratio import (
        ScaleByTrustRatio as ScaleByTrustRatio,
        fromage as fromage,
        lamb as lamb,
        scale_by_trust_ratio as scale_by_trust_ratio,
    )

    # isort: split
    # Adaptive and game optimisers: AdaBelief, Adadelta, Adan, NovoGrad, RAdam,
    # Rprop, SM3, Yogi, optimistic methods, Polyak's step, DoG.
    from ._transform.adadelta import (
        ScaleByAdadelta as ScaleByAdadelta,
        ScaleByAdadeltaState as ScaleByAdaDeltaState,  # noqa: F401
        ScaleByAdadeltaState as ScaleByAdadeltaState,
        adadelta as adadelta,
        scale_by_adadelta as scale_by_adadelta,
    )
    from ._transform.adan import (
        ScaleByAdan as ScaleByAdan,
        ScaleByAdanState as ScaleByAdanState,
        adan as adan,
        scale_by_adan as scale_by_adan,
    )
    from ._transform.belief import (
        ScaleByBelief as ScaleByBelief,
        ScaleByBeliefState as ScaleByBeliefState,
        adabelief as adabelief,
        scale_by_belief as scale_by_belief,
    )
    from ._transform.dog import (
        ScaleByDistanceOverGradients as ScaleByDistanceOverGradients,
        ScaleByDistanceOverGradientsState as ScaleByDistanceOverGradientsState,
        scale_by_distance_over_gradients as scale_by_distance_over_gradients,
    )
    from ._transform.novograd import (
        ScaleByNovograd as ScaleByNovograd,
        ScaleByNovogradState as ScaleByNovogradState,
        novograd as novograd,
        scale_by_novograd as scale_by_novograd,
    )
    from ._transform.optimistic import (
        ScaleByOptimisticGradient as ScaleByOptimisticGradient,
        ScaleByOptimisticGradientState as ScaleByOptimisticGradientState,
        optimistic_adam as optimistic_adam,
        optimistic_adam_v2 as optimistic_adam_v2,
        optimistic_gradient_descent as optimistic_gradient_descent,
        scale_by_optimistic_gradient as scale_by_optimistic_gradient,
    )
    from ._transform.polyak import (
        ScaleByPolyak as ScaleByPolyak,
        polyak_sgd as polyak_sgd,
        scale_by_polyak as scale_by_polyak,
    )
    from ._transform.radam import (
        ScaleByRadam as ScaleByRadam,
        radam as radam,
        scale_by_radam as scale_by_radam,
    )
    from ._transform.rprop import (
        ScaleByRprop as ScaleByRprop,
        ScaleByRpropState as ScaleByRpropState,
        rprop as rprop,
        scale_by_rprop as scale_by_rprop,
    )
    from ._transform.sm3 import (
        ScaleBySM3 as ScaleBySM3,
        ScaleBySM3State as ScaleBySM3State,
        scale_by_sm3 as scale_by_sm3,
        sm3 as sm3,
    )
    from ._transform.yogi import (
        ScaleByYogi as ScaleByYogi,
        scale_by_yogi as scale_by_yogi,
        yogi as yogi,
    )


def _table() -> dict[str, tuple[str, str | None]]:
    # name -> (module, attribute in it), None for a submodule; built once.
    global _PUBLIC
    if _PUBLIC is None:
        from ._exports import EXPORTS, RENAMED, SUBMODULES

        table: dict[str, tuple[str, str | None]] = {
            name: (f"{__name__}.{name}", None) for name in SUBMODULES
        }
        for module, names in EXPORTS.items():
            for name in names:
                table[name] = (f"{__name__}{module}", name)
        for name, (module, attribute) in RENAMED.items():
            table[name] = (f"{__name__}{module}", attribute)
        _PUBLIC = table
    return _PUBLIC


_PUBLIC: dict[str, tuple[str, str | None]] | None = None


def _version() -> str:
    try:
        return importlib.metadata.version("eqopt")
    except importlib.metadata.PackageNotFoundError:  # running from a checkout
        return "0.1.0"


def __getattr__(name: str):
    if name == "__version__":  # reading the installed metadata takes a while
        value = globals()[name] = _version()
        return value
    if name == "__all__":  # `from eqopt import *`
        return sorted(n for n in _table() if not n.startswith("_"))
    where = _table().get(name) if not name.startswith("__") else None
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attribute = where
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    if name in _MOVED:
        # Warned at every use, as Optax does, so never cached as a plain attribute.
        import warnings

        warnings.warn(
            f"`eqopt.{name}` is deprecated (as in Optax): use `{_MOVED[name]}`.",
            DeprecationWarning,
            stacklevel=2,
        )
        return value
    globals()[name] = value  # from now on a plain attribute
    return value


# Top-level names Optax deprecates in favour of their `contrib` home.
_MOVED = {
    "differentially_private_aggregate": "eqopt.contrib.differentially_private_aggregate",
    "DifferentiallyPrivateAggregateState": (
        "eqopt.contrib.DifferentiallyPrivateAggregateState"
    ),
    "dpsgd": "eqopt.contrib.dpsgd",
}


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_table()))
