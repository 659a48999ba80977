"""Experimental namespaces (Optax's `optax.experimental`).

`aggregating`: transforms of per-element gradients (one per example of a batch),
which average, accumulate or measure them before an optimiser runs.
"""

from . import aggregating as aggregating
