"""`eqopt.microbatching.micro_vmap`, `micro_grad` and `reshape_batch_axis` against Optax's."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqopt
from eqopt.microbatching import AccumulationType


def _close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axis,size", [(0, 2), (0, 3), (1, 3), (1, 2)])
def test_reshape_batch_axis(axis, size):
    tree = {
        "a": jnp.arange(24).reshape(6, 4) if axis == 0 else jnp.arange(24).reshape(4, 6)
    }
    ours = eqopt.microbatching.reshape_batch_axis(tree, size, axis)
    theirs = optax.microbatching.reshape_batch_axis(tree, size, axis)
    assert ours["a"].shape == theirs["a"].shape
    np.testing.assert_array_equal(ours["a"], theirs["a"])
    with pytest.raises(
        ValueError, match="batch size 6 of the leaf at .* is not divisible"
    ):
        eqopt.microbatching.reshape_batch_axis(tree, 4, axis)
    if axis == 1:  # a negative axis counts from the end
        np.testing.assert_array_equal(
            eqopt.microbatching.reshape_batch_axis(tree, size, -1)["a"], ours["a"]
        )


@pytest.mark.parametrize(
    "accumulator",
    [AccumulationType.CONCAT, AccumulationType.SUM, AccumulationType.MEAN],
)
@pytest.mark.parametrize("microbatch_size", [None, 1, 2, 4])
def test_micro_vmap(accumulator, microbatch_size):
    def fun(x, scale):
        return {"square": scale * x**2, "total": jnp.sum(x)}

    x = jnp.arange(16.0).reshape(8, 2)
    theirs_accumulator = getattr(optax.microbatching.AccumulationType, accumulator.name)
    ours = eqopt.microbatching.micro_vmap(
        fun, in_axes=(0, None), microbatch_size=microbatch_size, accumulator=accumulator
    )(x, 3.0)
    theirs = optax.microbatching.micro_vmap(
        fun,
        in_axes=(0, None),
        microbatch_size=microbatch_size,
        accumulator=theirs_accumulator,
    )(x, 3.0)
    _close(ours, theirs)
    if accumulator is AccumulationType.CONCAT:
        _close(ours, jax.vmap(fun, in_axes=(0, None))(x, 3.0))


def test_micro_vmap_axis_and_keywords():
    x = jnp.arange(8.0).reshape(2, 4)
    ours = eqopt.microbatching.micro_vmap(lambda a: a, in_axes=1, microbatch_size=2)(x)
    np.testing.assert_array_equal(ours, x.T)
    mapped = eqopt.microbatching.micro_vmap(lambda a, *, b: a + b, microbatch_size=2)
    np.testing.assert_array_equal(
        mapped(jnp.arange(4.0), b=jnp.ones(4)), 1 + jnp.arange(4.0)
    )
    with pytest.raises(ValueError, match="out_axes"):
        eqopt.microbatching.micro_vmap(lambda a: a, out_axes=1)


@pytest.mark.parametrize("keep_batch_dim", [True, False])
@pytest.mark.parametrize("microbatch_size", [None, 2])
def test_micro_grad_matches_optax(keep_batch_dim, microbatch_size):
    def loss(w, x, y):
        pred = x @ w
        return 0.5 * jnp.mean((pred - y) ** 2), {"pred": pred}

    w = jnp.array([0.5, -1.0])
    x = jnp.arange(8.0).reshape(4, 2) / 4
    y = jnp.arange(4.0)
    if not keep_batch_dim:

        def loss(w, x, y):  # noqa: F811 (one example, no batch axis)
            pred = x @ w
            return 0.5 * (pred - y) ** 2, {"pred": pred}

    kwargs = dict(
        has_aux=True,
        batch_argnums=(1, 2),
        keep_batch_dim=keep_batch_dim,
        microbatch_size=microbatch_size,
        transform_fn=lambda g: (g, g**2),
        metrics_fn=jnp.linalg.norm,
    )
    ours = eqopt.microbatching.micro_grad(
        loss, accumulator=AccumulationType.MEAN, **kwargs
    )(w, x, y)
    theirs = optax.microbatching.micro_grad(
        loss, accumulator=optax.microbatching.AccumulationType.MEAN, **kwargs
    )(w, x, y)
    (grad, squared), aux = ours
    _close((grad, squared), theirs[0])
    _close(
        (aux.values, aux.metrics, aux.aux),
        (theirs[1].values, theirs[1].metrics, theirs[1].aux),
    )
    assert aux._fields == ("values", "metrics", "aux")


def test_micro_grad_on_an_equinox_model():
    """Gradients are taken as `eqx.filter_grad` takes them: a whole model works."""
    model = eqx.nn.Linear(2, 1, key=jax.random.key(0))

    def loss(model, x, y):
        return jnp.mean((jax.vmap(model)(x)[:, 0] - y) ** 2)

    x, y = jnp.ones((4, 2)), jnp.arange(4.0)
    summed, aux = eqopt.microbatching.micro_grad(
        loss, batch_argnums=(1, 2), microbatch_size=2
    )(model, x, y)
    per_example = [
        eqx.filter_grad(loss)(model, x[i : i + 1], y[i : i + 1]) for i in range(4)
    ]
    expected = jax.tree.map(lambda *g: sum(g), *per_example)
    _close(summed, expected)
    assert aux.values.shape == (4,) and aux.metrics is None


def test_micro_grad_of_a_python_float():
    """An argument that is itself a Python float is differentiated, as `jax.grad`
    and Optax's `micro_grad` differentiate it; inside a pytree only arrays are."""

    def loss(c, x):
        return c * x.sum()

    ours = eqopt.microbatching.micro_grad(
        loss, microbatch_size=4, num_real_microbatches=3
    )
    theirs = optax.microbatching.micro_grad(
        loss, microbatch_size=4, num_real_microbatches=3
    )
    got, want = ours(1.0, jnp.ones(16))[0], theirs(1.0, jnp.ones(16))[0]
    assert float(got) == float(want) == 12.0
    model = eqx.nn.Dropout(0.5)  # its `p` is a Python float leaf: not differentiated
    grads = eqopt.microbatching.micro_grad(lambda m, x: m.p * x.sum())(
        model, jnp.ones(4)
    )
    assert grads[0].p is None
