"""Second-order quantities of a loss with respect to a model (Optax's
`optax.second_order`), computed without forming the Hessian."""

from ._curvature import (
    fisher_diag as fisher_diag,
    hessian_diag as hessian_diag,
    hvp as hvp,
)
