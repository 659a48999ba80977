"""Clipping (`eqopt/_transform/clipping.py`): clip and clip_by_global_norm."""

import optax
from helpers import ALL_DTYPES, Case

import eqopt

TRANSFORM_CASES = [
    Case("clip", lambda: eqopt.clip(0.5), lambda: optax.clip(0.5), needs_params=False),
    Case(
        "clip_by_global_norm",
        lambda: eqopt.clip_by_global_norm(1.0),
        lambda: optax.clip_by_global_norm(1.0),
        ALL_DTYPES,
        needs_params=False,
    ),
]
