"""Fine-tune a pretrained transformer with parameter groups, against one global rate.

A small Equinox transformer (token and position embeddings, a list of pre-norm
blocks with biases, a final LayerNorm, a `head`) is pretrained on task A: for
every token, how often its token occurs in the sequence (1, 2, 3 or 4 and more).
Its head is then replaced by a new one for task B, a related task with a small
training set: the largest count of any token in the sequence (2 or less, 3, 4,
5 or more). The pretrained features count tokens, but only up to four, so the
backbone has a little to learn too.

Fine-tuning runs, from the same pretrained model, on the same batches:

- AdamW with one global rate, a sweep of rates;
- `eqopt.param_groups` over the same AdamW: a 10x rate for the new head, no
  weight decay on the LayerNorms and biases, layer decay 0.75, on the same
  sweep of base rates;
- for reference, the head alone (the backbone frozen) and the same model
  trained without pretraining.

    python examples/fine_tuning.py                  # 3 seeds, a few minutes on 2 CPU cores
    python examples/fine_tuning.py --short --out /tmp/fine_tuning.png

Prints the groups' report, the held-out accuracy on task B of each run (mean
and spread over seeds) and how much of task A each backbone still does, and
saves the accuracy curves and the sweep.
"""

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
from tqdm import tqdm

import eqopt

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

VOCAB, LENGTH, WIDTH, DEPTH, HEADS = 12, 16, 64, 4, 4
CHUNK = 25  # steps per compiled call (one `lax.scan`), and between evaluations


class Block(eqx.Module):
    """Pre-norm transformer block: self-attention then an MLP, every layer with biases."""

    norm1: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP

    def __init__(self, *, key):
        k1, k2 = jax.random.split(key)
        self.norm1 = eqx.nn.LayerNorm(WIDTH)
        biases = dict.fromkeys(
            ("use_query_bias", "use_key_bias", "use_value_bias", "use_output_bias"),
            True,
        )
        self.attention = eqx.nn.MultiheadAttention(HEADS, WIDTH, **biases, key=k1)
        self.norm2 = eqx.nn.LayerNorm(WIDTH)
        self.mlp = eqx.nn.MLP(WIDTH, WIDTH, 2 * WIDTH, 1, jax.nn.gelu, key=k2)

    def __call__(self, x):
        h = jax.vmap(self.norm1)(x)
        x = x + self.attention(h, h, h)
        return x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))


class Transformer(eqx.Module):
    """Embeddings, `DEPTH` blocks, a final norm and a head (logits at every position)."""

    embedding: eqx.nn.Embedding
    position: eqx.nn.Embedding
    blocks: list[Block]
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, classes: int, *, key):
        keys = jax.random.split(key, DEPTH + 3)
        self.embedding = eqx.nn.Embedding(VOCAB, WIDTH, key=keys[0])
        self.position = eqx.nn.Embedding(LENGTH, WIDTH, key=keys[1])
        self.blocks = [Block(key=k) for k in keys[3:]]
        self.norm = eqx.nn.LayerNorm(WIDTH)
        self.head = eqx.nn.Linear(WIDTH, classes, key=keys[2])

    def __call__(self, tokens):
        x = jax.vmap(self.embedding)(tokens)
        x = x + jax.vmap(self.position)(jnp.arange(LENGTH))
        for block in self.blocks:
            x = block(x)
        return jax.vmap(self.head)(jax.vmap(self.norm)(x))


# -- The tasks: random sequences of 16 tokens out of 12 --------------------------


def counts_of(tokens):
    """For every position, how often its token occurs in the sequence."""
    return (tokens[:, :, None] == tokens[:, None, :]).sum(-1)


def task_a(rng, n):
    """Task A, per token: it occurs 1, 2, 3, or 4 or more times (classes 0-3)."""
    tokens = rng.integers(0, VOCAB, (n, LENGTH))
    return tokens.astype(np.int32), np.minimum(counts_of(tokens), 4).astype(
        np.int32
    ) - 1


