"""Dion (`eqopt.contrib.dion`, `scale_by_dion`): low-rank orthonormal updates by one
power iteration with error feedback.

No package ships Dion, so the oracle is `_paper_dion` below: Algorithm 1 of Ahn et
al. (arXiv:2504.05295), centralised, written here in numpy float64 from the paper.
The reading was checked against the authors' code in GitHub microsoft/dion:
`dion/dion_simple.py` at commit 6e2c58d477722c47472fd9de54b9889d1d5ffb6d (the same
steps: B = M + G, P = QR(B Q), R = B^T P, M = B - (1 - mu) P R^T, Q = R / (column
norms + eps), X <- X (1 - lr wd) - lr sqrt(out / in) P Q^T, with Q_0 ~ N(0, 1) of
shape (in, r)) and `optimizers/experimental/dion_reference_optax.py` at commit
16001b7bb8efd08278089111e7552817be719a99, which puts Q on the shorter side of a
wide matrix (power iteration on B^T): a different, equally valid warm start; eqopt
follows the paper and `dion_simple.py` (Q on the input side). Both draw Q_0 from
their own random generators, so the reference here starts from eqopt's Q_0.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Case

import eqopt

ORACLE = "Algorithm 1 of the paper, written in numpy in this file (20 steps)"

TRANSFORM_CASES = [
    Case(
        "contrib.dion",
        lambda: eqopt.contrib.dion(1e-2, rank_fraction=0.5),
        None,
        no_parity_reason=ORACLE,
    ),
    Case(
        "contrib.dion-lion-rank1",
        lambda: eqopt.contrib.dion(
            1e-2, rank=1, mu=0.9, weight_decay=0.1, scalar_optimizer="lion"
        ),
        None,
        no_parity_reason=ORACLE,
    ),
]


def _paper_dion(weights, grads, q0, lr, mu, weight_decay, eps=1e-8):
    """Algorithm 1 (centralised Dion) in float64 on (out, in) matrices: the weights
    after each step."""
    x = [np.asarray(w, np.float64) for w in weights]
    m = [np.zeros_like(w) for w in x]
    q = [np.asarray(f, np.float64) for f in q0]
    out = []
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            b = m[i] + np.asarray(g, np.float64)
            p, _ = np.linalg.qr(b @ q[i])
            r = b.T @ p
            m[i] = b - (1 - mu) * p @ r.T
            q[i] = r / (np.linalg.norm(r, axis=0, keepdims=True) + eps)
            fan_out, fan_in = b.shape
            x[i] = x[i] * (1 - lr * weight_decay) - lr * np.sqrt(fan_out / fan_in) * (
                p @ q[i].T
            )
        out.append([w.copy() for w in x])
    return out


def _run(opt, params, grads):
    step = eqx.filter_jit(lambda p, g, s: opt.update(g, s, p))
    state = opt.init(params)
    q0 = state.inner_states["dion"][0].right_factor
    out = []
    for g in grads:
        updates, state = step(params, g, state)
        params = eqopt.apply_updates(params, updates)
        out.append(params)
    return out, q0


def _relative(ours, theirs, start):
    """The largest difference over steps and matrices, relative to the largest
    change of that matrix from the start."""
    worst = 0.0
    for our_step, their_step in zip(ours, theirs, strict=True):
        for our, their, first in zip(our_step, their_step, start, strict=True):
            moved = np.max(np.abs(their - np.asarray(first, np.float64)))
            worst = max(worst, np.max(np.abs(np.asarray(our) - their)) / moved)
    return worst


@pytest.mark.parametrize("layout", ["equinox", "bare"])
def test_matches_the_papers_algorithm(layout):
    """20 steps, wide and tall matrices, rank below full: relative difference
    < 1e-4 of the weights' change. An `eqx.nn.Linear` weight is (out, in) as the
    paper's; a bare matrix is Optax's (in, out), the paper's transposed."""
    rng = np.random.default_rng(0)
    hyper = dict(learning_rate=0.02, mu=0.9, weight_decay=0.1)
    opt = eqopt.contrib.dion(rank=3, **hyper)
    if layout == "equinox":
        params = eqx.nn.MLP(10, 6, width_size=12, depth=1, key=jax.random.key(0))

        def matrices(model):
            return [layer.weight for layer in model.layers]

        def to_paper(x):
            return np.asarray(x)

    else:
        params = {
            "wide": jnp.asarray(rng.normal(size=(6, 10)), jnp.float32),
            "tall": jnp.asarray(rng.normal(size=(12, 5)), jnp.float32),
        }

        def matrices(tree):
            return [tree["wide"], tree["tall"]]

        def to_paper(x):
            return np.asarray(x).T

    grads = []
    for _ in range(20):
        g = jax.tree.map(
            lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32),
            eqx.filter(params, eqx.is_inexact_array),
        )
        grads.append(g)
    ours, q0 = _run(opt, params, grads)
    theirs = _paper_dion(
        [to_paper(w) for w in matrices(params)],
        [[to_paper(w) for w in matrices(g)] for g in grads],
        [np.asarray(q) for q in matrices(q0)],
        lr=0.02,
        mu=0.9,
        weight_decay=0.1,
    )
    ours = [[to_paper(w) for w in matrices(p)] for p in ours]
    start = [to_paper(w) for w in matrices(params)]
    difference = _relative(ours, theirs, start)
    print(f"Dion ({layout}) vs the paper's algorithm: {difference:.2e}")
    assert difference < 1e-4


