"""Gradient accumulation with `MultiSteps`, and a frozen layer chosen with a filter spec.

Two everyday needs in one training loop:

- **Freezing part of a model.** Which leaves to freeze is an Equinox filter
  spec built on the model itself with `eqx.tree_at`: a pytree shaped like the
  model with `True` over the frozen first layer and `False` elsewhere.
  `eqopt.selective_transform(opt, freeze_mask=spec)` gives those leaves zero
  updates, and the wrapped Adam keeps no moments for them (`None` in the state).
- **Gradient accumulation.** `eqopt.MultiSteps(opt, every_k_schedule=4)` averages
  the gradients of four micro-batches and applies `opt` once every fourth call,
  returning zero updates in between. Four micro-batches of 32 examples then
  give exactly the update of one batch of 128, with a quarter of the memory
  for activations.

The script trains the same model twice, once on batches of 128 and once on
micro-batches of 32 with `MultiSteps`, and checks that the two runs agree and
that the frozen layer never moved.

    python examples/accumulation_and_freezing.py --out accumulation_and_freezing.png
    python examples/accumulation_and_freezing.py --short     # the quick run the tests use

About 20 s on a 2-core CPU; `--short` (what the tests run) about 15 s,
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

MICRO_BATCH = 32
EVERY_K = 4  # micro-batches per update: an effective batch of 128


@eqx.filter_jit
def make_data(key, num_points: int = 4096, in_size: int = 8):
    """Inputs and targets from a random "teacher" MLP, plus noise."""
    x_key, teacher_key, noise_key = jax.random.split(key, 3)
    x = jax.random.normal(x_key, (num_points, in_size))
    teacher = eqx.nn.MLP(in_size, 1, 32, 2, activation=jax.nn.tanh, key=teacher_key)
    y = jax.vmap(teacher)(x)
    return x, y + 0.05 * jax.random.normal(noise_key, y.shape)


def loss_fn(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


@eqx.filter_jit(donate="all-except-first")
def step(opt, model, state, x, y):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, state = opt.update(grads, state, model)
    return eqopt.apply_updates(model, updates), state, loss


def copy_model(model):
    return jax.tree.map(lambda a: a.copy() if eqx.is_array(a) else a, model)


# The checks below run in NumPy on the host: no compilation for each shape.
def max_difference(a, b):
    """The largest absolute difference between the arrays of two models."""
    diffs = jax.tree.map(
        lambda u, v: np.max(np.abs(np.asarray(u) - np.asarray(v))),
        eqx.filter(a, eqx.is_array),
        eqx.filter(b, eqx.is_array),
    )
    return float(max(jax.tree.leaves(diffs)))


def layer_changes(before, after):
    """The norm of the change of each layer's weight matrix."""
    return [
        float(np.linalg.norm(np.asarray(new.weight) - np.asarray(old.weight)))
        for old, new in zip(before.layers, after.layers, strict=True)
    ]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--updates", type=int, default=400, help="optimiser updates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="accumulation_and_freezing.png")
    parser.add_argument("--short", action="store_true", help="a quick run for CI")
    args = parser.parse_args()
    if args.short:
        args.updates = 25

    data_key, model_key = jax.random.split(jax.random.key(args.seed))
    x, y = make_data(data_key)
    model = eqx.nn.MLP(8, 1, 64, 2, activation=jax.nn.tanh, key=model_key)
    initial = copy_model(model)  # `step` donates (consumes) the buffers it is given

    # The filter spec: shaped like the model, True over the first layer.
    freeze_spec = eqx.tree_at(
        lambda m: m.layers[0], jax.tree.map(lambda _: False, model), True
    )
    optimiser = eqopt.selective_transform(eqopt.adam(3e-3), freeze_mask=freeze_spec)
    accumulating = eqopt.MultiSteps(optimiser, every_k_schedule=EVERY_K)

    big_state = optimiser.init(model)
    micro_state = accumulating.init(model)
    adam_state = micro_state.inner_opt_state.inner_state.scale_by_adam
    print(f"Adam moments kept for the frozen layer: {adam_state.mu.layers[0].weight}")

    big_model, micro_model = copy_model(model), copy_model(model)
    rng = np.random.default_rng(args.seed)
    big_losses, micro_losses = [], []
    batch_size = EVERY_K * MICRO_BATCH
    for _ in tqdm(range(args.updates), desc="training", unit="update"):
        batch = rng.choice(len(x), batch_size, replace=False)
        # One update on the whole batch of 128...
        big_model, big_state, loss = step(
            optimiser, big_model, big_state, x[batch], y[batch]
        )
        big_losses.append(loss)
        # ...equals four calls on its micro-batches of 32 with `MultiSteps`.
        micro = []
        for micro_batch in np.split(batch, EVERY_K):
            micro_model, micro_state, loss = step(
                accumulating, micro_model, micro_state, x[micro_batch], y[micro_batch]
            )
            micro.append(loss)
        micro_losses.append(jnp.mean(jnp.stack(micro)))

    big_losses = np.asarray(jax.device_get(big_losses))
    micro_losses = np.asarray(jax.device_get(micro_losses))
    print(f"updates made by MultiSteps: {int(micro_state.gradient_step)}")
    print(f"final loss, batches of {batch_size}: {big_losses[-1]:.5f}")
    print(f"final loss, {EVERY_K} x {MICRO_BATCH} accumulated: {micro_losses[-1]:.5f}")
    print(
        "max |difference| between the two trained models: "
        f"{max_difference(big_model, micro_model):.2e}"
    )
    frozen_still = np.array_equal(
        micro_model.layers[0].weight, initial.layers[0].weight
    ) and np.array_equal(micro_model.layers[0].bias, initial.layers[0].bias)
    print(f"frozen layer unchanged: {frozen_still}")
    changes = layer_changes(initial, micro_model)
    print("weight change per layer: " + ", ".join(f"{c:.3g}" for c in changes))

    fig, (ax_loss, ax_change) = plt.subplots(
        1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]}
    )
    updates = np.arange(1, args.updates + 1)
    ax_loss.plot(updates, big_losses, lw=3, alpha=0.4, label=f"batches of {batch_size}")
    ax_loss.plot(
        updates,
        micro_losses,
        lw=1,
        color="k",
        label=f"MultiSteps: {EVERY_K} micro-batches of {MICRO_BATCH}",
    )
    ax_loss.set(xlabel="optimiser update", ylabel="training loss", yscale="log")
    ax_loss.set_title("One big batch = k accumulated micro-batches")
    ax_loss.legend()
    names = ["layer 0\n(frozen)"] + [f"layer {i}" for i in range(1, len(changes))]
    ax_change.bar(names, changes, color=["grey"] + ["C0"] * (len(changes) - 1))
    ax_change.set(ylabel="‖W_trained − W_initial‖", title="How far each layer moved")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"saved plot to {args.out}")


if __name__ == "__main__":
    main()
