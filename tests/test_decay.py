"""Decoupled weight decay (`eqopt/_transform/decay.py`): add_decayed_weights."""

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from helpers import ALL_DTYPES, Case, decaying_schedule, make_mlp, tree_allclose

import eqopt

TRANSFORM_CASES = [
    Case(
        "add_decayed_weights",
        lambda: eqopt.add_decayed_weights(0.1),
        lambda: optax.add_decayed_weights(0.1),
        ALL_DTYPES,
    ),
    Case(
        "add_decayed_weights-mask",
        lambda: eqopt.add_decayed_weights(0.1, mask=lambda x: x.ndim > 1),
        lambda: optax.add_decayed_weights(
            0.1, mask=lambda p: {k: v.ndim > 1 for k, v in p.items()}
        ),
        ALL_DTYPES,
    ),
    Case(
        "add_decayed_weights-schedule",
        lambda: eqopt.add_decayed_weights(decaying_schedule),
        lambda: optax.add_decayed_weights(decaying_schedule),
        ALL_DTYPES,
    ),
]


def test_weight_decay_needs_params():
    params = {"a": jnp.ones(2)}
    opt = eqopt.add_decayed_weights(0.1)
    with pytest.raises(ValueError, match="needs `params`"):
        opt.update(params, opt.init(params))


def test_mask_that_selects_nothing_decays_nothing_with_a_warning():
    model = make_mlp(in_size=3)
    tx = eqopt.add_decayed_weights(0.1, mask=False)
    with pytest.warns(UserWarning, match=r"weight-decay mask \(False\) selects no"):
        state = tx.init(model)
    grads = jax.tree.map(lambda x: x if eqx.is_inexact_array(x) else None, model)
    updates, _ = tx.update(grads, state, model)
    assert tree_allclose(updates, grads, rtol=0, atol=0)


def test_add_decayed_weights_with_nothing_to_decay_needs_no_params():
    tx = eqopt.add_decayed_weights(0.1)
    state = tx.init({"a": None})
    assert tx.update({"a": None}, state)[0] == {"a": None}
    with pytest.raises(ValueError, match="needs `params`"):
        tx.update({"a": jnp.ones(2)}, state)


def test_no_gradient_at_all_is_none_at_every_leaf():
    """`update(None, ...)`: no gradient for any leaf, read as `None` at every leaf
    of the params (eqopt's "not trained"), so nothing is decayed; Optax returns
    `None` itself. A stateful optimiser takes its step as for `None` leaves."""
    weights = (jnp.ones(2), {"a": jnp.ones(2), "b": jnp.ones(2)})
    decay = eqopt.add_decayed_weights(0.1, mask=None)
    updates, _ = decay.update(None, decay.init(weights), weights)
    assert updates == (None, {"a": None, "b": None})
    assert optax.add_decayed_weights(0.1).update(None, (), weights)[0] is None
    adam = eqopt.adam(1e-3)
    updates, state = adam.update(None, adam.init(weights), weights)
    assert jax.tree.leaves(updates) == [] and int(state[0].count) == 1
