"""Train the same Equinox MLP on scikit-learn's digits with AdamW and with Muon.

Muon orthogonalises the momentum of the hidden weight matrices (Jordan et al.,
2024). Which leaves get Muon is an Equinox filter spec: a tree of bools shaped
like the model, `True` at the hidden layers' weights, built with `eqx.tree_at`.
Every other leaf (the input and output layers, all biases) is trained by
AdamW inside the same optimiser, as the Muon authors recommend. Both runs start
from the same initialisation, see the same batches and use the same learning
rate schedule shape.

    python examples/muon_vs_adamw.py                       # 1500 steps each
    python examples/muon_vs_adamw.py --short --out /tmp/m.png

Prints both final test accuracies and saves one plot with both loss curves.
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


def load_data(seed: int):
    x, y = load_digits(return_X_y=True)
    x, y = (np.asarray(x) / 16.0).astype(np.float32), np.asarray(y).astype(np.int32)
    x_train, x_test, y_train, y_test = map(
        np.asarray,
        train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y),
    )
    mean, std = x_train.mean(0), x_train.std(0) + 1e-2
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test


def make_model(seed: int) -> eqx.nn.MLP:
    # 64 -> 128 -> 128 -> 128 -> 10: two hidden 128x128 matrices.
    return eqx.nn.MLP(64, 10, width_size=128, depth=3, key=jax.random.key(seed))


def hidden_matrices(model: eqx.nn.MLP):
    """A filter spec: `True` at the hidden layers' weights, `False` everywhere else."""
    spec = jax.tree.map(lambda _: False, model)
    return eqx.tree_at(
        lambda m: [layer.weight for layer in m.layers[1:-1]],
        spec,
        replace_fn=lambda _: True,
    )


def make_optimizers(model, steps: int):
    def schedule(peak):
        return eqopt.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=peak,
            warmup_steps=max(steps // 20, 1),
            decay_steps=steps,
            end_value=peak / 100,
        )

    adamw = eqopt.adamw(schedule(3e-3), weight_decay=1e-4)
    muon = eqopt.contrib.muon(
        learning_rate=schedule(0.02),
        muon_weight_dimension_numbers=hidden_matrices(model),
        adam_learning_rate=schedule(3e-3),
        adam_weight_decay=1e-4,
    )
    return {"AdamW": adamw, "Muon": muon}


def loss_fn(model, x, y):
    logits = jax.vmap(model)(x)
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=1))


@eqx.filter_jit(donate="all-except-first")
def step(opt, model, state, x, y):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, state = opt.update(grads, state, model)
    return eqopt.apply_updates(model, updates), state, loss


@eqx.filter_jit
def accuracy(model, x, y):
    return jnp.mean(jnp.argmax(jax.vmap(model)(x), axis=-1) == y)


def train(name, opt, model, data, steps, batch_size, seed):
    x_train, y_train, x_test, y_test = data
    state = opt.init(model)  # the whole model: no eqx.filter
    rng = np.random.default_rng(seed)  # same batches for both optimisers
    order, cursor, losses = rng.permutation(len(x_train)), 0, []
    bar = tqdm(range(steps), desc=f"{name:>5}", unit="step")
    for i in bar:
        if cursor + batch_size > len(order):
            order, cursor = rng.permutation(len(x_train)), 0
        batch = order[cursor : cursor + batch_size]
        cursor += batch_size
        model, state, loss = step(opt, model, state, x_train[batch], y_train[batch])
        losses.append(loss)
        if (i + 1) % 50 == 0 or i + 1 == steps:
            bar.set_postfix(loss=f"{float(loss):.2e}")
    return np.asarray(jax.device_get(losses)), float(accuracy(model, x_test, y_test))


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="steps per optimiser")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="muon_vs_adamw.png", help="the loss plot")
    parser.add_argument("--short", action="store_true", help="a few steps (for CI)")
    args = parser.parse_args(argv)
    steps = 40 if args.short else args.steps

    start = time.perf_counter()
    x_train, y_train, x_test, y_test = load_data(args.seed)
    data = (x_train, y_train, jnp.asarray(x_test), jnp.asarray(y_test))
    results = {}
    for name, opt in make_optimizers(make_model(args.seed), steps).items():
        # The same initialisation for both (a fresh copy: the step donates it).
        model = make_model(args.seed)
        results[name] = train(name, opt, model, data, steps, args.batch_size, args.seed)
    for name, (_, test_accuracy) in results.items():
        print(f"{name} test accuracy: {test_accuracy:.4f}")
    print(f"({len(y_test)} test images, {time.perf_counter() - start:.1f} s)")

    fig, ax = plt.subplots(figsize=(7, 4))
    window, floor = min(25, steps), 1e-6  # a loss that reaches 0 stays on the log axis
    for name, (losses, test_accuracy) in results.items():
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        smooth = np.maximum(smooth, floor)
        ax.plot(
            np.arange(window, len(losses) + 1),
            smooth,
            label=f"{name} (test accuracy {test_accuracy:.3f})",
        )
    ax.set(
        xlabel="step",
        ylabel=f"training loss (mean of {window})",
        yscale="log",
        title="Digits MLP: Muon on the hidden matrices vs AdamW",
    )
    ax.set_ylim(bottom=floor / 2)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"saved plot to {args.out}")
    return results


if __name__ == "__main__":
    main()
