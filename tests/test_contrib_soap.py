"""SOAP (`eqopt.contrib.soap`, `scale_by_soap`), checked against pytorch-optimizer's SOAP."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _precond_oracles import draw, relative_difference, torch_and_pytorch_optimizer
from _training import train
from helpers import Case

import eqopt
from eqopt.contrib._kronecker import merge_small_dims

_NO_OPTAX = "not in Optax: compared with pytorch-optimizer in test_contrib_soap.py"

TRANSFORM_CASES = [
    Case("contrib.soap", lambda: eqopt.contrib.soap(1e-2), no_parity_reason=_NO_OPTAX),
    Case(
        "contrib.soap-frequency-1-merge-1d",
        lambda: eqopt.contrib.soap(
            1e-2,
            precondition_frequency=1,
            merge_dims=True,
            precondition_1d=True,
            # Keeps 4x3 a matrix (see the note in test_contrib_shampoo.py).
            max_precondition_dim=8,
        ),
        no_parity_reason=_NO_OPTAX,
    ),
    Case(
        "contrib.scale_by_soap-one-sided",
        lambda: eqopt.contrib.scale_by_soap(
            b1=0.9, b2=0.99, precondition_frequency=2, one_sided=True
        ),
        no_parity_reason=_NO_OPTAX,
        needs_params=False,
    ),
]

SHAPES = {"w": (6, 5), "b": (5,), "s": (), "k": (2, 3, 4)}


def _compare_with_pytorch_optimizer(tx, options, shapes=SHAPES, steps=10):
    """The largest relative difference of the updates over `steps` steps."""
    torch, pytorch_optimizer = torch_and_pytorch_optimizer()
    params = draw(shapes, 0)
    state = tx.init(params)
    step = jax.jit(tx.update)
    weights = {
        k: torch.nn.Parameter(torch.tensor(np.asarray(v))) for k, v in params.items()
    }
    reference = pytorch_optimizer.SOAP(
        list(weights.values()), lr=1.0, weight_decay=0.0, **options
    )
    worst = 0.0
    for t in range(steps):
        grads = draw(shapes, 100 + t)
        updates, state = step(grads, state)
        before = {k: v.detach().clone() for k, v in weights.items()}
        for k, w in weights.items():
            w.grad = torch.tensor(np.asarray(grads[k]))
        reference.step()
        if t == 0:
            # A vector's first statistic is a rank-one outer product: its
            # eigenbasis is not unique (LAPACK's choice differs between torch
            # and JAX), so the oracle is given ours; later refreshes are compared.
            for k, w in weights.items():
                if len(shapes[k]) == 1 and state.eigenbases[k][0] is not None:
                    reference.state[w]["Q"] = [
                        torch.tensor(np.asarray(state.eigenbases[k][0]))
                    ]
        theirs = {k: (weights[k].detach() - before[k]).numpy() for k in weights}
        ours = {k: -np.asarray(v) for k, v in updates.items()}
        if t == 0:  # the first step only measures, in both
            assert all(np.all(v == 0) for v in ours.values())
        worst = max(worst, relative_difference(ours, theirs))
    return worst


@pytest.mark.parametrize(
    "ours,theirs,shapes",
    [
        ({"precondition_frequency": 2}, {"precondition_frequency": 2}, SHAPES),
        (
            {
                "b1": 0.9,
                "b2": 0.99,
                "shampoo_beta": 0.9,
                "eps": 1e-6,
                "precondition_frequency": 3,
                "precondition_1d": True,
                "max_precondition_dim": 5,
            },
            {
                "betas": (0.9, 0.99),
                "shampoo_beta": 0.9,
                "eps": 1e-6,
                "precondition_frequency": 3,
                "precondition_1d": True,
                "max_precondition_dim": 5,
            },
            SHAPES,
        ),
        (
            {
                "precondition_frequency": 1,
                "merge_dims": True,
                "max_precondition_dim": 8,
            },
            {
                "precondition_frequency": 1,
                "merge_dims": True,
                "max_precondition_dim": 8,
            },
            # pytorch-optimizer cannot merge a vector (see the test below); the
            # merged (6, 5) keeps its first statistics' eigenbases unique (a
            # Gram matrix short of full rank by two has no unique basis).
            {"w": (6, 5), "s": (), "k": (2, 3, 5)},
        ),
    ],
    ids=["default", "decays-1d-max-dim", "merge-dims"],
)
def test_matches_pytorch_optimizer(ours, theirs, shapes):
    """Ten steps on matrix, vector, scalar and 3-D leaves, refreshes included."""
    tx = eqopt.contrib.scale_by_soap(**ours)
    worst = _compare_with_pytorch_optimizer(tx, theirs, shapes)
    print(f"SOAP vs pytorch-optimizer: largest relative difference {worst:.2e}")
    assert worst < 1e-4


def test_one_sided_rotates_the_shorter_side_only():
    """One-sided SOAP on a 6x5 matrix is pytorch-optimizer's with the 6-side left alone."""
    shapes = {"w": (6, 5), "b": (5,), "s": ()}
    tx = eqopt.contrib.scale_by_soap(precondition_frequency=2, one_sided=True)
    state = tx.init(draw(shapes, 0))
    assert state.statistics["w"][0] is None and state.statistics["w"][1].shape == (5, 5)
    worst = _compare_with_pytorch_optimizer(
        tx, {"precondition_frequency": 2, "max_precondition_dim": 5}, shapes
    )
    assert worst < 1e-4


