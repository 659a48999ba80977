"""Checkpointing: save model and optimiser state mid-training, restore, continue identically.

An eqopt optimiser state is an `eqx.Module` (a pytree of arrays, with `None`
where a leaf is not trained), so it is saved and restored exactly like the
model, with no conversion:

- **Equinox serialisation.** `eqx.tree_serialise_leaves(path, tree)` writes every
  array leaf of a pytree; `eqx.tree_deserialise_leaves(path, like)` reads them
  back into a pytree of the same structure, `like`, built the same way
  (`make_model(key)`, `opt.init(model)`). The non-array leaves (activation
  functions, `Dropout.p`) come from `like`.
- **Orbax** (if `orbax.checkpoint` is installed). A `CheckpointManager` saves
  every few steps and keeps the last two; it stores the arrays
  (`eqx.filter(tree, eqx.is_array)`) and is given the same filtered structure
  to restore into, then `eqx.combine` puts the non-array leaves back.

The script trains an MLP with dropout and a warmup-cosine AdamW, saving every
`--save-every` steps. It "crashes" at `--crash-at`, restores the latest
checkpoint into freshly built (differently initialised) objects, and finishes
training. Because the data batch and the dropout key of step `i` are functions
of `i`, the resumed run is bit-identical to one that never stopped.

    python examples/checkpointing.py --out checkpointing.png
    python examples/checkpointing.py --short     # the quick run the tests use

About 20 s on a 2-core CPU; `--short` (what the tests run) about 15 s,
most of it start-up and compilation.
"""

import argparse
import pathlib
import shutil
import tempfile

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
from tqdm import tqdm

import eqopt

try:
    import orbax.checkpoint as ocp
except ImportError:  # Orbax is optional
    ocp = None

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


class Regressor(eqx.Module):
    """An MLP with dropout: a model with non-array leaves (activations, `p`)."""

    body: eqx.nn.MLP
    dropout: eqx.nn.Dropout
    head: eqx.nn.Linear

    def __init__(self, key):
        body_key, head_key = jax.random.split(key)
        self.body = eqx.nn.MLP(
            4, 64, 64, 1, activation=jax.nn.gelu, final_activation=jax.nn.gelu,
            key=body_key,
        )  # fmt: skip
        self.dropout = eqx.nn.Dropout(p=0.1)
        self.head = eqx.nn.Linear(64, 1, key=head_key)

    def __call__(self, x, *, key):
        return self.head(self.dropout(self.body(x), key=key))


@eqx.filter_jit
def make_data(key, num_points: int = 2048):
    x_key, noise_key = jax.random.split(key)
    x = jax.random.normal(x_key, (num_points, 4))
    y = jnp.sin(x[:, :1]) * x[:, 1:2] + 0.5 * x[:, 2:3] ** 2 - x[:, 3:]
    return x, y + 0.1 * jax.random.normal(noise_key, y.shape)


def loss_fn(model, x, y, key):
    keys = jax.random.split(key, x.shape[0])
    predictions = jax.vmap(lambda xi, ki: model(xi, key=ki))(x, keys)
    return jnp.mean((predictions - y) ** 2)


@eqx.filter_jit(donate="all-except-first")
def train_step(opt, model, state, x, y, key):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y, key)
    updates, state = opt.update(grads, state, model)
    return eqopt.apply_updates(model, updates), state, loss


def make_optimiser(total_steps: int):
    schedule = eqopt.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=3e-3, warmup_steps=10, decay_steps=total_steps
    )
    return eqopt.chain(eqopt.clip_by_global_norm(1.0), eqopt.adamw(schedule))


def train(opt, model, state, data, key, start, stop, *, on_step=None, desc=""):
    """Steps `start..stop-1`; the batch and dropout key of step `i` depend only on `i`."""
    x, y = data
    losses = []
    for i in tqdm(range(start, stop), desc=desc, unit="step"):
        batch = np.random.default_rng(i).choice(len(x), 128, replace=False)
        model, state, loss = train_step(
            opt, model, state, x[batch], y[batch], jax.random.fold_in(key, i)
        )
        losses.append(float(loss))
        if on_step is not None:
            on_step(i + 1, model, state)
    return model, state, losses


def fresh_objects(opt, seed: int):
    """What a restarted program builds before restoring: same structure, new values."""
    model = Regressor(jax.random.key(seed))
    return {"step": jnp.asarray(0), "model": model, "opt_state": opt.init(model)}


