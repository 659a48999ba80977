"""A small character-level transformer language model that trains on a CPU in minutes.

The shared task of the optimiser galleries: the text is the docstrings of a fixed
list of Python standard-library modules (shipped with every Python, so nothing is
downloaded), the model a two-block pre-norm transformer written with Equinox, and
`train` runs any eqopt optimiser on it with the same batches for every optimiser.

    python examples/char_lm.py --steps 300        # AdamW, prints the loss

Used by the gallery scripts: `train(opt, steps)` returns the loss per step, the
seconds per step and the optimiser state's bytes.
"""

import argparse
import dataclasses
import importlib
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import eqopt

_MODULES = (
    "argparse", "collections", "functools", "itertools", "json", "pathlib", "re",
    "string", "textwrap", "typing", "dataclasses", "contextlib", "inspect", "os",
    "random", "statistics", "heapq", "bisect", "enum", "fractions", "decimal",
)  # fmt: skip


def load_text() -> str:
    """The docstrings of `_MODULES` and of their public callables, in a fixed order."""
    parts = []
    for name in _MODULES:
        module = importlib.import_module(name)
        parts.append(module.__doc__ or "")
        for attr in sorted(dir(module)):
            obj = getattr(module, attr, None)
            doc = getattr(obj, "__doc__", None)
            if not attr.startswith("_") and callable(obj) and isinstance(doc, str):
                parts.append(doc)
    text = "\n".join(parts)
    return "".join(c for c in text if c.isascii())


class Block(eqx.Module):
    """Pre-norm transformer block: causal self-attention then an MLP."""

    norm1: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP

    def __init__(self, width: int, heads: int, *, key):
        k1, k2 = jax.random.split(key)
        self.norm1 = eqx.nn.LayerNorm(width)
        self.attention = eqx.nn.MultiheadAttention(heads, width, key=k1)
        self.norm2 = eqx.nn.LayerNorm(width)
        self.mlp = eqx.nn.MLP(
            width, width, 4 * width, 1, activation=jax.nn.gelu, key=k2
        )

    def __call__(self, x):
        length = x.shape[0]
        mask = jnp.tril(jnp.ones((length, length), bool))
        h = jax.vmap(self.norm1)(x)
        x = x + self.attention(h, h, h, mask=mask)
        return x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))


class CharLM(eqx.Module):
    """Token and position embeddings, `depth` blocks, a final norm and a readout."""

    embedding: eqx.nn.Embedding
    position: jax.Array
    blocks: list[Block]
    norm: eqx.nn.LayerNorm
    readout: eqx.nn.Linear

    def __init__(self, vocab: int, length: int, width=64, depth=2, heads=4, *, key):
        keys = jax.random.split(key, depth + 3)
        self.embedding = eqx.nn.Embedding(vocab, width, key=keys[0])
        self.position = 0.02 * jax.random.normal(keys[1], (length, width))
        self.blocks = [Block(width, heads, key=k) for k in keys[3:]]
        self.norm = eqx.nn.LayerNorm(width)
        self.readout = eqx.nn.Linear(width, vocab, key=keys[2])

    def __call__(self, tokens):
        x = jax.vmap(self.embedding)(tokens) + self.position[: tokens.shape[0]]
        for block in self.blocks:
            x = block(x)
        return jax.vmap(self.readout)(jax.vmap(self.norm)(x))


def loss_fn(model, tokens):
    """Mean next-character cross-entropy over a batch of sequences."""
    logits = jax.vmap(model)(tokens[:, :-1])
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
    targets = tokens[:, 1:, None]
    return -jnp.mean(jnp.take_along_axis(log_probs, targets, axis=-1))


@dataclasses.dataclass(frozen=True)
class Task:
    """The data and a fresh model; `batch(i)` is the same for every optimiser."""

    data: np.ndarray
    vocab: int
    seq_len: int
    batch_size: int
    seed: int

    def model(self, dtype=jnp.float32) -> CharLM:
        model = CharLM(self.vocab, self.seq_len, key=jax.random.key(self.seed))
        return jax.tree.map(
            lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model
        )

    def batch(self, i: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, i))
        starts = rng.integers(0, len(self.data) - self.seq_len - 1, self.batch_size)
        return np.stack([self.data[s : s + self.seq_len + 1] for s in starts])

    def held_out(self) -> np.ndarray:
        return np.stack([self.batch(10**6 + i) for i in range(4)]).reshape(
            -1, self.seq_len + 1
        )


def make_task(seed: int = 0, seq_len: int = 64, batch_size: int = 32) -> Task:
    text = load_text()
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    data = np.asarray([lookup[c] for c in text], np.int32)
    return Task(data, len(chars), seq_len, batch_size, seed)


def state_bytes(state) -> int:
    """Bytes of every array leaf of an optimiser state."""
    leaves = jax.tree.leaves(eqx.filter(state, eqx.is_array))
    return int(sum(x.size * x.dtype.itemsize for x in leaves))


@dataclasses.dataclass
class Result:
    losses: np.ndarray  # training loss per step
    seconds: np.ndarray  # wall time per step (first step includes compilation)
    state_bytes: int
    held_out_loss: float


@eqx.filter_jit
def _step(opt, model, state, tokens):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, tokens)
    updates, state = opt.update(grads, state, model)
    return eqopt.apply_updates(model, updates), state, loss


def train(
    opt, steps: int, task: Task | None = None, *, dtype=jnp.float32, step_fn=None
) -> Result:
    """Trains a fresh model of `task` for `steps` steps with `opt`.

    `step_fn(opt, model, state, tokens) -> (model, state, loss)` replaces the default
    step (loss, gradient, update, `apply_updates`) when given.
    """
    task = task or make_task()
    step_fn = step_fn or _step
    model = task.model(dtype)
    state = opt.init(model)
    losses, seconds = [], []
    for i in range(steps):
        start = time.perf_counter()
        model, state, loss = step_fn(opt, model, state, jnp.asarray(task.batch(i)))
        losses.append(float(loss))
        seconds.append(time.perf_counter() - start)
    held_out = float(eqx.filter_jit(loss_fn)(model, jnp.asarray(task.held_out())))
    return Result(np.asarray(losses), np.asarray(seconds), state_bytes(state), held_out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    task = make_task()
    print(f"{len(task.data)} characters, vocabulary {task.vocab}")
    result = train(eqopt.adamw(3e-3, weight_decay=1e-2), args.steps, task)
    print(
        f"AdamW: first loss {result.losses[0]:.3f}, last {result.losses[-1]:.3f}, "
        f"held-out {result.held_out_loss:.3f}, state {result.state_bytes} bytes, "
        f"median step {1e3 * np.median(result.seconds[1:]):.1f} ms"
    )


if __name__ == "__main__":
    main()