def task_b(rng, n):
    """Task B, per sequence: the largest count is 2 or less, 3, 4, or 5 or more."""
    tokens = rng.integers(0, VOCAB, (n, LENGTH))
    largest = counts_of(tokens).max(-1)
    return tokens.astype(np.int32), np.clip(largest, 2, 5).astype(np.int32) - 2


def logits(model, tokens, pooled):
    out = jax.vmap(model)(tokens)
    # Task B's logits: the mean over positions (the head is affine: the head of the
    # mean of the features).
    return out.mean(1) if pooled else out


def loss_fn(model, tokens, labels, pooled):
    log_probs = jax.nn.log_softmax(logits(model, tokens, pooled))
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[..., None], axis=-1))


@eqx.filter_jit(donate="all-except-first")
def train_chunk(opt, model, state, tokens, labels, pooled):
    """`CHUNK` steps in one compiled call: one compilation per kind of optimiser."""
    params, static = eqx.partition(model, eqx.is_array)

    def step(carry, batch):
        params, state = carry
        model = eqx.combine(params, static)
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, *batch, pooled)
        updates, state = opt.update(grads, state, model)
        return (
            eqx.filter(eqopt.apply_updates(model, updates), eqx.is_array),
            state,
        ), loss

    (params, state), losses = jax.lax.scan(step, (params, state), (tokens, labels))
    return eqx.combine(params, static), state, losses


@eqx.filter_jit
def accuracy(model, tokens, labels, pooled):
    return jnp.mean(jnp.argmax(logits(model, tokens, pooled), -1) == labels)


