"""Optax's protocol both ways (`from_optax`, `to_optax`) and the Optax idioms that
eqopt objects support: `init, update = tx`, `isinstance(tx, GradientTransformation)`,
a chain's state as a tuple, Optax's empty states."""

import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import assert_tree_allclose, make_model
from registry import ALL_CASES, build

import eqopt

# The registry cases of `from_optax` are in `_cases_interop.py` (a test module
# that defines cases cannot also import the registry; registry.py collects it).
CASE_IDS = [case.name for case in ALL_CASES]


def test_importing_eqopt_does_not_import_optax():
    code = "import sys, eqopt; assert 'optax' not in sys.modules, 'optax imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------
# from_optax
# ---------------------------------------------------------------------------


def test_from_optax_on_whole_model_matches_optax():
    model = eqx.nn.MLP(2, 2, 3, 1, key=jax.random.key(0))
    grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(2)) ** 2))(model)
    # Optax alone cannot take the model: its non-array leaves are not arrays.
    with pytest.raises(TypeError):
        optax.adam(1e-2).init(model)
    opt = eqopt.from_optax(optax.adam(1e-2))
    state = opt.init(model)
    updates, state = opt.update(grads, state, model)
    assert updates.activation is None
    params = eqx.filter(model, eqx.is_array)
    reference = optax.adam(1e-2)
    expected, _ = reference.update(grads, reference.init(params), params)
    assert_tree_allclose(eqx.filter(updates, eqx.is_array), expected, rtol=0, atol=0)


def test_from_optax_none_gradient_at_trainable_leaf():
    params = {"a": jnp.ones(2), "b": jnp.full(3, 2.0)}
    opt = eqopt.from_optax(optax.sgd(0.1, momentum=0.9))
    state = opt.init(params)
    updates, state = opt.update({"a": jnp.ones(2), "b": None}, state, params)
    assert updates["b"] is None
    np.testing.assert_allclose(updates["a"], -0.1 * jnp.ones(2))
    # Optax saw zeros there: its momentum for `b` is zero.
    np.testing.assert_array_equal(state.inner_state[0].trace["b"], jnp.zeros(3))


def test_from_optax_forwards_extra_args_only_when_accepted():
    seen = []

    def update_with_extras(updates, state, params=None, **extra_args):
        seen.append(extra_args)
        return updates, state

    def plain_update(updates, state, params=None):
        return updates, state

    params = {"a": jnp.ones(2)}
    for update in (update_with_extras, plain_update):
        tx = optax.GradientTransformationExtraArgs(lambda p: (), update)
        opt = eqopt.chain(eqopt.from_optax(tx))
        opt.update(params, opt.init(params), params, value=jnp.asarray(1.0))
    assert len(seen) == 1 and float(seen[0]["value"]) == 1.0


def test_from_optax_rejects_non_transforms():
    with pytest.raises(TypeError, match="from_optax"):
        eqopt.from_optax(eqopt.adam)  # a factory, not a transform


# ---------------------------------------------------------------------------
# to_optax
# ---------------------------------------------------------------------------


def test_to_optax_is_an_array_free_pair():
    tx = eqopt.to_optax(eqopt.adam(1e-2))
    assert isinstance(tx, tuple) and len(tx) == 2
    init, update = tx
    assert init is tx.init and update is tx.update
    leaves = jax.tree.leaves(tx)
    assert len(leaves) == 2 and all(callable(leaf) for leaf in leaves)
    assert not any(eqx.is_array(leaf) for leaf in leaves)


def test_to_optax_in_optax_wrappers_matches_optax():
    params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)}
    grads = [{"w": jnp.full((2, 3), g)} for g in (0.5, -1.0, 2.0, 0.25)]

    def run(inner):
        tx = optax.MultiSteps(optax.chain(optax.clip(1.0), inner), every_k_schedule=2)
        state, p = tx.init(params), params
        for g in grads:
            updates, state = tx.update(g, state, p)
            p = optax.apply_updates(p, updates)
        return p

    ours = run(eqopt.to_optax(eqopt.sgd(0.1, momentum=0.9)))
    theirs = run(optax.sgd(0.1, momentum=0.9))
    assert_tree_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_to_optax_forwards_extra_args():
    seen = []

    def update(updates, state, params=None, **extra_args):
        seen.append(extra_args)
        return updates, state

    inner = eqopt.GradientTransformation(lambda params: eqopt.EmptyState(), update)
    tx = eqopt.to_optax(eqopt.chain(eqopt.scale(2.0), inner))
    params = {"a": jnp.ones(2)}
    updates, _ = tx.update(params, tx.init(params), params, value=jnp.asarray(2.0))
    np.testing.assert_array_equal(updates["a"], jnp.full(2, 2.0))
    assert float(seen[0]["value"]) == 2.0


