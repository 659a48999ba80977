"""Low-memory training: 8-bit and 4-bit Adam states, bfloat16 parameters with master
weights or stochastic rounding, against float32 AdamW.

Two tasks, the same for every variant (same initialisation, same batches): the
shared character-level transformer language model of `examples/char_lm.py` and
an MLP on scikit-learn's digits (`examples/train_digits.py`'s model and data).

- `float32`: AdamW, float32 params and moments (8 bytes of state per param);
- `8-bit`, `4-bit`: the moments as `eqopt.Quantized(8)` / `eqopt.Quantized(4)`
  block-wise codes (about 2 and 1 byte per param; rounded stochastically, the
  default);
- `8-bit (nearest)`: 8-bit rounded to the nearest code (bitsandbytes'
  rounding), for contrast;
- `4-bit rank-1`: 4-bit with rank-1 scales (a maximum per row and per column,
  Li et al.'s choice) for the second moments of the matrices
  (`normalization="rank1"`);
- `4-bit (nearest)`: 4-bit rounded to the nearest code, for contrast;
- `bf16 + master`: bfloat16 params, `eqopt.master_weights(adamw)` keeps float32
  copies in the state;
- `bf16 + SR`: bfloat16 params, float32 moments, updates applied with
  `eqopt.stochastic_rounding`;
- `bf16 (nearest)`: the same without stochastic rounding, for contrast.

    python examples/low_memory.py                 # 600 + 400 steps, a few minutes on 2 CPU cores
    python examples/low_memory.py --short --out /tmp/low_memory.png
    python examples/low_memory.py --seeds 10      # digits only, the spread over seeds
    python examples/low_memory.py --regression 5  # teacher-student regression, 8-bit roundings

Prints the memory table and the final losses, and saves the loss curves.
"""

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

import eqopt

matplotlib.use("Agg")
import char_lm  # noqa: E402  (examples/ is the script's directory)
import matplotlib.pyplot as plt  # noqa: E402
import train_digits  # noqa: E402


def variants(learning_rate, weight_decay):
    """(name, optimiser, parameter dtype) of every variant."""

    def adamw(**moments):
        return eqopt.adamw(learning_rate, weight_decay=weight_decay, **moments)

    wide = dict(mu_dtype=jnp.float32, nu_dtype=jnp.float32)
    return [
        ("float32", adamw(), jnp.float32),
        (
            "8-bit",
            adamw(mu_dtype=eqopt.Quantized(8), nu_dtype=eqopt.Quantized(8)),
            jnp.float32,
        ),
        (
            "8-bit (nearest)",
            adamw(
                mu_dtype=eqopt.Quantized(8, rounding="nearest"),
                nu_dtype=eqopt.Quantized(8, rounding="nearest"),
            ),
            jnp.float32,
        ),
        (
            "4-bit",
            adamw(mu_dtype=eqopt.Quantized(4), nu_dtype=eqopt.Quantized(4)),
            jnp.float32,
        ),
        (
            "4-bit rank-1",
            adamw(
                mu_dtype=eqopt.Quantized(4),
                nu_dtype=eqopt.Quantized(4, normalization="rank1"),
            ),
            jnp.float32,
        ),
        (
            "4-bit (nearest)",
            adamw(
                mu_dtype=eqopt.Quantized(4, rounding="nearest"),
                nu_dtype=eqopt.Quantized(4, rounding="nearest"),
            ),
            jnp.float32,
        ),
        ("bf16 + master", eqopt.master_weights(adamw()), jnp.bfloat16),
        (
            "bf16 + SR",
            eqopt.chain(adamw(**wide), eqopt.stochastic_rounding(jax.random.key(0))),
            jnp.bfloat16,
        ),
        ("bf16 (nearest)", adamw(**wide), jnp.bfloat16),
    ]


# ---------------------------------------------------------------------------
# Digits
# ---------------------------------------------------------------------------


def digits_loss(model, x, y):
    logits = jax.vmap(model.mlp)(x.astype(model.mlp.layers[0].weight.dtype))
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=1))


@eqx.filter_jit
def digits_step(opt, model, state, x, y):
    loss, grads = eqx.filter_value_and_grad(digits_loss)(model, x, y)
    updates, state = opt.update(grads, state, model)
    return eqopt.apply_updates(model, updates), state, loss


