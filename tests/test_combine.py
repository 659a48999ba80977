"""Combinators (`eqopt/_combine.py`): chain, named_chain and parameter groups."""

import jax.numpy as jnp
import optax
import pytest
from helpers import ALL_DTYPES, Case, assert_tree_allclose, make_mlp, spec_like

import eqopt

TREE = {
    "a": jnp.array([1.0, -2.0, 3.0]),
    "b": jnp.array([[0.5, 0.0], [-1.5, 2.0]]),
}


TRANSFORM_CASES = [
    Case(
        "chain",
        lambda: eqopt.chain(
            eqopt.clip_by_global_norm(1.0), eqopt.scale_by_adam(), eqopt.scale(-0.1)
        ),
        lambda: optax.chain(
            optax.clip_by_global_norm(1.0), optax.scale_by_adam(), optax.scale(-0.1)
        ),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "named_chain",
        lambda: eqopt.named_chain(
            ("clip", eqopt.clip(1.0)), ("momentum", eqopt.trace(0.5))
        ),
        lambda: optax.named_chain(
            ("clip", optax.clip(1.0)), ("momentum", optax.trace(0.5))
        ),
        needs_params=False,
    ),
    Case(
        "partition",
        lambda: eqopt.partition(
            {"adam": eqopt.scale_by_adam(), "sgd": eqopt.scale(-0.1)},
            {"adam": lambda x: x.ndim > 1, "sgd": lambda x: x.ndim <= 1},
        ),
        lambda: optax.partition(
            {"adam": optax.scale_by_adam(), "sgd": optax.scale(-0.1)},
            lambda p: {k: "adam" if v.ndim > 1 else "sgd" for k, v in p.items()},
        ),
    ),
    Case(
        "partition-labels",
        lambda p: eqopt.partition(
            {"a": eqopt.trace(0.5), "b": eqopt.scale(-0.1)},
            spec_like(p, w="a", b="b", s="a"),
        ),
        lambda: optax.partition(
            {"a": optax.trace(0.5), "b": optax.scale(-0.1)},
            {"w": "a", "b": "b", "s": "a"},
        ),
    ),
]


def test_partition_leaf_in_no_group_or_two():
    model = make_mlp(in_size=3)
    transforms = {"a": eqopt.scale(1.0), "b": eqopt.scale(2.0)}
    with pytest.raises(ValueError, match=r"\.layers\[0\]\.bias.*no group"):
        eqopt.partition(transforms, {"a": lambda x: x.ndim > 1, "b": False}).init(model)
    with pytest.raises(ValueError, match=r"\.layers\[0\]\.weight.*several groups"):
        eqopt.partition(transforms, {"a": True, "b": lambda x: x.ndim > 1}).init(model)


def test_partition_unknown_label_names_path():
    params = {"w": jnp.ones(2), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"\['b'\].*'c'.*no group"):
        eqopt.partition({"a": eqopt.scale(1.0)}, {"w": "a", "b": "c"}).init(params)


def test_multi_transform_is_partition():
    tx = eqopt.multi_transform(
        {"x": eqopt.scale(2.0), "y": eqopt.scale(-1.0)}, {"a": "x", "b": "y"}
    )
    assert isinstance(tx, eqopt.Partition)
    updates, _ = tx.update(TREE, tx.init(TREE))
    assert_tree_allclose(updates, {"a": 2 * TREE["a"], "b": -TREE["b"]})
