"""Every registry case treats a stack of layers as its layers.

For each case of the registry that is not elementwise, the stacked model of
`tests/_stacked_model.py` gets, slice by slice, the updates of the same blocks as
a list (three steps, the same gradients). An elementwise case needs no run: its
`elementwise` claim, checked for every case by `tests/test_registry.py`, says its
update is the same on separate leaves and on their concatenation, and a stacked
leaf is the concatenation of its slices. A case that differs on purpose is in
`NOT_COMPARED` with its reason (a test keeps that list true to the registry).
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _stacked_model import (
    make_models,
    random_grads,
    relative_difference,
    run_steps,
    unstack,
)
from registry import ALL_CASES, build

#: Cases that do not give the list's numbers on a stacked model, and why. (A
#: random case, `Case.random`, draws per leaf: a stack is one leaf where the list
#: has L, so it is not compared either; `test_stacked.py` feeds PSGD Kron's
#: probes to both models and compares them.)
NOT_COMPARED = {
    "partition-labels": "its label tree names the standard test model's leaves",
    "contrib.kron": "random probes; test_stacked.py feeds both the same probes",
    "contrib.kron-one-diag-half-probability": "random probes (see contrib.kron)",
    "contrib.scale_by_kron-all-diag-gradient-fit": "random probes (see contrib.kron)",
    "contrib.sophia": "random Hutchinson probes drawn per leaf",
    "contrib.sophia-seed-mask-no-clip": "random Hutchinson probes drawn per leaf",
    "contrib.hutchinson_estimator_diag_hessian": "random probes drawn per leaf",
    "stochastic_rounding-adam": "random rounding drawn per leaf",
    "contrib.dion": "Q_0 drawn per leaf; test_contrib_dion.py gives both the same",
    "contrib.dion-lion-rank1": "Q_0 drawn per leaf (see contrib.dion)",
    # A storage format: quantisation blocks of 256 elements run across slices.
    "adam-8bit": "quantisation blocks span slices",
    "adamw-4bit": "quantisation blocks span slices",
    "adamw-4bit-rank1": "rank-1 quantisation scales span slices",
    "adam-8bit-linear-nesterov": "quantisation blocks span slices",
    "adam-8bit-small-leaves-float32": "quantisation blocks span slices",
    "lion-8bit": "quantisation blocks span slices",
    "rmsprop-8bit": "quantisation blocks span slices",
    "contrib.ademamix-8bit": "quantisation blocks span slices",
    "contrib.muon-8bit": "quantisation blocks span slices",
    "master_weights-adam-8bit": "quantisation blocks span slices",
}

_STACKED, _LISTED = make_models()
_RTOL = 1e-5

#: Where float32 rounding alone exceeds `_RTOL`, the tolerance and why.
_LOOSER = {
    # Global inner products: the stack's sum runs in another order than the list's.
    "lbfgs-learning_rate-no_linesearch": 5e-5,
    "lbfgs": 5e-5,
    "lbfgs-backtracking": 5e-5,
    "scale_by_lbfgs": 5e-5,
    "scale_by_lbfgs-memory2-unscaled": 5e-5,
    # Newton-Schulz on the Gram matrix amplifies float32 rounding (vmapped
    # slices round differently from separate leaves).
    "contrib.muon-gram": 5e-5,
    "contrib.normuon-gram": 5e-5,
    # AdaMuon divides by sqrt(V) element by element, which amplifies it further.
    "contrib.adamuon": 1e-4,
}


def _is_compared(case) -> bool:
    return not build(case.make, _STACKED).elementwise


_COMPARED = [
    case.name
    for case in ALL_CASES
    if case.name not in NOT_COMPARED and not case.random and _is_compared(case)
]
_CASES = {case.name: case for case in ALL_CASES}


class _Objective(eqx.Module):
    r"""$f(p) = \sum g\,d + \tfrac{k}{2} d^2 + \tfrac14 d^4$ over every trained
    entry, $d = p - m$: its gradient at the model $m$ is `direction` $g$ (any
    pytree: the stacked model's or the list's, which sum the same entries)."""

    centre: object
    direction: object

    def __call__(self, params):
        def entry(p, m, g):
            d = p - m
            return jnp.sum(g * d + 5.0 * d**2 + 0.25 * d**4)

        arrays = eqx.filter(params, eqx.is_inexact_array)
        return sum(
            jax.tree.leaves(jax.tree.map(entry, arrays, self.centre, self.direction))
        )


def _extra_args(case, params, grads) -> dict:
    """A line search's objective (its gradient at `params` is `grads`, or minus
    them for a bare line search, fed them as its descent direction) and SAM's
    `grad_fn`, for the cases that take extra arguments."""
    if case.extra_args is None:
        return {}
    bare_search = case.name.startswith(("scale_by_zoom", "scale_by_backtracking"))
    direction = jax.tree.map(lambda g: -g if bare_search else g, grads)
    objective = _Objective(eqx.filter(params, eqx.is_inexact_array), direction)
    value, grad = eqx.filter_value_and_grad(objective)(params)
    return {
        "value": value,
        "grad": grad,
        "value_fn": objective,
        "grad_fn": lambda p, i: eqx.filter_grad(objective)(p),
    }


def _difference(case) -> float:
    def updates(model, grads_of):
        tx = build(case.make, model)
        extra = functools.partial(_extra_args, case)
        return run_steps(tx, model, grads_of, extra_of=extra)[0]

    ours = updates(_STACKED, lambda k: random_grads(_STACKED, k))
    theirs = updates(_LISTED, lambda k: unstack(random_grads(_STACKED, k)))
    return relative_difference(ours, theirs)


@pytest.mark.parametrize("name", _COMPARED)
def test_a_stack_is_its_layers(name):
    assert _difference(_CASES[name]) < _LOOSER.get(name, _RTOL)


def test_not_compared_names_registry_cases_that_are_not_elementwise():
    for name, reason in NOT_COMPARED.items():
        assert name in _CASES, name
        assert _is_compared(_CASES[name]), f"{name} is elementwise: {reason}"


def test_the_elementwise_claim_covers_the_rest():
    """Spot check of the argument in the module docstring: an elementwise case
    gives the list's numbers too."""
    case = _CASES["adamw"]
    assert build(case.make, _STACKED).elementwise
    np.testing.assert_array_less(_difference(case), _RTOL)
