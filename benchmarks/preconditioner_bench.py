"""Compile and step time of eqopt's Shampoo and PSGD Kron against the JAX packages
researchers use today, interleaved in one process with an A/A run.

- Kron: `eqopt.contrib.kron` against `psgd_jax.kron` (Evan Walters' PSGD Kron,
  the reference the tests compare numbers with; `distributed_kron` 2.0 does not
  import under JAX 0.10), both refitting the preconditioner at every step
  (`preconditioner_update_probability=1`, the first 500 steps of the default
  schedule);
- Shampoo: `eqopt.contrib.shampoo` against `precondition-opt`'s
  `distributed_shampoo` (Anil et al.), both with blocks of 128, SGD grafting,
  inverse roots by the coupled Newton iteration recomputed at every step.

Each is run on `step_bench.py`'s ResNet-like and transformer-like trees (sizes
from `--quick` there, or smaller: this is CPU work with matrix roots), on the
default path (params as they are) and on `eqopt.pack`ed params.

In each round every variant compiles (`jax.jit(step).lower(...).compile()` of a
fresh closure after `jax.clear_caches()`, in an order mirrored in the next
round), then the steps (`update` + `apply_updates`, params and state donated)
are timed with the variants alternating. The table gives, per variant, the
geometric mean over the rounds of its ratio to the oracle's time in the same
round (< 1: faster than the oracle); the oracle run a second time (A/A) shows
the noise.

    python benchmarks/preconditioner_bench.py                 # ~10 minutes on 2 busy cores
    python benchmarks/preconditioner_bench.py --rounds 4 --steps 10
"""

import argparse
import contextlib
import gc
import math
import statistics
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_compilation_cache", False)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import eqopt  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
import step_bench  # noqa: E402
from _precond_oracles import (  # noqa: E402
    distributed_shampoo,
    old_jax_tree_names,
    psgd_jax_kron,
)

LEARNING_RATE = 1e-3


def make_tree(name, args):
    tree_args = step_bench.parse_args(
        [
            "--resnet-width",
            str(args.resnet_width),
            "--tf-width",
            str(args.tf_width),
            "--tf-blocks",
            "1",
            "--tf-vocab",
            str(args.tf_vocab),
            "--tf-context",
            "64",
        ]
    )
    return step_bench.TREE_MAKERS[name](tree_args, jax.random.key(0))


def make_optimiser(variant):
    """(transform, is_eqopt) for a variant name `<optimiser>:<library>`."""
    optimiser, library = variant.split(":")
    if optimiser == "kron":
        if library.startswith("eqopt"):
            return eqopt.contrib.kron(
                LEARNING_RATE, preconditioner_update_probability=1.0
            ), True
        return psgd_jax_kron().kron(
            LEARNING_RATE,
            preconditioner_update_probability=1.0,
            precond_update_precision=None,
        ), False
    if library.startswith("eqopt"):
        return eqopt.contrib.shampoo(
            LEARNING_RATE, block_size=128, root_method="newton"
        ), True
    module = distributed_shampoo()
    return module.distributed_shampoo(
        LEARNING_RATE, block_size=128, generate_training_metrics=False
    ), False


