"""Filter specs (`eqopt/_filters.py`): how masks select leaves, and their errors."""

import jax.numpy as jnp
import pytest

import eqopt


def test_mask_predicate_returning_a_tree_is_explained():
    params = {"a": jnp.ones(2)}
    with pytest.raises(
        ValueError, match=r"per-leaf predicate.*\['a'\]|\['a'\].*per-leaf predicate"
    ):
        eqopt.masked(eqopt.scale(2.0), lambda p: {"x": True}).init(params)


def test_mask_not_a_prefix():
    params = {"a": jnp.ones(2), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match="not a prefix"):
        eqopt.masked(eqopt.scale(2.0), {"a": True, "c": False}).init(params)
