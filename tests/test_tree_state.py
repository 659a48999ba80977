"""Tests of `eqopt.tree`'s state functions (`eqopt/tree/_state.py`): get, set,
get_all_with_path and map_params, on eqopt-like Module states and Optax's."""

from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from helpers import (
    assert_tree_allclose,
    compare_trees,
    filtered,
    make_mlp,
    tree_allclose,
)

import eqopt
import eqopt.tree

# ---------------------------------------------------------------------------
# get / set / get_all_with_path on eqopt-like Module states
# ---------------------------------------------------------------------------


class AdamLikeState(eqx.Module):
    count: jax.Array
    mu: Any
    nu: Any


class InjectLikeState(eqx.Module):
    count: jax.Array
    hyperparams: dict
    inner_state: Any


class ChainLikeState(eqx.Module):
    states: tuple


class TraceLikeState(eqx.Module):
    trace: Any


def make_state():
    model = make_mlp(0, width_size=8, depth=2)
    moments = jax.tree.map(
        lambda p: jnp.zeros_like(p) if eqx.is_inexact_array(p) else None, model
    )
    adam = AdamLikeState(jnp.asarray(3), moments, moments)
    chain = ChainLikeState((TraceLikeState(moments), adam))
    return InjectLikeState(
        jnp.asarray(5),
        {"learning_rate": jnp.asarray(0.1), "b1": jnp.asarray(0.9)},
        chain,
    )


def keystrs(found):
    return [jax.tree_util.keystr(path) for path, _ in found]


def test_get_all_with_path():
    state = make_state()
    assert keystrs(eqopt.tree.get_all_with_path(state, "count")) == [
        ".count",
        ".inner_state.states[1].count",
    ]
    assert keystrs(eqopt.tree.get_all_with_path(state, "learning_rate")) == [
        ".hyperparams['learning_rate']"
    ]
    only_inner = eqopt.tree.get_all_with_path(
        state, "count", lambda path, value: len(path) > 1
    )
    assert keystrs(only_inner) == [".inner_state.states[1].count"]
    assert eqopt.tree.get_all_with_path(state, "absent") == []
    # Sequence indices are not names.
    assert eqopt.tree.get_all_with_path([1.0, 2.0], 0) == []


def test_get():
    state = make_state()
    assert eqopt.tree.get(state, "learning_rate") == 0.1
    mu = eqopt.tree.get(state, "mu")
    assert isinstance(mu, eqx.nn.MLP) and mu.activation is None
    adam = eqopt.tree.get(state, "AdamLikeState")  # by class name
    assert adam.count == 3
    assert eqopt.tree.get(state, "count", filtering=lambda path, v: v == 3) == 3
    assert eqopt.tree.get(state, "absent", default=None) is None
    assert eqopt.tree.get(state, "absent", 7) == 7


def test_get_errors_name_paths():
    state = make_state()
    with pytest.raises(
        KeyError, match=r"2 values.*\.count.*\.inner_state\.states\[1\]\.count"
    ):
        eqopt.tree.get(state, "count")
    # No match gives the default, None unless given, as in Optax.
    assert eqopt.tree.get(state, "learning_rte") is None
    assert eqopt.tree.get(state, "learning_rte", default=3) == 3


def test_set():
    state = make_state()
    new = eqopt.tree.set(state, learning_rate=jnp.asarray(0.01))
    assert new.hyperparams["learning_rate"] == 0.01
    assert state.hyperparams["learning_rate"] == 0.1  # the input is not modified
    assert new.hyperparams["b1"] is state.hyperparams["b1"]
    assert new.inner_state is state.inner_state  # untouched subtrees are shared
    new = eqopt.tree.set(state, lambda path, v: len(path) > 1, count=jnp.asarray(0))
    assert new.count == 5 and eqopt.tree.get(new, "AdamLikeState").count == 0
    both = eqopt.tree.set(state, count=jnp.asarray(1), b1=jnp.asarray(0.5))
    assert (
        both.count == 1
        and both.inner_state.states[1].count == 1
        and both.hyperparams["b1"] == 0.5
    )
    # A whole Module replaced by class name.
    new = eqopt.tree.set(state, TraceLikeState=TraceLikeState(None))
    assert new.inner_state.states[0].trace is None
    with pytest.raises(KeyError, match="no value under 'absent'"):
        eqopt.tree.set(state, absent=1)


def test_set_outermost_of_nested_matches():
    tree = {"a": {"a": 1.0, "c": 2.0}}
    assert eqopt.tree.set(tree, a=7.0) == {"a": 7.0}


