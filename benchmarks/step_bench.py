"""Compile time and step time of eqopt against Optax, interleaved in one process.

For each optimiser case (`adam`, `adamw`, clipped `adamw` on a warmup-cosine
schedule with weight decay masked to matrices) and each parameter tree (a ~1M
parameter `eqx.nn.MLP`, a ~25M parameter transformer-shaped dict, and a dict of
2000 small leaves), this measures

- compile time: `jax.jit(step).lower(...)` (tracing, where eqopt's trace-time
  checks run) plus `.compile()` (XLA), each repetition on a fresh closure
  after `jax.clear_caches()`;
- step time: one call of a jitted `update` + `apply_updates` on fixed
  gradients, with the params and state donated, timed with
  `block_until_ready`.

eqopt and Optax repetitions alternate (A B, B A, ...) in one process, and the
table reports medians and ratios eqopt / Optax (< 1 means eqopt is faster).

Both libraries are jitted the same way, with `jax.jit` on trees of arrays:
Optax gets `eqx.filter(model, eqx.is_array)`, and eqopt gets the same arrays,
recombined inside the jitted function with the model's non-array leaves (so
`opt.update` sees the whole Equinox model, as in DESIGN §1) and with the
optimiser's array leaves (its hyperparameters) passed as arguments, as
`eqx.filter_jit` would pass them.

    python benchmarks/step_bench.py            # default sizes, about 5 minutes on 2 cores
    python benchmarks/step_bench.py --quick    # smoke run, under a minute
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

import eqopt  # noqa: E402

LIBRARIES = ("eqopt", "optax")
CASES = ("adam", "adamw", "clip+adamw+cos")
TREES = ("mlp", "transformer", "small")

LEARNING_RATE = 1e-3
WEIGHT_DECAY = 1e-4


# ---------------------------------------------------------------------------
# Parameter trees
# ---------------------------------------------------------------------------


def make_mlp(args, key):
    """An `eqx.nn.MLP`: array leaves plus activation functions and sizes."""
    return eqx.nn.MLP(
        args.mlp_in, 10, width_size=args.mlp_width, depth=args.mlp_depth, key=key
    )


def make_transformer(args, key):
    """A dict shaped like a decoder-only transformer's parameters."""
    d, f, vocab = args.tf_width, 4 * args.tf_width, args.tf_vocab
    rng = np.random.default_rng(args.seed)

    def normal(shape, scale):
        return jnp.asarray(rng.standard_normal(shape, np.float32) * scale)

    def dense(n_in, n_out):
        return {
            "w": normal((n_in, n_out), 1 / math.sqrt(n_in)),
            "b": jnp.zeros((n_out,), jnp.float32),
        }

    def layer_norm():
        return {
            "scale": jnp.ones((d,), jnp.float32),
            "bias": jnp.zeros((d,), jnp.float32),
        }

    blocks = [
        {
            "ln1": layer_norm(),
            "qkv": dense(d, 3 * d),
            "out": dense(d, d),
            "ln2": layer_norm(),
            "mlp_in": dense(d, f),
            "mlp_out": dense(f, d),
        }
        for _ in range(args.tf_blocks)
    ]
    return {
        "embed": normal((vocab, d), 0.02),
        "pos_embed": normal((args.tf_context, d), 0.02),
        "blocks": blocks,
        "ln_f": layer_norm(),
    }


SMALL_SHAPES = ((8, 8), (16,), (4, 16), (32,), (2, 4, 8))


def make_small(args, key):
    """A dict of many small leaves of mixed shapes (matrices and vectors)."""
    rng = np.random.default_rng(args.seed)
    width = len(str(args.small_leaves - 1))
    return {
        f"p{i:0{width}d}": jnp.asarray(
            rng.standard_normal(SMALL_SHAPES[i % len(SMALL_SHAPES)], np.float32)
        )
        for i in range(args.small_leaves)
    }


TREE_MAKERS = {"mlp": make_mlp, "transformer": make_transformer, "small": make_small}


# ---------------------------------------------------------------------------
# Optimisers
# ---------------------------------------------------------------------------


def is_matrix(x):
    return x.ndim > 1


