"""MARS (`eqopt.contrib.mars_adamw`, `mars_lion`, `scale_by_mars`) against
pytorch-optimizer's MARS, and the paper's first step."""

import jax.numpy as jnp
import numpy as np
import pytest
from _oracles import import_oracle
from _torch_oracle import eqopt_steps, max_difference, random_problem, torch_steps
from helpers import Case

import eqopt

ORACLE = "pytorch-optimizer's MARS, compared over several steps in this file"

TRANSFORM_CASES = [
    Case(
        "contrib.mars_adamw",
        lambda: eqopt.contrib.mars_adamw(1e-2, weight_decay=0.1),
        None,
        no_parity_reason=ORACLE,
    ),
    Case(
        "contrib.mars_lion",
        lambda: eqopt.contrib.mars_lion(1e-3, weight_decay=0.1),
        None,
        no_parity_reason=ORACLE,
    ),
    Case(
        "contrib.scale_by_mars-no-clipping",
        lambda: eqopt.contrib.scale_by_mars(max_norm=None, gamma=0.1),
        None,
        needs_params=False,
        no_parity_reason=ORACLE,
    ),
]

SHAPES = {"w": (6, 4), "b": (4,), "s": ()}


def _torch_mars(mars_type, lr, weight_decay, betas=(0.95, 0.99), gamma=0.025, eps=1e-8):
    pytorch_optimizer = import_oracle("pytorch_optimizer", "pytorch-optimizer")

    def make(tensors):
        return pytorch_optimizer.MARS(
            list(tensors.values()),
            lr=lr,
            betas=betas,
            gamma=gamma,
            mars_type=mars_type,
            optimize_1d=True,  # MARS on every leaf, as eqopt's mars_adamw
            weight_decay=weight_decay,
            eps=eps,
        )

    return make


def _paper_first_step(optimizer, tensors):
    """Sets the oracle's g_0 to g_1, so that its first correction vanishes (x_1 = x_0)."""
    for group in optimizer.param_groups:
        optimizer.init_group(group)
    for t in tensors.values():
        optimizer.state[t]["last_grad"].copy_(t.grad)


@pytest.mark.parametrize("scale", [0.01, 1.0])
def test_mars_adamw_matches_pytorch_optimizer(scale):
    """Over 8 steps, with small gradients (no clipping) and large ones (clipped).

    With eps = 0: the oracle adds eps before the bias correction of v, the paper
    (and eqopt) after it, which moves elements whose gradient is near eps."""
    params, grads = random_problem(SHAPES, 8)
    grads = [{k: scale * v for k, v in g.items()} for g in grads]
    ours = eqopt_steps(
        eqopt.contrib.mars_adamw(1e-2, weight_decay=0.1, gamma=0.05, eps=0.0),
        params,
        grads,
    )
    theirs = torch_steps(
        _torch_mars("adamw", 1e-2, 0.1, gamma=0.05, eps=0.0),
        params,
        grads,
        before_first_step=_paper_first_step,
    )
    assert max_difference(ours, theirs) < 2e-5


def test_mars_lion_matches_pytorch_optimizer():
    params, grads = random_problem(SHAPES, 8, seed=1)
    grads = [{k: 0.01 * v for k, v in g.items()} for g in grads]
    ours = eqopt_steps(
        eqopt.contrib.mars_lion(1e-3, b1=0.9, weight_decay=0.1), params, grads
    )
    theirs = torch_steps(
        _torch_mars("lion", 1e-3, 0.1, betas=(0.9, 0.99)),
        params,
        grads,
        before_first_step=_paper_first_step,
    )
    assert max_difference(ours, theirs) < 1e-6


def test_first_step_follows_the_paper():
    """The paper's x_1 = x_0 gives c_1 = g_1. The authors' code and pytorch-optimizer
    start from g_0 = 0, i.e. c_1 = (1 + gamma b1 / (1 - b1)) g_1, which changes the
    momentum and so every later step."""
    b1, gamma = 0.5, 1.0
    tx = eqopt.contrib.scale_by_mars(b1=b1, gamma=gamma)
    g = {"w": jnp.full((3,), 0.01)}
    _, state = tx.update(g, tx.init(g))
    np.testing.assert_allclose(state.mu["w"], (1 - b1) * 0.01, rtol=1e-6)
    params, grads = random_problem(SHAPES, 3, seed=2)
    grads = [{k: 0.01 * v for k, v in g.items()} for g in grads]
    ours = eqopt_steps(
        eqopt.contrib.mars_adamw(1e-2, b1=b1, gamma=gamma, eps=0.0), params, grads
    )
    oracle = _torch_mars("adamw", 1e-2, 0.0, betas=(b1, 0.99), gamma=gamma, eps=0.0)
    as_published = torch_steps(oracle, params, grads)
    as_in_the_paper = torch_steps(
        oracle, params, grads, before_first_step=_paper_first_step
    )
    assert max_difference(ours, as_published) > 1e-3
    assert max_difference(ours, as_in_the_paper) < 2e-5


def test_clipping_per_leaf():
    """A corrected gradient of norm above max_norm is rescaled to that norm, leaf by leaf."""
    tx = eqopt.contrib.scale_by_mars(b1=0.5, max_norm=2.0, preconditioner="lion")
    g = {"big": jnp.full((4,), 3.0), "small": jnp.full((4,), 0.1)}
    _, state = tx.update(g, tx.init(g))
    np.testing.assert_allclose(np.linalg.norm(state.mu["big"]), 0.5 * 2.0, rtol=1e-6)
    np.testing.assert_allclose(state.mu["small"], 0.5 * 0.1, rtol=1e-6)
    assert not tx.elementwise
    assert eqopt.contrib.scale_by_mars(max_norm=None).elementwise


def test_state_keeps_the_last_gradient():
    tx = eqopt.contrib.scale_by_mars()
    g = {"w": jnp.arange(3.0)}
    _, state = tx.update(g, tx.init(g))
    np.testing.assert_array_equal(state.previous_grad["w"], g["w"])
    assert eqopt.contrib.scale_by_mars(preconditioner="lion").init(g).nu is None


def test_bad_preconditioner():
    with pytest.raises((ValueError, TypeError), match="preconditioner"):
        eqopt.contrib.ScaleByMars(preconditioner="shampoo")  # pyright: ignore
