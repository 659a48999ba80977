"""Runs a PyTorch optimiser (the test-only oracles `pytorch-optimizer`, heavyball) on
numpy parameters and gradients, for comparison with eqopt over several steps."""

from collections.abc import Callable, Sequence

import jax
import numpy as np
from _oracles import import_oracle


def torch_steps(
    make_optimizer: Callable,
    params: dict[str, np.ndarray],
    grads: Sequence[dict[str, np.ndarray]],
    before_first_step: Callable | None = None,
) -> list[dict[str, np.ndarray]]:
    """The parameters after each step of `make_optimizer(tensors)` fed `grads`.

    `make_optimizer` receives the dict of float64 torch tensors; `before_first_step`
    (optional) receives the optimiser and the tensors once the first gradients are
    set, to adjust its state.
    """
    torch = import_oracle("torch")
    # Parameters, so that an oracle built from a torch module can hold these tensors.
    tensors = {
        k: torch.nn.Parameter(torch.tensor(np.asarray(v, np.float64)))
        for k, v in params.items()
    }
    optimizer = make_optimizer(tensors)
    out = []
    for index, g in enumerate(grads):
        for k, t in tensors.items():
            t.grad = torch.tensor(np.asarray(g[k], np.float64))
        if index == 0 and before_first_step is not None:
            before_first_step(optimizer, tensors)
        optimizer.step()
        out.append({k: t.detach().numpy().copy() for k, t in tensors.items()})
    return out


def eqopt_steps(tx, params, grads) -> list[dict[str, np.ndarray]]:
    """The parameters after each step of the eqopt transform `tx` fed `grads`."""
    import eqopt

    params = jax.tree.map(jax.numpy.asarray, params)
    state = tx.init(params)
    out = []
    for g in grads:
        g = jax.tree.map(jax.numpy.asarray, g)
        updates, state = tx.update(g, state, params)
        params = eqopt.apply_updates(params, updates)
        out.append(jax.tree.map(np.asarray, params))
    return out


def random_problem(shapes: dict[str, tuple[int, ...]], steps: int, seed: int = 0):
    """Random float32 params and `steps` gradients (as numpy) with the given shapes."""
    rng = np.random.default_rng(seed)
    params = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    grads = [
        {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
        for _ in range(steps)
    ]
    return params, grads


def max_difference(ours, theirs) -> float:
    """The largest absolute difference over all steps and leaves."""
    return max(
        float(np.max(np.abs(np.asarray(a[k], np.float64) - b[k])))
        for a, b in zip(ours, theirs, strict=True)
        for k in b
    )