def train_digits_variant(opt, dtype, steps, data, seed=0):
    x_train, y_train, x_test, y_test = data
    model = train_digits.Classifier(64, 10, key=jax.random.key(seed))
    model = jax.tree.map(
        lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model
    )
    state = opt.init(model)
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):
        index = rng.integers(0, len(x_train), 64)
        model, state, loss = digits_step(
            opt, model, state, jnp.asarray(x_train[index]), jnp.asarray(y_train[index])
        )
        losses.append(float(loss))
    test_loss = float(digits_loss(model, jnp.asarray(x_test), jnp.asarray(y_test)))
    return np.asarray(losses), test_loss, char_lm.state_bytes(state)


# ---------------------------------------------------------------------------


def final(losses):
    """The mean training loss over the last tenth of the steps (less noisy than one step)."""
    return float(np.mean(losses[-max(1, len(losses) // 10) :]))


def smooth(losses, width):
    width = max(1, min(width, len(losses)))
    return np.convolve(losses, np.ones(width) / width, mode="valid")


def seed_study(seeds, steps):
    """The digits task with `seeds` initialisations and batch orders per variant:
    how far each variant's final loss is from float32's on the same seed."""
    data = train_digits.load_data(0)
    finals, tests = {}, {}
    for name, opt, dtype in variants(3e-3, 1e-2):
        runs = [
            train_digits_variant(opt, dtype, steps, data, seed) for seed in range(seeds)
        ]
        finals[name] = np.asarray([final(losses) for losses, _, _ in runs])
        tests[name] = np.asarray([test for _, test, _ in runs])
    print(
        f"Digits MLP, {steps} steps, seeds 0-{seeds - 1} (initialisation and batches). "
        "Gap = final loss / float32's on the same seed - 1."
    )
    print(
        "| variant | final loss, mean ± sd | gap vs float32, mean ± sd | gap, median "
        "| gap, min .. max | test loss, mean |"
    )
    print("|---|---|---|---|---|---|")
    for name, values in finals.items():
        gap = 100 * (values / finals["float32"] - 1)
        print(
            f"| {name} | {values.mean():.5f} ± {values.std(ddof=1):.5f} "
            f"| {gap.mean():+.1f}% ± {gap.std(ddof=1):.1f}% | {np.median(gap):+.1f}% "
            f"| {gap.min():+.1f}% .. {gap.max():+.1f}% | {tests[name].mean():.4f} |"
        )


# ---------------------------------------------------------------------------
# Teacher-student regression
# ---------------------------------------------------------------------------


def regression_variants(learning_rate):
    """(name, optimiser) of the regression study: 8-bit Adam with the default
    rounding, and rounded to nearest with both moments or one of them in 8 bits."""
    nearest = eqopt.Quantized(8, rounding="nearest")
    return [
        ("float32", eqopt.adam(learning_rate)),
        (
            "8-bit",
            eqopt.adam(
                learning_rate, mu_dtype=eqopt.Quantized(8), nu_dtype=eqopt.Quantized(8)
            ),
        ),
        (
            "8-bit (nearest)",
            eqopt.adam(learning_rate, mu_dtype=nearest, nu_dtype=nearest),
        ),
        ("8-bit nu only (nearest)", eqopt.adam(learning_rate, nu_dtype=nearest)),
        ("8-bit mu only (nearest)", eqopt.adam(learning_rate, mu_dtype=nearest)),
    ]


def regression_loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


@eqx.filter_jit
def regression_step(opt, model, state, x, y):
    loss, grads = eqx.filter_value_and_grad(regression_loss)(model, x, y)
    updates, state = opt.update(grads, state, model)
    return eqopt.apply_updates(model, updates), state, loss


def train_regression(opt, steps, seed):
    """A student MLP 40-128-128-10 fitted to a random teacher of the same shape on
    1024 noisy examples (batches of 64, 50 epochs: it overfits); returns the
    training losses and the loss on 4096 held-out examples."""
    keys = jax.random.split(jax.random.key(1000 + seed), 5)
    teacher = eqx.nn.MLP(40, 10, 128, 2, activation=jnp.tanh, key=keys[0])
    student = eqx.nn.MLP(40, 10, 128, 2, activation=jnp.tanh, key=keys[1])
    x = jax.random.normal(keys[2], (5120, 40))
    y = jax.vmap(teacher)(x) + 0.1 * jax.random.normal(keys[3], (5120, 10))
    x_train, y_train, x_test, y_test = x[:1024], y[:1024], x[1024:], y[1024:]
    state = opt.init(student)
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):
        index = rng.integers(0, 1024, 64)
        student, state, loss = regression_step(
            opt, student, state, x_train[index], y_train[index]
        )
        losses.append(float(loss))
    return np.asarray(losses), float(regression_loss(student, x_test, y_test))


def regression_study(seeds, steps):
    """The teacher-student regression with `seeds` seeds per variant: the gap of
    each variant's final training and held-out losses to float32 Adam's."""
    finals, tests = {}, {}
    for name, opt in regression_variants(1e-3):
        runs = [train_regression(opt, steps, seed) for seed in range(seeds)]
        finals[name] = np.asarray([final(losses) for losses, _ in runs])
        tests[name] = np.asarray([test for _, test in runs])
    print(
        f"Teacher-student regression, MLP 40-128-128-10, Adam 1e-3, {steps} steps, "
        f"seeds 0-{seeds - 1}. Gap = loss / float32's on the same seed - 1."
    )
    print(
        "| variant | final loss, mean | gap, mean (min .. max) | held-out gap, mean (min .. max) |"
    )
    print("|---|---|---|---|")
    for name in finals:
        gap = 100 * (finals[name] / finals["float32"] - 1)
        held_out = 100 * (tests[name] / tests["float32"] - 1)
        print(
            f"| {name} | {finals[name].mean():.5f} "
            f"| {gap.mean():+.2f}% ({gap.min():+.2f}% .. {gap.max():+.2f}%) "
            f"| {held_out.mean():+.2f}% ({held_out.min():+.2f}% .. {held_out.max():+.2f}%) |"
        )


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="language-model steps")
    parser.add_argument("--digits-steps", type=int, default=400)
    parser.add_argument("--short", action="store_true", help="30 + 60 steps (CI)")
    parser.add_argument("--out", default="low_memory.png")
    parser.add_argument(
        "--seeds",
        type=int,
        default=0,
        help="only the digits task, over this many seeds (the spread of the gaps)",
    )
    parser.add_argument(
        "--regression",
        type=int,
        default=0,
        help="only the teacher-student regression, over this many seeds",
    )
    args = parser.parse_args()
    if args.regression:
        regression_study(args.regression, 800)
        return
    if args.seeds:
        seed_study(args.seeds, args.digits_steps)
        return
    if args.short:
        args.steps, args.digits_steps = 30, 60
    task = char_lm.make_task()
    n_params = sum(
        x.size for x in jax.tree.leaves(eqx.filter(task.model(), eqx.is_inexact_array))
    )
    data = train_digits.load_data(0)
    results = {}
    for name, opt, dtype in variants(3e-3, 1e-2):
        start = time.perf_counter()
        lm = char_lm.train(opt, args.steps, task, dtype=dtype)
        digits = train_digits_variant(opt, dtype, args.digits_steps, data)
        results[name] = (lm, digits, jnp.dtype(dtype).itemsize)
        print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)

    reference_lm, reference_digits, _ = results["float32"]
    print(
        f"\nLanguage model: {n_params} params, {args.steps} steps; digits MLP: "
        f"{args.digits_steps} steps. Final loss = mean over the last tenth of the steps."
    )
    print(
        "| variant | param bytes | state bytes/param (LM) | LM final loss | vs float32 "
        "| LM held-out | digits final loss | vs float32 | digits test loss |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (lm, digits, param_bytes) in results.items():
        lm_final, digits_final = final(lm.losses), final(digits[0])
        print(
            f"| {name} | {param_bytes} | {lm.state_bytes / n_params:.2f} "
            f"| {lm_final:.4f} | {100 * (lm_final / final(reference_lm.losses) - 1):+.2f}% "
            f"| {lm.held_out_loss:.4f} | {digits_final:.4f} "
            f"| {100 * (digits_final / final(reference_digits[0]) - 1):+.2f}% "
            f"| {digits[1]:.4f} |"
        )

    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, (lm, digits, _) in results.items():
        style = "--" if name.startswith("bf16") else ":" if "4-bit " in name else "-"
        axes[0].plot(smooth(lm.losses, 20), style, label=name)
        axes[1].plot(smooth(digits[0], 50), style, label=name)
    axes[0].set(title="Character language model", xlabel="step", ylabel="training loss")
    axes[1].set(title="Digits MLP", xlabel="step", yscale="log")
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
