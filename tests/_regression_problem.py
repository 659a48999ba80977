"""A small regression problem on an Equinox MLP, for the contrib training tests.

`train(optimiser)` fits a two-layer MLP (with its non-array leaves: activation
functions, sizes) to a smooth target by full-batch steps, and returns the loss
before and after. The step is one `eqx.filter_jit`-ed function; the optimiser is
passed in, so its hyperparameters stay leaves.
"""

import equinox as eqx
import jax
import jax.numpy as jnp

import eqopt


def _data():
    key_x, key_w = jax.random.split(jax.random.key(0))
    x = jax.random.normal(key_x, (64, 4))
    w = jax.random.normal(key_w, (4,))
    y = jnp.sin(x @ w)[:, None] + 0.5
    return x, y


def make_model(seed: int = 0) -> eqx.nn.MLP:
    return eqx.nn.MLP(4, 1, 16, 1, activation=jnp.tanh, key=jax.random.key(seed))


def loss_fn(model, x, y):
    prediction = jax.vmap(model)(x)
    return jnp.mean((prediction - y) ** 2)


# Donating the model and the state, as DESIGN.md recommends, also checks that
# no state shares a buffer with the model.
@eqx.filter_jit(donate="all-except-first")
def _step(optimiser, model, state, x, y, pass_value):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    extra = {"value": loss} if pass_value else {}
    updates, state = optimiser.update(grads, state, model, **extra)
    return eqopt.apply_updates(model, updates), state, loss


def train(optimiser, steps: int = 100, pass_value: bool = False):
    """Trains the MLP; returns `(initial_loss, final_loss)`."""
    x, y = _data()
    model = make_model()
    state = optimiser.init(model)
    initial = float(loss_fn(model, x, y))
    for _ in range(steps):
        model, state, _ = _step(optimiser, model, state, x, y, pass_value)
    final = float(loss_fn(model, x, y))
    assert model.activation is jnp.tanh
    return initial, final
