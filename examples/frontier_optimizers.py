"""The newest optimisers against AdamW and Muon, on one small character-level language model.

MuonClip (Muon with QK-clip), AdaMuon, Scion, LaProp, MuonH (Muon on the
hyperball), SPlus, Dion, Muon with Gram Newton-Schulz and AdamW with cautious
weight decay train the transformer of `examples/char_lm.py` from the same
initialisation on the same batches, beside AdamW and Muon. The steps of all
optimisers are interleaved (one step of each in turn), so a load on the machine
slows them alike; AdamW runs twice (an A/A pair) to show how far two identical
runs' timings differ. Every step also records the largest pre-softmax attention
logit of the model (`eqopt.contrib.attention_max_logits`), which MuonClip needs
and which shows what its QK-clip does.

    python examples/frontier_optimizers.py                  # 80 steps each
    python examples/frontier_optimizers.py --short --out /tmp/frontier.png

Prints a table (final and held-out loss, state memory and step time relative to
AdamW, largest attention logit) and saves one figure: loss per step, loss per
second, and the largest attention logit per step of Muon with and without QK-clip.
"""

import argparse
import pathlib
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

import eqopt

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import char_lm  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LEARNING_RATE = 3e-3  # AdamW's, and of every AdamW part
WEIGHT_DECAY = 1e-2
MUON_LEARNING_RATE = 0.02  # Muon's, and of the other orthogonalising optimisers
CLIP_LEARNING_RATE = 0.05  # the Muon / MuonClip pair: high enough to pass TAU
TAU = 12.0  # QK-clip's threshold


def hidden_matrices(model, value):
    """A filter spec: `value` at every 2-D weight inside the transformer blocks.

    The embedding, position table and readout are left to AdamW, as Muon's
    authors recommend; Equinox's `Linear` weights are `(out, in)`, so neurons
    are rows (`reduction_axis=1`).
    """
    spec = jax.tree.map(lambda _: False, model)
    blocks = jax.tree.map(
        lambda x: value if eqx.is_array(x) and x.ndim == 2 else False, model.blocks
    )
    return eqx.tree_at(lambda m: m.blocks, spec, blocks)


def loss_and_max_logits(model, tokens):
    """`char_lm.loss_fn`, and the largest attention logit of each head of each block
    over the batch, as MuonClip's `max_logits`: `{"blocks": [{"attention": s}]}`
    mirrors the path `model.blocks[i].attention` of each attention layer."""

    def forward(tokens):
        x = jax.vmap(model.embedding)(tokens) + model.position[: tokens.shape[0]]
        mask = jnp.tril(jnp.ones((tokens.shape[0], tokens.shape[0]), bool))
        logits = []
        for block in model.blocks:
            h = jax.vmap(block.norm1)(x)
            logits.append(
                eqopt.contrib.attention_max_logits(block.attention, h, h, mask=mask)
            )
            x = block(x)
        return jax.vmap(model.readout)(jax.vmap(model.norm)(x)), logits

    outputs, logits = jax.vmap(forward)(tokens[:, :-1])
    log_probs = jax.nn.log_softmax(outputs.astype(jnp.float32))
    loss = -jnp.mean(jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1))
    max_logits = {"blocks": [{"attention": jnp.max(s, axis=0)} for s in logits]}
    return loss, max_logits


