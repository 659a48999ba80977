"""Compile time and step time of eqopt against Optax, interleaved in one process.

For each optimiser case (`sgdm`, `adam`, `adamw`, clipped `adamw` on a
warmup-cosine schedule with weight decay masked to matrices, `lion`, `rmsprop`,
`adafactor`) and each parameter tree (`mlp`: an `eqx.nn.MLP` of ~1M params in
8 leaves; `resnet`: ResNet-50-shaped, ~11M in 161 leaves; `transformer`: ~26M in
148 leaves; `small`: 2000 small leaves; `onebig`: one 33M leaf), this times
five variants (Optax, Optax again for the noise, eqopt's default path,
`eqopt.bucketed`, `eqopt.pack`ed params):

- compile time: `jax.jit(step).lower(...)` (tracing, where eqopt's trace-time
  checks run) plus `.compile()` (XLA), each on a fresh closure after
  `jax.clear_caches()`;
- step time: one call of the compiled `update` + `apply_updates` on fixed
  gradients, with the params and state donated, timed with
  `block_until_ready`.

The work runs in rounds: every variant compiles (in an order that is mirrored
in the next round, see `compile_orders`), then steps are timed on those
executables, the variants alternating. The table reports, for each variant,
the geometric mean over the rounds of its ratio to Optax's median in the same
round (< 1 means faster than Optax).

Both libraries are jitted the same way, with `jax.jit` on trees of arrays:
Optax gets `eqx.filter(model, eqx.is_array)`, and eqopt gets the same arrays,
recombined inside the jitted function with the model's non-array leaves (so
`opt.update` sees the whole Equinox model, as in docs/design.md, "Whole models
are the params") and with the
optimiser's array leaves (its hyperparameters) passed as arguments, as
`eqx.filter_jit` would pass them.

    python benchmarks/step_bench.py            # default sizes, about 70 minutes on 2 cores
    python benchmarks/step_bench.py --quick    # smoke run, about 7 minutes on 2 cores
    JAXTYPING_DISABLE=1 python benchmarks/step_bench.py   # eqopt without beartype checks
"""

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time

import jax

# Compile timings must not come from a cache on disk.
jax.config.update("jax_enable_compilation_cache", False)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

#: What is timed: Optax; Optax again (an A/A run, for the noise); eqopt on the
#: params as they are (the default path); eqopt with its state bucketed
#: (`eqopt.bucketed`, params as they are); eqopt on `eqopt.pack`ed params.
from bench_report import LIBRARIES  # noqa: E402

import eqopt  # noqa: E402

CASES = ("sgdm", "adam", "adamw", "clip+adamw+cos", "lion", "rmsprop", "adafactor")
DEFAULT_CASES = (
    "sgdm",
    "adam",
    "adamw",
    "clip+adamw+cos",
    "lion",
    "rmsprop",
    "adafactor",
)
TREES = ("mlp", "resnet", "transformer", "small", "onebig")

from bench_trees import (  # noqa: E402, F401  # noqa: E402
    LEARNING_RATE,
    SMALL_SHAPES as SMALL_SHAPES,
    TREE_MAKERS as TREE_MAKERS,
    WEIGHT_DECAY,
    is_matrix as is_matrix,
    make_mlp as make_mlp,
    make_onebig as make_onebig,
    make_optimiser as make_optimiser,
    make_resnet as make_resnet,
    make_small as make_small,
    make_transformer as make_transformer,
)


def copy_arrays(tree):
    """A copy in fresh device buffers (through NumPy, so nothing is compiled)."""
    return jax.tree.map(lambda x: jnp.asarray(np.array(x)), tree)