# ---------------------------------------------------------------------------
# Optax's idioms on eqopt objects
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", ALL_CASES, ids=CASE_IDS)
def test_every_transform_unpacks_and_is_a_gradient_transformation(case):
    tx = build(case.make, make_model())
    init, update = tx
    assert init == tx.init and update == tx.update
    if not isinstance(tx, eqopt.Chain):  # a chain's `[i]` is its part
        assert (tx[0], tx[1]) == (tx.init, tx.update)  # Optax's `masked(...)[0]`
    assert isinstance(tx, eqopt.GradientTransformation)
    assert isinstance(tx, eqopt.GradientTransformationExtraArgs)


def test_unpacked_optimiser_trains():
    init, update = eqopt.adam(0.1)
    params = {"a": jnp.ones(2)}
    state = init(params)
    updates, state = update({"a": jnp.ones(2)}, state, params)
    np.testing.assert_allclose(updates["a"], -0.1 * jnp.ones(2), rtol=1e-6)


def test_isinstance_is_false_for_other_objects():
    assert not isinstance(optax.adam(1e-3), eqopt.GradientTransformation)
    assert not isinstance(jnp.ones(2), eqopt.GradientTransformationExtraArgs)
    assert not isinstance(
        eqopt.schedules.constant_schedule(1.0), eqopt.GradientTransformation
    )


def test_gradient_transformation_takes_optax_keywords():
    init = lambda params: eqopt.EmptyState()
    update = lambda updates, state, params=None: (updates, state)
    for tx in (
        eqopt.GradientTransformation(init, update),
        eqopt.GradientTransformation(init=init, update=update),
        eqopt.GradientTransformationExtraArgs(init=init, update=update),
        eqopt.GradientTransformation(init_fn=init, update_fn=update),
    ):
        assert tx.init_fn is init and tx.update_fn is update
        assert tx.init({"a": jnp.ones(1)}) == eqopt.EmptyState()
    with pytest.raises(TypeError, match="both `init` and `init_fn`"):
        eqopt.GradientTransformation(init, update, init_fn=init)
    with pytest.raises(TypeError, match="missing the function `update`"):
        eqopt.GradientTransformation(init=init)
    with pytest.raises(TypeError, match="update"):
        eqopt.GradientTransformation(init, 3)


def test_chain_state_behaves_as_a_tuple():
    opt = eqopt.chain(
        eqopt.clip_by_global_norm(1.0), eqopt.scale_by_adam(), eqopt.scale(-0.1)
    )
    state = opt.init({"a": jnp.ones(2)})
    assert len(state) == 3
    assert type(state[1]).__name__ == "ScaleByAdamState"
    assert state[1] is state.scale_by_adam is state["scale_by_adam"]
    clip_state, adam_state, scale_state = state
    assert adam_state is state[1]
    assert [type(s).__name__ for s in state] == [
        "EmptyState",
        "ScaleByAdamState",
        "EmptyState",
    ]
    assert state[-1] is scale_state and state[:2] == (clip_state, adam_state)
    # Optax's `optax.tree.get` idiom on the state still finds by name.
    assert int(eqopt.tree.get(state, "count")) == 0


@pytest.mark.parametrize(
    "empty", [eqopt.EmptyState(), optax.EmptyState(), (), {}, None]
)
def test_stateless_transform_accepts_optax_empty_states(empty):
    updates = {"a": jnp.array([3.0, -4.0])}
    for tx in (eqopt.scale(2.0), eqopt.identity(), eqopt.clip_by_global_norm(1.0)):
        new_updates, new_state = tx.update(updates, empty)
        assert new_state is empty
        assert new_updates["a"].shape == (2,)
    assert isinstance(empty, eqopt.EmptyState)
    assert not isinstance(0, eqopt.EmptyState)
    assert not isinstance({"a": 1}, eqopt.EmptyState)
