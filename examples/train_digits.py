"""Train a small Equinox MLP on scikit-learn's digits with eqopt.

The whole model (activation functions and all) goes straight into `opt.init`
and `opt.update`; there is no `eqx.filter(model, eqx.is_array)` anywhere. The
optimiser is gradient clipping chained with AdamW on a warmup-cosine learning
rate, and weight decay applies only to the weight matrices, chosen with the
per-leaf predicate `lambda x: x.ndim > 1` (an Equinox filter spec).

    python examples/train_digits.py --steps 1500 --seed 0 --plot digits_training.png

Runs on CPU in about ten seconds; the data ship with scikit-learn (no download).
"""

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import eqopt

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


class Classifier(eqx.Module):
    """An MLP with dropout: a pytree with non-array leaves (activations, `p`, sizes)."""

    mlp: eqx.nn.MLP
    dropout: eqx.nn.Dropout

    def __init__(self, in_size: int, num_classes: int, *, key):
        self.mlp = eqx.nn.MLP(
            in_size,
            num_classes,
            width_size=128,
            depth=2,
            activation=jax.nn.gelu,
            key=key,
        )
        self.dropout = eqx.nn.Dropout(p=0.1)

    def __call__(self, x, *, key=None):
        x = self.dropout(x, key=key, inference=key is None)
        return self.mlp(x)


def loss_fn(model, x, y, key):
    keys = jax.random.split(key, x.shape[0])
    logits = jax.vmap(lambda xi, ki: model(xi, key=ki))(x, keys)
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=1))


@eqx.filter_jit(donate="all-except-first")
def step(opt, model, state, x, y, key):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y, key)
    updates, state = opt.update(grads, state, model)
    return eqopt.apply_updates(model, updates), state, loss


@eqx.filter_jit
def accuracy(model, x, y):
    predictions = jnp.argmax(jax.vmap(model)(x), axis=-1)
    return jnp.mean(predictions == y)


def load_data(seed: int):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # pixel values 0..16
    y = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=seed, stratify=y
    )
    mean, std = x_train.mean(0), x_train.std(0) + 1e-2
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test


def make_optimizer(steps: int):
    schedule = eqopt.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=3e-3,
        warmup_steps=steps // 20,
        decay_steps=steps,
        end_value=3e-5,
    )
    return eqopt.chain(
        eqopt.clip_by_global_norm(1.0),
        # Decay the weight matrices only: a per-leaf predicate, as in `eqx.filter`.
        eqopt.adamw(schedule, weight_decay=1e-3, mask=lambda x: x.ndim > 1),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="training steps")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument(
        "--plot", default="digits_training.png", help="where to save the plot"
    )
    args = parser.parse_args()

    start = time.perf_counter()
    x_train, y_train, x_test, y_test = load_data(args.seed)
    x_test, y_test = jnp.asarray(x_test), jnp.asarray(y_test)
    model_key, train_key = jax.random.split(jax.random.key(args.seed))
    model = Classifier(x_train.shape[1], 10, key=model_key)

    opt = make_optimizer(args.steps)
    print(opt)
    state = opt.init(model)  # the whole model: no eqx.filter

    rng = np.random.default_rng(args.seed)
    order, cursor = rng.permutation(len(x_train)), 0
    losses, eval_steps, accuracies = [], [], []
    bar = tqdm(range(args.steps), desc="training", unit="step")
    for i in bar:
        if cursor + args.batch_size > len(order):
            order, cursor = rng.permutation(len(x_train)), 0
        batch = order[cursor : cursor + args.batch_size]
        cursor += args.batch_size
        key = jax.random.fold_in(train_key, i)
        model, state, loss = step(
            opt, model, state, x_train[batch], y_train[batch], key
        )
        losses.append(loss)
        if (i + 1) % args.eval_every == 0 or i + 1 == args.steps:
            eval_steps.append(i + 1)
            accuracies.append(float(accuracy(model, x_test, y_test)))
            bar.set_postfix(loss=f"{float(loss):.2e}", test_acc=f"{accuracies[-1]:.3f}")
    losses = np.asarray(jax.device_get(losses))
    final = accuracies[-1]
    elapsed = time.perf_counter() - start
    print(
        f"held-out accuracy: {final:.4f} ({len(y_test)} test images, {elapsed:.1f} s)"
    )

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(np.arange(1, len(losses) + 1), losses, alpha=0.3, label="batch")
    window = min(50, len(losses))
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    ax_loss.plot(np.arange(window, len(losses) + 1), smooth, label=f"mean of {window}")
    ax_loss.set(xlabel="step", ylabel="training loss", yscale="log", title="Loss")
    ax_loss.legend()
    ax_acc.plot(eval_steps, accuracies, marker=".")
    ax_acc.set(
        xlabel="step", ylabel="accuracy", title=f"Held-out accuracy (final {final:.3f})"
    )
    ax_acc.set_ylim(max(0.0, min(accuracies) - 0.02), 1.0)
    ax_acc.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    print(f"saved plot to {args.plot}")


if __name__ == "__main__":
    main()
