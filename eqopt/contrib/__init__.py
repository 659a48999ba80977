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
from ._madgrad import (
    MadgradState as MadgradState,
    ScaleByMadgrad as ScaleByMadgrad,
    madgrad as madgrad,
    scale_by_madgrad as scale_by_madgrad,
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