class OptaxLike(NamedTuple):
    count: Any
    hyperparams: Any


def test_get_set_parity_with_optax_states():
    params = {"w": jnp.ones(3), "b": jnp.zeros(2)}
    opt = optax.inject_hyperparams(optax.adam)(learning_rate=lambda c: 0.1 / (c + 1))
    state = opt.init(params)
    for key_name in ["learning_rate", "count", "mu", "ScaleByAdamState"]:
        ours = [v for _, v in eqopt.tree.get_all_with_path(state, key_name)]
        theirs = [v for _, v in optax.tree.get_all_with_path(state, key_name)]
        assert tree_allclose(ours, theirs), key_name
    is_array = lambda path, value: isinstance(value, jax.Array)
    assert eqopt.tree.get(state, "learning_rate", filtering=is_array) == optax.tree.get(
        state, "learning_rate", filtering=is_array
    )
    ours = eqopt.tree.set(state, is_array, learning_rate=jnp.asarray(0.5))
    theirs = optax.tree.set(state, is_array, learning_rate=jnp.asarray(0.5))
    assert tree_allclose(ours, theirs)
    nt = OptaxLike(jnp.asarray(1), {"count": jnp.asarray(2)})
    assert tree_allclose(
        eqopt.tree.set(nt, count=jnp.asarray(0)),
        optax.tree.set(nt, count=jnp.asarray(0)),
    )


# ---------------------------------------------------------------------------
# map_params
# ---------------------------------------------------------------------------


class AdamLike(eqx.Module):
    """Stands for an eqopt transform: moments with `None` at non-trainable leaves."""

    def init(self, params):
        moments = jax.tree.map(
            lambda p: jnp.zeros_like(p) if eqx.is_inexact_array(p) else None, params
        )
        return AdamLikeState(jnp.zeros([], jnp.int32), moments, moments)


class ChainLike(eqx.Module):
    parts: tuple

    def init(self, params):
        return ChainLikeState(tuple(part.init(params) for part in self.parts))


class PickyInit(eqx.Module):
    """An init that inspects the params (as a mask or partition does)."""

    def init(self, params):
        if not jax.tree.leaves(params):
            raise ValueError("no parameters")
        return TraceLikeState(
            jax.tree.map(lambda p: p if eqx.is_inexact_array(p) else None, params)
        )


def test_map_params_parity_with_optax():
    params = {"a": jnp.ones(3), "b": jnp.zeros((2, 2))}
    opt = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adam(1e-3), optax.add_noise(0.1, 0.5, 0)
    )
    state = opt.init(params)
    specs = jax.tree.map(lambda p: p.shape, params)
    f = lambda leaf, spec: ("param", spec)
    ours = eqopt.tree.map_params(
        opt, f, state, specs, transform_non_params=lambda _: "other"
    )
    theirs = optax.tree.map_params(
        opt, f, state, specs, transform_non_params=lambda _: "other"
    )
    assert ours == theirs
    ours = eqopt.tree.map_params(opt.init, lambda p: 2 * p, state)
    theirs = optax.tree.map_params(opt.init, lambda p: 2 * p, state)
    assert compare_trees(ours, theirs)


def test_map_params_on_module_state_with_model():
    model = make_mlp(0, width_size=8, depth=2)
    opt = ChainLike((AdamLike(), AdamLike()))
    state = jax.tree.map(lambda p: p + 1, opt.init(model))
    out = eqopt.tree.map_params(
        opt,
        lambda leaf, p: leaf.shape == p.shape,
        state,
        model,
        transform_non_params=lambda _: "count",
    )
    adam = out.states[1]
    assert adam.count == "count"
    assert adam.mu.activation is None  # None stays None; f is not called there
    assert all(leaf is True for leaf in jax.tree.leaves(adam.nu))
    assert len(jax.tree.leaves(adam.mu)) == len(jax.tree.leaves(filtered(model)))


def test_map_params_by_structure_when_init_inspects_params():
    model = make_mlp(0, width_size=8, depth=2)
    opt = PickyInit()
    state = opt.init(model)
    out = eqopt.tree.map_params(opt, lambda leaf, p: jnp.shape(p), state, model)
    assert out.trace.layers[0].weight == (8, 2)
    with pytest.raises(ValueError, match="placeholder failed.*no parameters"):
        eqopt.tree.map_params(opt, lambda leaf: leaf, state)


