"""Cautious updates (`eqopt.cautious`) against pytorch-optimizer's cautious Lion and
MARS, and heavyball's rescaling."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _oracles import import_oracle
from _torch_oracle import eqopt_steps, max_difference, random_problem, torch_steps
from helpers import Case, as_dict, make_model, random_grads

import eqopt

ORACLE = "pytorch-optimizer's cautious Lion and MARS, compared in this file"


def _c_adamw(learning_rate=1e-2, weight_decay=0.1, rescale="leaf"):
    return eqopt.chain(
        eqopt.cautious(eqopt.scale_by_adam(), rescale, descent=False),
        eqopt.add_decayed_weights(weight_decay),
        eqopt.scale_by_learning_rate(learning_rate),
    )


TRANSFORM_CASES = [
    Case(
        "cautious-adamw",
        lambda: eqopt.cautious(eqopt.adamw(1e-2, weight_decay=0.1)),
        None,
        no_parity_reason=ORACLE,
    ),
    Case(
        "cautious-c_adamw-global",
        lambda: _c_adamw(rescale="global"),
        None,
        no_parity_reason=ORACLE,
    ),
    Case(
        "contrib.cautious-lion-none",
        lambda: eqopt.contrib.cautious(eqopt.lion(1e-3), rescale="none"),
        None,
        no_parity_reason=ORACLE,
    ),
]

SHAPES = {"w": (6, 4), "b": (4,), "s": ()}


def _pytorch_optimizer():
    return import_oracle("pytorch_optimizer", "pytorch-optimizer")


def test_cautious_lion_matches_pytorch_optimizer():
    po = _pytorch_optimizer()
    params, grads = random_problem(SHAPES, 8)
    ours = eqopt_steps(
        eqopt.chain(
            eqopt.cautious(eqopt.scale_by_lion(b1=0.9, b2=0.99), descent=False),
            eqopt.add_decayed_weights(0.1),
            eqopt.scale_by_learning_rate(1e-2),
        ),
        params,
        grads,
    )
    theirs = torch_steps(
        lambda t: po.Lion(
            list(t.values()),
            lr=1e-2,
            betas=(0.9, 0.99),
            weight_decay=0.1,
            cautious=True,
        ),
        params,
        grads,
    )
    assert max_difference(ours, theirs) < 1e-5


def _paper_first_step(optimizer, tensors):
    for group in optimizer.param_groups:
        optimizer.init_group(group)
    for t in tensors.values():
        optimizer.state[t]["last_grad"].copy_(t.grad)


def test_cautious_mars_matches_pytorch_optimizer():
    """The wrapper around another optimiser's direction: MARS-AdamW (eps = 0, and
    the paper's first step: see test_contrib_mars.py)."""
    po = _pytorch_optimizer()
    params, grads = random_problem(SHAPES, 8, seed=1)
    grads = [{k: 0.01 * v for k, v in g.items()} for g in grads]
    ours = eqopt_steps(
        eqopt.chain(
            eqopt.cautious(eqopt.contrib.scale_by_mars(eps=0.0), descent=False),
            eqopt.add_decayed_weights(0.1),
            eqopt.scale_by_learning_rate(1e-2),
        ),
        params,
        grads,
    )
    theirs = torch_steps(
        lambda t: po.MARS(
            list(t.values()),
            lr=1e-2,
            optimize_1d=True,
            weight_decay=0.1,
            eps=0.0,
            cautious=True,
        ),
        params,
        grads,
        before_first_step=_paper_first_step,
    )
    assert max_difference(ours, theirs) < 2e-5


def test_rescaling_follows_the_paper_not_heavyball():
    """Paper (Algorithm 2) and pytorch-optimizer: d / (nnz + 1); heavyball: d / nnz."""
    torch = import_oracle("torch")
    utils = import_oracle("heavyball.utils", "heavyball")
    g = np.array([1.0, -1.0, 2.0, 0.5, -3.0, 1.0], np.float32)
    direction = np.array([1.0, 1.0, 1.0, -1.0, -2.0, 4.0], np.float32)
    tx = eqopt.cautious(
        eqopt.stateless(lambda u, p: {"x": jnp.asarray(direction)}), descent=False
    )
    ours = np.asarray(tx.update({"x": jnp.asarray(g)}, tx.init({"x": g}))[0]["x"])
    kept = direction * g > 0  # 4 of 6 agree
    np.testing.assert_allclose(ours, direction * kept * 6 / (4 + 1), rtol=1e-6)
    theirs = utils.caution(torch.tensor(g), torch.tensor(direction)).numpy()
    np.testing.assert_allclose(theirs, direction * kept * 6 / 4, rtol=1e-6)
    np.testing.assert_allclose(ours, theirs * 4 / 5, rtol=1e-6)


def test_every_kept_coordinate_descends():
    """For a whole optimiser (descent=True), every nonzero coordinate opposes the gradient."""
    model = make_model()
    tx = eqopt.cautious(eqopt.sgd(0.1, momentum=0.9))
    state = tx.init(model)
    for step in range(4):
        grads = random_grads(model, step)
        updates, state = tx.update(grads, state, model)
        for u, g in zip(
            jax.tree.leaves(as_dict(updates)),
            jax.tree.leaves(as_dict(grads)),
            strict=True,
        ):
            assert np.all(np.asarray(u) * np.asarray(g) <= 0)
        model = eqopt.apply_updates(model, updates)


def test_rescale_modes():
    grads = {"a": jnp.array([1.0, 1.0, -1.0, 1.0]), "b": jnp.array([1.0, -1.0])}
    direction = {"a": jnp.ones(4), "b": jnp.ones(2)}
    fixed = eqopt.stateless(lambda u, p: direction)
    out = {
        mode: eqopt.cautious(fixed, mode, descent=False).update(
            grads, eqopt.cautious(fixed, mode).init(grads)
        )[0]
        for mode in ("leaf", "global", "none")
    }
    np.testing.assert_allclose(out["leaf"]["a"], [1, 1, 0, 1], rtol=1e-6)  # 4 / (3 + 1)
    np.testing.assert_allclose(out["leaf"]["b"], [1, 0], rtol=1e-6)  # 2 / (1 + 1)
    np.testing.assert_allclose(out["global"]["a"], [1.2, 1.2, 0, 1.2], rtol=1e-6)
    np.testing.assert_allclose(out["global"]["b"], [1.2, 0], rtol=1e-6)
    np.testing.assert_allclose(out["none"]["a"], [1, 1, 0, 1])


def test_elementwise_follows_the_inner_and_the_rescaling():
    assert not eqopt.cautious(eqopt.adam(1e-3)).elementwise
    assert eqopt.cautious(eqopt.adam(1e-3), "global").elementwise
    assert eqopt.cautious(eqopt.adam(1e-3), "none").elementwise
    assert not eqopt.cautious(eqopt.contrib.muon(1e-3), "global").elementwise


def test_state_holds_the_inner_state_and_none_grads_pass():
    model = make_model()
    tx = eqopt.cautious(eqopt.adam(1e-2))
    state = tx.init(model)
    assert isinstance(state.inner_state, type(eqopt.adam(1e-2).init(model)))
    grads = eqx.tree_at(
        lambda m: m.b, random_grads(model, 0), None, is_leaf=lambda x: x is None
    )
    updates, _ = tx.update(grads, state, model)
    assert updates.b is None and updates.w.shape == (4, 3)


def test_bad_rescale():
    with pytest.raises((ValueError, TypeError), match="rescale"):
        eqopt.cautious(eqopt.adam(1e-3), "tensor")  # pyright: ignore