class Runner:
    def __init__(self, variant, model):
        tx, is_eqopt = make_optimiser(variant)
        rng = np.random.default_rng(1)
        grads = jax.tree.map(
            lambda x: jnp.asarray(rng.standard_normal(x.shape, np.float32) * 1e-2),
            model,
        )
        if variant.endswith("packed"):
            model = eqopt.pack(model)
            grads = eqopt.Packed.like(model, grads)
        with quiet():
            self.state = tx.init(model)
        if is_eqopt:
            opt_arrays, opt_static = eqx.partition(tx, eqx.is_array)
            _, model_static = eqx.partition(model, eqx.is_array)

            def factory():
                def step(opt_arrays, params, state, grads):
                    opt = eqx.combine(opt_arrays, opt_static)
                    model = eqx.combine(params, model_static)
                    updates, state = opt.update(grads, state, model)
                    model = eqopt.apply_updates(model, updates)
                    return eqx.filter(model, eqx.is_array), state

                return jax.jit(step, donate_argnums=(1, 2))

            self.prefix = (opt_arrays,)
        else:

            def factory():
                def step(params, state, grads):
                    updates, state = tx.update(grads, state, params)
                    return jax.tree.map(jnp.add, params, updates), state

                return jax.jit(step, donate_argnums=(0, 1))

            self.prefix = ()
        self.factory = factory
        self.params = step_bench.copy_arrays(eqx.filter(model, eqx.is_array))
        self.grads = grads

    def compile(self):
        jax.clear_caches()
        gc.collect()
        start = time.perf_counter()
        with quiet():
            self.step = (
                self.factory()
                .lower(*self.prefix, self.params, self.state, self.grads)
                .compile()
            )
        return time.perf_counter() - start

    def run(self, n):
        params, state = self.params, self.state
        start = time.perf_counter()
        for _ in range(n):
            params, state = self.step(*self.prefix, params, state, self.grads)
        jax.block_until_ready((params, state))
        self.params, self.state = params, state
        return (time.perf_counter() - start) / n


@contextlib.contextmanager
def quiet():
    """The oracles' old `jax.tree_map` names, and psgd_jax's size printout silenced."""
    import io

    with old_jax_tree_names(), contextlib.redirect_stdout(io.StringIO()):
        yield


def bench(optimiser, tree_name, args):
    oracle = "psgd_jax" if optimiser == "kron" else "precondition-opt"
    variants = [
        f"{optimiser}:{oracle}",
        f"{optimiser}:{oracle}-aa",
        f"{optimiser}:eqopt",
    ]
    if args.packed:
        variants.append(f"{optimiser}:eqopt-packed")
    model = make_tree(tree_name, args)
    runners = {v: Runner(v, model) for v in variants}
    compile_ratios = {v: [] for v in variants}
    step_ratios = {v: [] for v in variants}
    for round_ in range(args.rounds):
        order = variants if round_ % 2 == 0 else variants[::-1]
        compiles = {v: runners[v].compile() for v in order}
        for v in order:
            runners[v].run(args.warmup)
        times = {v: [] for v in variants}
        for _ in range(args.reps):
            for v in order:
                times[v].append(runners[v].run(args.steps))
        base_compile = compiles[variants[0]]
        base_step = statistics.median(times[variants[0]])
        for v in variants:
            compile_ratios[v].append(compiles[v] / base_compile)
            step_ratios[v].append(statistics.median(times[v]) / base_step)
        print(
            f"  {optimiser}/{tree_name} round {round_}: oracle step {base_step * 1e3:.1f} ms,"
            f" compile {base_compile:.1f} s",
            flush=True,
        )
    size = sum(x.size for x in jax.tree.leaves(model))
    rows = []
    for v in variants[1:]:
        gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
        rows.append(
            (
                optimiser,
                tree_name,
                size,
                len(jax.tree.leaves(model)),
                v.split(":")[1],
                gm(step_ratios[v]),
                gm(compile_ratios[v]),
            )
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimisers", nargs="+", default=["kron", "shampoo"])
    parser.add_argument("--trees", nargs="+", default=["resnet", "transformer"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--resnet-width", type=int, default=8)
    parser.add_argument("--tf-width", type=int, default=64)
    parser.add_argument("--tf-vocab", type=int, default=512)
    parser.add_argument(
        "--packed",
        action="store_true",
        help="also time eqopt on `eqopt.pack`ed params (a non-elementwise"
        " optimiser then sees each leaf through the packed view)",
    )
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {args}")
    rows = []
    for tree_name in args.trees:
        for optimiser in args.optimisers:
            rows += bench(optimiser, tree_name, args)
            print("  rows so far:", rows[-3:], flush=True)
    print(
        "\n| optimiser | tree | params | leaves | variant | step / oracle | compile / oracle |"
    )
    print("|---|---|---|---|---|---|---|")
    for optimiser, tree, size, leaves, variant, step, compile_ in rows:
        print(
            f"| {optimiser} | {tree} | {size / 1e6:.2f}M | {leaves} | {variant} |"
            f" {step:.2f} | {compile_:.2f} |"
        )


if __name__ == "__main__":
    main()
