"""Selecting parameters (`eqopt/_wrappers/masked.py`): masked, freeze and
selective_transform."""

import re
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import ALL_DTYPES, Case, make_mlp, spec_like, tree_allclose

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


def _grads(model, value=1.0):
    return jax.tree.map(
        lambda x: jnp.full_like(x, value) if eqx.is_inexact_array(x) else None, model
    )


def _train(opt, model, steps=3):
    state = opt.init(model)
    step = eqx.filter_jit(
        lambda opt, model, state: _apply(opt, model, state, _grads(model, 0.5))
    )
    for _ in range(steps):
        model, state = step(opt, model, state)
    return model, state


def _apply(opt, model, state, grads):
    updates, state = opt.update(grads, state, model)
    return eqopt.apply_updates(model, updates), state


def _first_layer(model, value=True):
    # False everywhere, `value` at the first layer.
    spec = jax.tree.map(lambda _: False, model)
    return eqx.tree_at(lambda m: m.layers[0], spec, value)


def test_the_freezing_recipe_freezes():
    # Getting started's recipe: the frozen layer does not move under AdamW's weight
    # decay, and Adam keeps no moments for it; the rest trains.
    model = make_mlp(in_size=3)
    frozen = _first_layer(model)
    for opt in [
        eqopt.chain(eqopt.freeze(frozen), eqopt.adamw(0.1, weight_decay=0.5)),
        # Nested: the inner chain freezes for the chain around it too.
        eqopt.chain(
            eqopt.clip_by_global_norm(1.0),
            eqopt.chain(eqopt.freeze(frozen), eqopt.adamw(0.1, weight_decay=0.5)),
            eqopt.add_decayed_weights(0.5),
        ),
    ]:
        trained, state = _train(opt, model)
        for field in ("weight", "bias"):
            before = getattr(model.layers[0], field)
            after = getattr(trained.layers[0], field)
            np.testing.assert_array_equal(after, before)
            assert not np.array_equal(
                getattr(trained.layers[1], field), getattr(model.layers[1], field)
            )
        adam_states = [
            s
            for s in jax.tree.leaves(
                state, is_leaf=lambda x: isinstance(x, eqopt.ScaleByAdamState)
            )
            if isinstance(s, eqopt.ScaleByAdamState)
        ]
        assert len(adam_states) == 1
        assert adam_states[0].mu.layers[0].weight is None
        assert adam_states[0].nu.layers[0].bias is None
        assert adam_states[0].mu.layers[1].weight is not None


def test_freeze_gives_zero_updates_alone_and_in_a_chain():
    model = make_mlp(in_size=3)
    grads = _grads(model)
    frozen = _first_layer(model)
    for opt in [
        eqopt.freeze(frozen),
        eqopt.chain(eqopt.freeze(frozen), eqopt.add_decayed_weights(1.0)),
    ]:
        updates, _ = opt.update(grads, opt.init(model), model)
        np.testing.assert_array_equal(updates.layers[0].weight, 0.0)
        assert updates.layers[0].weight.dtype == grads.layers[0].weight.dtype
        assert not np.any(updates.layers[1].weight == 0.0)


def test_freeze_after_the_optimiser_still_freezes():
    # The parts before it see the leaf (Adam keeps its moments), the result is zero.
    model = make_mlp(in_size=3)
    opt = eqopt.chain(
        eqopt.adamw(0.1, weight_decay=0.5), eqopt.freeze(_first_layer(model))
    )
    trained, state = _train(opt, model)
    np.testing.assert_array_equal(trained.layers[0].weight, model.layers[0].weight)
    assert state[0].scale_by_adam.mu.layers[0].weight is not None


