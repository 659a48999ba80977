"""eqopt: gradient processing and optimisation for JAX, the Equinox way."""

import importlib.metadata

import jaxtyping as _jaxtyping

# Every public function, method and Module of eqopt carries jaxtyping annotations.
# Importing its modules under this hook checks them with beartype (at trace time
# under jit). Setting JAXTYPING_DISABLE=1 turns the checks off.
with _jaxtyping.install_import_hook("eqopt", "beartype.beartype"):
    from . import (
        assignment as assignment,
        losses as losses,
        monte_carlo as monte_carlo,
        perturbations as perturbations,
        projections as projections,
        schedules as schedules,
        second_order as second_order,
        tree as tree,
    )
    from ._alias import (
        adagrad as adagrad,
        adam as adam,
        adamax as adamax,
        adamaxw as adamaxw,
        adamw as adamw,
        amsgrad as amsgrad,
        lion as lion,
        nadam as nadam,
        nadamw as nadamw,
        noisy_sgd as noisy_sgd,
        rmsprop as rmsprop,
        sgd as sgd,
        sign_sgd as sign_sgd,
        signum as signum,
    )
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
    # L-BFGS and line searches (issue 7).
    from ._transform.lbfgs import (
        ScaleByLBFGS as ScaleByLBFGS,
        ScaleByLBFGSState as ScaleByLBFGSState,
        lbfgs as lbfgs,
        scale_by_lbfgs as scale_by_lbfgs,
    )
    from ._transform.linesearch import (
        BacktrackingLinesearchInfo as BacktrackingLinesearchInfo,
        ScaleByBacktrackingLinesearch as ScaleByBacktrackingLinesearch,
        ScaleByBacktrackingLinesearchState as ScaleByBacktrackingLinesearchState,
        ScaleByZoomLinesearch as ScaleByZoomLinesearch,
        ScaleByZoomLinesearchState as ScaleByZoomLinesearchState,
        ZoomLinesearchInfo as ZoomLinesearchInfo,
        scale_by_backtracking_linesearch as scale_by_backtracking_linesearch,
        scale_by_zoom_linesearch as scale_by_zoom_linesearch,
        value_and_grad_from_state as value_and_grad_from_state,
    )
    from .monte_carlo import multi_normal as multi_normal
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
    )
    from ._transform.rms import (
        ScaleByRms as ScaleByRms,
        ScaleByRmsState as ScaleByRmsState,
        ScaleByRss as ScaleByRss,
        ScaleByRssState as ScaleByRssState,
        ScaleByStddev as ScaleByStddev,
        ScaleByStddevState as ScaleByStddevState,
        scale_by_rms as scale_by_rms,
        scale_by_rss as scale_by_rss,
        scale_by_stddev as scale_by_stddev,
    )
    from ._transform.sign import (
        ScaleByLion as ScaleByLion,
        ScaleByLionState as ScaleByLionState,
        ScaleBySign as ScaleBySign,
        scale_by_lion as scale_by_lion,
        scale_by_sign as scale_by_sign,
    )
    from ._wrappers.inject import (
        AbstractStatefulSchedule as AbstractStatefulSchedule,
        InjectHyperparams as InjectHyperparams,
        InjectHyperparamsState as InjectHyperparamsState,
        InjectStatefulHyperparams as InjectStatefulHyperparams,
        InjectStatefulHyperparamsState as InjectStatefulHyperparamsState,
        ScheduleCountState as ScheduleCountState,
        WrappedSchedule as WrappedSchedule,
        inject_hyperparams as inject_hyperparams,
        inject_stateful_hyperparams as inject_stateful_hyperparams,
    )
    from ._wrappers.masked import (
        Masked as Masked,
        MaskedState as MaskedState,
        SelectiveTransform as SelectiveTransform,
        freeze as freeze,
        masked as masked,
        selective_transform as selective_transform,
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
    from .tree import map_params as tree_map_params  # noqa: F401 (Optax's name)

try:
    __version__ = importlib.metadata.version("eqopt")
except importlib.metadata.PackageNotFoundError:  # running from a checkout
    __version__ = "0.1.0"
