"""Research optimisers from recent papers (Optax's `optax.contrib`).

Each is implemented from its paper, named in its docstring, and matches Optax's
`contrib` spelling, arguments and numerics.
"""

from ._acprop import (
    ScaleByAcprop as ScaleByAcprop,
    ScaleByAcpropState as ScaleByAcpropState,
    acprop as acprop,
    scale_by_acprop as scale_by_acprop,
)
from ._adam_mini import (
    AdamMiniBlocks as AdamMiniBlocks,
    ScaleByAdamMini as ScaleByAdamMini,
    ScaleByAdamMiniState as ScaleByAdamMiniState,
    adam_mini as adam_mini,
    scale_by_adam_mini as scale_by_adam_mini,
)
from ._ademamix import (
    ScaleByAdemamix as ScaleByAdemamix,
    ScaleByAdemamixState as ScaleByAdemamixState,
    ScaleBySimplifiedAdemamix as ScaleBySimplifiedAdemamix,
    ScaleBySimplifiedAdEMAMixState as ScaleBySimplifiedAdEMAMixState,
    ademamix as ademamix,
    scale_by_ademamix as scale_by_ademamix,
    scale_by_simplified_ademamix as scale_by_simplified_ademamix,
    simplified_ademamix as simplified_ademamix,
)
from ._adopt import (
    ScaleByAdopt as ScaleByAdopt,
    ScaleByAdoptState as ScaleByAdoptState,
    adopt as adopt,
    scale_by_adopt as scale_by_adopt,
)
from ._cocob import (
    COCOBState as COCOBState,
    ScaleByCocob as ScaleByCocob,
    cocob as cocob,
    scale_by_cocob as scale_by_cocob,
)
from ._dadapt import (
    DAdaptAdamW as DAdaptAdamW,
    DAdaptAdamWState as DAdaptAdamWState,
    dadapt_adamw as dadapt_adamw,
)
from ._dog import (
    DoGState as DoGState,
    DoWGState as DoWGState,
    ScaleByDoG as ScaleByDoG,
    ScaleByDoWG as ScaleByDoWG,
    dog as dog,
    dowg as dowg,
)
from ._laprop import (
    ScaleByLaProp as ScaleByLaProp,
    ScaleByLaPropState as ScaleByLaPropState,
    laprop as laprop,
    scale_by_laprop as scale_by_laprop,
)
from ._madgrad import (
    MadgradState as MadgradState,
    ScaleByMadgrad as ScaleByMadgrad,
    madgrad as madgrad,
    scale_by_madgrad as scale_by_madgrad,
)
from ._mars import (
    ScaleByMars as ScaleByMars,
    ScaleByMarsState as ScaleByMarsState,
    mars_adamw as mars_adamw,
    mars_lion as mars_lion,
    scale_by_mars as scale_by_mars,
)
from ._mechanic import (
    MechanicState as MechanicState,
    Mechanize as Mechanize,
    mechanize as mechanize,
)
from ._momo import (
    Momo as Momo,
    MomoAdam as MomoAdam,
    MomoAdamState as MomoAdamState,
    MomoState as MomoState,
    momo as momo,
    momo_adam as momo_adam,
)
from ._prodigy import (
    Prodigy as Prodigy,
    ProdigyState as ProdigyState,
    prodigy as prodigy,
)

