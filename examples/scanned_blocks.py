"""Deep models with scanned blocks: the same optimiser on a stack of layers and on a list.

Equinox's way to compile a deep model fast is to build its blocks once with
`eqx.filter_vmap` (every leaf of the blocks gains a leading axis of length
`depth`) and run them with `jax.lax.scan`: XLA compiles one block instead of
`depth`. eqopt treats such a stack as its layers: Muon orthogonalises each
layer's matrix (not the stack as one tensor), the parameter groups' layer decay
gives each slice of the stack its own layer's rate, and the report shows
`blocks[0-11]`.

The character-level language model of `examples/char_lm.py`, with 12 blocks, is
built twice from the same weights: scanned, and as a Python list of the same
blocks. Both train with the same optimiser on the same batches: Muon on the
blocks' matrices, AdamW on the rest, layer decay 0.9, no weight decay on norms
and biases. The loss curves coincide; the scanned model's first call (its
compilation) is a fraction of the list's.

    python examples/scanned_blocks.py                  # 12 blocks, 100 steps
    python examples/scanned_blocks.py --short --out /tmp/scanned_blocks.png
"""

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
from char_lm import Block, CharLM, loss_fn, make_task
from tqdm import tqdm

import eqopt

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


class ScannedLM(eqx.Module):
    """`CharLM` with its blocks stacked on a leading axis and run by `lax.scan`."""

    embedding: eqx.nn.Embedding
    position: jax.Array
    blocks: Block  # every leaf has a leading axis of length `depth`
    norm: eqx.nn.LayerNorm
    readout: eqx.nn.Linear

    def __call__(self, tokens):
        x = jax.vmap(self.embedding)(tokens) + self.position[: tokens.shape[0]]
        arrays, static = eqx.partition(self.blocks, eqx.is_array)

        def body(x, block_arrays):
            return eqx.combine(block_arrays, static)(x), None

        x, _ = jax.lax.scan(body, x, arrays)
        return jax.vmap(self.readout)(jax.vmap(self.norm)(x))


def scanned_of(listed: CharLM) -> ScannedLM:
    """The list model's blocks stacked: the same numbers, one leaf per field."""
    arrays = [eqx.filter(block, eqx.is_array) for block in listed.blocks]
    static = eqx.filter(listed.blocks[0], eqx.is_array, inverse=True)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *arrays)
    return ScannedLM(
        listed.embedding,
        listed.position,
        eqx.combine(stacked, static),
        listed.norm,
        listed.readout,
    )


def optimiser(model, steps: int):
    """Muon on the blocks' matrices, AdamW on the rest; layer decay 0.9 and no
    weight decay on norms and biases. The same call for both models: a
    predicate sees one layer of a stack, so `x.ndim == 2` picks the weights."""
    spec = eqx.tree_at(
        lambda m: m.blocks,
        jax.tree.map(lambda _: False, model),
        replace_fn=lambda _: lambda x: x.ndim == 2,
    )
    warmup = max(steps // 10, 1)
    muon = eqopt.contrib.muon(
        learning_rate=eqopt.warmup_cosine_decay_schedule(0.0, 0.02, warmup, steps),
        muon_weight_dimension_numbers=spec,
        adam_learning_rate=eqopt.warmup_cosine_decay_schedule(0.0, 3e-3, warmup, steps),
        weight_decay=0.01,
        adam_weight_decay=0.01,
    )
    return eqopt.param_groups(
        muon,
        groups=[
            eqopt.Group(
                select=(eqx.nn.LayerNorm, eqopt.in_layer(eqx.nn.Linear, field="bias")),
                name="no_decay",
                wd_mult=0.0,
            )
        ],
        layer_decay=eqopt.layer_decay(0.9),
    )


@eqx.filter_jit
def step(opt, model, state, tokens):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, tokens)
    updates, state = opt.update(grads, state, model)
    return eqopt.apply_updates(model, updates), state, loss


def train(name, model, task, steps):
    """Losses per step, the first call's seconds and the median later step's."""
    opt = optimiser(model, steps)
    state = opt.init(model)
    losses, seconds = [], []
    for i in tqdm(range(steps), desc=f"{name:>7}", unit="step"):
        start = time.perf_counter()
        model, state, loss = step(opt, model, state, jnp.asarray(task.batch(i)))
        losses.append(float(loss))
        seconds.append(time.perf_counter() - start)
    return opt, state, np.asarray(losses), seconds[0], float(np.median(seconds[1:]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--short", action="store_true", help="4 blocks, 6 steps")
    parser.add_argument("--out", default="scanned_blocks.png")
    args = parser.parse_args(argv)
    depth, steps = (4, 6) if args.short else (args.depth, args.steps)

    task = make_task()
    listed = CharLM(task.vocab, task.seq_len, depth=depth, key=jax.random.key(0))
    scanned = scanned_of(listed)
    print(
        f"{depth} blocks: blocks.mlp.layers[0].weight is {scanned.blocks.mlp.layers[0].weight.shape} scanned"
    )

    opt, state, scanned_losses, scanned_first, scanned_step = train(
        "scanned", scanned, task, steps
    )
    print(eqopt.param_groups_report(opt, state))
    _, _, listed_losses, listed_first, listed_step = train("list", listed, task, steps)

    gap = float(np.max(np.abs(scanned_losses - listed_losses)))
    print(f"largest loss difference, scanned vs list: {gap:.2e}")
    print(
        f"first call (compilation): scanned {scanned_first:.1f} s, list "
        f"{listed_first:.1f} s ({scanned_first / listed_first:.2f}x)"
    )
    print(
        f"median step: scanned {1e3 * scanned_step:.1f} ms, list "
        f"{1e3 * listed_step:.1f} ms ({scanned_step / listed_step:.2f}x)"
    )

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), width_ratios=(2, 1))
    left.plot(listed_losses, lw=3, alpha=0.4, label="list of blocks")
    left.plot(scanned_losses, lw=1, label="scanned blocks")
    left.set(
        xlabel="step", ylabel="training loss", title=f"{depth} blocks, same optimiser"
    )
    left.legend()
    right.bar(["scanned", "list"], [scanned_first, listed_first], color=["C1", "C0"])
    right.set(ylabel="seconds", title="first call (compilation)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