class Runner:
    """Everything one library needs for one (case, tree): a step factory and its arguments."""

    def __init__(self, library, case, model, grads, total_steps):
        self.library = library
        params = eqx.filter(model, eqx.is_array)
        if library.startswith("optax"):
            tx = make_optimiser("optax", case, total_steps)
            self.state = tx.init(params)

            def factory():
                def step(params, state, grads):
                    updates, state = tx.update(grads, state, params)
                    return optax.apply_updates(params, updates), state

                return jax.jit(step, donate_argnums=(0, 1))

            self.prefix = ()
        else:
            opt = make_optimiser("eqopt", case, total_steps)
            if library == "eqopt-bucketed":
                opt = eqopt.bucketed(opt)
            opt_arrays, opt_static = eqx.partition(opt, eqx.is_array)
            if library == "eqopt-packed":
                # The model's trainable arrays in one buffer per dtype; gradients as
                # `eqx.filter_grad` of `loss(packed.unpack())` gives them.
                model = eqopt.pack(model)
                grads = eqopt.Packed.like(model, grads)
                params = eqx.filter(model, eqx.is_array)
            self.state = opt.init(model)  # the whole model
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
        self.factory = factory
        self.params = copy_arrays(params)  # its own buffers: they are donated
        self.grads = grads
        self.step = factory()

    def args(self):
        return (*self.prefix, self.params, self.state, self.grads)

    def time_compile(self):
        """Trace + lower and XLA compile times of a fresh closure, caches cleared.

        Returns `((trace_wall, trace_cpu), (xla_wall, xla_cpu))` in seconds, and
        keeps the compiled step for the step timings (it has the same fast C++
        dispatch path as a `jax.jit` function), so nothing is compiled twice.
        """
        jax.clear_caches()
        gc.collect()
        jitted = self.factory()
        args = self.args()
        gc.disable()
        try:
            wall0, cpu0 = time.perf_counter(), time.process_time()
            lowered = jitted.lower(*args)
            wall1, cpu1 = time.perf_counter(), time.process_time()
            compiled = lowered.compile()
            wall2, cpu2 = time.perf_counter(), time.process_time()
        finally:
            gc.enable()
        self.step = compiled
        return (wall1 - wall0, cpu1 - cpu0), (wall2 - wall1, cpu2 - cpu1)

    def run(self, n):
        """Seconds per step `(wall, process cpu)` over `n` steps, blocking on the result."""
        step = self.step
        prefix, grads = self.prefix, self.grads
        params, state = self.params, self.state
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            params, state = step(*prefix, params, state, grads)
        jax.block_until_ready((params, state))
        wall1, cpu1 = time.perf_counter(), time.process_time()
        self.params, self.state = params, state
        return (wall1 - wall0) / n, (cpu1 - cpu0) / n


def max_relative_difference(a, b):
    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        worst = max(worst, float(np.max(np.abs(x - y)) / (np.max(np.abs(y)) + 1e-30)))
    return worst


# ---------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------


def orders(rep):
    # A rotation, reversed every other repetition: no variant always runs first.
    k = rep % len(LIBRARIES)
    order = LIBRARIES[k:] + LIBRARIES[:k]
    return order if rep % 2 == 0 else order[::-1]


