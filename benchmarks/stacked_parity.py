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
import pathlib
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The model is the stacked-layers tests' (tests/_stacked_model.py).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _stacked_model import (  # noqa: E402
    Stacked,
    make_models,
    random_grads,
    relative_difference,
    unstack,
)

import eqopt  # noqa: E402
import eqopt.contrib  # noqa: E402

STEPS = 3


def restack(tree):
    """The stacked model (or its state's tree) of a list one."""
    return Stacked(jax.tree.map(lambda *xs: jnp.stack(xs), *tree.blocks), tree.head)


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
        updates, state = step(tx, as_model(random_grads(STACKED, k)), state, model)
        model = eqopt.apply_updates(model, updates)
    return updates


def difference(tx):
    state = share_draws(tx.init(STACKED), tx.init(LISTED))
    ours = last_updates(tx, STACKED, lambda g: g, state)
    return relative_difference(ours, last_updates(tx, LISTED, unstack))


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

STACKED, LISTED = make_models()


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
