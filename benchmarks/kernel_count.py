"""How many distinct kernels XLA compiles for one optimiser step, eqopt against Optax.

XLA on CPU compiles each distinct fused kernel once with LLVM (about 10 ms
each on a 2-core machine) and reuses it for every leaf of the same shape, so
the number of *distinct* kernels, not the number of leaves, drives compile
time. A per-leaf update whose kernels differ from leaf to leaf (for example in
the order of their parameters) compiles more of them. This script builds the
steps of `step_bench.py` (same trees, same cases, same jitted functions) and
counts, for Optax, for eqopt with its hyperparameters as inputs of the program
(the default, as `eqx.filter_jit` passes them) and for eqopt closed over (its
hyperparameters constants, as Optax's Python floats are), the fused kernels
and how many of them are distinct.

    python benchmarks/kernel_count.py                    # resnet-shaped tree, --quick sizes
    python benchmarks/kernel_count.py --trees small --cases adam
"""

import argparse
import re
import sys
from pathlib import Path

import equinox as eqx
import jax

sys.path.insert(0, str(Path(__file__).parent))
import step_bench  # noqa: E402

FUSED = re.compile(r"^%fused_computation[.\d]* \((.*?)^}", flags=re.S | re.M)


def _normalise(body: str) -> str:
    # Two kernels are the same program when they differ only in names.
    body = re.sub(r", metadata=\{[^}]*\}", "", body)
    body = re.sub(r"%[\w.\-]+", "%x", body)
    return re.sub(r"param_[\d.]+", "p", body)


def count(hlo_text: str) -> tuple[int, int]:
    bodies = FUSED.findall(hlo_text)
    return len(bodies), len({_normalise(b) for b in bodies})


def compiled_text(library, case, model, grads, closed=False):
    runner = step_bench.Runner(library, case, model, grads, total_steps=1000)
    if closed:
        opt_arrays = runner.prefix[0]
        step = runner.factory()
        jitted = jax.jit(lambda *a: step(opt_arrays, *a))
        return jitted.lower(*runner.args()[1:]).compile().as_text()
    return runner.factory().lower(*runner.args()).compile().as_text()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(step_bench.DEFAULT_CASES))
    parser.add_argument("--trees", default="resnet")
    parser.add_argument(
        "--full-size", action="store_true", help="step_bench's default sizes"
    )
    args = parser.parse_args(argv)
    bench_args = step_bench.parse_args([] if args.full_size else ["--quick"])
    print(
        "| case | tree | leaves | kernels | distinct: Optax | eqopt | eqopt closed over |"
    )
    print("|---|---|--:|--:|--:|--:|--:|")
    for tree in args.trees.split(","):
        model = step_bench.TREE_MAKERS[tree](bench_args, jax.random.key(0))
        grads = step_bench.make_grads(model, 1)
        leaves = len(jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)))
        for case in args.cases.split(","):
            n, optax_distinct = count(compiled_text("optax", case, model, grads))
            _, eqopt_distinct = count(compiled_text("eqopt", case, model, grads))
            _, closed_distinct = count(compiled_text("eqopt", case, model, grads, True))
            print(
                f"| {case} | {tree} | {leaves} | {n} | {optax_distinct} | "
                f"{eqopt_distinct} | {closed_distinct} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
