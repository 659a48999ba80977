"""What eqopt's machinery costs outside the compiled step, against Optax in one process.

The compiled step is `step_bench.py`'s and `train_step_bench.py`'s subject. This
script measures what a user pays around it, each row against Optax with an
Optax A/A run (Optax against itself) for the noise:

- **eager update**: `opt.update(grads, state, model)` called without `jit` (a
  notebook, a debugger, an Optimistix-style loop) on a 4-leaf MLP,
  `eqx.nn.MLP(32, 10, width_size=64, depth=1)`, for `adam(1e-3)` and
  `chain(clip_by_global_norm(1.0), adamw(1e-3))`. eqopt gets the whole model;
  Optax gets `eqx.filter(model, eqx.is_array)`; both get the same gradients
  (`None` at the non-array leaves, as `eqx.filter_grad` gives them). The
  variants alternate in a rotation, reversed every other round; each sample
  is a batch of calls ended by `block_until_ready`; a ratio is the median over
  the rounds of the round's ratio.
- **Python calls** per eager update: 'call' events seen by `sys.setprofile`
  during one warm call (C functions are not counted).
- **traceback** of a wrong-shaped gradient (the first layer's weight given as
  (3, 3)) passed to eager Adam's `update` with the params: the lines of
  `traceback.format_exception`, the frames whose file is inside the library's
  package, and whether eqopt's message names the leaf's path and shape
  (`--show-traceback` prints both tracebacks). Optax's column is its own error
  for the same mistake (a broadcasting error from inside its update).
- **trace time** of `update` on a 400-leaf tree (200 `Linear(16, 16)` layers'
  weights and biases as a list of dicts): `jax.jit(...).lower(grads, state,
  params)` of a fresh function, after `jax.clear_caches()`.
- **import + first optimiser**: a fresh interpreter per sample (with
  `import_time.py`'s environment: bytecode caches on, filled by an untimed
  first round) imports jax and equinox and builds the model, then times
  `import eqopt`, `eqopt.adam(1e-3)` and `init(model)` (Optax: `import optax`,
  `optax.adam(1e-3)`, `init` of the filtered model) until the state is ready.
  The interpreter's whole wall time is the second such row.

Targets from the restructuring of eqopt's machinery are shown in brackets.
JAX runs on the CPU (`JAX_PLATFORMS=cpu` unless set otherwise).

    python benchmarks/overhead_bench.py                    # about 3 minutes on 2 cores
    python benchmarks/overhead_bench.py --quick            # smoke run, under a minute
    python benchmarks/overhead_bench.py --rounds 31 --json out.json
    python benchmarks/overhead_bench.py --show-traceback   # also print both tracebacks
"""

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import import_time  # noqa: E402
from bench_report import markdown_table  # noqa: E402

import eqopt  # noqa: E402

# eqopt suggests `bucketed` for the 400-leaf tree; the advice is not measured here.
warnings.filterwarnings("ignore", message=".*per-leaf overhead dominates")

#: Optax, Optax again (the A/A run), eqopt.
VARIANTS = ("optax", "optax-aa", "eqopt")
CASES = ("adam", "clip+adamw")


def make_optimiser(library, case):
    m = eqopt if library == "eqopt" else optax
    if case == "adam":
        return m.adam(1e-3)
    return m.chain(m.clip_by_global_norm(1.0), m.adamw(1e-3))