# isort: split
# Muon, GaLore, schedule-free, SAM, Sophia, reduce-on-plateau, normalize, complex.
from ._adamuon import (
    AdaMuonState as AdaMuonState,
    ScaleByAdaMuon as ScaleByAdaMuon,
    adamuon as adamuon,
    scale_by_adamuon as scale_by_adamuon,
)
from ._complex import (
    SplitRealAndImaginary as SplitRealAndImaginary,
    SplitRealAndImaginaryState as SplitRealAndImaginaryState,
    split_real_and_imaginary as split_real_and_imaginary,
)
from ._dion import (
    DionState as DionState,
    ScaleByDion as ScaleByDion,
    dion as dion,
    scale_by_dion as scale_by_dion,
)
from ._galore import (
    GaLoreDimensionNumbers as GaLoreDimensionNumbers,
    GaLoreState as GaLoreState,
    ScaleByGaLore as ScaleByGaLore,
    galore as galore,
    scale_by_galore as scale_by_galore,
)
from ._hyperball import (
    Hyperball as Hyperball,
    HyperballState as HyperballState,
    adamh as adamh,
    hyperball as hyperball,
    muonh as muonh,
)
from ._muon import (
    MuonDimensionNumbers as MuonDimensionNumbers,
    MuonState as MuonState,
    ScaleByMuon as ScaleByMuon,
    ScaleByShape as ScaleByShape,
    muon as muon,
    scale_by_muon as scale_by_muon,
)
from ._muon_clip import (
    QKClip as QKClip,
    QKClipProjection as QKClipProjection,
    attention_max_logits as attention_max_logits,
    muon_clip as muon_clip,
    qk_clip as qk_clip,
)
from ._normalize import (
    Normalize as Normalize,
    NormalizeState as NormalizeState,
    normalize as normalize,
)
from ._normuon import (
    NorMuonState as NorMuonState,
    ScaleByNorMuon as ScaleByNorMuon,
    normuon as normuon,
    scale_by_normuon as scale_by_normuon,
)
from ._plateau import (
    ReduceLROnPlateauState as ReduceLROnPlateauState,
    ReduceOnPlateau as ReduceOnPlateau,
    reduce_on_plateau as reduce_on_plateau,
)
from ._polar_express import (
    polar_express_coefficients as polar_express_coefficients,
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
from ._scion import (
    ScaleByScion as ScaleByScion,
    ScionNorm as ScionNorm,
    ScionState as ScionState,
    scale_by_scion as scale_by_scion,
    scion as scion,
)
from ._sophia import (
    HutchinsonEstimatorDiagHessian as HutchinsonEstimatorDiagHessian,
    HutchinsonState as HutchinsonState,
    ScaleBySophia as ScaleBySophia,
    SophiaState as SophiaState,
    hutchinson_estimator_diag_hessian as hutchinson_estimator_diag_hessian,
    sophia as sophia,
)
from ._splus import (
    IterateAverage as IterateAverage,
    IterateAverageState as IterateAverageState,
    ScaleBySPlus as ScaleBySPlus,
    ScaleBySPlusShape as ScaleBySPlusShape,
    ScaleBySPlusState as ScaleBySPlusState,
    scale_by_splus as scale_by_splus,
    splus as splus,
    splus_eval_params as splus_eval_params,
)

# End of Muon ... complex.

# isort: split
# Cautious updates are a general wrapper (`eqopt.cautious`); Optax's pull request
# (#1690) puts them in `contrib`, so they are spelled here too: the same objects.
from .._wrappers.cautious import (
    Cautious as Cautious,
    CautiousState as CautiousState,
    cautious as cautious,
)

# Kronecker-factored preconditioners: SOAP, Shampoo, PSGD Kron (not in Optax).
from ._kron import (
    KronUpdateProbabilitySchedule as KronUpdateProbabilitySchedule,
    ScaleByKron as ScaleByKron,
    ScaleByKronState as ScaleByKronState,
    kron as kron,
    kron_probes as kron_probes,
    precond_update_prob_schedule as precond_update_prob_schedule,
    scale_by_kron as scale_by_kron,
)
from ._shampoo import (
    ScaleByShampoo as ScaleByShampoo,
    ScaleByShampooState as ScaleByShampooState,
    scale_by_shampoo as scale_by_shampoo,
    shampoo as shampoo,
)
from ._soap import (
    ScaleBySoap as ScaleBySoap,
    ScaleBySoapState as ScaleBySoapState,
    scale_by_soap as scale_by_soap,
    soap as soap,
)

# End of SOAP, Shampoo, Kron.

# isort: split
# Optax also spells the differentially private optimiser in `contrib`: the same
# objects as at the top level.
from .._wrappers.privacy import (
    DifferentiallyPrivateAggregate as DifferentiallyPrivateAggregate,
    DifferentiallyPrivateAggregateState as DifferentiallyPrivateAggregateState,
    differentially_private_aggregate as differentially_private_aggregate,
    dpsgd as dpsgd,
)
