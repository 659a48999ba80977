"""Shampoo (`eqopt.contrib.shampoo`, `scale_by_shampoo`), checked against Google's
`precondition-opt` distributed Shampoo (Anil et al.)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _precond_oracles import (
    distributed_shampoo,
    draw,
    old_jax_tree_names,
    relative_difference,
)
from _training import train
from helpers import Case

import eqopt

_NO_OPTAX = "not in Optax: compared with precondition-opt in test_contrib_shampoo.py"

TRANSFORM_CASES = [
    # The registry's 4x3 leaf is kept a matrix (merging it gives a 12x12 factor,
    # which tests/test_sharding.py's shape rule takes for a state shaped like
    # the 12-element packed buffer); the default merging is tested below.
    Case(
        "contrib.shampoo",
        lambda: eqopt.contrib.shampoo(1e-2, merge_small_dims_block_size=8),
        no_parity_reason=_NO_OPTAX,
    ),
    Case(
        "contrib.shampoo-blocked-adam-newton",
        lambda: eqopt.contrib.shampoo(
            1e-2,
            block_size=2,
            grafting="adam",
            root_method="newton",
            start_preconditioning_step=1,
            weight_decay=1e-3,
            merge_small_dims_block_size=None,
        ),
        no_parity_reason=_NO_OPTAX,
    ),
    Case(
        "contrib.scale_by_shampoo-adagrad-every-2",
        lambda: eqopt.contrib.scale_by_shampoo(
            grafting="adagrad",
            merge_small_dims_block_size=None,
            start_preconditioning_step=0,
            preconditioning_compute_steps=2,
            nesterov=False,
        ),
        no_parity_reason=_NO_OPTAX,
        needs_params=False,
    ),
]

SHAPES = {"w": (6, 5), "b": (5,), "s": (), "k": (3, 4, 5)}


CONFIGS = {
    # The defaults: SGD grafting, 4x3 and 3x4x5 merged into vectors, eigh.
    "default": ({}, {}),
    "blocked-adam-newton-decay": (
        dict(
            block_size=4,
            grafting="adam",
            root_method="newton",
            start_preconditioning_step=2,
            weight_decay=0.01,
            merge_small_dims_block_size=None,
        ),
        dict(
            block_size=4,
            graft_type="RMSPROP",
            eigh=False,
            start_preconditioning_step=2,
            weight_decay=0.01,
            best_effort_shape_interpretation=False,
        ),
    ),
    "blocked-adagrad-every-2-momentum-average": (
        dict(
            block_size=4,
            grafting="adagrad",
            start_preconditioning_step=1,
            preconditioning_compute_steps=2,
            nesterov=False,
            moving_average_for_momentum=True,
            b2=1.0,
            exponent_override=2,
            matrix_epsilon=1e-3,
        ),
        # Summed statistics (b2 = 1) dwarf the initial 1e-6 I: the inverse root
        # of their (numerically) null space would then be float32 noise in both
        # implementations (2e-2 apart), so the damping is raised to 1e-3.
        dict(
            block_size=4,
            graft_type="ADAGRAD",
            start_preconditioning_step=1,
            preconditioning_compute_steps=2,
            nesterov=False,
            moving_average_for_momentum=True,
            beta2=1.0,
            exponent_override=2,
            matrix_epsilon=1e-3,
        ),
    ),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_precondition_opt(name):
    """Eight steps on matrix, vector, scalar and 3-D leaves, against distributed Shampoo."""
    module = distributed_shampoo()
    ours, theirs = CONFIGS[name]
    theirs = dict(theirs)
    theirs.setdefault("block_size", 128)
    theirs.setdefault("eigh", True)
    if "graft_type" in theirs:
        theirs["graft_type"] = getattr(module.GraftingType, theirs["graft_type"])
    tx = eqopt.contrib.scale_by_shampoo(**ours)
    params = draw(SHAPES, 0)
    # precondition-opt broadcasts ranks implicitly; the suite raises on that.
    with old_jax_tree_names(), jax.numpy_rank_promotion("allow"):
        reference = module.distributed_shampoo(
            1.0, generate_training_metrics=False, **theirs
        )
        state, reference_state = tx.init(params), reference.init(params)
        step, reference_step = jax.jit(tx.update), jax.jit(reference.update)
        worst = 0.0
        for t in range(8):
            grads = draw(SHAPES, 100 + t)
            updates, state = step(grads, state, params)
            reference_updates, reference_state = reference_step(
                grads, reference_state, params
            )
            # Theirs includes -learning_rate (here -1).
            negated = {k: -v for k, v in reference_updates.items()}
            worst = max(worst, relative_difference(updates, negated))
    print(
        f"Shampoo vs precondition-opt ({name}): largest relative difference {worst:.2e}"
    )
    # The damping's largest eigenvalue: exact here, by power iteration there.
    assert worst < 1e-3


def test_blocks_and_factor_shapes():
    """A 6x5 matrix in blocks of 4: a 2x2 grid, one (4, 4, 4) stack per axis."""
    tx = eqopt.contrib.scale_by_shampoo(block_size=4, merge_small_dims_block_size=None)
    state = tx.init(draw(SHAPES, 0))
    assert [s.shape for s in state.statistics["w"]] == [(4, 4, 4), (4, 4, 4)]
    assert [s.shape for s in state.statistics["k"]] == [(2, 3, 3), (2, 4, 4), (2, 4, 4)]
    assert state.statistics["s"] == () and state.graft_nu is None
    # Merged by default: 6x5 becomes a vector of 30, in one 30x30 factor.
    merged = eqopt.contrib.scale_by_shampoo(block_size=32).init(draw(SHAPES, 0))
    assert [s.shape for s in merged.statistics["w"]] == [(1, 30, 30)]


def test_padded_blocks_give_the_unpadded_roots():
    """An uneven last block is padded; its preconditioned part equals the block
    preconditioned on its own."""
    grads = {"w": jax.random.normal(jax.random.key(0), (6, 2))}
    blocked = eqopt.contrib.scale_by_shampoo(
        block_size=4,
        start_preconditioning_step=0,
        merge_small_dims_block_size=None,
        nesterov=False,
        b1=0.0,
    )
    whole = eqopt.contrib.scale_by_shampoo(
        block_size=8,
        start_preconditioning_step=0,
        merge_small_dims_block_size=None,
        nesterov=False,
        b1=0.0,
    )
    blocked_updates, blocked_state = blocked.update(grads, blocked.init(grads))
    tail = {"w": grads["w"][4:]}
    tail_updates, _ = whole.update(tail, whole.init(tail))
    # Equal up to the grafting norm, which is over the whole leaf.
    a, b = np.asarray(blocked_updates["w"][4:]), np.asarray(tail_updates["w"])
    np.testing.assert_allclose(
        a / np.linalg.norm(a), b / np.linalg.norm(b), rtol=1e-4, atol=1e-6
    )
    assert blocked_state.preconditioners["w"][0].shape == (2, 4, 4)


def test_eigh_and_newton_roots_agree():
    statistic = jax.random.normal(jax.random.key(1), (6, 10))
    statistic = statistic @ statistic.T
    roots = {}
    for method in ("eigh", "newton"):
        tx = eqopt.contrib.scale_by_shampoo(root_method=method)
        roots[method], _ = tx._root(statistic, 4)
    np.testing.assert_allclose(roots["eigh"], roots["newton"], rtol=2e-3, atol=1e-4)
    expected = np.linalg.matrix_power(np.asarray(roots["eigh"], np.float64), 4)
    damped = np.asarray(statistic) + 1e-6 * np.linalg.eigvalsh(statistic)[-1] * np.eye(
        6
    )
    np.testing.assert_allclose(expected @ damped, np.eye(6), atol=1e-3)


def test_preconditioners_recomputed_under_cond_and_grafting_before_start():
    tx = eqopt.contrib.scale_by_shampoo(
        preconditioning_compute_steps=3,
        start_preconditioning_step=2,
        nesterov=False,
        b1=0.0,
    )
    params = {"w": jnp.zeros((3, 2))}
    state = tx.init(params)
    traces = []

    @jax.jit
    def step(grads, state):
        traces.append(None)
        return tx.update(grads, state)

    for t in range(7):
        grads = {"w": jax.random.normal(jax.random.key(t), (3, 2))}
        before = state.preconditioners["w"][0]
        updates, state = step(grads, state)
        changed = not np.allclose(before, state.preconditioners["w"][0])
        assert changed == (t % 3 == 0), t
        if t < 2:  # SGD grafting only, before the start
            np.testing.assert_allclose(updates["w"], grads["w"], rtol=1e-6)
        else:  # Shampoo's direction with the gradient's norm
            np.testing.assert_allclose(
                jnp.linalg.norm(updates["w"]), jnp.linalg.norm(grads["w"]), rtol=1e-5
            )
    assert len(traces) == 1


def test_shampoo_trains_an_mlp():
    first, last, _, state = train(
        eqopt.contrib.shampoo(3e-3, block_size=8, grafting="adam"), steps=60
    )
    assert last < 0.5 * first
    # The 16x16 hidden weight is merged into a vector of 256 (as distributed
    # Shampoo does by default): 32 blocks of 8.
    assert state[0].statistics.layers[1].weight[0].shape == (32, 8, 8)


SHARDING_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import eqopt

    assert len(jax.devices()) == 8
    mesh = jax.make_mesh((8,), ("blocks",), axis_types=(jax.sharding.AxisType.Auto,))
    tx = eqopt.contrib.scale_by_shampoo(block_size=4, start_preconditioning_step=0,
                                        merge_small_dims_block_size=None)
    params = {"w": jax.random.normal(jax.random.key(0), (16, 8))}
    state = tx.init(params)
    assert state.statistics["w"][0].shape == (8, 4, 4)   # a 4x2 grid of blocks

    def shard_blocks(x):
        if x.ndim == 3:   # a stack of per-block factors: one block per device
            return jax.device_put(x, NamedSharding(mesh, P("blocks")))
        return jax.device_put(x, NamedSharding(mesh, P()))
    sharded = jax.tree.map(shard_blocks, state)
    shardings = jax.tree.map(lambda x: x.sharding, sharded)
    step = jax.jit(tx.update, out_shardings=(None, shardings))
    reference_state = state
    for t in range(3):
        grads = {"w": jax.random.normal(jax.random.key(t + 1), (16, 8))}
        updates, sharded = step(grads, sharded)
        expected, reference_state = tx.update(grads, reference_state)
        # jitted and eager steps round differently
        np.testing.assert_allclose(updates["w"], expected["w"], rtol=1e-4, atol=1e-5)
        for ours, theirs in zip(jax.tree.leaves(sharded), jax.tree.leaves(reference_state)):
            np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    for factor in sharded.statistics["w"] + sharded.preconditioners["w"]:
        assert factor.sharding.spec == P("blocks"), factor.sharding
        assert len(factor.addressable_shards) == 8
        assert factor.addressable_shards[0].data.shape == (1, 4, 4)
    print("ok")
    """
)


def test_block_factors_shard_over_their_block_axis():
    """In tests/test_sharding.py's way (8 simulated devices): the factors, one stack
    per axis with a leading block axis, are sharded one block per device, and a
    jitted step keeps that layout and the unsharded numbers."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        "--xla_force_host_platform_device_count=8 "
        "--xla_cpu_collective_call_terminate_timeout_seconds=600"
    )
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run(
        [sys.executable, "-c", SHARDING_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(Path(__file__).parent.parent),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "ok" in result.stdout