def make_optimizers(model, names=None):
    lr, wd, muon_lr = LEARNING_RATE, WEIGHT_DECAY, MUON_LEARNING_RATE
    rows = eqopt.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=0)
    hidden = hidden_matrices(model, rows)
    muon = dict(
        weight_decay=wd,
        muon_weight_dimension_numbers=hidden,
        adam_learning_rate=lr,
        adam_weight_decay=wd,
    )
    # The pair differs only by the clip: MuonClip's Kimi K2 defaults
    # (consistent_rms=0.2, nesterov=False) are set back to Muon's.
    pair = dict(muon, nesterov=True, consistent_rms=None)
    optimizers = {
        "AdamW": lambda: eqopt.adamw(lr, weight_decay=wd),
        "AdamW (A/A)": lambda: eqopt.adamw(lr, weight_decay=wd),
        "AdamW cautious WD": lambda: eqopt.adamw(
            lr, weight_decay=wd, cautious_weight_decay=True
        ),
        "LaProp": lambda: eqopt.contrib.laprop(lr, weight_decay=wd),
        "Muon": lambda: eqopt.contrib.muon(CLIP_LEARNING_RATE, **pair),
        "MuonClip": lambda: eqopt.contrib.muon_clip(
            CLIP_LEARNING_RATE, qk_clip_threshold=TAU, **pair
        ),
        f"Muon lr {muon_lr}": lambda: eqopt.contrib.muon(muon_lr, **muon),
        "Muon Gram NS": lambda: eqopt.contrib.muon(
            muon_lr, orthogonalization="gram", **muon
        ),
        "AdaMuon": lambda: eqopt.contrib.adamuon(
            lr,
            weight_decay=wd,
            adamuon_weight_dimension_numbers=hidden,
            adam_weight_decay=wd,
        ),
        "MuonH": lambda: eqopt.contrib.muonh(
            muon_lr,
            muon_weight_dimension_numbers=hidden,
            adam_learning_rate=lr,
            adam_weight_decay=wd,
        ),
        "Dion": lambda: eqopt.contrib.dion(
            muon_lr,
            weight_decay=wd,
            dion_weight_dimension_numbers=hidden,
            scalar_learning_rate=lr,
            scalar_weight_decay=wd,
        ),
        # Every leaf by Scion, with the norm its layer calls for: ColNorm for
        # the embedding, spectral for the Linear weights, sign for vectors.
        "Scion": lambda: eqopt.contrib.scion(muon_lr, weight_decay=wd),
        "SPlus": lambda: eqopt.contrib.splus(0.1, weight_decay=wd),
    }
    names = list(optimizers) if names is None else names
    return {name: optimizers[name]() for name in names}


@eqx.filter_jit
def step(opt, model, state, tokens):
    (loss, max_logits), grads = eqx.filter_value_and_grad(
        loss_and_max_logits, has_aux=True
    )(model, tokens)
    updates, state = opt.update(grads, state, model, max_logits=max_logits)
    largest = jnp.max(jnp.stack([d["attention"] for d in max_logits["blocks"]]))
    return eqopt.apply_updates(model, updates), state, loss, largest


def run(optimizers, task, steps, make_model=None):
    """One step of each optimiser in turn; losses, largest logits and wall time."""
    make_model = make_model or task.model
    models = {name: make_model() for name in optimizers}
    states = {name: opt.init(models[name]) for name, opt in optimizers.items()}
    losses = {name: [] for name in optimizers}
    logits = {name: [] for name in optimizers}
    seconds = {name: [] for name in optimizers}
    for i in range(steps):
        tokens = jnp.asarray(task.batch(i))
        for name, opt in optimizers.items():
            start = time.perf_counter()
            models[name], states[name], loss, largest = step(
                opt, models[name], states[name], tokens
            )
            losses[name].append(float(loss))  # waits for the step
            seconds[name].append(time.perf_counter() - start)
            logits[name].append(float(largest))
    held_out = jnp.asarray(task.held_out())
    evaluate = eqx.filter_jit(char_lm.loss_fn)
    results = {
        name: char_lm.Result(
            np.asarray(losses[name]),
            np.asarray(seconds[name]),
            char_lm.state_bytes(states[name]),
            float(evaluate(models[name], held_out)),
        )
        for name in optimizers
    }
    return results, {name: np.asarray(v) for name, v in logits.items()}


SHORT = ["Muon", "MuonClip"]


def tiny_model(task):
    """One block of width 32: a model that compiles in a few seconds (for CI)."""
    return char_lm.CharLM(
        task.vocab, task.seq_len, width=32, depth=1, key=jax.random.key(task.seed)
    )


