"""A small residual model built twice: its blocks stacked by `eqx.filter_vmap` (run
with `lax.scan`), and the same blocks as a Python list.

`tests/test_stacked.py` trains both with the same gradients and compares the
stacked updates with the list's, slice by slice.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import eqopt

DEPTH = 3
WIDTH = 24
HIDDEN = 48
OUT = 3


class Block(eqx.Module):
    """A residual block: `x + down(relu(up(norm(x))))`."""

    norm: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, key):
        up_key, down_key = jax.random.split(key)
        self.norm = eqx.nn.LayerNorm(WIDTH)
        self.up = eqx.nn.Linear(WIDTH, HIDDEN, key=up_key)
        self.down = eqx.nn.Linear(HIDDEN, WIDTH, key=down_key)

    def __call__(self, x):
        return x + self.down(jax.nn.relu(self.up(self.norm(x))))


class Stacked(eqx.Module):
    """`DEPTH` blocks on a leading axis of every leaf, run by `lax.scan`."""

    blocks: Block
    head: eqx.nn.Linear

    def __call__(self, x):
        arrays, static = eqx.partition(self.blocks, eqx.is_array)

        def body(h, block):
            return eqx.combine(block, static)(h), None

        return self.head(jax.lax.scan(body, x, arrays)[0])


class Listed(eqx.Module):
    """The same blocks as a Python list."""

    blocks: list[Block]
    head: eqx.nn.Linear

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_models(dtype: Any = jnp.float32, seed: int = 0) -> tuple[Stacked, Listed]:
    """The stacked model and the list of its slices (the same numbers)."""
    key, head_key = jax.random.split(jax.random.key(seed))
    blocks = eqx.filter_vmap(Block)(jax.random.split(key, DEPTH))
    # Give the norms numbers of their own, so that a mix-up shows.
    blocks = eqx.tree_at(
        lambda b: (b.norm.weight, b.norm.bias),
        blocks,
        (
            1.0 + 0.1 * jax.random.normal(jax.random.key(seed + 1), (DEPTH, WIDTH)),
            0.1 * jax.random.normal(jax.random.key(seed + 2), (DEPTH, WIDTH)),
        ),
    )
    stacked = Stacked(blocks, eqx.nn.Linear(WIDTH, OUT, key=head_key))
    stacked = jax.tree.map(
        lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, stacked
    )
    return stacked, unstack(stacked)


def unstack(stacked: Any) -> Listed:
    """The list model (or its gradients or updates) of a stacked tree."""
    blocks = [jax.tree.map(lambda x, k=k: x[k], stacked.blocks) for k in range(DEPTH)]
    return Listed(blocks, stacked.head)


def random_grads(stacked: Stacked, step: int) -> Stacked:
    """Gradients shaped like `eqx.filter_grad`'s of the stacked model (list them with
    `unstack`): scales differ per slice, as a real network's do."""
    arrays = eqx.filter(stacked, eqx.is_inexact_array)
    leaves, treedef = jax.tree.flatten(arrays)
    keys = jax.random.split(jax.random.key(100 + step), len(leaves))

    def draw(key, leaf):
        g = jax.random.normal(key, leaf.shape, jnp.float32)
        if leaf.ndim and leaf.shape[0] == DEPTH:
            g = g * (1.0 + jnp.arange(DEPTH)).reshape((DEPTH,) + (1,) * (leaf.ndim - 1))
        return g.astype(leaf.dtype)

    return jax.tree.unflatten(
        treedef, [draw(k, x) for k, x in zip(keys, leaves, strict=True)]
    )


def relative_difference(stacked_updates: Stacked, list_updates: Listed) -> float:
    """The largest difference, leaf by leaf, between the stacked updates and the
    list's, relative to the largest list update of that leaf."""
    worst = 0.0
    ours = jax.tree.leaves(unstack(stacked_updates))
    theirs = jax.tree.leaves(list_updates)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        a = np.asarray(a, np.float64)
        b = np.asarray(b, np.float64)
        scale = np.max(np.abs(b)) if b.size else 0.0
        diff = np.max(np.abs(a - b)) if b.size else 0.0
        if scale == 0.0:
            worst = max(worst, diff)
        else:
            worst = max(worst, diff / scale)
    return worst


def run_steps(
    tx, model, grads_of, steps: int = 3, jit: bool = True, pack=False, extra_of=None
):
    """The updates of the last of `steps` steps of `tx` on `model`; `grads_of(step)`
    gives the gradients (shaped like `model`), `extra_of(params, grads)` the extra
    arguments of `update` (a line search's objective), if any."""
    params = eqopt.pack(model) if pack else model

    def step(tx, grads, state, params, extra):
        return tx.update(grads, state, params, **extra)

    if jit:
        step = eqx.filter_jit(step)
    state = tx.init(params)
    updates = None
    for k in range(steps):
        grads = grads_of(k)
        if pack:
            grads = eqopt.Packed.like(params, grads)
        extra = {} if extra_of is None else extra_of(params, grads)
        updates, state = step(tx, grads, state, params, extra)
        params = eqopt.apply_updates(params, updates)
    if pack:
        updates = updates.unpack()
    return updates, state