def test_full_rank_approaches_the_orthogonal_factor():
    """With r = min(m, n), a constant gradient with well-separated singular values:
    the update becomes sqrt(out / in) U V^T (Muon's direction), and the error
    feedback leaves mu B in the momentum."""
    rng = np.random.default_rng(1)
    u, _ = np.linalg.qr(rng.normal(size=(10, 6)))
    v, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    g = (u * 2.0 ** -np.arange(6)) @ v.T  # (out, in) = (10, 6)
    tx = eqopt.contrib.scale_by_dion(
        weight_dimension_numbers=eqopt.contrib.MuonDimensionNumbers(1, 0)
    )
    params = {"w": jnp.zeros((10, 6))}
    grads = {"w": jnp.asarray(g, jnp.float32)}
    state = tx.init(params)
    assert state.right_factor["w"].shape == (6, 6)
    step = jax.jit(tx.update)
    for _ in range(40):
        updates, state = step(grads, state)
    polar = np.sqrt(10 / 6) * u @ v.T
    np.testing.assert_allclose(updates["w"], polar, atol=1e-4)


def test_a_zero_gradient_keeps_the_factor():
    tx = eqopt.contrib.scale_by_dion(rank=2)
    params = {"w": jnp.ones((5, 4))}
    state = tx.init(params)
    updates, after = tx.update({"w": jnp.zeros((5, 4))}, state)
    assert np.array_equal(after.right_factor["w"], state.right_factor["w"])
    assert not np.any(updates["w"])
    updates, _ = tx.update({"w": jnp.arange(20.0).reshape(5, 4)}, after)
    assert np.all(np.isfinite(updates["w"])) and np.any(updates["w"])


class _Stacked(eqx.Module):
    blocks: eqx.nn.Linear  # three Linear(8, 12) stacked by `eqx.filter_vmap`
    head: eqx.nn.Linear


def test_stacked_layers_have_their_own_factors_and_are_their_layers():
    """Each slice of a stack gets its own Q_0 (shape (L, in, r)); given the same
    Q_0 slice by slice, the list of the layers gets the stacked updates."""
    keys = jax.random.split(jax.random.key(0), 4)
    stacked = _Stacked(
        eqx.filter_vmap(lambda k: eqx.nn.Linear(8, 12, key=k))(keys[:3]),
        eqx.nn.Linear(12, 2, key=keys[3]),
    )

    def layer(tree, i):
        return jax.tree.map(lambda x: x[i] if eqx.is_array(x) else x, tree)

    listed = [layer(stacked.blocks, i) for i in range(3)] + [stacked.head]
    opt = eqopt.contrib.dion(0.05, rank_fraction=0.5)
    state = opt.init(stacked)
    q = state.inner_states["dion"][0].right_factor.blocks.weight
    assert q.shape == (3, 8, 4)
    assert not np.allclose(q[0], q[1])
    list_state = opt.init(listed)
    inner = list_state.inner_states["dion"][0]
    given = [layer(q, i) for i in range(3)] + [
        state.inner_states["dion"][0].right_factor.head.weight
    ]
    list_state = eqx.tree_at(
        lambda s: [f.weight for f in s.inner_states["dion"][0].right_factor],
        list_state,
        given,
    )
    assert inner.right_factor[0].weight.shape == (8, 4)
    step = eqx.filter_jit(lambda o, g, s, p: o.update(g, s, p))
    for k in range(3):
        grads = jax.tree.map(
            lambda x, k=k: jax.random.normal(jax.random.key(k), x.shape),
            eqx.filter(stacked, eqx.is_inexact_array),
        )
        ours, state = step(opt, grads, state, stacked)
        list_grads = [layer(grads.blocks, i) for i in range(3)] + [grads.head]
        theirs, list_state = step(opt, list_grads, list_state, listed)
        stacked = eqopt.apply_updates(stacked, ours)
        listed = eqopt.apply_updates(listed, theirs)
    for i in range(3):
        for a, b in zip(
            jax.tree.leaves(layer(ours.blocks, i)),
            jax.tree.leaves(theirs[i]),
            strict=True,
        ):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_inside_param_groups():
    """A group's learning-rate multiplier scales its Dion update."""
    model = eqx.nn.MLP(8, 4, width_size=16, depth=1, key=jax.random.key(2))
    params = eqx.filter(model, eqx.is_inexact_array)
    grads = jax.tree.map(lambda x: jnp.cos(jnp.arange(x.size)).reshape(x.shape), params)
    plain = eqopt.contrib.dion(1e-2, rank_fraction=0.5, weight_decay=0.0)
    grouped = eqopt.param_groups(
        plain, [eqopt.Group(r"^layers\[1\]\.", name="last", lr_mult=0.25)]
    )
    u_plain, _ = plain.update(grads, plain.init(params), params)
    u_grouped, _ = grouped.update(grads, grouped.init(params), params)
    np.testing.assert_allclose(
        u_grouped.layers[1].weight, 0.25 * u_plain.layers[1].weight, rtol=1e-6
    )
    np.testing.assert_allclose(u_grouped.layers[0].weight, u_plain.layers[0].weight)


