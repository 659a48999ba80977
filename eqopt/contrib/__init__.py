"""Optimisers from recent papers (Optax's `optax.contrib`): Muon, schedule-free,
SAM, Sophia, GaLore, reduce-on-plateau and more, each implemented from its paper."""

# Muon, GaLore, schedule-free, SAM, Sophia, reduce-on-plateau, normalize, complex.
from ._complex import (
    SplitRealAndImaginary as SplitRealAndImaginary,
    SplitRealAndImaginaryState as SplitRealAndImaginaryState,
    split_real_and_imaginary as split_real_and_imaginary,
)
from ._galore import (
    GaLoreDimensionNumbers as GaLoreDimensionNumbers,
    GaLoreState as GaLoreState,
    ScaleByGaLore as ScaleByGaLore,
    galore as galore,
    scale_by_galore as scale_by_galore,
)
from ._muon import (
    MuonDimensionNumbers as MuonDimensionNumbers,
    MuonState as MuonState,
    ScaleByMuon as ScaleByMuon,
    ScaleByShape as ScaleByShape,
    muon as muon,
    scale_by_muon as scale_by_muon,
)
from ._normalize import (
    Normalize as Normalize,
    NormalizeState as NormalizeState,
    normalize as normalize,
)
from ._plateau import (
    ReduceLROnPlateauState as ReduceLROnPlateauState,
    ReduceOnPlateau as ReduceOnPlateau,
    reduce_on_plateau as reduce_on_plateau,
)
from ._sam import SAM as SAM, SAMState as SAMState, sam as sam
from ._schedule_free import (
    ScheduleFree as ScheduleFree,
    ScheduleFreeState as ScheduleFreeState,
    schedule_free as schedule_free,
    schedule_free_adamw as schedule_free_adamw,
    schedule_free_eval_params as schedule_free_eval_params,
    schedule_free_sgd as schedule_free_sgd,
)
from ._sophia import (
    HutchinsonEstimatorDiagHessian as HutchinsonEstimatorDiagHessian,
    HutchinsonState as HutchinsonState,
    ScaleBySophia as ScaleBySophia,
    SophiaState as SophiaState,
    hutchinson_estimator_diag_hessian as hutchinson_estimator_diag_hessian,
    sophia as sophia,
)
# End of Muon ... complex.
