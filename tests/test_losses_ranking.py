"""The ranking loss (`eqopt/losses/_ranking.py`): the registry cases, compared with Optax by the
generic tests of test_losses.py, and their edges, bad inputs and documented
differences from Optax."""

import jax.numpy as jnp
from loss_helpers import (
    Case,
    _full_where,
    _ranking_inputs,
)

LOSS_CASES = [
    Case("ranking_softmax_loss", "ranking_softmax_loss", _ranking_inputs),
    Case(
        "ranking_softmax_loss-weights-unreduced",
        "ranking_softmax_loss",
        _ranking_inputs,
        lambda args: {"weights": jnp.exp(args[0]), "reduce_fn": None},
    ),
    Case(  # Optax's gradient wrt the labels of left-out items is NaN.
        "ranking_softmax_loss-where-weights-sum",
        "ranking_softmax_loss",
        _ranking_inputs,
        lambda args: {
            "where": _full_where(args).at[1].set(False),
            "weights": jnp.exp(args[0]),
            "reduce_fn": jnp.sum,
        },
        optax_nan_gradient=True,
    ),
    Case(
        "ranking_softmax_loss-where-mean",
        "ranking_softmax_loss",
        _ranking_inputs,
        lambda args: {"where": _full_where(args).at[1].set(False)},
    ),
]