def test_state_and_bad_arguments():
    model = eqx.nn.MLP(8, 4, width_size=16, depth=1, key=jax.random.key(0))
    state = eqopt.contrib.dion(1e-2, rank=100).init(model)
    inner = state.inner_states["dion"][0]
    assert inner.right_factor.layers[0].weight.shape == (8, 8)  # capped at min
    assert inner.right_factor.layers[1].weight.shape == (16, 4)
    assert inner.mu.layers[0].bias is None and inner.right_factor.layers[0].bias is None
    # The draw is keyed: the same seed gives the same Q_0.
    again = eqopt.contrib.dion(1e-2, rank=100).init(model)
    assert np.array_equal(
        again.inner_states["dion"][0].right_factor.layers[0].weight,
        inner.right_factor.layers[0].weight,
    )
    with pytest.raises(ValueError, match="rank_fraction"):
        eqopt.contrib.scale_by_dion(rank_fraction=0.0)
    with pytest.raises(ValueError, match="rank"):
        eqopt.contrib.scale_by_dion(rank=0)
    with pytest.raises(ValueError, match="scalar_optimizer"):
        eqopt.contrib.dion(1e-2, scalar_optimizer="sgd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Dion.*\['b'\]"):
        eqopt.contrib.scale_by_dion().init({"b": jnp.ones(3)})


ZERO = """
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import eqopt

assert len(jax.devices()) == 4
model = eqx.nn.MLP(8, 4, width_size=16, depth=1, key=jax.random.key(0))
opt = eqopt.contrib.dion(0.02, rank_fraction=0.5)
grads = [
    jax.tree.map(
        lambda x, k=k: jax.random.normal(jax.random.key(k), x.shape),
        eqx.filter(model, eqx.is_inexact_array),
    )
    for k in range(3)
]
reference, state = model, opt.init(model)
for g in grads:
    u, state = opt.update(g, state, reference)
    reference = eqopt.apply_updates(reference, u)
for kind in (AxisType.Auto, AxisType.Explicit):
    mesh = jax.make_mesh((4,), ("data",), axis_types=(kind,))
    with jax.set_mesh(mesh):
        params = eqx.filter_shard(model, NamedSharding(mesh, P()))
        plan = eqopt.zero_plan(opt, params, mesh, "data", min_size=0)
        state = plan.init(opt, params)
        factor = state.inner_states["dion"][0].right_factor.layers[0].weight
        assert "data" in str(factor.sharding.spec), factor.sharding
        step = eqx.filter_jit(plan.update)
        for g in grads:
            g = eqx.filter_shard(g, NamedSharding(mesh, P()))
            u, state = step(opt, g, state, params)
            params = eqopt.apply_updates(params, u)
        factor = state.inner_states["dion"][0].right_factor.layers[0].weight
        assert "data" in str(factor.sharding.spec), factor.sharding
    for a, b in zip(jax.tree.leaves(eqx.filter(params, eqx.is_array)),
                    jax.tree.leaves(eqx.filter(reference, eqx.is_array))):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)), (kind, np.max(np.abs(a - b)))
print("ok")
"""


def test_under_zero_one_sharding():
    """ZeRO-1 on 4 simulated CPU devices (a subprocess, as `tests/test_zero.py`
    does: the device count is fixed when JAX starts), automatic and explicit
    axes: the right factors are split over the data axis, and three jitted steps
    give the unsharded numbers."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        "--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0"
    )
    env["JAX_PLATFORMS"] = "cpu"
    root = Path(__file__).parent.parent
    env["PYTHONPATH"] = os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(ZERO)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(root),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "ok" in result.stdout.split(), result.stdout
