"""Selecting parameters (`eqopt/_wrappers/masked.py`): masked, freeze and
selective_transform."""

import optax
import pytest
from helpers import ALL_DTYPES, Case, make_mlp, spec_like

import eqopt

TRANSFORM_CASES = [
    Case(
        "masked",
        lambda: eqopt.masked(eqopt.scale_by_adam(), lambda x: x.ndim > 1),
        lambda: optax.masked(
            optax.scale_by_adam(), lambda p: {k: v.ndim > 1 for k, v in p.items()}
        ),
        ALL_DTYPES,
    ),
    Case(
        "masked-tree",
        lambda p: eqopt.masked(eqopt.trace(0.9), spec_like(p, w=True, s=True)),
        lambda: optax.masked(optax.trace(0.9), {"w": True, "b": False, "s": True}),
    ),
    Case(
        "masked-nested",
        lambda p: eqopt.masked(
            eqopt.masked(eqopt.scale(2.0), spec_like(p, w=True, b=True)),
            lambda x: x.ndim >= 1,
        ),
        lambda: optax.masked(
            optax.masked(optax.scale(2.0), {"w": True, "b": True, "s": False}),
            lambda p: {k: v.ndim >= 1 for k, v in p.items()},
        ),
    ),
    Case(
        "freeze",
        lambda p: eqopt.chain(eqopt.freeze(spec_like(p, b=True)), eqopt.scale(-0.1)),
        lambda: optax.chain(
            optax.freeze({"w": False, "b": True, "s": False}), optax.scale(-0.1)
        ),
    ),
    Case(
        "selective_transform",
        lambda: eqopt.selective_transform(
            eqopt.scale_by_adam(), freeze_mask=lambda x: x.ndim == 1
        ),
        lambda: optax.selective_transform(
            optax.scale_by_adam(), freeze_mask={"w": False, "b": True, "s": False}
        ),
    ),
]


def test_mask_that_selects_nothing():
    with pytest.raises(ValueError, match="selects no trainable leaf"):
        eqopt.masked(eqopt.scale(2.0), lambda x: x.ndim > 3).init(make_mlp(in_size=3))
