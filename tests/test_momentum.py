"""Momentum and moving averages (`eqopt/_transform/momentum.py`): trace and ema."""

import optax
from helpers import ALL_DTYPES, Case

import eqopt

TRANSFORM_CASES = [
    Case(
        "trace",
        lambda: eqopt.trace(0.9),
        lambda: optax.trace(0.9),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "trace-nesterov",
        lambda: eqopt.trace(0.9, nesterov=True),
        lambda: optax.trace(0.9, nesterov=True),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "ema",
        lambda: eqopt.ema(0.9),
        lambda: optax.ema(0.9),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "ema-nodebias",
        lambda: eqopt.ema(0.8, debias=False),
        lambda: optax.ema(0.8, debias=False),
        ALL_DTYPES,
        needs_params=False,
    ),
]