def make_optax(case, total_steps):
    if case == "adam":
        return optax.adam(LEARNING_RATE)
    if case == "adamw":
        return optax.adamw(LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        LEARNING_RATE,
        total_steps // 10,
        total_steps,
        end_value=LEARNING_RATE / 100,
    )
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(
            schedule,
            weight_decay=WEIGHT_DECAY,
            # An Optax callable mask is a function of the whole params.
            mask=lambda params: jax.tree.map(is_matrix, params),
        ),
    )


def make_eqopt(case, total_steps):
    if case == "adam":
        return eqopt.adam(LEARNING_RATE)
    if case == "adamw":
        return eqopt.adamw(LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    schedule = eqopt.warmup_cosine_decay_schedule(
        0.0,
        LEARNING_RATE,
        total_steps // 10,
        total_steps,
        end_value=LEARNING_RATE / 100,
    )
    return eqopt.chain(
        eqopt.clip_by_global_norm(1.0),
        # An eqopt callable mask is a per-leaf predicate (an Equinox filter spec).
        eqopt.adamw(schedule, weight_decay=WEIGHT_DECAY, mask=is_matrix),
    )


# ---------------------------------------------------------------------------
# Jitted steps
# ---------------------------------------------------------------------------


def copy_arrays(tree):
    """A copy in fresh device buffers (through NumPy, so nothing is compiled)."""
    return jax.tree.map(lambda x: jnp.asarray(np.array(x)), tree)


class Runner:
    """Everything one library needs for one (case, tree): a step factory and its arguments."""

    def __init__(self, library, case, model, grads, total_steps):
        self.library = library
        params = eqx.filter(model, eqx.is_array)
        if library == "optax":
            tx = make_optax(case, total_steps)
            self.state = tx.init(params)

            def factory():
                def step(params, state, grads):
                    updates, state = tx.update(grads, state, params)
                    return optax.apply_updates(params, updates), state

                return jax.jit(step, donate_argnums=(0, 1))

            self.prefix = ()
        else:
            opt = make_eqopt(case, total_steps)
            self.state = opt.init(model)  # the whole model
            opt_arrays, opt_static = eqx.partition(opt, eqx.is_array)
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
    return LIBRARIES if rep % 2 == 0 else LIBRARIES[::-1]


def make_grads(model, seed):
    """Fixed gradients: `None` at non-array leaves, as `eqx.filter_grad` gives them."""
    rng = np.random.default_rng(seed + 1)
    return jax.tree.map(
        lambda p: jnp.asarray((rng.standard_normal(p.shape) * 1e-2).astype(p.dtype)),
        eqx.filter(model, eqx.is_array),
    )


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

    # Compile time: fresh closures, caches cleared, libraries alternating.
    compile_reps = (
        args.compile_reps if tree_name != "small" else args.small_compile_reps
    )
    for rep in range(compile_reps):
        for lib in orders(rep):
            trace, xla = runners[lib].time_compile()
            for i, clock in enumerate(("wall", "cpu")):
                samples[lib]["trace"][clock].append(trace[i])
                samples[lib]["xla"][clock].append(xla[i])
                samples[lib]["compile"][clock].append(trace[i] + xla[i])

    # Same computation? One step from identical params.
    for runner in runners.values():
        runner.run(1)
    difference = max_relative_difference(
        runners["eqopt"].params, runners["optax"].params
    )
    if difference > 1e-4:
        log(
            f"  WARNING: eqopt and Optax params differ after one step (max rel diff {difference:.2e})"
        )

    # Step time: warm up, calibrate the steps per repetition, libraries alternating.
    for runner in runners.values():
        runner.run(args.warmup)
    one = statistics.median(runners["optax"].run(1)[0] for _ in range(3))
    inner = max(1, math.ceil(args.rep_seconds / max(one, 1e-9)))
    gc.collect()
    gc.disable()  # no collection pauses inside a timed repetition
    try:
        for rep in range(args.step_reps):
            for lib in orders(rep):
                wall, cpu = runners[lib].run(inner)
                samples[lib]["step"]["wall"].append(wall)
                samples[lib]["step"]["cpu"].append(cpu)
    finally:
        gc.enable()

    result = {
        "case": case,
        "tree": tree_name,
        "leaves": len(leaves),
        "params": int(n_params),
        "one_step_max_rel_diff": difference,
        "steps_per_rep": inner,
        "samples_s": samples,
        "median_ms": {
            lib: {
                m: {
                    c: 1e3 * statistics.median(v) if v else math.nan
                    for c, v in by_clock.items()
                }
                for m, by_clock in samples[lib].items()
            }
            for lib in LIBRARIES
        },
    }
    # Ratios of the medians, eqopt / Optax.
    result["ratio"] = {
        m: {
            c: result["median_ms"]["eqopt"][m][c] / result["median_ms"]["optax"][m][c]
            for c in ("wall", "cpu")
        }
        for m in ("trace", "xla", "compile", "step")
    }
    del runners, params
    jax.clear_caches()
    gc.collect()
    return result


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def fmt_ms(x):
    if math.isnan(x):
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def fmt_ratio(x):
    return "-" if math.isnan(x) else f"{x:.2f}"


def fmt_count(n):
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e3:
        return f"{n / 1e3:.0f}k"
    return str(n)


def table(results):
    header = (
        "case",
        "tree",
        "leaves",
        "params",
        "compile ratio",
        "(cpu)",
        "trace ratio",
        "(cpu)",
        "step ratio",
        "(cpu)",
        "compile ms eqopt / optax",
        "step ms eqopt / optax",
    )
    rows = []
    for r in results:
        ratio, ms = r["ratio"], r["median_ms"]
        rows.append(
            (
                r["case"],
                r["tree"],
                str(r["leaves"]),
                fmt_count(r["params"]),
                fmt_ratio(ratio["compile"]["wall"]),
                fmt_ratio(ratio["compile"]["cpu"]),
                fmt_ratio(ratio["trace"]["wall"]),
                fmt_ratio(ratio["trace"]["cpu"]),
                fmt_ratio(ratio["step"]["wall"]),
                fmt_ratio(ratio["step"]["cpu"]),
                f"{fmt_ms(ms['eqopt']['compile']['wall'])} / {fmt_ms(ms['optax']['compile']['wall'])}",
                f"{fmt_ms(ms['eqopt']['step']['wall'])} / {fmt_ms(ms['optax']['step']['wall'])}",
            )
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    numeric = set(range(2, len(header)))

    def line(cells):
        return (
            "| "
            + " | ".join(
                c.rjust(w) if i in numeric else c.ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    out = [line(header)]
    out.append(
        "|"
        + "|".join(
            "-" * (w + 1) + ":" if i in numeric else "-" * (w + 2)
            for i, w in enumerate(widths)
        )
        + "|"
    )
    out.extend(line(row) for row in rows)
    return "\n".join(out)


QUICK = {
    "mlp_in": 256,
    "mlp_width": 256,
    "mlp_depth": 2,
    "tf_width": 128,
    "tf_blocks": 1,
    "tf_vocab": 1000,
    "tf_context": 64,
    "small_leaves": 100,
    "compile_reps": 1,
    "small_compile_reps": 1,
    "step_reps": 7,
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
        help="small trees and few repetitions: a sub-minute smoke run",
    )
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
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
        default=3,
        help="compile repetitions per library (0: skip compile timing)",
    )
    parser.add_argument(
        "--small-compile-reps",
        type=int,
        default=1,
        help="compile repetitions per library for the many-leaf tree (each takes"
        " 15-60 s of XLA time on 2 cores)",
    )
    parser.add_argument(
        "--step-reps",
        type=int,
        default=21,
        help="step-time repetitions per library (0: skip step timing)",
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
        "--tf-width", type=int, default=512, help="model width d (MLP width is 4d)"
    )
    parser.add_argument("--tf-blocks", type=int, default=6)
    parser.add_argument("--tf-vocab", type=int, default=12_000)
    parser.add_argument("--tf-context", type=int, default=512)
    parser.add_argument("--small-leaves", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write every measurement to this file")
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
            log(f"[{time.perf_counter() - start:6.1f}s] {case} on {tree_name}...")
            results.append(bench_one(case, tree_name, model, grads, args, log))
        del model, grads
    print(table(results))
    print(
        "ratio = eqopt / Optax of the medians (< 1: eqopt faster), in wall-clock time and, under\n"
        "(cpu), in this process's CPU time (robust to other load on the machine). compile = trace\n"
        "(jax.jit(...).lower, where eqopt's checks run) + XLA compile; step = update + apply_updates\n"
        "with donated params and state; medians in wall-clock ms."
    )
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
