"""Gram Newton–Schulz against the standard iteration: one orthogonalisation, jitted.

Times Muon's orthogonalisation (`eqopt.contrib._newton_schulz.orthogonalize`, five
quintic steps, Polar Express coefficients) of a 1024x4096 and a 4096x1024 float32
matrix with `orthogonalization="gram"` and the standard iteration, interleaved in one
process (the order mirrored round by round), and reports per-round medians combined
by a geometric mean, with an A/A row (standard against a second, identical standard
executable) for the noise. The CPU is shared: pass `--quick` for a short run.

    python benchmarks/gram_ns_bench.py [--quick] [--rounds R] [--reps N]
"""

import argparse
import os
import statistics
import sys
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_report import (  # noqa: E402
    fmt_ms,
    fmt_ratio,
    geometric_mean,
    markdown_table,
    stderr_log,
)

from eqopt.contrib import MuonDimensionNumbers  # noqa: E402
from eqopt.contrib._newton_schulz import (  # noqa: E402
    _as_coefficients,
    orthogonalize,
)

SHAPES = ((1024, 4096), (4096, 1024))
VARIANTS = ("standard", "standard-aa", "gram")


def make_runner(method, coefficients):
    dims = MuonDimensionNumbers(reduction_axis=0, output_axis=1)

    @jax.jit
    def run(x):
        return orthogonalize(x, dims, coefficients, 5, "frobenius", 1e-7, method)

    return run


def mirrored(round_, variants):
    order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
    return order if round_ % 2 == 0 else order[::-1]


def bench(shape, args, log):
    coefficients = _as_coefficients("polar_express")
    x = jax.random.normal(jax.random.key(0), shape)
    runners = {
        "standard": make_runner("newton_schulz", coefficients),
        # A second executable of the same computation: its ratio is the noise.
        "standard-aa": make_runner("newton_schulz", coefficients + 0.0),
        "gram": make_runner("gram", coefficients),
    }
    for run in runners.values():
        run(x).block_until_ready()  # compile
    medians = {v: [] for v in VARIANTS}
    for round_ in range(args.rounds):
        samples = {v: [] for v in VARIANTS}
        for _ in range(args.reps):
            for name in mirrored(round_, list(VARIANTS)):
                start = time.perf_counter()
                runners[name](x).block_until_ready()
                samples[name].append(time.perf_counter() - start)
        for name in VARIANTS:
            medians[name].append(statistics.median(samples[name]))
        log(
            f"{shape} round {round_ + 1}: "
            + " ".join(f"{v}={1e3 * medians[v][-1]:.4g}ms" for v in VARIANTS)
        )
    base = medians["standard"]
    return {
        v: (
            1e3 * geometric_mean(medians[v]),
            geometric_mean([a / b for a, b in zip(medians[v], base, strict=True)]),
        )
        for v in VARIANTS
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 reps")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.reps = 2, 3
    log = stderr_log()
    rows = []
    for shape in SHAPES:
        result = bench(shape, args, log)
        for name, label in (("gram", "gram / standard"), ("standard-aa", "A/A")):
            rows.append(
                (
                    f"{shape[0]}x{shape[1]}",
                    label,
                    fmt_ms(result[name][0]),
                    fmt_ms(result["standard"][0]),
                    fmt_ratio(result[name][1]),
                )
            )
    header = ("matrix", "row", "ms", "ms standard", "ratio")
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {os.cpu_count()} cpus")
    print(markdown_table(header, rows, numeric={2, 3, 4}))


if __name__ == "__main__":
    main()
