"""Meta-learning a learning rate by differentiating through the optimiser's updates.

An eqopt optimiser is an `eqx.Module` whose hyperparameters are array leaves, so
"the loss after ten training steps" is an ordinary differentiable function of
the optimiser: `eqx.filter_grad` of it returns an optimiser-shaped pytree holding
the derivative with respect to every hyperparameter (learning rate, `b1`, `b2`...).
No `inject_hyperparams`, no rewriting the update rule by hand.

Here an Equinox MLP is trained for a few unrolled steps of Adam on a random
sine-wave regression task; the meta-loss is its error on held-out
points of the same task, averaged over a batch of tasks. An outer Adam (also
eqopt) then descends the meta-loss with respect to the log learning rate, which
starts far too small and climbs towards the best value for this horizon.

    python examples/meta_learning_lr.py --out meta_learning_lr.png
    python examples/meta_learning_lr.py --short     # the quick run the tests use

About 25 s on a 2-core CPU; `--short` (what the tests run) about 15 s,
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

INNER_STEPS = 10  # unrolled training steps per task
POINTS = 20  # training points and held-out points per task
TASKS = 16  # tasks per meta-step


@eqx.filter_jit
def sample_tasks(key, num_tasks: int):
    """Sine waves `a sin(x + phase)`, each with its own training and held-out points."""
    amp_key, phase_key, x_key = jax.random.split(key, 3)
    amplitude = jax.random.uniform(amp_key, (num_tasks, 1, 1), minval=0.5, maxval=2.0)
    phase = jax.random.uniform(phase_key, (num_tasks, 1, 1), maxval=jnp.pi)
    x = jax.random.uniform(x_key, (num_tasks, 2 * POINTS, 1), minval=-5.0, maxval=5.0)
    y = amplitude * jnp.sin(x + phase)
    return (x[:, :POINTS], y[:, :POINTS]), (x[:, POINTS:], y[:, POINTS:])


def mse(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def held_out_loss_after_training(opt, model, train, held_out):
    """Train `model` with `opt` for `INNER_STEPS` steps; return the held-out loss.

    Every step is the usual eqopt update, inside `lax.scan`, so the whole
    unrolled training is differentiable with respect to `opt`'s leaves.
    """
    params, static = eqx.partition(model, eqx.is_array)

    def step(carry, _):
        params, state = carry
        model = eqx.combine(params, static)
        grads = eqx.filter_grad(mse)(model, *train)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
        return (eqx.filter(model, eqx.is_array), state), None

    (params, _), _ = jax.lax.scan(step, (params, opt.init(model)), length=INNER_STEPS)
    return mse(eqx.combine(params, static), *held_out)


def meta_loss(opt, model, tasks):
    """The held-out loss after training, averaged over a batch of tasks."""
    train, held_out = tasks
    per_task = jax.vmap(held_out_loss_after_training, in_axes=(None, None, 0, 0))
    return jnp.mean(per_task(opt, model, train, held_out))


def with_learning_rate(opt, learning_rate):
    """The same optimiser with another learning rate: `eqx.tree_at` on the leaf."""
    return eqx.tree_at(
        lambda o: o["scale_by_learning_rate"].learning_rate, opt, learning_rate
    )


@eqx.filter_jit
def meta_step(log_lr, meta_state, meta_opt, opt, model, tasks):
    """One step of the outer Adam on the log learning rate."""
    opt = with_learning_rate(opt, jnp.exp(log_lr))
    # The gradient with respect to the whole optimiser: one entry per leaf.
    loss, hypergrad = eqx.filter_value_and_grad(meta_loss)(opt, model, tasks)
    # Chain rule from the learning-rate leaf to its logarithm.
    grad = hypergrad["scale_by_learning_rate"].learning_rate * jnp.exp(log_lr)
    updates, meta_state = meta_opt.update(grad, meta_state, log_lr)
    return eqopt.apply_updates(log_lr, updates), meta_state, loss, hypergrad


@eqx.filter_jit
def landscape(opt, model, tasks, learning_rates):
    """The meta-loss at many learning rates at once (`vmap` over the leaf)."""
    return jax.vmap(lambda lr: meta_loss(with_learning_rate(opt, lr), model, tasks))(
        learning_rates
    )


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--meta-steps", type=int, default=100)
    parser.add_argument("--initial-lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="meta_learning_lr.png", help="plot file")
    parser.add_argument("--short", action="store_true", help="a quick run for CI")
    args = parser.parse_args()
    if args.short:
        args.meta_steps = 25

    model_key, task_key, eval_key = jax.random.split(jax.random.key(args.seed), 3)
    eval_tasks = sample_tasks(eval_key, 64)
    model = eqx.nn.MLP(1, 1, 40, 2, activation=jax.nn.tanh, key=model_key)
    opt = eqopt.adam(args.initial_lr)

    # Meta-optimise the log learning rate (positive, and scale-free steps). A
    # float32 array, not a Python float: the updated one has the same type, so
    # `meta_step` compiles once.
    log_lr = jnp.log(jnp.asarray(args.initial_lr, dtype=jnp.float32))
    meta_opt = eqopt.adam(0.1)
    meta_state = meta_opt.init(log_lr)
    learning_rates, meta_losses = [], []
    bar = tqdm(range(args.meta_steps), desc="meta-training", unit="meta-step")
    for i in bar:
        tasks = sample_tasks(jax.random.fold_in(task_key, i), TASKS)
        log_lr, meta_state, loss, hypergrad = meta_step(
            log_lr, meta_state, meta_opt, opt, model, tasks
        )
        if i == 0:
            # An optimiser-shaped pytree: d(meta-loss)/d(each hyperparameter).
            adam_grad = hypergrad["scale_by_adam"]
            lr_grad = hypergrad["scale_by_learning_rate"].learning_rate
            tqdm.write("d(held-out loss)/d(optimiser) at the start:")
            tqdm.write(f"  learning_rate: {float(lr_grad):+.4g}")
            for name in ("b1", "b2", "eps"):
                tqdm.write(f"  {name + ':':14} {float(getattr(adam_grad, name)):+.4g}")
        learning_rates.append(float(jnp.exp(log_lr)))
        meta_losses.append(float(loss))
        bar.set_postfix(lr=f"{learning_rates[-1]:.3g}", loss=f"{meta_losses[-1]:.3f}")

    learned = learning_rates[-1]
    print(f"learned learning rate: {learned:.4g} (started at {args.initial_lr:g})")
    # One vmapped evaluation: the two learning rates, then a grid for the plot.
    grid = jnp.concatenate(
        [jnp.array([args.initial_lr, learned]), jnp.logspace(-4, 0, 41)]
    )
    curve = np.asarray(landscape(opt, model, eval_tasks, grid))
    print(f"held-out loss on 64 new tasks: {curve[0]:.4f} -> {curve[1]:.4f}")
    grid, curve = np.asarray(grid[2:]), curve[2:]

    fig, (ax_lr, ax_land) = plt.subplots(1, 2, figsize=(11, 4))
    ax_lr.plot(np.arange(1, args.meta_steps + 1), learning_rates)
    ax_lr.set(xlabel="meta-step", ylabel="learning rate", yscale="log")
    ax_lr.set_title("Learning rate, learned by gradient descent")
    ax_lr.grid(alpha=0.3)
    ax_land.plot(grid, curve, label="meta-loss (vmap over the leaf)")
    ax_land.axvline(args.initial_lr, color="grey", ls=":", label="initial")
    ax_land.axvline(learned, color="C3", ls="--", label="learned")
    ax_land.set(xscale="log", yscale="log", xlabel="learning rate")
    ax_land.set(ylabel=f"held-out loss after {INNER_STEPS} steps")
    ax_land.set_title("Meta-loss landscape on new tasks")
    ax_land.legend()
    ax_land.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"saved plot to {args.out}")


if __name__ == "__main__":
    main()
