"""A small training problem shared by the optimisers' behaviour tests.

An `eqx.nn.MLP` (a whole model, with activation functions as leaves) fitted to
a smooth target by full-batch gradient steps, all inside one `lax.scan`, so
each optimiser compiles once.
"""

import equinox as eqx
import jax
import jax.numpy as jnp

import eqopt


def _problem(seed: int = 0):
    model_key, data_key = jax.random.split(jax.random.key(seed))
    model = eqx.nn.MLP(2, 1, 16, 1, key=model_key)
    x = jax.random.normal(data_key, (32, 2))
    y = jnp.sin(2 * x[:, :1]) + 0.5 * x[:, 1:]
    return model, x, y


def _loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


@eqx.filter_jit
def _train(opt, model, x, y, steps, with_value):
    params, static = eqx.partition(model, eqx.is_array)

    def step(carry, _):
        params, state = carry
        model = eqx.combine(params, static)
        value, grads = eqx.filter_value_and_grad(_loss)(model, x, y)
        extra = {"value": value} if with_value else {}
        updates, state = opt.update(grads, state, model, **extra)
        model = eqopt.apply_updates(model, updates)
        return (eqx.filter(model, eqx.is_array), state), value

    carry = (params, opt.init(model))
    (params, _), losses = jax.lax.scan(step, carry, None, length=steps)
    return losses, _loss(eqx.combine(params, static), x, y)


def train_regression(opt, steps: int = 100, with_value: bool = False):
    """Trains the MLP with `opt`; returns the initial and the final loss.

    `with_value=True` passes the loss as the `value` extra argument (Polyak).
    """
    model, x, y = _problem()
    losses, final = _train(opt, model, x, y, steps, with_value)
    return float(losses[0]), float(final)
