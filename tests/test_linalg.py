"""matrix_inverse_pth_root, power_iteration, nnls and scale_gradient: parity with
Optax and closed forms; the per-layer decompositions (eigh, qr, thin_svd) on stacks."""

import re
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import optax
import pytest
from helpers import assert_tree_allclose

from eqopt._linalg import (
    eigh,
    matrix_inverse_pth_root,
    nnls,
    power_iteration,
    qr,
    scale_gradient,
    solve_upper_right,
    thin_svd,
)


def _psd(size, seed=0):
    a = jax.random.normal(jax.random.PRNGKey(seed), (size, size))
    return a @ a.T + 0.1 * jnp.eye(size)


def _eigh_root(matrix, p, ridge_epsilon=1e-6):
    w, v = np.linalg.eigh(np.asarray(matrix, np.float64))
    w = w + ridge_epsilon * w.max()
    return (v * w ** (-1.0 / p)) @ v.T


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_matrix_inverse_pth_root_parity(p):
    matrix = _psd(6)
    root, error = matrix_inverse_pth_root(matrix, p)
    expected_root, expected_error = optax.matrix_inverse_pth_root(matrix, p)
    assert_tree_allclose(root, expected_root)
    assert_tree_allclose(error, expected_error, atol=1e-7)
    np.testing.assert_allclose(root, _eigh_root(matrix, p), rtol=2e-3, atol=2e-4)


def test_matrix_inverse_pth_root_other_p_and_jit():
    matrix = _psd(5, seed=1)
    # Optax raises the matrix to the nearest power of two of p; we use p itself.
    root, _ = matrix_inverse_pth_root(matrix, 3)
    np.testing.assert_allclose(root, _eigh_root(matrix, 3), rtol=2e-3, atol=2e-4)
    # p and the matrix traced: same numbers.
    jitted_root, _ = jax.jit(matrix_inverse_pth_root)(matrix, jnp.asarray(3))
    assert_tree_allclose(jitted_root, root, rtol=1e-4, atol=1e-5)
    # The 1x1 case.
    one = jnp.array([[4.0]])
    assert_tree_allclose(
        matrix_inverse_pth_root(one, 2)[0], optax.matrix_inverse_pth_root(one, 2)[0]
    )
    with pytest.raises(ValueError, match="positive integer"):
        matrix_inverse_pth_root(matrix, 0)
    with pytest.raises(jaxtyping.TypeCheckError):
        matrix_inverse_pth_root(jnp.ones((2, 3)), 2)


def test_power_iteration_parity():
    matrix = _psd(7, seed=2)
    assert_tree_allclose(power_iteration(matrix), optax.power_iteration(matrix))
    v0 = jnp.arange(1.0, 8.0)
    assert_tree_allclose(
        power_iteration(matrix, v0=v0, num_iters=5),
        optax.power_iteration(matrix, v0=v0, num_iters=5),
    )
    key = jax.random.PRNGKey(3)
    assert_tree_allclose(
        power_iteration(matrix, key=key), optax.power_iteration(matrix, key=key)
    )
    eigenvalue, _ = power_iteration(matrix, num_iters=1000, error_tolerance=1e-7)
    np.testing.assert_allclose(eigenvalue, np.linalg.eigvalsh(matrix).max(), rtol=1e-4)


def test_power_iteration_on_a_pytree_operator():
    diag = {"a": jnp.array([3.0, 1.0]), "b": jnp.array([[0.5, 5.0]])}
    matvec = lambda tree: jax.tree.map(jnp.multiply, diag, tree)
    v0 = jax.tree.map(jnp.ones_like, diag)
    ours = jax.jit(lambda v: power_iteration(matvec, v0=v, num_iters=200))(v0)
    assert_tree_allclose(ours, optax.power_iteration(matvec, v0=v0, num_iters=200))
    np.testing.assert_allclose(ours[0], 5.0, rtol=1e-4)
    with pytest.raises(ValueError, match="v0"):
        power_iteration(matvec)
    with pytest.raises(ValueError, match="shape"):
        power_iteration(jnp.eye(3), v0=jnp.ones(4))


@pytest.mark.parametrize("rhs_shape", [(6,), (6, 3)])
def test_nnls_parity(rhs_shape):
    a = jax.random.normal(jax.random.PRNGKey(4), (6, 4))
    b = jax.random.normal(jax.random.PRNGKey(5), rhs_shape)
    x = nnls(a, b, 200)
    assert x.shape == (4,) + rhs_shape[1:]
    assert_tree_allclose(x, optax.nnls(a, b, 200))
    assert_tree_allclose(
        nnls(a, b, 50, unroll=2, L=30.0), optax.nnls(a, b, 50, unroll=2, L=30.0)
    )
    assert_tree_allclose(jax.jit(nnls, static_argnums=2)(a, b, 200), x)
    assert np.all(np.asarray(x) >= 0)