EMPTY_MASKS = {
    "selective_transform": (
        lambda model: eqopt.selective_transform(
            eqopt.adam(0.1), freeze_mask=_first_layer(model, False)
        ),
        r"freeze mask of selective_transform \(a prefix tree of bools and predicates "
        r"\(MLP\)\) selects no trainable leaf",
        lambda: eqopt.adam(0.1),
    ),
    "chain-freeze": (
        lambda model: eqopt.chain(
            eqopt.freeze(_first_layer(model, False)), eqopt.adam(0.1)
        ),
        r"mask of freeze \(a prefix tree of bools and predicates \(MLP\)\) selects no",
        lambda: eqopt.chain(eqopt.identity(), eqopt.adam(0.1)),
    ),
    "adamw-mask": (
        lambda model: eqopt.adamw(0.1, weight_decay=0.5, mask=lambda x: False),
        r"weight-decay mask \(a lambda\) selects no trainable leaf",
        lambda: eqopt.adam(0.1),
    ),
    "masked": (
        lambda model: eqopt.masked(eqopt.scale(2.0), lambda x: x.ndim > 3),
        r"mask of masked\(Scale\) \(a lambda\) selects no",
        lambda: eqopt.identity(),
    ),
    "partition-empty-group": (
        lambda model: eqopt.partition(
            {"all": eqopt.adam(0.1), "none": eqopt.sgd(1.0)},
            {"all": True, "none": False},
        ),
        r"group 'none' of partition \(False\) selects no trainable leaf",
        lambda: eqopt.adam(0.1),
    ),
}


@pytest.mark.parametrize("name", sorted(EMPTY_MASKS))
def test_a_mask_that_selects_nothing_works_with_one_warning(name):
    # "Freeze the first k layers" with k = 0: allowed, said once, same numbers as
    # the optimiser without the mask.
    make, message, reference = EMPTY_MASKS[name]
    model = make_mlp(in_size=3)
    opt = make(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = opt.init(model)
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert re.search(message, str(caught[0].message)), str(caught[0].message)
    assert caught[0].filename == __file__  # points at the user's line
    grads = _grads(model)
    updates, _ = opt.update(grads, state, model)
    expected, _ = reference().update(grads, reference().init(model), model)
    assert tree_allclose(updates, expected, rtol=0, atol=0)


def test_a_mask_of_the_wrong_structure_names_the_place():
    model = make_mlp(in_size=3)
    other = eqx.nn.MLP(3, 2, 4, depth=3, key=jax.random.key(0))
    mask = jax.tree.map(lambda x: eqx.is_array(x) and x.ndim > 1, other)
    with pytest.raises(ValueError) as info:
        eqopt.masked(eqopt.scale(2.0), mask).init(model)
    message = str(info.value)
    assert message.startswith(
        "The mask is not a prefix of the params' structure: at <root>, it has "
        "`depth=3` where the params have `depth="
    )
    assert "Mismatch custom node data" not in message
    assert len(message) < 300
    with pytest.raises(
        ValueError,
        match=r"\(Dict key mismatch\): at \['b'\], it has nothing where the params",
    ):
        eqopt.masked(eqopt.scale(2.0), {"a": True}).init({"b": jnp.ones(2)})


def test_a_mask_that_selects_nothing_passes_every_update_through():
    # Found by test_properties: on a one-leaf model a mask that selects nothing
    # left the inner transform without params (`adaptive_grad_clip needs params`).
    params = jnp.asarray(1.5)
    opt = eqopt.masked(eqopt.adaptive_grad_clip(0.3), lambda x: x.ndim > 0)
    with pytest.warns(UserWarning, match="selects no trainable leaf"):
        state = opt.init(params)
    updates, new_state = eqx.filter_jit(opt.update)(jnp.asarray(-0.25), state, params)
    np.testing.assert_allclose(updates, -0.25)


@pytest.mark.parametrize("mask", [np.array(True), jnp.array(True), np.bool_(True)])
def test_a_zero_d_boolean_array_is_a_bool_mask(mask):
    """`np.array(True)` and `jnp.array(True)` mean `True`, for `masked`, `freeze`
    and `selective_transform` (as in Optax); the mask is kept as a Python bool,
    so it is no leaf of the transform."""
    params = {"a": jnp.ones(3), "b": jnp.ones((2, 2))}
    grads = jax.tree.map(jnp.ones_like, params)
    for opt in (
        eqopt.freeze(mask),
        eqopt.selective_transform(eqopt.sgd(1.0), freeze_mask=mask),
    ):
        updates, _ = opt.update(grads, opt.init(params), params)
        assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree.leaves(updates))
    opt = eqopt.masked(eqopt.sgd(1.0), {"a": mask, "b": np.array(False)})
    assert opt.mask == {"a": True, "b": False}
    updates, _ = opt.update(grads, opt.init(params), params)
    assert float(updates["a"][0]) == -1.0 and float(updates["b"][0, 0]) == 1.0
    assert eqopt.freeze(mask).mask is True
