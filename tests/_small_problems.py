"""Small training problems on Equinox models, for the contrib optimisers' training tests."""

import equinox as eqx
import jax
import jax.numpy as jnp

import eqopt


def regression_data(seed: int = 0, n: int = 64):
    """Inputs `(n, 4)` and targets `(n, 2)` of a smooth nonlinear function."""
    x = jax.random.normal(jax.random.key(seed), (n, 4))
    y = jnp.stack([jnp.sin(x[:, 0] + x[:, 1]), x[:, 2] * x[:, 3] / 2], axis=-1)
    return x, y


def make_mlp(seed: int = 0, dtype=jnp.float32) -> eqx.nn.MLP:
    """An MLP 4 -> 16 -> 16 -> 2: a pytree with non-array leaves (activations, sizes)."""
    model = eqx.nn.MLP(4, 2, width_size=16, depth=2, key=jax.random.key(seed))
    return jax.tree.map(
        lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model
    )


def mse(model, x, y):
    """Mean squared error of a model over a batch."""
    prediction = jax.vmap(model)(x.astype(jnp.result_type(model.layers[0].weight)))
    return jnp.mean((prediction.astype(jnp.float32) - y) ** 2)


def train(opt, steps: int = 100, *, extra=None, model=None, seed: int = 0):
    """Trains an MLP on the regression data; returns `(first_loss, last_loss, model, state)`.

    `extra(model, x, y, loss)` gives the extra keyword arguments of `update`.
    """
    x, y = regression_data(seed)
    model = make_mlp(seed) if model is None else model
    state = opt.init(model)

    @eqx.filter_jit
    def step(opt, model, state):
        loss, grads = eqx.filter_value_and_grad(mse)(model, x, y)
        kwargs = {} if extra is None else extra(model, x, y, loss)
        updates, state = opt.update(grads, state, model, **kwargs)
        return eqopt.apply_updates(model, updates), state, loss

    losses = []
    for _ in range(steps):
        model, state, loss = step(opt, model, state)
        losses.append(float(loss))
    return losses[0], float(mse(model, x, y)), model, state