def batches(rng, data, steps, batch_size):
    """`steps` batches drawn from a fixed training set, in chunks of `CHUNK`."""
    tokens, labels = data
    for _ in range(steps // CHUNK):
        index = rng.integers(0, len(tokens), (CHUNK, batch_size))
        yield tokens[index], labels[index]


# -- Pretraining on task A, and the optimisers for task B -------------------------


def pretrain(steps, seed):
    model = Transformer(4, key=jax.random.key(seed))
    schedule = eqopt.warmup_cosine_decay_schedule(0.0, 3e-3, steps // 20, steps, 1e-5)
    opt = eqopt.adamw(schedule, weight_decay=1e-2)
    state = opt.init(model)
    rng = np.random.default_rng(seed)
    bar = tqdm(range(steps // CHUNK), desc="pretraining on A", unit="chunk")
    for _ in bar:
        tokens, labels = task_a(rng, CHUNK * 64)
        shape = (CHUNK, 64, LENGTH)
        model, state, losses = train_chunk(
            opt, model, state, tokens.reshape(shape), labels.reshape(shape), False
        )
        bar.set_postfix(loss=f"{float(losses[-1]):.3f}")
    return model


def schedule(peak, steps):
    """A warm-up of `CHUNK` steps to `peak`, then a cosine decay to 0."""
    return eqopt.warmup_cosine_decay_schedule(0.0, peak, CHUNK, steps, 0.0)


def grouped(peak, steps):
    """The parameter groups: the page shows this call."""
    return eqopt.param_groups(
        eqopt.adamw(schedule(peak, steps), weight_decay=0.05),
        groups=[
            eqopt.Group(select=r"^head\.", name="head", lr_mult=10.0),
            eqopt.Group(
                select=(eqx.nn.LayerNorm, eqopt.in_layer(eqx.nn.Linear, field="bias")),
                name="no_decay",
                wd_mult=0.0,
            ),
        ],
        layer_decay=eqopt.layer_decay(0.75),
    )


def head_only(model, peak, steps):
    backbone = eqx.tree_at(lambda m: m.head, jax.tree.map(lambda _: True, model), False)
    return eqopt.chain(
        eqopt.freeze(backbone), eqopt.adamw(schedule(peak, steps), weight_decay=0.05)
    )


def runs(pretrained, rates, head_rates, steps, seed):
    """(name, rate, optimiser, starting model) of every fine-tuning run."""
    head = eqx.nn.Linear(WIDTH, 4, key=jax.random.key(1000 + seed))
    start = eqx.tree_at(lambda m: m.head, pretrained, head)
    untrained = eqx.tree_at(
        lambda m: m.head, Transformer(4, key=jax.random.key(2000 + seed)), head
    )
    out = [
        ("global rate", r, eqopt.adamw(schedule(r, steps), weight_decay=0.05), start)
        for r in rates
    ]
    # The groups' base rates: the same, but the largest (its head would get 0.1).
    out += [("param groups", r, grouped(r, steps), start) for r in rates[:-1]]
    out += [("head only", r, head_only(start, r, steps), start) for r in head_rates]
    out += [
        (
            "no pretraining",
            1e-3,
            eqopt.adamw(schedule(1e-3, steps), weight_decay=0.05),
            untrained,
        )
    ]
    return out


def copy(model):
    return jax.tree.map(lambda x: x.copy() if eqx.is_array(x) else x, model)


def fine_tune(opt, model, data, held_out, steps, seed):
    state = opt.init(model)
    model = copy(model)  # the step donates its buffers; `model` is shared by runs
    # The curve on the first 512 held-out sequences (cheaper), the end on them all.
    part = tuple(x[:512] for x in held_out)
    curve = [float(accuracy(model, *part, True))]
    rng = np.random.default_rng(seed)  # the same batches for every run of a seed
    for tokens, labels in batches(rng, data, steps, 32):
        model, state, _ = train_chunk(opt, model, state, tokens, labels, True)
        curve.append(float(accuracy(model, *part, True)))
    return model, np.asarray(curve), float(accuracy(model, *held_out, True))


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--train-size", type=int, default=1024, help="task B's examples"
    )
    parser.add_argument("--out", default="fine_tuning.png", help="the plot")
    parser.add_argument("--short", action="store_true", help="a quick run (for CI)")
    args = parser.parse_args(argv)
    start_time = time.perf_counter()
    if args.short:
        pretrain_steps, steps, seeds = 200, 150, 1
        rates, head_rates = (1e-3, 1e-2), (1e-2,)
    else:
        pretrain_steps, steps, seeds = 600, 400, args.seeds
        rates, head_rates = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2), (1e-2, 3e-2)

    pretrained = pretrain(pretrain_steps, seed=0)
    a_test = tuple(map(jnp.asarray, task_a(np.random.default_rng(10**6), 1024)))
    b_test = tuple(map(jnp.asarray, task_b(np.random.default_rng(10**6 + 1), 2048)))
    print(
        f"pretrained: task A accuracy {float(accuracy(pretrained, *a_test, False)):.3f}"
    )

    # Who got what: the groups' report on the model with its new head, after the
    # warm-up (at step 0 the warm-up's rate is 0).
    head = eqx.nn.Linear(WIDTH, 4, key=jax.random.key(0))
    model = copy(eqx.tree_at(lambda m: m.head, pretrained, head))
    opt = grouped(1e-3, steps)
    state = opt.init(model)
    data = task_b(np.random.default_rng(0), args.train_size)
    tokens, labels = next(batches(np.random.default_rng(0), data, steps, 32))
    _, state, _ = train_chunk(opt, model, state, tokens, labels, True)
    print(eqopt.param_groups_report(opt, state))
    now = eqopt.current_hyperparams(opt, state)
    print(
        "rates after the warm-up: "
        + ", ".join(
            f"{key} {float(now[key]):.3g}"
            for key in (
                "head.layer5.learning_rate",
                "default.layer4.learning_rate",
                "default.layer1.learning_rate",
                "default.layer0.learning_rate",
            )
        )
    )

    results: dict[tuple[str, float], list] = {}
    total = seeds * len(runs(pretrained, rates, head_rates, steps, 0))
    bar = tqdm(total=total, desc="fine-tuning on B", unit="run")
    for seed in range(seeds):
        data = task_b(np.random.default_rng(100 + seed), args.train_size)
        for name, rate, opt, model in runs(pretrained, rates, head_rates, steps, seed):
            model, curve, end = fine_tune(opt, model, data, b_test, steps, seed)
            # What the backbone still does of task A, under its old head.
            old = eqx.tree_at(lambda m: m.head, model, pretrained.head)
            kept = float(accuracy(old, *a_test, False))
            results.setdefault((name, rate), []).append((curve, end, kept))
            bar.update()
    bar.close()

    print(
        f"\nTask B: {args.train_size} training sequences, {steps} steps of batch 32, "
        f"held-out accuracy on {len(b_test[1])} sequences "
        f"(mean ± std over {seeds} seed{'s' * (seeds > 1)}); task A kept: the task-A "
        "accuracy of the fine-tuned backbone under the pretrained head."
    )
    majority = float(np.bincount(np.asarray(b_test[1])).max() / len(b_test[1]))
    print(f"always the most common class: {majority:.3f}")
    print("| fine-tuning | rate | task B accuracy | task A kept |")
    print("|---|---|---|---|")
    for (name, rate), found in results.items():
        accuracies, kept = final(found), np.mean([k for _, _, k in found])
        print(
            f"| {name} | {rate:g} | {accuracies.mean():.3f} ± {accuracies.std():.3f} "
            f"| {kept:.3f} |"
        )
    best = {}
    for name in ("global rate", "param groups"):
        means = {r: final(f).mean() for (n, r), f in results.items() if n == name}
        best[name] = max(means.items(), key=lambda item: item[1])
        print(f"best {name}: {best[name][1]:.3f} at {best[name][0]:g}")
    print(f"({time.perf_counter() - start_time:.0f} s)")
    plot(results, best, rates, steps, majority, args.out)
    print(f"saved plot to {args.out}")
    return results


def final(found):
    """The final held-out accuracies of a run, one per seed."""
    return np.asarray([end for _, end, _ in found])


def plot(results, best, rates, steps, majority, out):
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = np.arange(0, steps + 1, CHUNK)
    blues = plt.get_cmap("Blues")(np.linspace(0.35, 1.0, len(rates)))
    for rate, colour in zip(rates, blues, strict=True):
        curves = np.stack([curve for curve, _, _ in results[("global rate", rate)]])
        left.plot(
            x, curves.mean(0), color=colour, lw=1.2, label=f"global rate {rate:g}"
        )
    rate = best["param groups"][0]
    curves = np.stack([curve for curve, _, _ in results[("param groups", rate)]])
    left.plot(
        x, curves.mean(0), color="C3", lw=2.5, label=f"param groups, base {rate:g}"
    )
    left.set(
        xlabel="fine-tuning step", ylabel="held-out accuracy on task B (512 sequences)"
    )
    left.set_title("During fine-tuning (mean over seeds)")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    for name, marker, colour in (
        ("global rate", "o", "C0"),
        ("param groups", "s", "C3"),
    ):
        found = [r for r in rates if (name, r) in results]
        values = [final(results[(name, r)]) for r in found]
        right.errorbar(
            found,
            [v.mean() for v in values],
            yerr=[v.std() for v in values],
            marker=marker,
            color=colour,
            capsize=3,
            label=name,
        )
    head = max(
        (final(f).mean() for (n, _), f in results.items() if n == "head only"),
        default=None,
    )
    if head is not None:
        right.axhline(head, ls="--", lw=1, color="C2", label="head only (best rate)")
    untrained = final(next(f for (n, _), f in results.items() if n == "no pretraining"))
    right.axhline(
        untrained.mean(), ls=":", lw=1.5, color="gray", label="no pretraining"
    )
    right.axhline(majority, lw=0.8, color="black", label="the most common class")
    right.set(xscale="log", xlabel="learning rate (param groups: the base rate)")
    right.set_title("Final held-out accuracy on task B (mean ± std)")
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
