"""PSGD Kron (`eqopt.contrib.kron`, `scale_by_kron`), checked against `psgd_jax`'s
Kron given the same random probes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _precond_oracles import draw, psgd_jax_kron
from _training import train
from helpers import Case

import eqopt
from eqopt.contrib import kron_probes
from eqopt.contrib._kron import _balance, _norm_lower_bound, _precondition

_NO_OPTAX = "not in Optax: compared with psgd_jax (same probes) in test_contrib_kron.py"

TRANSFORM_CASES = [
    Case("contrib.kron", lambda: eqopt.contrib.kron(1e-2), no_parity_reason=_NO_OPTAX),
    Case(
        "contrib.kron-one-diag-half-probability",
        lambda: eqopt.contrib.kron(
            1e-2,
            memory_save_mode="one_diag",
            preconditioner_update_probability=0.5,
            weight_decay=1e-3,
        ),
        no_parity_reason=_NO_OPTAX,
    ),
    Case(
        "contrib.scale_by_kron-all-diag-gradient-fit",
        lambda: eqopt.contrib.scale_by_kron(
            b1=0.0, memory_save_mode="all_diag", momentum_into_precond_update=False
        ),
        no_parity_reason=_NO_OPTAX,
        needs_params=False,
    ),
]

SHAPES = {"b": (5,), "k": (3, 4, 2), "s": (), "w": (6, 5)}  # sorted: the oracle's order


class _InjectedRandom:
    """Stands in for `jax.random` in the oracle: its probes are given, and its 1%
    balancing draw never fires (balancing leaves P unchanged: tested below)."""

    def __init__(self):
        self.probes = []

    def normal(self, key, shape=(), dtype=jnp.float32):
        probe = self.probes.pop(0)
        assert probe.shape == tuple(shape)
        return probe.astype(dtype)

    def uniform(self, key, *args, **kwargs):
        return jnp.ones(())

    def __getattr__(self, name):
        return getattr(jax.random, name)


class _JaxWithRandom:
    def __init__(self, random):
        self.random = random

    def __getattr__(self, name):
        return getattr(jax, name)


CONFIGS = {
    "every-step": {"preconditioner_update_probability": 1.0},
    "half-one-diag-b1": {
        "preconditioner_update_probability": 0.5,
        "memory_save_mode": "one_diag",
        "b1": 0.5,
    },
    "small-triangular-gradient-fit-scale": {
        "preconditioner_update_probability": 1.0,
        "max_size_triangular": 4,
        "momentum_into_precond_update": False,
        "preconditioner_lr": 0.3,
        "preconditioner_init_scale": 2.0,
    },
    "all-diag-annealed": {
        "preconditioner_update_probability": eqopt.contrib.precond_update_prob_schedule(
            flat_start=2, decay=0.5
        ),
        "memory_save_mode": "all_diag",
    },
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_psgd_jax_given_the_same_probes(name, monkeypatch):
    """Ten steps on matrix, vector, scalar and 3-D leaves, both jitted; the oracle's
    probes are arguments of its jitted step, set to the ones eqopt draws."""
    oracle = psgd_jax_kron()
    random = _InjectedRandom()
    monkeypatch.setattr(oracle, "jax", _JaxWithRandom(random))
    options = dict(CONFIGS[name])
    tx = eqopt.contrib.scale_by_kron(**options)
    schedule = options.get("preconditioner_update_probability")
    if isinstance(schedule, eqopt.contrib.KronUpdateProbabilitySchedule):
        options["preconditioner_update_probability"] = (
            oracle.precond_update_prob_schedule(flat_start=2, decay=0.5)
        )
    reference = oracle.scale_by_kron(precond_update_precision=None, **options)

    def reference_update(grads, state, probes):
        random.probes = [probes[k] for k in sorted(probes)]
        return reference.update(grads, state)

    params = draw(SHAPES, 0)
    # psgd_jax broadcasts ranks implicitly; the suite raises on that.
    with jax.numpy_rank_promotion("allow"):
        state, reference_state = tx.init(params), reference.init(params)
        step, reference_step = jax.jit(tx.update), jax.jit(reference_update)
        worst, refits = 0.0, 0
        for t in range(10):
            grads = draw(SHAPES, 100 + t)
            _, probes, balance_draw = kron_probes(state.key, grads)
            assert balance_draw >= 0.01  # no balancing in these steps (seed 0)
            before = state.preconditioner["w"][0]
            updates, state = step(grads, state)
            refits += not np.allclose(before, state.preconditioner["w"][0])
            reference_updates, reference_state = reference_step(
                grads, reference_state, probes
            )
            for k in grads:
                worst = max(
                    worst, float(jnp.abs(updates[k] - reference_updates[k]).max())
                )
            for ours, theirs in zip(
                jax.tree.leaves(state.preconditioner),
                jax.tree.leaves(reference_state["Qs_preconditioners"]),
                strict=True,
            ):
                np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    print(f"Kron vs psgd_jax ({name}): largest difference {worst:.2e}, {refits} refits")
    assert worst < 1e-5  # the updates have an RMS of at most 1.1
    assert refits >= 2  # the annealed schedule refits less and less


def test_update_fraction_follows_the_probability():
    """With p = 1/4 the preconditioner is refitted on every fourth step, under a
    `lax.cond` of a jitted step that compiles once."""
    tx = eqopt.contrib.scale_by_kron(preconditioner_update_probability=0.25)
    params = {"w": jnp.zeros((3, 2))}
    state = tx.init(params)
    traces = []

    @jax.jit
    def step(grads, state):
        traces.append(None)
        return tx.update(grads, state)

    refitted = []
    for t in range(12):
        before = state.preconditioner["w"]
        _, state = step({"w": jax.random.normal(jax.random.key(t), (3, 2))}, state)
        refitted.append(
            not all(
                np.allclose(a, b)
                for a, b in zip(before, state.preconditioner["w"], strict=True)
            )
        )
    assert refitted == [t % 4 == 3 for t in range(12)]
    assert len(traces) == 1


def test_schedule_matches_psgd_jax():
    oracle = psgd_jax_kron()
    ours, theirs = (
        eqopt.contrib.precond_update_prob_schedule(),
        oracle.precond_update_prob_schedule(),
    )
    steps = jnp.array([0, 1, 250, 500, 501, 1000, 2000, 4000, 10000])
    np.testing.assert_allclose(ours(steps), theirs(steps), rtol=1e-6)
    assert float(ours(500)) == 1.0 and float(ours(10**5)) == pytest.approx(0.03)


def test_factor_kinds_and_memory_modes():
    params = draw(SHAPES, 0)
    shapes = lambda state: {
        k: [q.shape for q in v] for k, v in state.preconditioner.items()
    }
    default = shapes(eqopt.contrib.scale_by_kron().init(params))
    assert default == {
        "b": [(5,)],
        "k": [(3, 3), (4, 4), (2, 2)],
        "s": [()],
        "w": [(6, 6), (5, 5)],
    }
    one = shapes(eqopt.contrib.scale_by_kron(memory_save_mode="one_diag").init(params))
    assert one["w"] == [(6,), (5, 5)] and one["k"] == [(3, 3), (4,), (2, 2)]
    every = shapes(
        eqopt.contrib.scale_by_kron(memory_save_mode="all_diag").init(params)
    )
    assert every["w"] == [(6,), (5,)]
    small = shapes(eqopt.contrib.scale_by_kron(max_size_triangular=4).init(params))
    assert small["w"] == [(6,), (5,)] and small["k"] == [(3, 3), (4, 4), (2, 2)]


def test_balancing_keeps_the_preconditioner():
    key = jax.random.key(3)
    factors = (
        jnp.triu(jax.random.normal(key, (4, 4))) * 10.0,
        jnp.abs(jax.random.normal(jax.random.fold_in(key, 1), (3,))) * 0.1,
    )
    g = jax.random.normal(jax.random.fold_in(key, 2), (4, 3))
    balanced = _balance(factors)
    np.testing.assert_allclose(
        _precondition(balanced, g), _precondition(factors, g), rtol=1e-4, atol=1e-5
    )
    assert float(jnp.abs(balanced[0]).max()) == pytest.approx(
        float(jnp.abs(balanced[1]).max()), rel=1e-5
    )


def test_norm_lower_bound_brackets_the_spectral_norm():
    for seed in range(5):
        x = jax.random.normal(jax.random.key(seed), (7, 9))
        matrix = x @ x.T
        bound = float(_norm_lower_bound(matrix))
        norm = float(jnp.linalg.norm(matrix, ord=2))
        assert bound <= norm * (1 + 1e-5) and norm <= np.sqrt(2) * bound
    assert float(_norm_lower_bound(jnp.zeros((3, 3)))) == 0.0


def test_fitted_preconditioner_whitens_the_gradient_noise():
    """On gradients g = H^(1/2) z with z ~ N(0, I) and H = diag(h) ⊗ I, the fitted
    P approaches H^(-1/2) (Li's criterion): P times the true square root is near a
    multiple of the identity."""
    h = jnp.array([100.0, 1.0, 0.01])
    tx = eqopt.contrib.scale_by_kron(b1=0.0, preconditioner_update_probability=1.0)
    state = tx.init({"w": jnp.zeros((3, 4))})
    step = jax.jit(tx.update)
    for t in range(400):
        z = jax.random.normal(jax.random.key(t), (3, 4))
        _, state = step({"w": jnp.sqrt(h)[:, None] * z}, state)
    left, right = state.preconditioner["w"]
    p_left = np.asarray(left.T @ left) * np.asarray(right.T @ right).trace() / 4
    scaled = np.diag(p_left) * np.sqrt(np.asarray(h))
    assert scaled.max() / scaled.min() < 2.0  # from a spread of 100 in H^(1/2)


def test_kron_trains_an_mlp():
    first, last, _, state = train(eqopt.contrib.kron(1e-2), steps=60)
    assert last < 0.5 * first
    assert [q.shape for q in state[0].preconditioner.layers[1].weight] == [
        (16, 16),
        (16, 16),
    ]
    assert [q.shape for q in state[0].preconditioner.layers[1].bias] == [(16,)]