def test_merging_that_ends_in_one_axis_keeps_it():
    """pytorch-optimizer's `merge_small_dims` returns [1] when all axes merge into one
    (a 4x3 matrix cannot then be reshaped); eqopt keeps the merged axis, as
    precondition-opt's Shampoo does."""
    _, pytorch_optimizer = torch_and_pytorch_optimizer()
    from pytorch_optimizer.optimizer.utils.shape import merge_small_dims as theirs

    assert theirs([4, 3], 16) == [1]
    assert merge_small_dims((4, 3), 16) == (12,)
    assert theirs([2, 3, 8], 8) == [6, 8] == list(merge_small_dims((2, 3, 8), 8))
    tx = eqopt.contrib.scale_by_soap(merge_dims=True, max_precondition_dim=16)
    params = {"w": jnp.ones((4, 3))}
    state = tx.init(params)
    assert [s.shape for s in state.statistics["w"]] == [(12, 12)]
    updates, state = tx.update({"w": jnp.ones((4, 3))}, state)
    updates, state = tx.update(draw({"w": (4, 3)}, 1), state)
    assert updates["w"].shape == (4, 3) and bool(jnp.all(jnp.isfinite(updates["w"])))


def test_eigenbases_diagonalise_the_statistics_and_refresh_under_cond():
    """After the first step the bases are the statistics' eigenvectors (decreasing);
    the jitted step compiles once although it refreshes every other step."""
    tx = eqopt.contrib.scale_by_soap(precondition_frequency=2)
    params = draw({"w": (6, 5)}, 0)
    state = tx.init(params)
    traces = []

    @jax.jit
    def step(grads, state):
        traces.append(None)
        return tx.update(grads, state)

    for t in range(7):
        before = state.eigenbases["w"]
        _, state = step(draw({"w": (6, 5)}, t), state)
        changed = not all(
            np.allclose(a, b)
            for a, b in zip(before, state.eigenbases["w"], strict=True)
        )
        # Set at the first step (count 0), refreshed when count % 2 == 0.
        assert changed == (t % 2 == 0), t
        if t == 0:
            for statistic, basis in zip(
                state.statistics["w"], state.eigenbases["w"], strict=True
            ):
                rotated = basis.T @ statistic @ basis
                off = rotated - jnp.diag(jnp.diag(rotated))
                assert float(jnp.abs(off).max()) < 1e-5 * float(jnp.abs(rotated).max())
                assert bool(jnp.all(jnp.diff(jnp.diag(rotated)) <= 1e-6))
        for basis in state.eigenbases["w"]:
            np.testing.assert_allclose(
                basis.T @ basis, np.eye(basis.shape[0]), atol=1e-5
            )
    assert len(traces) == 1


def test_soap_trains_an_mlp():
    first, last, _, state = train(eqopt.contrib.soap(1e-2), steps=60)
    assert last < 0.5 * first
    assert state[0].eigenbases.layers[1].weight[0].shape == (16, 16)
    # Biases are vectors: plain Adam unless `precondition_1d`.
    assert state[0].statistics.layers[1].bias == (None,)