def identical(a, b) -> bool:
    """Whether two pytrees have the same structure and bit-identical arrays."""
    a, b = eqx.filter(a, eqx.is_array), eqx.filter(b, eqx.is_array)
    if jax.tree.structure(a) != jax.tree.structure(b):
        return False
    same = jax.tree.map(lambda u, v: np.array_equal(u, v), a, b)  # on the host
    return all(jax.tree.leaves(same))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument("--crash-at", type=int, default=350)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="checkpointing.png", help="plot file")
    parser.add_argument("--short", action="store_true", help="a quick run for CI")
    args = parser.parse_args()
    if args.short:
        args.steps, args.save_every, args.crash_at = 40, 10, 25

    data_key, model_key, dropout_key = jax.random.split(jax.random.key(args.seed), 3)
    data = make_data(data_key)
    opt = make_optimiser(args.steps)

    def start():
        model = Regressor(model_key)
        return model, opt.init(model)

    # 1. The reference: one uninterrupted run.
    model, state = start()
    reference_model, reference_state, reference_losses = train(
        opt, model, state, data, dropout_key, 0, args.steps, desc="uninterrupted"
    )

    # 2. The same run, checkpointed every `save_every` steps, "crashing" at `crash_at`.
    directory = pathlib.Path(tempfile.mkdtemp(prefix="eqopt-checkpoints-"))
    eqx_path = directory / "latest.eqx"
    manager = None
    if ocp is not None:
        manager = ocp.CheckpointManager(
            directory / "orbax",
            # Synchronous, so a saved step is on disk before the next donating step.
            options=ocp.CheckpointManagerOptions(
                max_to_keep=2, enable_async_checkpointing=False
            ),
        )

    def save(step, model, state):
        if step % args.save_every:
            return
        checkpoint = {"step": jnp.asarray(step), "model": model, "opt_state": state}
        eqx.tree_serialise_leaves(eqx_path, checkpoint)
        if ocp is not None and manager is not None:
            arrays = eqx.filter(checkpoint, eqx.is_array)
            manager.save(step, args=ocp.args.StandardSave(arrays))

    model, state = start()
    _, _, losses_before = train(
        opt, model, state, data, dropout_key, 0, args.crash_at, on_step=save,
        desc="until the crash",
    )  # fmt: skip
    del model, state  # the crash: everything in memory is lost
    print(f"crashed after step {args.crash_at}")

    # 3. Restart: build fresh objects of the same structure, then restore into them.
    like = fresh_objects(opt, seed=12345)
    restored = {"equinox": eqx.tree_deserialise_leaves(eqx_path, like)}
    if ocp is not None and manager is not None:
        arrays, static = eqx.partition(like, eqx.is_array)
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, arrays)
        latest = manager.latest_step()
        arrays = manager.restore(latest, args=ocp.args.StandardRestore(target))
        restored["orbax"] = eqx.combine(arrays, static)
        print(f"orbax keeps the checkpoints of steps {manager.all_steps()}")
        manager.close()

    losses_after = {}
    for backend, checkpoint in restored.items():
        step = int(checkpoint["step"])
        print(f"{backend}: restored the checkpoint of step {step}")
        model, state, losses_after[backend] = train(
            opt, checkpoint["model"], checkpoint["opt_state"], data, dropout_key,
            step, args.steps, desc=f"resumed ({backend})",
        )  # fmt: skip
        same = identical((model, state), (reference_model, reference_state))
        print(f"{backend}: final model and optimiser state bit-identical: {same}")
        tail = reference_losses[step:]
        print(
            f"{backend}: losses after the restart identical: {losses_after[backend] == tail}"
        )
    print(f"final loss: {reference_losses[-1]:.4f}")
    shutil.rmtree(directory)

    fig, ax = plt.subplots(figsize=(8, 4))
    steps = np.arange(1, args.steps + 1)
    ax.plot(steps, reference_losses, lw=4, alpha=0.3, label="uninterrupted")
    ax.plot(steps[: args.crash_at], losses_before, lw=1, color="k", label="before")
    for backend, losses in losses_after.items():
        style = "--" if backend == "orbax" else "-"
        ax.plot(
            steps[-len(losses) :], losses, style, lw=1, label=f"resumed ({backend})"
        )
    ax.axvline(args.crash_at, color="C3", ls=":", label="crash")
    ax.axvline(
        args.crash_at // args.save_every * args.save_every,
        color="C2",
        ls=":",
        label="restored step",
    )
    ax.set(xlabel="step", ylabel="training loss", yscale="log")
    ax.set_title("Resuming from a checkpoint continues the same run")
    ax.legend(loc="upper right", ncol=2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"saved plot to {args.out}")


if __name__ == "__main__":
    main()
