"""`microbatch`, compared with Optax's on every accumulation type.

`microbatch` transforms functions, not gradients, so it has no registry case.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.microbatching
import pytest
from helpers import assert_tree_allclose

import eqopt
import eqopt.microbatching as mb

OURS, THEIRS = mb.AccumulationType, optax.microbatching.AccumulationType


def _fun(x, y):
    return x + 1, jnp.sum(3 * x * y)


def _data():
    return jnp.arange(8.0), jnp.linspace(-1.0, 1.0, 8)


@pytest.mark.parametrize(
    "kinds",
    [
        ("SUM",),
        ("MEAN",),
        ("RUNNING_MEAN",),
        ("CONCAT", "SUM"),
        ("CONCAT", "MEAN"),
        ("CONCAT", "RUNNING_MEAN"),
    ],
)
@pytest.mark.parametrize("num_real", [None, 3])
def test_matches_optax(kinds, num_real):
    if len(kinds) == 1:
        fun = lambda x, y: jnp.sum(x * y) + x[0]  # noqa: E731
        ours, theirs = getattr(OURS, kinds[0]), getattr(THEIRS, kinds[0])
    else:
        fun = _fun
        ours = tuple(getattr(OURS, k) for k in kinds)
        theirs = tuple(getattr(THEIRS, k) for k in kinds)
    x, y = _data()
    result = eqopt.microbatch(fun, (0, 1), 2, ours, num_real_microbatches=num_real)(
        x, y
    )
    expected = optax.microbatch(fun, (0, 1), 2, theirs, num_real_microbatches=num_real)(
        x, y
    )
    assert_tree_allclose(result, expected, rtol=1e-6)


def test_concat_restores_the_batch_order():
    x, y = _data()
    result = eqopt.microbatch(
        _fun, argnums=0, microbatch_size=2, accumulator=(OURS.CONCAT, OURS.SUM)
    )(x, 1.0)
    assert_tree_allclose(result, _fun(x, 1.0), rtol=1e-6)


def test_in_axes_and_argnames():
    data = jnp.arange(24.0).reshape(3, 8)

    def fun(a, *, scale):
        return jnp.sum(a, axis=1) * jnp.sum(scale)

    kwargs = {"scale": jnp.ones(8)}
    ours = eqopt.microbatch(
        fun, argnums=0, argnames="scale", microbatch_size=4, in_axes=(1, 0)
    )(data, **kwargs)
    theirs = optax.microbatch(
        fun, argnums=0, argnames="scale", microbatch_size=4, in_axes=(1, 0)
    )(data, **kwargs)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_pytree_arguments_and_a_whole_model_gradient():
    model = eqx.nn.MLP(3, 1, 4, 1, key=jax.random.key(0))
    batch = {
        "x": jax.random.normal(jax.random.key(1), (12, 3)),
        "y": jax.random.normal(jax.random.key(2), (12, 1)),
    }

    def loss(model, batch):
        return jnp.mean((jax.vmap(model)(batch["x"]) - batch["y"]) ** 2)

    grad = eqx.filter_grad(loss)
    micro = eqopt.microbatch(grad, argnums=1, microbatch_size=3, accumulator=OURS.MEAN)
    assert_tree_allclose(micro(model, batch), grad(model, batch), rtol=1e-5, atol=1e-6)


def test_traced_num_real_microbatches_under_jit():
    @jax.jit
    def run(x, n):
        return eqopt.microbatch(jnp.sum, 0, 2, num_real_microbatches=n)(x)

    x = jnp.arange(8.0)
    # Micro-batch j holds the rows j and j + 4: 0 + 4, then 1 + 5, ...
    np.testing.assert_allclose(run(x, jnp.asarray(2)), 10.0)
    np.testing.assert_allclose(run(x, jnp.asarray(4)), 28.0)
    assert run._cache_size() == 1


def test_custom_accumulator():
    maximum = mb.Accumulator(
        init=lambda s: jnp.full(s.shape, -jnp.inf, s.dtype),
        update=lambda carry, value, index: jnp.maximum(carry, value),
        finalize=lambda carry: carry,
        aggregate=lambda values: jnp.max(values, axis=0),
    )
    result = eqopt.microbatch(jnp.max, 0, 2, maximum)(jnp.array([3.0, 9.0, 1.0, 4.0]))
    assert float(result) == 9.0


def test_none_microbatch_size_is_the_function_itself():
    assert eqopt.microbatch(_fun, 0, None) is _fun


def test_errors():
    x = jnp.arange(8.0)
    with pytest.raises(ValueError, match="batch size 8 is not divisible"):
        eqopt.microbatch(jnp.sum, 0, 3)(x)
    with pytest.raises(ValueError, match="different batch sizes"):
        eqopt.microbatch(lambda a, b: jnp.sum(a) + jnp.sum(b), (0, 1), 2)(x, x[:4])
    with pytest.raises(ValueError, match="microbatch_size"):
        eqopt.microbatch(jnp.sum, 0, 0)
    with pytest.raises(TypeError, match="accumulator"):
        eqopt.microbatch(jnp.sum, 0, 2, accumulator="sum")(x)
    with pytest.raises(ValueError, match="in_axes"):
        eqopt.microbatch(jnp.sum, 0, 2, in_axes=(0, 1))


def test_accumulation_type_matches_optax():
    assert [(t.name, t.value) for t in OURS] == [(t.name, t.value) for t in THEIRS]