def orders(round_):
    """A rotation of the variants, reversed every other round."""
    k = (round_ // 2) % len(VARIANTS)
    order = VARIANTS[k:] + VARIANTS[:k]
    return order if round_ % 2 == 0 else order[::-1]


def per_round_ratios(samples, name):
    """Each round's `name` sample over its Optax sample."""
    return [a / b for a, b in zip(samples[name], samples["optax"], strict=True)]


def summary(samples):
    """Medians of each variant and of the per-round ratios to Optax."""
    return {
        "median": {name: statistics.median(values) for name, values in samples.items()},
        "ratio": statistics.median(per_round_ratios(samples, "eqopt")),
        "aa": statistics.median(per_round_ratios(samples, "optax-aa")),
        "samples": samples,
    }


# ---------------------------------------------------------------------------
# Eager update and Python calls
# ---------------------------------------------------------------------------


class Eager:
    """One library's optimiser, state and arguments for an eager update."""

    def __init__(self, library, case, model, grads):
        self.opt = make_optimiser(library, case)
        if library == "eqopt":
            self.params = model  # the whole model
        else:
            self.params = eqx.filter(model, eqx.is_array)
        self.state = self.opt.init(self.params)
        self.grads = grads

    def call(self):
        return self.opt.update(self.grads, self.state, self.params)

    def time(self, n):
        """Seconds per eager update over `n` calls, blocking on the last result."""
        call = self.call
        gc.disable()
        try:
            start = time.perf_counter()
            for _ in range(n):
                out = call()
            jax.block_until_ready(out)
            return (time.perf_counter() - start) / n
        finally:
            gc.enable()

    def python_calls(self):
        count = 0

        def profile(frame, event, arg):
            nonlocal count
            if event == "call":
                count += 1

        sys.setprofile(profile)
        try:
            out = self.call()
        finally:
            sys.setprofile(None)
        jax.block_until_ready(out)
        return count


def max_relative_difference(a, b):
    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        worst = max(worst, float(np.max(np.abs(x - y)) / (np.max(np.abs(y)) + 1e-30)))
    return worst


def bench_eager(case, model, grads, args, log):
    runners = {name: Eager(name.split("-")[0], case, model, grads) for name in VARIANTS}
    for runner in runners.values():  # warm up: eager ops compile on first use
        for _ in range(3):
            jax.block_until_ready(runner.call())
    difference = max_relative_difference(
        runners["eqopt"].call()[0], runners["optax"].call()[0]
    )
    if difference > 1e-5:
        log(f"WARNING: eqopt's {case} updates differ from Optax's by {difference:.2e}")
    # Calls per sample: enough that Optax's batch lasts about --rep-seconds.
    single = min(runners["optax"].time(1) for _ in range(5))
    n = max(1, round(args.rep_seconds / single))
    samples = {name: [] for name in VARIANTS}
    for round_ in range(args.rounds):
        for name in orders(round_):
            samples[name].append(runners[name].time(n))
    calls = {name: runners[name].python_calls() for name in VARIANTS}
    result = summary(samples)
    result["calls_per_sample"] = n
    result["max_relative_difference"] = difference
    calls_result = {
        "median": calls,
        "ratio": calls["eqopt"] / calls["optax"],
        "aa": calls["optax-aa"] / calls["optax"],
    }
    return result, calls_result


# ---------------------------------------------------------------------------
# Traceback of a wrong-shaped gradient
# ---------------------------------------------------------------------------


def bench_traceback(model, grads, show):
    bad = eqx.tree_at(lambda m: m.layers[0].weight, grads, jnp.ones((3, 3)))
    result = {}
    for library, module in (("eqopt", eqopt), ("optax", optax)):
        runner = Eager(library, "adam", model, grads)
        try:
            jax.block_until_ready(runner.opt.update(bad, runner.state, runner.params))
        except Exception as error:  # noqa: BLE001
            text = "".join(traceback.format_exception(error))
            package = Path(module.__file__).parent.resolve()
            frames = traceback.extract_tb(error.__traceback__)
            inside = sum(
                Path(f.filename).resolve().is_relative_to(package) for f in frames
            )
            message = str(error)
            result[library] = {
                "lines": len(text.splitlines()),
                "frames": len(frames),
                "package_frames": inside,
                "names_path_and_shape": ".layers[0].weight" in message
                and "(3, 3)" in message
                and "(64, 32)" in message,
                "message": f"{type(error).__name__}: {message}".splitlines()[0],
                "traceback": text,
            }
            if show:
                print(f"--- {library}: wrong-shaped gradient ---\n{text}")
        else:
            result[library] = None
    return result


# ---------------------------------------------------------------------------
# Trace time on 400 leaves
# ---------------------------------------------------------------------------


def make_layers(n_layers, width, seed):
    rng = np.random.default_rng(seed)
    return [
        {
            "weight": jnp.asarray(rng.standard_normal((width, width), np.float32)),
            "bias": jnp.asarray(rng.standard_normal((width,), np.float32)),
        }
        for _ in range(n_layers)
    ]


def lower_seconds(opt, grads, state, params):
    jax.clear_caches()
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        jax.jit(lambda g, s, p: opt.update(g, s, p)).lower(grads, state, params)
        return time.perf_counter() - start
    finally:
        gc.enable()


def bench_trace(case, args):
    params = make_layers(args.layers, 16, args.seed)
    grads = make_layers(args.layers, 16, args.seed + 1)
    setups = {}
    for name in VARIANTS:
        opt = make_optimiser(name.split("-")[0], case)
        setups[name] = (opt, grads, opt.init(params), params)
    for name in VARIANTS:  # untimed: Python's and JAX's first-use costs
        lower_seconds(*setups[name])
    samples = {name: [] for name in VARIANTS}
    for round_ in range(args.trace_rounds):
        for name in orders(round_):
            samples[name].append(lower_seconds(*setups[name]))
    result = summary(samples)
    result["leaves"] = len(jax.tree.leaves(params))
    return result


# ---------------------------------------------------------------------------
# Import and first optimiser, in a fresh interpreter
# ---------------------------------------------------------------------------

FIRST_OPTIMISER = {
    "eqopt": "import eqopt; opt = eqopt.adam(1e-3); state = opt.init(model)",
    "optax": (
        "import optax; opt = optax.adam(1e-3); "
        "state = opt.init(eqx.filter(model, eqx.is_array))"
    ),
}


def first_optimiser_statement(library):
    return (
        "import time, jax, equinox as eqx; "
        "model = eqx.nn.MLP(32, 10, 64, 1, key=jax.random.key(0)); "
        "jax.block_until_ready(model); start = time.perf_counter(); "
        f"{FIRST_OPTIMISER[library]}; jax.block_until_ready(state); "
        f"print({library}.__file__, time.perf_counter() - start)"
    )


def first_optimiser_once(library):
    """(seconds from `import` to a ready state, the interpreter's wall time)."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", first_optimiser_statement(library)],
        check=True,
        env=import_time._env(),
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    path, seconds = result.stdout.split()[-2:]
    if library == "eqopt" and Path(path) != Path(eqopt.__file__):
        # `python -c` puts the working directory first on the path.
        raise RuntimeError(f"the subprocess imported {path}, not {eqopt.__file__}")
    return float(seconds), wall


def bench_import(args):
    for name in VARIANTS:  # fill the bytecode caches
        first_optimiser_once(name.split("-")[0])
    inside = {name: [] for name in VARIANTS}
    wall = {name: [] for name in VARIANTS}
    for round_ in range(args.import_rounds):
        for name in orders(round_):
            a, b = first_optimiser_once(name.split("-")[0])
            inside[name].append(a)
            wall[name].append(b)
    return summary(inside), summary(wall)


# ---------------------------------------------------------------------------
# Table
# ---------------------------------------------------------------------------


def fmt_ms(seconds):
    return f"{seconds * 1e3:.3f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"


def table(rows):
    header = ("target", "eqopt", "Optax", "ratio", "A/A")
    return markdown_table(header, rows, numeric=set(range(1, len(header))))


def timed_row(label, result, fmt=fmt_ms):
    m = result["median"]
    return (
        label,
        fmt(m["eqopt"]),
        fmt(m["optax"]),
        f"{result['ratio']:.2f}x",
        f"{result['aa']:.2f}x",
    )


def rows_of(results):
    rows = []
    for case in results["cases"]:
        rows.append(
            timed_row(f"eager update, {case} [<= 1.3x]", results["eager"][case])
        )
    for case in results["cases"]:
        calls = results["calls"][case]
        rows.append(
            (
                f"Python calls per eager update, {case} [<= 1.5x]",
                str(calls["median"]["eqopt"]),
                str(calls["median"]["optax"]),
                f"{calls['ratio']:.2f}x",
                f"{calls['aa']:.2f}x",
            )
        )
    tb = results["traceback"]
    if tb["eqopt"] is not None and tb["optax"] is not None:
        for key, label in (
            ("lines", "wrong-shaped gradient: traceback lines [<= 20]"),
            ("package_frames", "wrong-shaped gradient: frames in the package [<= 3]"),
            ("frames", "wrong-shaped gradient: frames in all"),
        ):
            e, o = tb["eqopt"][key], tb["optax"][key]
            rows.append((label, str(e), str(o), f"{e / o:.2f}x", "-"))
        rows.append(
            (
                "wrong-shaped gradient: names path and shape",
                "yes" if tb["eqopt"]["names_path_and_shape"] else "NO",
                "no" if not tb["optax"]["names_path_and_shape"] else "yes",
                "-",
                "-",
            )
        )
    for case in results["cases"]:
        leaves = results["trace"][case]["leaves"]
        rows.append(
            timed_row(
                f"trace time of update, {leaves} leaves, {case} [<= 1.0x]",
                results["trace"][case],
            )
        )
    if "import" in results:

        def fmt_s(s):
            return f"{s:.3f} s"

        rows.append(
            timed_row(
                "import + adam + init, after jax [no worse]",
                results["import"]["inside"],
                fmt_s,
            )
        )
        rows.append(
            timed_row(
                "interpreter with the above, wall", results["import"]["wall"], fmt_s
            )
        )
    return rows


def load():
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--rounds", type=int, default=31, help="eager-update rounds (one sample each)"
    )
    parser.add_argument(
        "--rep-seconds",
        type=float,
        default=0.05,
        help="length of one eager-update sample (sets the calls per sample)",
    )
    parser.add_argument("--trace-rounds", type=int, default=15)
    parser.add_argument(
        "--import-rounds", type=int, default=15, help="0: skip the import rows"
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=200,
        help="layers of the trace-time tree (2 leaves each)",
    )
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help="comma-separated subset of " + ", ".join(CASES),
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="few rounds: a smoke run of under a minute"
    )
    parser.add_argument(
        "--show-traceback", action="store_true", help="print both tracebacks"
    )
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args(argv)
    if args.quick:
        quick = {
            "rounds": 5,
            "trace_rounds": 2,
            "import_rounds": 2,
            "rep_seconds": 0.02,
        }
        for name, value in quick.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in args.cases:
        if c not in CASES:
            parser.error(f"unknown case {c!r}; choose from {CASES}")
    return args


def main(argv=None):
    args = parse_args(argv)

    def log(message):
        print(message, file=sys.stderr, flush=True)

    header = (
        f"eqopt {eqopt.__version__} ({Path(eqopt.__file__).parent}), optax "
        f"{optax.__version__}, jax {jax.__version__}, equinox {eqx.__version__}, "
        f"python {platform.python_version()}; {jax.devices()[0].platform} with "
        f"{os.cpu_count()} cores; {load()} at the start"
    )
    print(header, flush=True)
    start = time.perf_counter()
    model = eqx.nn.MLP(32, 10, width_size=64, depth=1, key=jax.random.key(args.seed))
    rng = np.random.default_rng(args.seed)
    grads = jax.tree.map(
        lambda p: jnp.asarray(rng.standard_normal(p.shape).astype(p.dtype) * 1e-2),
        eqx.filter(model, eqx.is_array),
    )
    results = {"header": header, "args": vars(args), "cases": args.cases}
    results["eager"], results["calls"], results["trace"] = {}, {}, {}
    for case in args.cases:
        log(f"[{time.perf_counter() - start:6.1f}s] eager update, {case}...")
        results["eager"][case], results["calls"][case] = bench_eager(
            case, model, grads, args, log
        )
    log(f"[{time.perf_counter() - start:6.1f}s] traceback...")
    results["traceback"] = bench_traceback(model, grads, args.show_traceback)
    for case in args.cases:
        log(f"[{time.perf_counter() - start:6.1f}s] trace time, {case}...")
        results["trace"][case] = bench_trace(case, args)
    if args.import_rounds:
        log(f"[{time.perf_counter() - start:6.1f}s] import + first optimiser...")
        inside, wall = bench_import(args)
        results["import"] = {"inside": inside, "wall": wall}
    results["load_at_end"] = load()
    print(table(rows_of(results)))
    print(
        "Medians over interleaved rounds; ratio = eqopt / Optax (the median of the\n"
        "per-round ratios), A/A = Optax against itself, the noise. Targets in brackets.\n"
        f"{results['load_at_end']} at the end; total {time.perf_counter() - start:.0f} s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
