"""Every wrapper has its inner transform's capabilities (`eqopt.AbstractWrapper`).

A `freeze` (or a per-example aggregation) inside any wrapper is seen by the chain
around it as it is bare: the frozen leaf gets no weight decay from a later part,
bit for bit as with the bare `freeze`, and the chain asks the wrapper's first
part for per-example updates as it would ask the bare aggregation.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqopt
from eqopt import AbstractWrapper

#: Each wrapper of the catalogue around one inner transform.
WRAPPERS = {
    "apply_if_finite": lambda t: eqopt.apply_if_finite(t, 3),
    "masked-everything": lambda t: eqopt.masked(t, True),
    "conditionally_transform": lambda t: eqopt.conditionally_transform(
        t, lambda step: True
    ),
    "conditionally_mask": lambda t: eqopt.conditionally_mask(t, lambda step: True),
    "master_weights": eqopt.master_weights,
    "with_stack_axes": lambda t: eqopt.with_stack_axes(t, 0),
    "multi_steps": lambda t: eqopt.MultiSteps(t, every_k_schedule=1),
    "bucketed": eqopt.bucketed,
    "param_groups": eqopt.param_groups,
    # Before the learning rate: the inner updates point up the gradient.
    "cautious": lambda t: eqopt.contrib.cautious(t, "none", descent=False),
    "split_real_and_imaginary": eqopt.contrib.split_real_and_imaginary,
    "inject_hyperparams": lambda t: eqopt.inject_hyperparams(lambda: t)(),
    "offload": lambda t: eqopt.offload(t, min_size=0),
}

_PARAMS = {"frozen": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "free": jnp.ones(4)}
_GRADS = jax.tree.map(lambda x: jnp.cos(3.0 * x), _PARAMS)
_SPEC = {"frozen": True, "free": False}


def _run(tx, steps=2):
    params, state = _PARAMS, tx.init(_PARAMS)
    for _ in range(steps):
        updates, state = tx.update(_GRADS, state, params)
        params = eqopt.apply_updates(params, updates)
    return params


def test_every_wrapper_uses_the_base():
    for name, wrap in WRAPPERS.items():
        assert isinstance(wrap(eqopt.sgd(0.1)), AbstractWrapper), name


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_a_freeze_inside_a_wrapper_freezes_for_the_chain(name):
    wrap = WRAPPERS[name]
    wrapped = wrap(eqopt.freeze(_SPEC))
    assert wrapped.freezes
    decay = eqopt.adamw(0.1, weight_decay=0.5)
    ours = _run(eqopt.chain(wrapped, decay))
    bare = _run(eqopt.chain(eqopt.freeze(_SPEC), eqopt.adamw(0.1, weight_decay=0.5)))
    np.testing.assert_array_equal(ours["frozen"], _PARAMS["frozen"])
    np.testing.assert_array_equal(ours["free"], bare["free"])


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_a_per_example_transform_inside_a_wrapper_is_seen(name):
    aggregate = eqopt.contrib.differentially_private_aggregate(
        1.0, 0.0, key=jax.random.key(0)
    )
    assert WRAPPERS[name](aggregate).per_example_updates
    assert eqopt.chain(WRAPPERS[name](aggregate), eqopt.sgd(0.1)).per_example_updates


def test_lookahead_keeps_its_own_params():
    """Lookahead's params pair fast and slow weights: a chain around it freezes
    nothing by it (the freeze works inside), and its params are not the updates'."""
    look = eqopt.lookahead(eqopt.chain(eqopt.freeze(_SPEC), eqopt.sgd(0.1)), 2, 0.5)
    assert not look.freezes and not look.params_like_updates
    params = eqopt.LookaheadParams.init_synced(_PARAMS)
    updates, _ = look.update(_GRADS, look.init(params), params)
    np.testing.assert_array_equal(updates.fast["frozen"], jnp.zeros((3, 4)))


def test_a_freeze_inside_flatten_freezes_the_vector_for_the_chain():
    """`flatten`'s inner transform sees one vector: a freeze there freezes all of it
    (a model-shaped mask cannot reach it), and the chain around keeps every leaf."""
    wrapped = eqopt.flatten(eqopt.freeze(True))
    assert (
        wrapped.freezes
        and eqopt.flatten(eqopt.sgd(0.1)).frozen_selection(_PARAMS) is None
    )
    ours = _run(eqopt.chain(wrapped, eqopt.adamw(0.1, weight_decay=0.5)))
    jax.tree.map(np.testing.assert_array_equal, ours, _PARAMS)
    aggregate = eqopt.contrib.differentially_private_aggregate(
        1.0, 0.0, key=jax.random.key(0)
    )
    assert eqopt.flatten(aggregate).per_example_updates


def test_selective_transform_freezes_its_mask_and_the_inner_freeze():
    inner = eqopt.chain(eqopt.freeze({"frozen": False, "free": True}), eqopt.sgd(0.1))
    both = eqopt.selective_transform(inner, freeze_mask=_SPEC)
    assert both.frozen_selection(_PARAMS) == {"frozen": True, "free": True}


#: Wrappers that change the inner updates (so the free leaf differs from the bare
#: chain's): a freeze inside still freezes for the chain around them.
OPTIMISER_WRAPPERS = {
    "schedule_free": lambda t: eqopt.contrib.schedule_free(t, 0.1),
    "mechanize": eqopt.contrib.mechanize,
}


@pytest.mark.parametrize("name", sorted(OPTIMISER_WRAPPERS))
def test_a_freeze_inside_an_optimiser_wrapper_freezes_for_the_chain(name):
    wrap = OPTIMISER_WRAPPERS[name]
    assert isinstance(wrap(eqopt.sgd(0.1)), AbstractWrapper)
    inner = eqopt.chain(eqopt.freeze(_SPEC), eqopt.sgd(0.1))
    wrapped = wrap(inner)
    assert wrapped.freezes and wrapped.frozen_selection(_PARAMS) == _SPEC
    ours = _run(eqopt.chain(wrapped, eqopt.add_decayed_weights(0.5)))
    np.testing.assert_array_equal(ours["frozen"], _PARAMS["frozen"])
    assert not np.array_equal(ours["free"], _PARAMS["free"])
    assert not wrap(eqopt.sgd(0.1)).freezes
