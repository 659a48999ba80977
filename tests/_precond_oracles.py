"""The independent implementations the Kronecker-factored optimisers are checked against.

Each loader returns the oracle module, or skips the test with the reason (fails
it under `EQOPT_REQUIRE_ORACLES=1`, as `.ci/run` sets it: see `_oracles.py`). Two of
them need a shim for today's JAX and Optax (test-time only, nothing in eqopt):

- `psgd_jax` 0.2.9 imports `optax._src.clipping`, which Optax 0.2.8 no longer
  has (it uses nothing from it): an empty module stands in;
- `precondition-opt` 0.3.0 calls `jax.tree_map` and friends, removed from JAX:
  they are pointed at `jax.tree.*` while its functions run.

`distributed_kron` 2.0.0 (a later `psgd_jax`) annotates with
`PartitionSpec[str, str]`, which JAX 0.10's `PartitionSpec` refuses at import;
it is not used.
"""

import contextlib
import sys
import types

import jax
import numpy as np
from _oracles import missing_oracle as _skip


def torch_and_pytorch_optimizer():
    try:
        import pytorch_optimizer
        import torch
    except Exception as error:  # noqa: BLE001 - any import failure skips
        _skip("pytorch-optimizer (with torch)", error)
    return torch, pytorch_optimizer


def psgd_jax_kron():
    try:
        import optax._src

        name = "optax._src.clipping"
        if name not in sys.modules:
            sys.modules[name] = types.ModuleType(name)
            optax._src.clipping = sys.modules[name]  # pyright: ignore
        import psgd_jax.kron as kron
    except Exception as error:  # noqa: BLE001
        _skip("psgd-jax", error)
    return kron


@contextlib.contextmanager
def old_jax_tree_names():
    """`jax.tree_map`, `jax.tree_flatten`... as `precondition-opt` calls them."""
    names = {
        "tree_map": jax.tree.map,
        "tree_flatten": jax.tree.flatten,
        "tree_unflatten": jax.tree.unflatten,
        "tree_leaves": jax.tree.leaves,
    }
    missing = [name for name in names if not hasattr(jax, name)]
    for name in missing:
        setattr(jax, name, names[name])
    try:
        yield
    finally:
        for name in missing:
            delattr(jax, name)


def distributed_shampoo():
    try:
        from precondition import distributed_shampoo
    except Exception as error:  # noqa: BLE001
        _skip("precondition-opt", error)
    return distributed_shampoo


def draw(shapes: dict, seed: int) -> dict:
    """A dict of standard normal arrays of the given shapes."""
    key = jax.random.key(seed)
    return {
        name: jax.random.normal(jax.random.fold_in(key, i), shape)
        for i, (name, shape) in enumerate(shapes.items())
    }


def relative_difference(ours, theirs) -> float:
    """max |ours - theirs| / max |theirs| over the leaves of two dicts."""
    worst = 0.0
    for key in theirs:
        a, b = np.asarray(ours[key], np.float64), np.asarray(theirs[key], np.float64)
        worst = max(worst, float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)))
    return worst
