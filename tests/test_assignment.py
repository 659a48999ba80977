"""hungarian_algorithm and base_hungarian_algorithm: optimal against exhaustive
search, identical to optax.assignment, and usable under jit and vmap."""

import itertools

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import optax
import pytest

from eqopt import assignment

SOLVERS = {
    "hungarian_algorithm": (
        assignment.hungarian_algorithm,
        optax.assignment.hungarian_algorithm,
    ),
    "base_hungarian_algorithm": (
        assignment.base_hungarian_algorithm,
        optax.assignment.base_hungarian_algorithm,
    ),
}
SHAPES = [(1, 3), (4, 1), (2, 5), (5, 2), (4, 4)]


def brute_force_cost(cost):
    cost = np.asarray(cost, np.float64)
    if cost.shape[0] > cost.shape[1]:
        cost = cost.T
    n, m = cost.shape
    return min(
        cost[np.arange(n), list(columns)].sum()
        for columns in itertools.permutations(range(m), n)
    )


def check_valid(i, j, shape):
    n, m = shape
    k = min(n, m)
    assert i.shape == j.shape == (k,)
    assert i.dtype == j.dtype == jnp.int32
    assert (
        len(set(np.asarray(i).tolist())) == k and len(set(np.asarray(j).tolist())) == k
    )
    assert np.all((0 <= i) & (i < n)) and np.all((0 <= j) & (j < m))


@pytest.mark.parametrize("name", list(SOLVERS))
def test_optimal_and_identical_to_optax(name):
    ours, theirs = SOLVERS[name]
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        cost = jnp.asarray(rng.normal(size=shape), jnp.float32)
        i, j = ours(cost)
        check_valid(i, j, shape)
        np.testing.assert_allclose(cost[i, j].sum(), brute_force_cost(cost), rtol=1e-5)
        # Random costs have a unique optimum, so the pairs, and their order, match.
        expected_i, expected_j = theirs(cost)
        np.testing.assert_array_equal(i, expected_i)
        np.testing.assert_array_equal(j, expected_j)


@pytest.mark.parametrize("name", list(SOLVERS))
def test_integer_costs_with_ties(name):
    ours, _ = SOLVERS[name]
    rng = np.random.default_rng(1)
    for shape in [(4, 4), (3, 5), (5, 3)]:
        cost = jnp.asarray(rng.integers(0, 3, size=shape))
        i, j = ours(cost)
        check_valid(i, j, shape)
        assert int(cost[i, j].sum()) == brute_force_cost(cost)
    # Optax's documented examples.
    cost = jnp.array([[8, 4, 7], [5, 2, 3], [9, 6, 7], [9, 4, 8]])
    i, j = ours(cost)
    assert int(cost[i, j].sum()) == 15
    cost = jnp.array(
        [
            [90, 80, 75, 70],
            [35, 85, 55, 65],
            [125, 95, 90, 95],
            [45, 110, 95, 115],
            [50, 100, 90, 100],
        ]
    )
    i, j = ours(cost)
    assert int(cost[i, j].sum()) == 265


@pytest.mark.parametrize("name", list(SOLVERS))
def test_jit_vmap_and_empty(name):
    ours, theirs = SOLVERS[name]
    costs = jax.random.normal(jax.random.PRNGKey(2), (3, 4, 6))
    batched = jax.jit(jax.vmap(ours))(costs)
    for index in range(costs.shape[0]):
        expected = ours(costs[index])
        np.testing.assert_array_equal(batched[0][index], expected[0])
        np.testing.assert_array_equal(batched[1][index], expected[1])
    for shape in [(0, 3), (3, 0)]:
        i, j = ours(jnp.zeros(shape))
        expected_i, expected_j = theirs(jnp.zeros(shape))
        assert i.shape == j.shape == expected_i.shape == expected_j.shape == (0,)
    # A very unequal scale of costs.
    cost = jnp.array([[1e6, 1.0, 2.0], [1.0, 1e6, 3.0]])
    i, j = ours(cost)
    assert float(cost[i, j].sum()) == 2.0


def test_bad_input():
    with pytest.raises(jaxtyping.TypeCheckError):
        assignment.hungarian_algorithm(jnp.ones(3))
    with pytest.raises(jaxtyping.TypeCheckError):
        assignment.base_hungarian_algorithm(jnp.ones((2, 2), bool))