def test_map_params_state_mismatch():
    model = make_mlp(0, width_size=8, depth=2)
    state = AdamLike().init(model)
    with pytest.raises(ValueError, match="differs from `state`"):
        eqopt.tree.map_params(ChainLike((AdamLike(),)), lambda leaf: leaf, state)


def test_map_params_is_leaf():
    params = {"a": (jnp.ones(2), jnp.ones(3))}
    opt = AdamLike()
    state = opt.init(params)
    out = eqopt.tree.map_params(
        opt, lambda leaf: len(leaf), state, is_leaf=lambda v: isinstance(v, tuple)
    )
    assert out.mu == {"a": 2}


def test_tree_map_params_over_a_chain_state():
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    opt = eqopt.adam(1e-3)
    state = opt.init(params)
    doubled = eqopt.tree_map_params(opt, lambda p: p + 2.0, state)
    assert_tree_allclose(doubled[0].mu, jax.tree.map(lambda x: x + 2.0, state[0].mu))
    assert doubled[0].count == state[0].count


@pytest.mark.parametrize("wrapper", ["masked", "freeze", "selective_transform"])
def test_map_params_finds_the_moments_under_a_tree_mask(wrapper):
    """A mask that is a tree (not a bool or a predicate) resolves against the
    placeholder that stands for the whole params, so the moments are found
    without `*rest`: the selected leaves are mapped, as Optax's are."""
    params = {"a": jnp.ones(3), "b": {"c": jnp.ones((2, 2)), "d": jnp.ones(2)}}
    mask = {"a": True, "b": {"c": False, "d": True}}
    frozen = {"a": False, "b": True}
    opt = {
        "masked": lambda: eqopt.masked(eqopt.adam(1.0), mask),
        "freeze": lambda: eqopt.chain(eqopt.freeze(frozen), eqopt.adam(1.0)),
        "selective_transform": lambda: eqopt.selective_transform(
            eqopt.adam(1.0), freeze_mask=frozen
        ),
    }[wrapper]()
    state = opt.init(params)
    out = eqopt.tree.map_params(opt, lambda p: p + 1.0, state)
    assert jax.tree.structure(out) == jax.tree.structure(state)
    mu = eqopt.tree.get(out, "mu")
    assert float(mu["a"].sum()) == 3.0 and mu["b"]["c"] is None
    if wrapper == "masked":
        theirs = optax.masked(optax.adam(1.0), mask)
        mapped = optax.tree.map_params(theirs, lambda p: p + 1.0, theirs.init(params))
        assert float(mapped.inner_state[0].mu["b"]["d"].sum()) == float(
            mu["b"]["d"].sum()
        )


def test_map_params_finds_the_fast_moments_of_lookahead():
    """`lookahead`'s state is built on the stand-in for the params (the fast
    optimiser's state is shaped like them), as Optax's is."""
    params = {"w": jnp.ones(3)}
    opt = eqopt.lookahead(eqopt.adam(1e-3), sync_period=2, slow_step_size=0.5)
    state = opt.init(eqopt.LookaheadParams.init_synced(params))
    out = eqopt.tree.map_params(opt, lambda p: p + 1.0, state)
    assert float(eqopt.tree.get(out, "mu")["w"].sum()) == 3.0
    assert int(eqopt.tree.get(out, "count")) == 0


def test_map_params_puts_any_value_in_a_typed_state():
    """Sharding specs or `None` replace the arrays of a typed state (its fields are
    checked when a state is built by hand, not when `map_params` rebuilds one)."""

    class Spec(eqx.Module):
        axis: int | None = eqx.field(static=True)

    params = {"w": jnp.zeros((1, 2)), "b": jnp.zeros(3)}
    opt = eqopt.adam(eqopt.linear_schedule(1e-2, 1e-4, 10))
    state = opt.init(params)
    specs = eqopt.tree_utils.tree_map_params(
        opt,
        lambda _, spec: spec,
        state,
        {"w": Spec(0), "b": Spec(1)},
        transform_non_params=lambda _: Spec(None),
    )
    adam, schedule = specs
    assert adam.count == Spec(None) and schedule.count == Spec(None)
    assert adam.mu == {"w": Spec(0), "b": Spec(1)} and adam.nu == adam.mu
    nones = eqopt.tree.map_params(
        opt, lambda _: 1, state, transform_non_params=lambda _: None
    )
    assert nones[0].count is None and nones[0].mu == {"w": 1, "b": 1}
    assert nones[1].count is None
