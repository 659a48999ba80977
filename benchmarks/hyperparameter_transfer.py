"""What an optimiser's hyperparameters cost at the `jit` boundary, per call.

eqopt's hyperparameters are array leaves, so an optimiser passed into a jitted
step (`step(model, state, opt, batch)`) takes them as inputs: a new value is not
a new program. A JAX scalar on the device crosses the boundary without a copy;
a NumPy scalar (or a Python float passed as an argument) is copied to the
device at every call. This prints, interleaved in one process:

- a tiny jitted function given `k` scalars as NumPy, device or Python values
  (microseconds per call; the `k = 0` rows are the dispatch alone);
- an Adam step with the optimiser passed in, its hyperparameters as they are
  (device scalars) and through `eqopt.on_host` (NumPy), as a ratio.

On an NVIDIA H200 (jax 0.11.2) each NumPy scalar cost 45-75 us per call and the
Adam step of a small model took 1.75 times as long through `eqopt.on_host`;
on the 2-core CPU, about 1.5 us per scalar.

    python benchmarks/hyperparameter_transfer.py
"""

import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import eqopt


def per_call(fn, *args, calls: int = 50, rounds: int = 7) -> float:
    """Median seconds per call of `fn(*args)` (dispatch included)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def scalars_table() -> None:
    x = jnp.ones((256, 256))
    scale = jax.jit(lambda x, scalars: x * sum(scalars))
    makers = {
        "numpy": lambda v: np.asarray(v),
        "device": lambda v: jnp.asarray(v),
        "python": lambda v: v,
    }
    print("| scalars | " + " | ".join(f"{k} (us/call)" for k in makers) + " |")
    print("|---|" + "---|" * len(makers))
    for k in (0, 1, 4, 16):
        row = [
            per_call(scale, x, [make(0.5 + i) for i in range(k)]) * 1e6
            for make in makers.values()
        ]
        print(f"| {k} | " + " | ".join(f"{t:.1f}" for t in row) + " |")


def adam_step_ratio(rounds: int = 5) -> None:
    model = [jnp.ones((64, 64)) for _ in range(8)]

    @eqx.filter_jit(donate="all-except-first")
    def step(opt, model, state):
        grads = jax.tree.map(lambda m: m * 0.01, model)
        updates, state = opt.update(grads, state, model)
        return eqopt.apply_updates(model, updates), state

    variants = {"device": eqopt.adam(1e-3), "on_host": eqopt.on_host(eqopt.adam(1e-3))}
    # Each variant its own copy of the model: the step donates it.
    entries = {
        name: [opt, [jnp.copy(m) for m in model], opt.init(model)]
        for name, opt in variants.items()
    }

    def run(name):
        opt, params, state = entries[name]
        params, state = step(opt, params, state)
        entries[name][1:] = [params, state]
        return params

    ratios = []
    for _ in range(rounds):
        times = {
            name: per_call(lambda n=name: run(n), calls=30, rounds=3)
            for name in entries
        }
        ratios.append(times["on_host"] / times["device"])
    print(
        f"Adam step, optimiser passed in: on_host / device = {statistics.median(ratios):.2f} "
        f"(rounds: {' '.join(f'{r:.2f}' for r in ratios)})"
    )


def main() -> None:
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}")
    scalars_table()
    adam_step_ratio()


if __name__ == "__main__":
    main()