def test_nnls_solution_and_errors():
    # The unconstrained solution is feasible here, so NNLS must find it.
    a = jnp.array([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    b = a @ jnp.array([0.5, 2.0])
    np.testing.assert_allclose(nnls(a, b, 2000), [0.5, 2.0], atol=1e-4)
    assert_tree_allclose(nnls(jnp.zeros((3, 2)), jnp.ones(3), 5), jnp.zeros(2))
    with pytest.raises(jaxtyping.TypeCheckError):
        nnls(a, jnp.ones(4), 10)


@pytest.mark.parametrize("scale", [0.5, -1.0, 1.0, 0.0])
def test_scale_gradient_parity(scale):
    x = jnp.array([1.0, -2.0, 3.0])
    f = lambda fn: lambda x: jnp.sum(jnp.sin(fn(x * 2.0, scale)))
    assert_tree_allclose(scale_gradient(x, scale), x)
    assert_tree_allclose(
        jax.grad(f(scale_gradient))(x), jax.grad(f(optax.scale_gradient))(x)
    )


def test_scale_gradient_traced_scale_and_models():
    model = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.PRNGKey(0))
    x = jnp.array([0.3, -0.7])

    def loss(model, scale):
        return jnp.sum(scale_gradient(model, scale)(x) ** 2)

    reference = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(model)
    grads = eqx.filter_jit(eqx.filter_grad(loss))(model, jnp.asarray(0.25))
    assert_tree_allclose(grads, jax.tree.map(lambda g: 0.25 * g, reference))
    # Forward pass unchanged, non-array leaves untouched.
    assert scale_gradient(model, 0.5).activation is model.activation
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_tree_allclose(
            jax.grad(lambda s: jnp.sum(scale_gradient(x, s) * x))(2.0), jnp.asarray(0.0)
        )


def _stack(shape, seed=0):
    return jax.random.normal(jax.random.key(seed), (3, 2, *shape))


_DECOMPOSITIONS = {
    "eigh": (eigh, jnp.linalg.eigh, lambda: (_stack((6, 4)) @ _stack((4, 6)),)),
    "qr": (qr, jnp.linalg.qr, lambda: (_stack((6, 4)),)),
    "thin_svd": (
        thin_svd,
        lambda m: jnp.linalg.svd(m, full_matrices=False),
        lambda: (_stack((6, 4)),),
    ),
    "solve_upper_right": (
        solve_upper_right,
        lambda a, b: jax.lax.linalg.triangular_solve(
            a, b, left_side=False, lower=False
        ),
        lambda: (
            jnp.triu(_stack((5, 5))) + 4 * jnp.eye(5)[None, None],
            _stack((7, 5), seed=1),
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(_DECOMPOSITIONS))
def test_stacked_decompositions_call_lapack_once_per_matrix(name):
    """Vmapped over two stack axes, the decompositions equal jnp's batched ones
    bit for bit, and on the CPU every LAPACK call takes one matrix: jaxlib splits
    a batched call over XLA's thread pool and blocks a pool thread on it, and two
    such calls at once deadlock a two-thread pool (SOAP's refresh of a scanned
    model hung that way on a 2-core machine)."""
    ours, reference, make_args = _DECOMPOSITIONS[name]
    args = make_args()
    stacked = jax.jit(jax.vmap(jax.vmap(ours)))
    for got, want in zip(
        jax.tree.leaves(stacked(*args)), jax.tree.leaves(reference(*args)), strict=True
    ):
        np.testing.assert_array_equal(got, want)
    one = [x[0, 0] for x in args]
    np.testing.assert_array_equal(
        jax.tree.leaves(ours(*one))[0], jax.tree.leaves(reference(*one))[0]
    )
    # A matrix shared by every slice (not batched) is passed to each.
    shared = jax.vmap(ours, in_axes=(None,) + (0,) * (len(args) - 1))
    if len(args) > 1:
        got = jax.jit(shared)(one[0], *(x[0] for x in args[1:]))
        want = jax.vmap(reference, in_axes=(None, 0))(one[0], args[1][0])
        np.testing.assert_array_equal(got, want)
    # Differentiated, they are jnp's (custom_vmap alone has no JVP).
    first = lambda f: lambda *a: jax.tree.leaves(f(*a))[0].sum()
    np.testing.assert_allclose(
        jax.grad(first(jax.vmap(jax.vmap(ours))))(*args),
        jax.grad(first(reference))(*args),
        rtol=1e-5,
        atol=1e-6,
    )
    if jax.default_backend() == "cpu":
        hlo = stacked.lower(*args).compile().as_text()
        results = re.findall(r"= (.*) custom-call\(.*custom_call_target=\"lapack_", hlo)
        assert results
        for result in results:
            # One matrix: no array of the call's result has a stack axis.
            assert not re.search(r"\[[32],", result), result
