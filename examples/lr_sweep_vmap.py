"""A learning-rate sweep in one compiled program, with `jax.vmap` over optimisers.

In eqopt a learning rate is an array leaf of the optimiser, not a constant closed
over by a function. So a batch of optimisers, one per learning rate, is just an
optimiser whose `learning_rate` leaf has a leading batch axis, and
`eqx.filter_vmap` trains all of them at once: one trace, one compilation, one
program that updates eight models side by side. (With Optax the learning rate
is baked into the update function; sweeping it under `vmap` needs
`optax.inject_hyperparams` to move it into the state first.)

The problem is a small regression: an Equinox MLP fits a noisy wiggly curve.
Every run starts from the same initial model; only the learning rate differs.

    python examples/lr_sweep_vmap.py --out lr_sweep_vmap.png
    python examples/lr_sweep_vmap.py --short     # the quick run the tests use

About 15 s on a 2-core CPU; `--short` (what the tests run) about 10 s,
most of it start-up and compilation.
"""

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
from tqdm import tqdm

import eqopt

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Counts how often the training step is traced (Python runs only while tracing).
TRACE_COUNT = 0


@eqx.filter_jit
def make_data(key, num_points: int = 256):
    """Noisy samples of a wiggly curve on [-1, 1]."""
    x_key, noise_key = jax.random.split(key)
    x = jax.random.uniform(x_key, (num_points, 1), minval=-1.0, maxval=1.0)
    y = jnp.sin(3.0 * x) + 0.5 * jnp.cos(7.0 * x)
    return x, y + 0.05 * jax.random.normal(noise_key, y.shape)


def loss_fn(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


# One learning rate per run: the optimiser is built inside `vmap`, so its
# `learning_rate` leaf (and every array in the model and state) gets a batch axis.
# `in_axes=(0, None)`: a batch of learning rates, one shared initial model.
@eqx.filter_vmap(in_axes=(0, None))
def make_runs(learning_rate, model):
    opt = eqopt.adam(learning_rate)
    return opt, model, opt.init(model)


# The usual Equinox training step, vmapped over the arrays of (optimiser, model,
# state) with shared data, then jitted once. It runs `num_steps` steps in a
# `lax.scan` per call, so Python dispatches once per chunk rather than per step.
batched = eqx.if_array(0)


@eqx.filter_jit(donate="all-except-first")
@eqx.filter_vmap(in_axes=(batched, batched, batched, None, None, None))
def train_chunk(opt, model, state, x, y, num_steps):
    global TRACE_COUNT
    TRACE_COUNT += 1
    params, static = eqx.partition(model, eqx.is_array)

    def step(carry, _):
        params, state = carry
        model = eqx.combine(params, static)
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
        return (eqx.filter(model, eqx.is_array), state), loss

    (params, state), losses = jax.lax.scan(step, (params, state), length=num_steps)
    return eqx.combine(params, static), state, losses


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--num-rates", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="lr_sweep_vmap.png", help="plot file")
    parser.add_argument("--short", action="store_true", help="a quick run for CI")
    args = parser.parse_args()
    if args.short:
        args.steps = 300

    data_key, model_key = jax.random.split(jax.random.key(args.seed))
    x, y = make_data(data_key)
    model = eqx.nn.MLP(1, 1, 64, 2, activation=jax.nn.tanh, key=model_key)

    learning_rates = jnp.logspace(-4, -0.5, args.num_rates)
    opts, models, states = make_runs(learning_rates, model)
    # One optimiser, batched: every hyperparameter leaf now has shape (num_rates,).
    print(opts)

    losses = []
    chunk = 50  # steps per call: a Python int, so static (one value, one trace)
    args.steps = chunk * -(-args.steps // chunk)
    with tqdm(total=args.steps, desc="sweep", unit="step") as bar:
        for _ in range(args.steps // chunk):
            models, states, chunk_losses = train_chunk(
                opts, models, states, x, y, chunk
            )
            losses.append(chunk_losses)
            bar.update(chunk)
    losses = np.concatenate(jax.device_get(losses), axis=1).T  # (steps, num_rates)

    print(
        f"traced train_chunk {TRACE_COUNT} time(s) for {args.num_rates} learning rates"
    )
    # The mean over the last 5% of steps: the unstable rates spike now and then.
    window = max(1, args.steps // 20)
    final = np.mean(losses[-window:], axis=0)
    print(f"learning rate   mean loss over the last {window} steps")
    for rate, value in zip(np.asarray(learning_rates), final, strict=True):
        print(f"{rate:13.2e}   {value:.3e}")
    best = int(np.nanargmin(final))
    print(
        f"best learning rate: {float(learning_rates[best]):.2e} "
        f"(final loss {final[best]:.3e})"
    )

    fig, (ax_curves, ax_final) = plt.subplots(1, 2, figsize=(11, 4))
    colours = plt.cm.viridis(np.linspace(0, 1, args.num_rates))
    steps = np.arange(1, args.steps + 1)
    for rate, curve, colour in zip(
        np.asarray(learning_rates), losses.T, colours, strict=True
    ):
        ax_curves.plot(steps, curve, color=colour, label=f"{rate:.1e}")
    ax_curves.set(xlabel="step", ylabel="training loss", yscale="log")
    ax_curves.set_title("One vmapped program, one curve per learning rate")
    ax_curves.legend(title="learning rate", fontsize=8, ncol=2)
    ax_final.plot(np.asarray(learning_rates), final, marker="o")
    ax_final.set(xscale="log", yscale="log", xlabel="learning rate")
    ax_final.set(ylabel=f"mean loss over the last {window} steps")
    ax_final.set_title("Final loss")
    ax_final.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"saved plot to {args.out}")


if __name__ == "__main__":
    main()