def compile_orders(round_):
    """The order the variants compile in: rounds come in pairs, the second the mirror
    of the first, so that over a pair every variant's positions add up the same.

    The order matters for the step timings, not only the compile timings: an
    executable compiled later in the process runs slower. On the 1000-leaf tree,
    three identical Optax Adam steps compiled one after the other ran at 18.7,
    19.9 and 22.4 ms (medians of 21 interleaved repetitions), and recompiling the
    first moved it to last place. Steps are therefore timed after every round,
    each variant's samples pooled over the rounds.
    """
    k = (round_ // 2) % len(LIBRARIES)
    order = LIBRARIES[k:] + LIBRARIES[:k]
    return order if round_ % 2 == 0 else order[::-1]


def make_grads(model, seed):
    """Fixed gradients: `None` at non-array leaves, as `eqx.filter_grad` gives them."""
    rng = np.random.default_rng(seed + 1)
    return jax.tree.map(
        lambda p: jnp.asarray((rng.standard_normal(p.shape) * 1e-2).astype(p.dtype)),
        eqx.filter(model, eqx.is_array),
    )


def trainable_params(runner):
    params = runner.params
    if runner.library == "eqopt-packed":
        params = params.unpack()
    return eqx.filter(params, eqx.is_inexact_array)


def streaming_bandwidth(n, reps=9):
    """Bytes per second of `y = a * x + y` on `n` float32 (reads 8n bytes, writes 4n)."""
    x = jnp.ones((n,), jnp.float32)
    y = jnp.ones((n,), jnp.float32)
    axpy = jax.jit(lambda x, y: 0.5 * x + y, donate_argnums=1)
    y = axpy(x, y).block_until_ready()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        y = axpy(x, y).block_until_ready()
        times.append(time.perf_counter() - t0)
    return 12 * n / statistics.median(times)


def bench_one(case, tree_name, model, grads, args, log):
    params = eqx.filter(model, eqx.is_array)
    leaves = jax.tree.leaves(params)
    n_params = sum(x.size for x in leaves)
    total_steps = 10_000
    runners = {lib: Runner(lib, case, model, grads, total_steps) for lib in LIBRARIES}

    samples = {
        lib: {m: {"wall": [], "cpu": []} for m in ("trace", "xla", "compile", "step")}
        for lib in LIBRARIES
    }

    # Rounds: compile every variant (fresh closures, caches cleared, in the order of
    # `compile_orders`), then time steps on those executables.
    compile_reps = compile_reps_for(vars(args), tree_name)
    rounds, step_reps_per_round = round_plan(vars(args), tree_name)
    differences = None
    inner = None
    step_rep = 0
    for round_ in range(rounds):
        for lib in compile_orders(round_):
            trace, xla = runners[lib].time_compile()
            if compile_reps:
                for i, clock in enumerate(("wall", "cpu")):
                    samples[lib]["trace"][clock].append(trace[i])
                    samples[lib]["xla"][clock].append(xla[i])
                    samples[lib]["compile"][clock].append(trace[i] + xla[i])
        if not step_reps_per_round:
            continue

        if differences is None:
            # Same computation? One step from identical params.
            for runner in runners.values():
                runner.run(1)
            differences = {
                lib: max_relative_difference(
                    trainable_params(runners[lib]), trainable_params(runners["optax"])
                )
                for lib in LIBRARIES
            }
            for lib, difference in differences.items():
                if difference > 1e-4:
                    log(
                        f"  WARNING: {lib} and Optax differ after one step"
                        f" (max rel diff {difference:.2e})"
                    )

        # Step time: warm up, calibrate the steps per repetition once, variants alternating.
        for runner in runners.values():
            runner.run(args.warmup)
        if inner is None:
            one = statistics.median(runners["optax"].run(1)[0] for _ in range(3))
            inner = max(1, math.ceil(args.rep_seconds / max(one, 1e-9)))
        gc.collect()
        gc.disable()  # no collection pauses inside a timed repetition
        try:
            for _ in range(step_reps_per_round):
                for lib in orders(step_rep):
                    wall, cpu = runners[lib].run(inner)
                    samples[lib]["step"]["wall"].append(wall)
                    samples[lib]["step"]["cpu"].append(cpu)
                step_rep += 1
        finally:
            gc.enable()

    result = {
        "case": case,
        "tree": tree_name,
        "leaves": len(leaves),
        "params": int(n_params),
        "one_step_max_rel_diff": differences,
        "steps_per_rep": inner,
        "rounds": rounds,
        "step_reps_per_round": step_reps_per_round,
        "samples_s": samples,
    }
    if tree_name == "onebig":
        bandwidth = streaming_bandwidth(int(n_params))
        result["bandwidth_GBps"] = bandwidth / 1e9
    summarise(result)
    del runners, params
    jax.clear_caches()
    gc.collect()
    return result


def compile_reps_for(args, tree_name):
    """The compile repetitions asked for one tree (fewer for the many-leaf one)."""
    return args["compile_reps"] if tree_name != "small" else args["small_compile_reps"]


def round_plan(args, tree_name):
    """`(rounds, step repetitions per round)` for one tree, from the arguments.

    Rounds come in mirrored pairs: `compile_reps` rounded up to even, and two
    rounds when only steps are timed (`compile_reps` 0: the compile times are not
    kept).
    """
    compile_reps = compile_reps_for(args, tree_name)
    rounds = 2 * math.ceil(max(compile_reps, 1 if args["step_reps"] else 0) / 2)
    return rounds, math.ceil(args["step_reps"] / rounds) if rounds else 0


from bench_report import (  # noqa: E402
    fmt_count as fmt_count,
    fmt_ms as fmt_ms,
    fmt_ratio as fmt_ratio,
    geometric_mean as geometric_mean,
    summarise as summarise,
    table as table,
)

QUICK = {
    "mlp_in": 256,
    "mlp_width": 256,
    "mlp_depth": 2,
    "tf_width": 128,
    "tf_blocks": 1,
    "tf_vocab": 1000,
    "tf_context": 64,
    "small_leaves": 100,
    "resnet_width": 8,
    "onebig_size": 1_000_000,
    "compile_reps": 2,
    "small_compile_reps": 2,
    "step_reps": 8,
    "rep_seconds": 0.01,
    "warmup": 2,
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="eqopt / Optax compile-time and step-time ratios.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small trees and few repetitions: a smoke run of about 7 minutes on 2 cores",
    )
    parser.add_argument(
        "--cases",
        default=",".join(DEFAULT_CASES),
        help="comma-separated subset of " + ", ".join(CASES),
    )
    parser.add_argument(
        "--trees",
        default=",".join(TREES),
        help="comma-separated subset of " + ", ".join(TREES),
    )
    parser.add_argument(
        "--compile-reps",
        type=int,
        default=4,
        help="compile rounds (each compiles every variant; rounded up to an even"
        " number, so that the compile orders come in mirrored pairs; 0: two rounds,"
        " compile times not kept)",
    )
    parser.add_argument(
        "--small-compile-reps",
        type=int,
        default=2,
        help="compile rounds for the many-leaf tree (each compile takes 5-70 s on"
        " 2 cores)",
    )
    parser.add_argument(
        "--step-reps",
        type=int,
        default=21,
        help="step-time repetitions per library, spread over the compile rounds"
        " (0: skip step timing)",
    )
    parser.add_argument(
        "--rep-seconds",
        type=float,
        default=0.1,
        help="target length of one step-time repetition (sets the steps per repetition)",
    )
    parser.add_argument(
        "--warmup", type=int, default=3, help="untimed steps before timing"
    )
    parser.add_argument("--mlp-in", type=int, default=1024)
    parser.add_argument("--mlp-width", type=int, default=512)
    parser.add_argument("--mlp-depth", type=int, default=3)
    parser.add_argument(
        "--tf-width", type=int, default=384, help="model width d (MLP width is 4d)"
    )
    parser.add_argument("--tf-blocks", type=int, default=12)
    parser.add_argument("--tf-vocab", type=int, default=12_000)
    parser.add_argument("--tf-context", type=int, default=512)
    parser.add_argument("--small-leaves", type=int, default=2000)
    parser.add_argument(
        "--resnet-width",
        type=int,
        default=42,
        help="ResNet-50 stem width (42: ~11M params; 64 is the real ResNet-50, ~25M)",
    )
    parser.add_argument("--onebig-size", type=int, default=33_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write every measurement to this file")
    parser.add_argument(
        "--table-from",
        nargs="+",
        metavar="JSON",
        help="measure nothing: print the table of results saved with --json",
    )
    args = parser.parse_args(argv)
    if args.quick:
        # Smaller trees and fewer repetitions, except where given on the command line.
        for name, value in QUICK.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    args.trees = [t.strip() for t in args.trees.split(",") if t.strip()]
    for c in args.cases:
        if c not in CASES:
            parser.error(f"unknown case {c!r}; choose from {CASES}")
    for t in args.trees:
        if t not in TREES:
            parser.error(f"unknown tree {t!r}; choose from {TREES}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.table_from:
        results = []
        for path in args.table_from:
            with open(path) as f:
                saved = json.load(f)
            for result in saved["results"]:
                if "rounds" not in result:
                    # Saved before the rounds were recorded: recover them from the args.
                    result["rounds"], result["step_reps_per_round"] = round_plan(
                        saved["args"], result["tree"]
                    )
                results.append(summarise(result))
        print(table(results))
        return

    def log(message):
        print(message, file=sys.stderr, flush=True)

    typecheck = (
        "off (JAXTYPING_DISABLE)"
        if os.environ.get("JAXTYPING_DISABLE", "") not in ("", "0", "false", "False")
        else "on"
    )
    print(
        f"eqopt {eqopt.__version__}, optax {optax.__version__}, jax {jax.__version__}, "
        f"equinox {eqx.__version__}, python {platform.python_version()}; "
        f"{jax.devices()[0].platform} with {os.cpu_count()} cores; eqopt type checks {typecheck}"
    )
    results = []
    start = time.perf_counter()
    for tree_name in args.trees:
        model = TREE_MAKERS[tree_name](args, jax.random.key(args.seed))
        grads = make_grads(model, args.seed)
        for case in args.cases:
            if not hasattr(
                eqopt, case.split("+")[-1].replace("cos", "adamw")
            ) and case not in (
                "sgdm",
                "clip+adamw+cos",
            ):
                log(f"skipping {case}: eqopt has no such optimiser")
                continue
            log(f"[{time.perf_counter() - start:6.1f}s] {case} on {tree_name}...")
            results.append(bench_one(case, tree_name, model, grads, args, log))
            if args.json:
                # Saved after every case, so that a long run cut short keeps
                # what it measured (`--table-from` prints it).
                with open(args.json, "w") as f:
                    json.dump({"args": vars(args), "results": results}, f, indent=1)
        del model, grads
    print(table(results))
    print(
        "Ratios of medians to Optax's (< 1: faster than Optax), wall-clock. step eqopt: the\n"
        "default path (params as they are); bucketed: `eqopt.bucketed(opt)`; step packed: params made by `eqopt.pack`; A/A: Optax\n"
        "against itself, the noise of the measurement. compile = trace + XLA compile of the\n"
        "optimiser step (update + apply_updates, params and state donated). roofline (one-big\n"
        "tree): median step / (minimum bytes moved / the streaming bandwidth measured in the\n"
        "same run)."
    )
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
