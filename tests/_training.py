"""The small training problems of the optimisers' behaviour tests: three problems, one loop.

`train(opt, steps, problem=...)` fits an `eqx.nn.MLP` (a whole model, with
activation functions and sizes as leaves) to a smooth target by full-batch
steps and returns the loss before and after, the model and the state. The step
is one `eqx.filter_jit`-ed function that donates the model and the state (as
the step in docs/design.md, "Whole models are the params", does; donating also
checks that no state shares a buffer with the model); the optimiser is passed
in, so its hyperparameters stay leaves.

The three problems are the ones the tests' thresholds were set on:

- `"mlp-2-1"`: 2 -> 16 -> 1 (ReLU), 32 points of $\\sin(2x_0) + x_1/2$ (the
  transform families' tests);
- `"mlp-4-1"`: 4 -> 16 -> 1 (tanh), 64 points of $\\sin(x \\cdot w) + 0.5$;
- `"mlp-4-2"`: 4 -> 16 -> 16 -> 2 (ReLU), 64 points of two smooth functions.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

import eqopt


class Trained(NamedTuple):
    first: float
    last: float
    model: Any
    state: Any


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
    """Mean squared error of a model over a batch (in float32 for a low-precision model)."""
    prediction = jax.vmap(model)(x.astype(jnp.result_type(model.layers[0].weight)))
    return jnp.mean((prediction.astype(jnp.float32) - y) ** 2)


def _mlp_2_1(seed: int):
    model_key, data_key = jax.random.split(jax.random.key(seed))
    model = eqx.nn.MLP(2, 1, 16, 1, key=model_key)
    x = jax.random.normal(data_key, (32, 2))
    return model, x, jnp.sin(2 * x[:, :1]) + 0.5 * x[:, 1:]


def _mlp_4_1(seed: int):
    key_x, key_w = jax.random.split(jax.random.key(0))
    x = jax.random.normal(key_x, (64, 4))
    y = jnp.sin(x @ jax.random.normal(key_w, (4,)))[:, None] + 0.5
    model = eqx.nn.MLP(4, 1, 16, 1, activation=jnp.tanh, key=jax.random.key(seed))
    return model, x, y


def _mlp_4_2(seed: int):
    return make_mlp(seed), *regression_data(seed)


PROBLEMS: dict[str, Callable[[int], tuple[Any, Any, Any]]] = {
    "mlp-2-1": _mlp_2_1,
    "mlp-4-1": _mlp_4_1,
    "mlp-4-2": _mlp_4_2,
}


@eqx.filter_jit(donate="all-except-first")
def _step(setup, model, state):
    opt, x, y, extra = setup
    loss, grads = eqx.filter_value_and_grad(mse)(model, x, y)
    kwargs = {} if extra is None else extra(model, x, y, loss)
    updates, state = opt.update(grads, state, model, **kwargs)
    return eqopt.apply_updates(model, updates), state, loss


def train(
    opt,
    steps: int = 100,
    *,
    problem: str = "mlp-4-2",
    with_value: bool = False,
    extra: Callable[..., dict] | None = None,
    model: Any = None,
    seed: int = 0,
) -> Trained:
    """Trains on `problem`; returns `(first_loss, last_loss, model, state)`.

    `with_value=True` passes the loss as the `value` extra argument (Polyak,
    line searches); `extra(model, x, y, loss)` gives any other extra keyword
    arguments of `update`. `model` replaces the problem's model (it is copied,
    not donated).
    """
    initial, x, y = PROBLEMS[problem](seed)
    if model is not None:
        initial = model
    if with_value:
        extra = lambda model, x, y, loss: {"value": loss}  # noqa: E731
    model = jax.tree.map(
        lambda leaf: jnp.copy(leaf) if eqx.is_array(leaf) else leaf, initial
    )
    state = opt.init(model)
    first = None
    for _ in range(steps):
        model, state, loss = _step((opt, x, y, extra), model, state)
        first = float(loss) if first is None else first
    # The non-array leaves (activation functions, sizes) come through untouched.
    static = lambda tree: eqx.filter(tree, eqx.is_array, inverse=True)  # noqa: E731
    assert eqx.tree_equal(static(model), static(initial))
    return Trained(first, float(mse(model, x, y)), model, state)  # pyright: ignore
