"""The optimisers researchers try after AdamW, on one small character-level language model.

AdamW, Muon, NorMuon, SOAP, Shampoo, PSGD Kron, MARS-AdamW, cautious AdamW
and Adam-mini train the transformer of
`examples/char_lm.py` from the same initialisation on the same batches. The
steps of all optimisers are interleaved (one step of each in turn), so a load
on the machine slows them alike; AdamW runs twice (an A/A pair) to show how far
two identical runs' timings differ.

    python examples/optimizer_zoo.py                        # 200 steps each
    python examples/optimizer_zoo.py --short --out /tmp/zoo.png

Prints a table (final and held-out loss, state memory, step time relative to
AdamW) and saves one figure: loss per step, loss per second, state memory.
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

LEARNING_RATE = 3e-3
WEIGHT_DECAY = 1e-2
HEADS = 4  # char_lm's default


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


def with_adamw_for_vectors(preconditioner, model):
    """`preconditioner` on the weights of the `Linear` layers, AdamW on every other
    leaf: the embedding and position table, biases and normalisations.

    Kronecker-factored preconditioners are for weight matrices: a vector or a
    normalisation's scale gains nothing from a factor, and an embedding's
    factor over its tokens costs a `(vocab, vocab)` matrix.
    """
    is_linear = lambda x: isinstance(x, eqx.nn.Linear)  # noqa: E731

    def label(node):
        labels = jax.tree.map(lambda _: "adamw", node)
        if is_linear(node):
            labels = eqx.tree_at(lambda layer: layer.weight, labels, "matrices")
        return labels

    return eqopt.partition(
        {
            "matrices": preconditioner,
            "adamw": eqopt.adamw(LEARNING_RATE, weight_decay=WEIGHT_DECAY),
        },
        jax.tree.map(label, model, is_leaf=is_linear),
    )


def adam_mini_blocks(model):
    """The paper's partition: queries and keys by head, every other matrix by output
    neuron (rows of a `Linear`) or token (rows of the embedding and readout), and
    one block for each vector."""
    blocks = jax.tree.map(
        eqopt.contrib.AdamMiniBlocks.default, eqx.filter(model, eqx.is_inexact_array)
    )
    by_head = eqopt.contrib.AdamMiniBlocks(axis=0, heads=HEADS)
    return eqx.tree_at(
        lambda b: [
            proj.weight
            for block in b.blocks
            for proj in (block.attention.query_proj, block.attention.key_proj)
        ],
        blocks,
        replace_fn=lambda _: by_head,
    )


def make_optimizers(model):
    lr, wd = LEARNING_RATE, WEIGHT_DECAY
    rows = eqopt.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=0)
    optimizers = {
        "AdamW": eqopt.adamw(lr, weight_decay=wd),
        "AdamW (A/A)": eqopt.adamw(lr, weight_decay=wd),
        "Muon": eqopt.contrib.muon(
            0.02,
            weight_decay=wd,
            muon_weight_dimension_numbers=hidden_matrices(model, rows),
            adam_learning_rate=lr,
            adam_weight_decay=wd,
        ),
        "NorMuon": eqopt.contrib.normuon(
            1e-2,
            weight_decay=wd,
            normuon_weight_dimension_numbers=hidden_matrices(model, rows),
            adam_learning_rate=lr,
            adam_weight_decay=wd,
        ),
        "SOAP": with_adamw_for_vectors(eqopt.contrib.soap(lr, weight_decay=wd), model),
        # Adam grafting (SGD grafting would need SGD's learning rate) with
        # SOAP's b2 = 0.95 (Shampoo's Adam grafting has no bias correction, so
        # b2 = 0.999 takes huge first steps); roots every 10 steps, as SOAP
        # refreshes its eigenbases.
        "Shampoo": eqopt.contrib.shampoo(
            lr,
            b2=0.95,
            grafting="adam",
            weight_decay=wd,
            preconditioning_compute_steps=10,
        ),
        "Kron": with_adamw_for_vectors(eqopt.contrib.kron(lr, weight_decay=wd), model),
        "MARS-AdamW": eqopt.contrib.mars_adamw(lr, weight_decay=wd),
        "cautious AdamW": eqopt.chain(
            eqopt.cautious(eqopt.scale_by_adam(), descent=False),
            eqopt.add_decayed_weights(wd),
            eqopt.scale_by_learning_rate(lr),
        ),
        "Adam-mini": eqopt.contrib.adam_mini(
            lr, weight_decay=wd, blocks=adam_mini_blocks(model)
        ),
    }
    return optimizers


@eqx.filter_jit
def step(opt, model, state, tokens):
    loss, grads = eqx.filter_value_and_grad(char_lm.loss_fn)(model, tokens)
    updates, state = opt.update(grads, state, model)
    return eqopt.apply_updates(model, updates), state, loss


def run(optimizers, task, steps):
    """One step of each optimiser in turn; losses and wall time per step."""
    models = {name: task.model() for name in optimizers}
    states = {name: opt.init(models[name]) for name, opt in optimizers.items()}
    losses = {name: [] for name in optimizers}
    seconds = {name: [] for name in optimizers}
    for i in range(steps):
        tokens = jnp.asarray(task.batch(i))
        for name, opt in optimizers.items():
            start = time.perf_counter()
            models[name], states[name], loss = step(
                opt, models[name], states[name], tokens
            )
            losses[name].append(float(loss))  # waits for the step
            seconds[name].append(time.perf_counter() - start)
    held_out = jnp.asarray(task.held_out())
    evaluate = eqx.filter_jit(char_lm.loss_fn)
    return {
        name: char_lm.Result(
            np.asarray(losses[name]),
            np.asarray(seconds[name]),
            char_lm.state_bytes(states[name]),
            float(evaluate(models[name], held_out)),
        )
        for name in optimizers
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per optimiser")
    parser.add_argument("--out", default="optimizer_zoo.png", help="the figure")
    parser.add_argument("--short", action="store_true", help="a few steps (for CI)")
    args = parser.parse_args(argv)
    steps = 12 if args.short else args.steps

    start = time.perf_counter()
    task = char_lm.make_task()
    optimizers = make_optimizers(task.model())
    results = run(optimizers, task, steps)
    base = results["AdamW"]
    base_time = np.median(base.seconds[1:])
    tail = max(1, steps // 10)
    print(
        f"{steps} steps each, interleaved; {len(task.data)} characters, vocabulary "
        f"{task.vocab}; step times relative to AdamW's (median, compilation excluded)"
    )
    print(
        f"{'optimiser':<16}{'final loss':>11}{'held-out':>10}"
        f"{'state KiB':>11}{'state/AdamW':>13}{'time/AdamW':>12}"
    )
    for name, result in results.items():
        print(
            f"{name:<16}{np.mean(result.losses[-tail:]):>11.3f}"
            f"{result.held_out_loss:>10.3f}{result.state_bytes / 1024:>11.1f}"
            f"{result.state_bytes / base.state_bytes:>13.2f}"
            f"{np.median(result.seconds[1:]) / base_time:>12.2f}"
        )
    print(
        f"(final loss: mean of the last {tail} steps; {time.perf_counter() - start:.0f} s)"
    )

    fig, (by_step, by_time, memory) = plt.subplots(
        1, 3, figsize=(15, 4.5), gridspec_kw={"width_ratios": [1.2, 1.2, 1]}
    )
    window = min(10, steps)
    for name, result in results.items():
        if name == "AdamW (A/A)":
            continue
        smooth = np.convolve(result.losses, np.ones(window) / window, mode="valid")
        by_step.plot(np.arange(window, steps + 1), smooth, label=name)
        # Wall time without the first (compiling) step.
        elapsed = np.cumsum(result.seconds[1:])
        by_time.plot(elapsed[window - 2 :], smooth, label=name)
    by_step.set(xlabel="step", ylabel=f"training loss (mean of {window})")
    by_time.set(xlabel="seconds (interleaved, compilation excluded)")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=8)
    names = [n for n in results if n != "AdamW (A/A)"]
    memory.barh(names, [results[n].state_bytes / 1024 for n in names])
    memory.set(xlabel="optimiser state (KiB)")
    memory.invert_yaxis()
    fig.suptitle("Character-level transformer: optimisers after AdamW")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"saved plot to {args.out}")
    return results


if __name__ == "__main__":
    main()
