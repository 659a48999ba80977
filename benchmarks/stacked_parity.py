"""How far a scanned model's updates are from the same layers' as a list.

A small residual model (3 blocks of LayerNorm, Linear 24->48, Linear 48->24; a
head 24->3) is built once with `eqx.filter_vmap` (one leaf holds the 3 layers)
and once as a Python list of the same blocks. Both get the same gradients (the
list's are the stacked ones sliced) for 3 steps; printed per optimiser: the
largest difference, leaf by leaf, between a stacked slice's update at the third
step and its layer's, relative to the largest update of that leaf (0 means the
scanned model trains as the list does). `layer_decay` is run through
`eqopt.param_groups` (rate 0.5 per layer). Dion draws its first right factor
per leaf; the stack is given the list's.

    python benchmarks/stacked_parity.py
    PYTHONPATH=/path/to/old/checkout python benchmarks/stacked_parity.py

Run against an older checkout, an optimiser it lacks or that refuses the model
prints why instead of a number.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import eqopt  # noqa: E402
import eqopt.contrib  # noqa: E402

DEPTH, WIDTH, HIDDEN, OUT, STEPS = 3, 24, 48, 3, 3


class Block(eqx.Module):
    norm: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, key):
        up_key, down_key = jax.random.split(key)
        self.norm = eqx.nn.LayerNorm(WIDTH)
        self.up = eqx.nn.Linear(WIDTH, HIDDEN, key=up_key)
        self.down = eqx.nn.Linear(HIDDEN, WIDTH, key=down_key)


class Model(eqx.Module):
    """`blocks` is one `Block` of stacked leaves, or a list of blocks."""

    blocks: Block | list[Block]
    head: eqx.nn.Linear


def models():
    key, head_key = jax.random.split(jax.random.key(0))
    blocks = eqx.filter_vmap(Block)(jax.random.split(key, DEPTH))
    blocks = eqx.tree_at(
        lambda b: (b.norm.weight, b.norm.bias),
        blocks,
        (
            1.0 + 0.1 * jax.random.normal(jax.random.key(1), (DEPTH, WIDTH)),
            0.1 * jax.random.normal(jax.random.key(2), (DEPTH, WIDTH)),
        ),
    )
    stacked = Model(blocks, eqx.nn.Linear(WIDTH, OUT, key=head_key))
    return stacked, unstack(stacked)


def unstack(tree):
    blocks = [jax.tree.map(lambda x, k=k: x[k], tree.blocks) for k in range(DEPTH)]
    return Model(blocks, tree.head)


def grads(stacked, step):
    """Gradients shaped like the stacked model's, their scale growing with depth."""
    leaves, treedef = jax.tree.flatten(eqx.filter(stacked, eqx.is_inexact_array))
    keys = jax.random.split(jax.random.key(100 + step), len(leaves))
    out = []
    for key, leaf in zip(keys, leaves, strict=True):
        g = jax.random.normal(key, leaf.shape)
        if leaf.ndim and leaf.shape[0] == DEPTH:
            g = g * (1.0 + jnp.arange(DEPTH)).reshape((DEPTH,) + (1,) * (leaf.ndim - 1))
        out.append(g)
    return jax.tree.unflatten(treedef, out)


def restack(tree):
    """The stacked model (or its state's tree) of a list one."""
    return Model(jax.tree.map(lambda *xs: jnp.stack(xs), *tree.blocks), tree.head)


def share_draws(stacked_state, list_state):
    """Dion draws its first right factor per leaf: give the stack the list's."""
    dion = getattr(eqopt.contrib, "DionState", None)
    is_dion = lambda x: dion is not None and isinstance(x, dion)
    ours, treedef = jax.tree.flatten(stacked_state, is_leaf=is_dion)
    theirs = iter(x for x in jax.tree.leaves(list_state, is_leaf=is_dion) if is_dion(x))
    ours = [
        eqx.tree_at(lambda s: s.right_factor, x, restack(next(theirs).right_factor))
        if is_dion(x)
        else x
        for x in ours
    ]
    return jax.tree.unflatten(treedef, ours)


def last_updates(tx, model, as_model, state=None):
    step = eqx.filter_jit(lambda tx, g, s, p: tx.update(g, s, p))
    state, updates = tx.init(model) if state is None else state, None
    for k in range(STEPS):
        updates, state = step(tx, as_model(grads(STACKED, k)), state, model)
        model = eqopt.apply_updates(model, updates)
    return updates


def difference(tx):
    state = share_draws(tx.init(STACKED), tx.init(LISTED))
    ours = jax.tree.leaves(unstack(last_updates(tx, STACKED, lambda g: g, state)))
    theirs = jax.tree.leaves(last_updates(tx, LISTED, unstack))
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = np.max(np.abs(b))
        diff = np.max(np.abs(a - b))
        worst = max(worst, diff / scale if scale else diff)
    return worst


def layer_decay():
    groups = [eqopt.Group(r"norm|bias", wd_mult=0.0)]
    decay = eqopt.layer_decay(0.5) if hasattr(eqopt, "layer_decay") else 0.5
    return eqopt.param_groups(eqopt.adamw(1e-2), groups, layer_decay=decay)


CASES = {
    "adamw (element-wise)": lambda: eqopt.adamw(1e-2),
    "lamb": lambda: eqopt.lamb(1e-2),
    "lars": lambda: eqopt.lars(1e-2),
    "fromage": lambda: eqopt.fromage(1e-2),
    "novograd": lambda: eqopt.novograd(1e-2),
    "adafactor": lambda: eqopt.adafactor(1e-2),
    "sm3": lambda: eqopt.sm3(1e-2),
    "clip_by_block_rms": lambda: eqopt.clip_by_block_rms(0.5),
    "adaptive_grad_clip": lambda: eqopt.adaptive_grad_clip(0.01),
    "scale_by_param_block_norm": lambda: eqopt.scale_by_param_block_norm(),
    "scale_by_param_block_rms": lambda: eqopt.scale_by_param_block_rms(),
    "muon": lambda: eqopt.contrib.muon(1e-2),
    "muon, Polar Express": lambda: eqopt.contrib.muon(1e-2, ns_coeffs="polar_express"),
    "normuon": lambda: eqopt.contrib.normuon(1e-2),
    "adam_mini": lambda: eqopt.contrib.adam_mini(1e-2),
    "galore": lambda: eqopt.contrib.galore(1e-2, rank=4),
    "soap": lambda: eqopt.contrib.soap(1e-2),
    "shampoo": lambda: eqopt.contrib.shampoo(1e-2),
    "splus": lambda: eqopt.contrib.splus(1e-2),
    "dion (the list's first factor)": lambda: eqopt.contrib.dion(1e-2, rank=8),
    "layer_decay (param_groups)": layer_decay,
}

STACKED, LISTED = models()


def main():
    print(f"eqopt at {os.path.dirname(eqopt.__file__)}, jax {jax.__version__}")
    print("| optimiser | stacked vs list, 3rd step's update |")
    print("|---|--:|")
    for name, make in CASES.items():
        try:
            value = f"{difference(make()):.2g}"
        except Exception as error:  # noqa: BLE001 - an older eqopt may refuse
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            value = f"{type(error).__name__}: {first[:70]}"
        print(f"| {name} | {value} |", flush=True)


if __name__ == "__main__":
    main()
