"""A stack of layers is its layers: a model whose blocks are stacked by `eqx.filter_vmap`
(run with `lax.scan`) gets, slice by slice, the updates of the same blocks as a list.

The model is in `tests/_stacked_model.py`. Both models get the same gradients (the
list's are the slices of the stacked ones) for three steps; the stacked updates of
the last step are compared with the list's, slice by slice.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _stacked_model import (
    DEPTH,
    Listed,
    Stacked,
    make_models,
    random_grads,
    relative_difference,
    run_steps,
    unstack,
)
from registry import ALL_CASES, build

import eqopt
import eqopt.contrib._kron as kron_module
from eqopt._layer_axes import describe, given_stack_axes, layer_leaves

#: Every registry case that is not elementwise is compared with the list model
#: in float32 by `tests/test_stacked_registry.py`; this file checks the other
#: paths (bfloat16, eager, packed, bucketed) on a few, and the descriptions.
_CASES = {case.name: case for case in ALL_CASES}

_RTOL = {"float32": 1e-5, "bfloat16": 2e-2}


def _compare(case, dtype="float32", jit=True, pack=False, wrap=None):
    stacked, listed = make_models(jnp.dtype(dtype))

    def grads(k):
        return random_grads(stacked, k)

    def make(params):
        tx = build(case.make, params)
        return tx if wrap is None else wrap(tx)

    ours, _ = run_steps(make(stacked), stacked, grads, jit=jit, pack=pack)
    theirs, _ = run_steps(
        make(listed), listed, lambda k: unstack(grads(k)), jit=jit, pack=pack
    )
    return relative_difference(ours, theirs)


@pytest.mark.parametrize("name", ["lamb", "adafactor", "contrib.muon"])
def test_stacked_bfloat16(name):
    assert _compare(_CASES[name], "bfloat16") < _RTOL["bfloat16"]


@pytest.mark.parametrize("name", ["lamb", "sm3"])
def test_stacked_eager(name):
    assert _compare(_CASES[name], jit=False) < _RTOL["float32"]


@pytest.mark.parametrize("name", ["lamb", "contrib.muon"])
def test_stacked_packed_and_bucketed(name):
    case = _CASES[name]
    assert _compare(case, pack=True) < _RTOL["float32"]
    assert _compare(case, wrap=eqopt.bucketed) < _RTOL["float32"]


def test_a_model_without_stacks_is_unchanged():
    """The list model's leaves have no stack axes: `leafwise` runs as before."""
    _, listed = make_models()
    assert all(d is None or d.stack_axes == 0 for d in describe(listed))


def test_the_layers_say_their_stack_axes():
    stacked, _ = make_models()
    found = {
        jax.tree_util.keystr(path): d.stack_axes
        for path, d in layer_leaves(stacked).items()
    }
    assert found[".blocks.up.weight"] == 1
    assert found[".blocks.up.bias"] == 1
    assert found[".blocks.norm.weight"] == 1
    assert found[".head.weight"] == 0
    # A stack of stacks: two stack axes.
    keys = jax.random.split(jax.random.key(0), 6).reshape(2, 3)
    nested = eqx.filter_vmap(eqx.filter_vmap(lambda k: eqx.nn.Linear(4, 5, key=k)))(
        keys
    )
    assert {d.stack_axes for d in layer_leaves(nested).values()} == {2}


def test_the_users_stack_axes_win():
    """Bare arrays: the user says it once, with `eqopt.with_stack_axes`."""
    stacked, _ = make_models()
    bare = {"w": stacked.blocks.up.weight, "b": stacked.blocks.up.bias}
    grads = jax.tree.map(lambda x: jnp.cos(x) + 1.0, bare)
    opt = eqopt.with_stack_axes(eqopt.lamb(1e-2), lambda path: 1)
    updates, _ = opt.update(grads, opt.init(bare), bare)
    for k in range(DEPTH):
        one = jax.tree.map(lambda x, k=k: x[k], (grads, bare))
        plain = eqopt.lamb(1e-2)
        alone, _ = plain.update(one[0], plain.init(one[1]), one[1])
        np.testing.assert_allclose(updates["w"][k], alone["w"], rtol=1e-5)
        np.testing.assert_allclose(updates["b"][k], alone["b"], rtol=1e-5)
    # Without it, the bare array is one tensor (Optax's reading).
    plain = eqopt.lamb(1e-2)
    whole, _ = plain.update(grads, plain.init(bare), bare)
    assert not np.allclose(whole["w"], updates["w"], rtol=1e-3)
    with given_stack_axes({"w": 0, "b": None}):
        assert [d.stack_axes for d in describe(bare) if d] == [0]


def test_the_users_stack_axes_are_checked():
    bare = {"w": jnp.ones((3, 4))}
    opt = eqopt.with_stack_axes(eqopt.lamb(1e-2), 3)
    with pytest.raises(ValueError, match=r"\['w'\].*3 stack axes"):
        opt.update(bare, opt.init(bare), bare)


def test_a_stacked_bias_is_a_vector_per_layer_for_muon():
    """Muon's default selection (`x.ndim == 2`) sees one layer: the stacked
    weights get Muon, the stacked biases and norm scales AdamW."""
    stacked, _ = make_models()
    opt = eqopt.contrib.muon(1e-2)
    state = opt.init(stacked)
    muon_state = state.inner_states["muon"][0]
    assert muon_state.mu.blocks.up.weight is not None
    assert muon_state.mu.blocks.up.bias is None
    assert muon_state.mu.blocks.norm.weight is None


def test_per_layer_state_is_stacked():
    """A per-layer state holds one value per slice, on the leaf's stack axes."""
    stacked, _ = make_models()
    novograd = eqopt.scale_by_novograd().init(stacked)
    assert novograd.nu.blocks.up.weight.shape == (DEPTH,)
    assert novograd.nu.head.weight.shape == ()
    kron = eqopt.contrib.scale_by_kron().init(stacked)
    factors = kron.preconditioner.blocks.up.weight
    assert [q.shape for q in factors] == [(DEPTH, 48, 48), (DEPTH, 24, 24)]


def _restack(listed: Listed):
    blocks = jax.tree.map(lambda *xs: jnp.stack(xs), *listed.blocks)
    return blocks, listed.head


def test_kron_same_probes(monkeypatch):
    """PSGD Kron draws random probes: the list model is given the stacked model's
    probes, slice by slice, and then gets the stacked model's updates."""
    drawn = kron_module.kron_probes

    def probes(key, updates):
        if isinstance(updates, Listed):
            key, found, balance = drawn(key, Stacked(*_restack(updates)))
            return key, unstack(found), balance
        return drawn(key, updates)

    monkeypatch.setattr(kron_module, "kron_probes", probes)
    assert _compare(_CASES["contrib.kron"]) < _RTOL["float32"]