def main(argv=None):
    global CLIP_LEARNING_RATE, TAU
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=80, help="steps per optimiser")
    parser.add_argument("--out", default="frontier_optimizers.png", help="the figure")
    parser.add_argument(
        "--short", action="store_true", help="a tiny model, two optimisers (CI)"
    )
    args = parser.parse_args(argv)
    steps = 10 if args.short else args.steps

    start = time.perf_counter()
    if args.short:
        # A smaller batch and a higher rate for the pair, so that the logits
        # pass a lower threshold within the few steps.
        task = char_lm.make_task(seq_len=32, batch_size=8)
        CLIP_LEARNING_RATE, TAU = 0.1, 4.0
        make_model = lambda: tiny_model(task)  # noqa: E731
    else:
        task = char_lm.make_task()
        make_model = task.model
    optimizers = make_optimizers(make_model(), SHORT if args.short else None)
    results, logits = run(optimizers, task, steps, make_model)
    base_name = "AdamW" if "AdamW" in results else next(iter(results))
    base = results[base_name]
    base_time = np.median(base.seconds[1:])
    tail = max(1, steps // 10)
    print(
        f"{steps} steps each, interleaved; {len(task.data)} characters, vocabulary "
        f"{task.vocab}; state and step time (median, compilation excluded) relative "
        f"to {base_name}'s"
    )
    print(
        f"Muon and MuonClip at learning rate {CLIP_LEARNING_RATE}, "
        f"QK-clip threshold tau = {TAU}"
    )
    print(
        f"{'optimiser':<18}{'final loss':>11}{'held-out':>10}{'state':>8}"
        f"{'time':>8}{'max logit':>11}{'last logit':>12}"
    )
    for name, result in results.items():
        print(
            f"{name:<18}{np.mean(result.losses[-tail:]):>11.3f}"
            f"{result.held_out_loss:>10.3f}"
            f"{result.state_bytes / base.state_bytes:>8.2f}"
            f"{np.median(result.seconds[1:]) / base_time:>8.2f}"
            f"{np.max(logits[name]):>11.2f}{logits[name][-1]:>12.2f}"
        )
    above = np.flatnonzero(logits["Muon"] > TAU)
    if above.size:
        after = logits["MuonClip"][above[0] :]
        print(
            f"Muon's largest logit first above tau at step {above[0] + 1}; "
            f"MuonClip's from then on: {after.min():.2f} to {after.max():.2f}"
        )
    print(
        f"(final loss: mean of the last {tail} steps; max logit: the largest "
        f"pre-softmax attention logit over all steps, heads and blocks; "
        f"{time.perf_counter() - start:.0f} s)"
    )

    fig, (by_step, by_time, clip) = plt.subplots(1, 3, figsize=(16, 4.8))
    window = min(10, steps)
    names = [name for name in results if name != "AdamW (A/A)"]
    colours = [*plt.get_cmap("tab10").colors, "black", "darkgoldenrod"]
    colour_of = dict(zip(names, colours, strict=False))
    for name, colour in colour_of.items():
        result = results[name]
        smooth = np.convolve(result.losses, np.ones(window) / window, mode="valid")
        style = dict(
            color=colour, linestyle="--" if name in ("Muon", "MuonClip") else "-"
        )
        by_step.plot(np.arange(window, steps + 1), smooth, label=name, **style)
        # Wall time without the first (compiling) step.
        elapsed = np.cumsum(result.seconds[1:])
        by_time.plot(elapsed[window - 2 :], smooth, label=name, **style)
    by_step.set(xlabel="step", ylabel=f"training loss (mean of {window})")
    by_time.set(xlabel="seconds (interleaved, compilation excluded)", xscale="log")
    by_time.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    by_time.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    by_step.legend(fontsize=7, ncol=2)
    for name in ("AdamW", "Muon", "MuonClip")[1 if args.short else 0 :]:
        clip.plot(
            np.arange(1, steps + 1), logits[name], label=name, color=colour_of[name]
        )
    clip.axhline(TAU, color="k", linestyle=":", label=f"tau = {TAU:g}")
    clip.set(
        xlabel="step",
        ylabel="largest attention logit",
        title=f"Muon at lr {CLIP_LEARNING_RATE:g}, with and without QK-clip",
    )
    clip.legend(fontsize=8)
    for ax in (by_step, by_time, clip):
        ax.grid(alpha=0.3)
    fig.suptitle(
        "Character-level transformer: the newest optimisers against AdamW and Muon"
    )
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"saved plot to {args.out}")
    return results, logits


if __name__ == "__main__":
    main()
