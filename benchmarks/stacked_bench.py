"""Scanned blocks against a list of blocks: the whole training step with Muon and SOAP.

A small transformer (token and position `eqx.nn.Embedding`s, `--blocks` pre-norm
blocks of two `eqx.nn.LayerNorm`s, a fused QKV and an output `eqx.nn.Linear`
for causal multi-head attention, a two-layer MLP; a final `LayerNorm` and a
head `Linear`) is built once, its blocks by `eqx.filter_vmap` (every leaf of
`blocks` has the blocks on a leading axis, run by `jax.lax.scan`), and once
more as a Python list of the same blocks (the same numbers, slice k of the
stack is block k). Each is trained on next-token cross-entropy with:

- `muon`: `eqopt.contrib.muon` (Muon on the matrices of each layer, AdamW on
  the rest: norms, biases, and a stacked bias is a vector per layer);
- `soap`: `eqopt.contrib.soap` (one preconditioner per layer, the stacked
  model's state stacked on the same axis).

The step (loss, gradient, `update`, `apply_updates`) is jitted with
`eqx.filter_jit`, the model and the state donated. Variants, interleaved in one
process: for each optimiser `list` (the base), `list-aa` (the list again: the
A/A row, whose ratio to the base is the noise) and `stacked`. Before the
timings, three steps of the stacked model must give the list model's params
(slice by slice), else the script stops.

The work runs in rounds. In each round every variant is traced, compiled and
runs its first step (a fresh closure after `jax.clear_caches()`, in an order
mirrored in the next round): the "first call". Then steps are timed, the
variants alternating, each sample a few steps back to back. The table shows,
per optimiser, the geometric mean over the rounds of each variant's ratio of
medians to its list's in the same round (wall clock; and process CPU time, less
moved by other jobs on the machine), and the first call's ratio.

    python benchmarks/stacked_bench.py --json benchmarks/stacked_bench.json
    python benchmarks/stacked_bench.py --quick   # 2 rounds, fewer samples
    python benchmarks/stacked_bench.py --optimisers muon --blocks 4
"""

import argparse
import gc
import json
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_report import (  # noqa: E402
    geometric_mean,
    markdown_table,
    stderr_log,
)

# The same transformer block as the parameter-groups benchmark's.
from param_groups_bench import Block, _dense, _norm  # noqa: E402

import eqopt  # noqa: E402

OPTIMISERS = ("muon", "soap")
LAYOUTS = ("list", "list-aa", "stacked")
BASE = "list"
ROWS = {
    "list": "list of blocks (base)",
    "list-aa": "list again: A/A",
    "stacked": "scanned blocks",
}
LEARNING_RATE = 1e-3
CHECK_STEPS = 3
#: SOAP's `precondition_frequency` (its default): steps per sample are a multiple.
PERIOD = 10
#: Per optimiser, the largest difference of the params after `CHECK_STEPS` steps
#: between the stacked and the list model: per leaf, the median of the entries'
#: differences over the median of the list's changes. The two programs'
#: gradients differ in the last bits (scan against unrolled), and early Adam
#: steps magnify that where a gradient is zero but for rounding (the key bias:
#: softmax ignores it), hence medians. SOAP is only reported (`None`): fed the
#: same gradients, its stacked updates are the list's bit for bit (checked on 2
#: blocks for 3 steps), but in training the programs' last-bit differences
#: grow into different steps (likely through the eigenbases of rank-deficient
#: Gram matrices: a 192x64 gradient's 192x192 `G G^T`).
CHECK_TOLERANCE = {"muon": 1e-3, "soap": None}


class Transformer(eqx.Module):
    """`blocks` is one `Block` whose leaves stack the blocks (`stacked`), or a list."""

    embed: eqx.nn.Embedding
    pos: eqx.nn.Embedding
    blocks: Block | list[Block]
    ln_f: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __call__(self, tokens):
        n = tokens.shape[-1]
        x = self.embed.weight[tokens] + self.pos.weight[:n]
        mask = jnp.tril(jnp.ones((n, n), bool))
        if isinstance(self.blocks, list):
            for block in self.blocks:
                x = block(x, mask)
        else:
            arrays, static = eqx.partition(self.blocks, eqx.is_array)

            def body(h, block):
                return eqx.combine(block, static)(h, mask), None

            x = jax.lax.scan(body, x, arrays)[0]
        return _dense(self.head, _norm(self.ln_f, x))


def make_models(args):
    """The scanned model and the list model, with the same numbers."""
    keys = jax.random.split(jax.random.key(args.seed), 4)
    d = args.width
    stack = eqx.filter_vmap(lambda k: Block(d, args.heads, k))(
        jax.random.split(keys[0], args.blocks)
    )
    arrays, static = eqx.partition(stack, eqx.is_array)
    listed = [
        eqx.combine(jax.tree.map(lambda x, i=i: x[i], arrays), static)
        for i in range(args.blocks)
    ]
    common = dict(
        embed=eqx.nn.Embedding(args.vocab, d, key=keys[1]),
        pos=eqx.nn.Embedding(args.context, d, key=keys[2]),
        ln_f=eqx.nn.LayerNorm(d),
        head=eqx.nn.Linear(d, args.vocab, key=keys[3]),
    )
    return Transformer(blocks=stack, **common), Transformer(blocks=listed, **common)


def loss(model, tokens):
    logits = model(tokens[:, :-1])
    labels = tokens[:, 1:]
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def make_batch(args):
    rng = np.random.default_rng(args.seed)
    return jnp.asarray(rng.integers(0, args.vocab, (args.batch, args.context + 1)))


def make_optimiser(name):
    if name == "muon":
        return eqopt.contrib.muon(LEARNING_RATE, adam_weight_decay=0.01)
    return eqopt.contrib.soap(LEARNING_RATE)


def copy_arrays(tree):
    """A copy in fresh device buffers (through NumPy, so nothing is compiled)."""
    return jax.tree.map(
        lambda x: jnp.asarray(np.array(x)) if eqx.is_array(x) else x, tree
    )


class Runner:
    """One variant: an optimiser on one layout, the model and state donated."""

    def __init__(self, optimiser, layout, model, batch):
        self.name = f"{optimiser}/{layout}"
        opt = make_optimiser(optimiser)
        self.state = copy_arrays(opt.init(model))
        self.fixed = (opt, batch)
        self.params = copy_arrays(model)
        self.step = None

    @staticmethod
    def _step(fixed, model, state):
        opt, batch = fixed
        value, grads = eqx.filter_value_and_grad(loss)(model, batch)
        updates, state = opt.update(grads, state, model)
        return eqopt.apply_updates(model, updates), state, value

    def first_call(self):
        """Seconds (wall, process CPU) to trace, lower and compile a fresh closure
        (caches cleared) and run its first step."""
        jax.clear_caches()
        gc.collect()

        def step(fixed, model, state):
            return self._step(fixed, model, state)

        jitted = eqx.filter_jit(step, donate="all-except-first")
        t0, c0 = time.perf_counter(), time.process_time()
        self.step = jitted.lower(self.fixed, self.params, self.state).compile()
        self.run(1)
        return time.perf_counter() - t0, time.process_time() - c0

    def run(self, n):
        """Seconds (wall, process CPU) per step over `n` steps back to back."""
        params, state = self.params, self.state
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            params, state, value = self.step(self.fixed, params, state)
        jax.block_until_ready((params, state, value))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        self.params, self.state = params, state
        return wall / n, cpu / n

    def blocks(self):
        """The blocks' arrays as NumPy, stacked on a leading axis for both layouts."""
        blocks = eqx.filter(self.params.blocks, eqx.is_array)
        if isinstance(blocks, list):
            return jax.tree.map(lambda *xs: np.stack(xs), *blocks)
        return jax.tree.map(np.asarray, blocks)


def check(runners, initial, optimiser, log):
    """After `CHECK_STEPS` steps, the stacked blocks' change equals the list's."""
    listed, stacked = runners[f"{optimiser}/list"], runners[f"{optimiser}/stacked"]
    worst = 0.0
    for a, b, x0 in zip(
        jax.tree.leaves(stacked.blocks()),
        jax.tree.leaves(listed.blocks()),
        jax.tree.leaves(initial),
        strict=True,
    ):
        change = np.median(np.abs(b - x0))
        worst = max(worst, float(np.median(np.abs(a - b)) / max(change, 1e-30)))
    tolerance = CHECK_TOLERANCE[optimiser]
    log(f"  {optimiser}: stacked vs list after {CHECK_STEPS} steps: {worst:.2g}")
    if tolerance is not None and not worst <= tolerance:
        sys.exit(f"{optimiser}: the stacked model differs from the list ({worst:.2g})")
    return worst


def mirrored(round_, variants):
    k = (round_ // 2) % len(variants)
    order = variants[k:] + variants[:k]
    return order if round_ % 2 == 0 else order[::-1]


def bench(args, log):
    stacked, listed = make_models(args)
    batch = make_batch(args)
    models = {"list": listed, "list-aa": listed, "stacked": stacked}
    runners = {}
    for optimiser in args.optimisers:
        for layout in LAYOUTS:
            runner = Runner(optimiser, layout, models[layout], batch)
            runners[runner.name] = runner
    names = list(runners)
    leaves = jax.tree.leaves(eqx.filter(stacked, eqx.is_inexact_array))
    result = {
        "leaves": {
            "stacked": len(leaves),
            "list": len(jax.tree.leaves(eqx.filter(listed, eqx.is_inexact_array))),
        },
        "params": sum(x.size for x in leaves),
        **{
            f"{what}_{clock}": {v: [] for v in names}
            for what in ("first_call", "step")
            for clock in ("s", "cpu_s")
        },
        "check": {},
    }
    initial = jax.tree.map(np.asarray, eqx.filter(stacked.blocks, eqx.is_array))
    for round_ in range(args.rounds):
        for name in mirrored(round_, names):
            wall, cpu = runners[name].first_call()
            result["first_call_s"][name].append(wall)
            result["first_call_cpu_s"][name].append(cpu)
            log(f"    {name}: first call {wall:.3g} s")
        if round_ == 0:
            for runner in runners.values():
                runner.run(CHECK_STEPS - 1)
            for optimiser in args.optimisers:
                result["check"][optimiser] = check(runners, initial, optimiser, log)
        for runner in runners.values():
            runner.run(args.warmup)
        # Steps per sample: about `rep_seconds` of the slowest list's steps, a
        # multiple of SOAP's `precondition_frequency` so that every sample holds
        # as many eigenbasis updates (every runner has run as many steps).
        once = {name: runner.run(1)[0] for name, runner in runners.items()}
        per_step = max(once[f"{o}/{BASE}"] for o in args.optimisers)
        n = PERIOD * max(1, round(args.rep_seconds / max(PERIOD * per_step, 1e-6)))
        samples = {v: [] for v in names}
        for rep in range(args.step_reps):
            for name in names if rep % 2 == 0 else names[::-1]:
                samples[name].append(runners[name].run(n))
        for name in names:
            for i, clock in enumerate(("s", "cpu_s")):
                times = [sample[i] for sample in samples[name]]
                result[f"step_{clock}"][name].append(statistics.median(times))
        log(
            f"  round {round_ + 1}/{args.rounds} ({n} steps a sample, load "
            f"{os.getloadavg()[0]:.1f}): step ms "
            + " ".join(f"{v}={1e3 * result['step_s'][v][-1]:.4g}" for v in names)
        )
    return result


def ratio(result, metric, name, base):
    times = result[metric]
    return geometric_mean(
        [x / b for x, b in zip(times[name], times[base], strict=True)]
    )


def table(result, optimisers):
    header = (
        "optimiser",
        "model",
        "step vs list",
        "CPU time: step vs list",
        "first call vs list",
        "step ms",
        "first call s",
    )
    rows = []
    for optimiser in optimisers:
        base = f"{optimiser}/{BASE}"
        for layout in LAYOUTS:
            name = f"{optimiser}/{layout}"
            rows.append(
                (
                    optimiser,
                    ROWS[layout],
                    f"{ratio(result, 'step_s', name, base):.3f}",
                    f"{ratio(result, 'step_cpu_s', name, base):.3f}",
                    f"{ratio(result, 'first_call_s', name, base):.3f}",
                    f"{1e3 * geometric_mean(result['step_s'][name]):.3g}",
                    f"{geometric_mean(result['first_call_s'][name]):.3g}",
                )
            )
    return markdown_table(header, rows, numeric=set(range(2, len(header))))


QUICK = {"rounds": 2, "step_reps": 7, "rep_seconds": 0.2}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds, fewer samples")
    parser.add_argument(
        "--optimisers", default=",".join(OPTIMISERS), help=",".join(OPTIMISERS)
    )
    parser.add_argument("--rounds", type=int, default=4, help="compile rounds (even)")
    parser.add_argument("--step-reps", type=int, default=15, help="samples per round")
    parser.add_argument("--rep-seconds", type=float, default=0.3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args(argv)
    chosen = args.optimisers.split(",")
    unknown = set(chosen) - set(OPTIMISERS)
    if unknown:
        parser.error(f"unknown optimisers {sorted(unknown)}: choose from {OPTIMISERS}")
    args.optimisers = tuple(o for o in OPTIMISERS if o in chosen)
    if args.quick:
        given = {
            a.lstrip("-").split("=")[0].replace("-", "_")
            for a in (argv or sys.argv[1:])
        }
        for key, value in QUICK.items():
            if key not in given:
                setattr(args, key, value)
    return args


def main(argv=None):
    args = parse_args(argv)
    log = stderr_log()
    machine = (
        f"{jax.devices()[0].device_kind}, {platform.machine()}, {os.cpu_count()} cores"
    )
    load_before = os.getloadavg()
    versions = (
        f"jax {jax.__version__}, equinox {eqx.__version__}, optax {optax.__version__}"
    )
    log(f"{versions}, {machine}, load average {load_before[0]:.1f}")
    result = bench(args, log)
    load_after = os.getloadavg()
    log(f"done, load average {load_after[0]:.1f}")
    text = table(result, args.optimisers)
    print(
        f"{args.blocks} blocks of width {args.width} ({args.heads} heads), "
        f"{result['params']:,} params in {result['leaves']['stacked']} leaves "
        f"(list: {result['leaves']['list']}), batch {args.batch}x{args.context} "
        f"tokens; {args.rounds} rounds of {args.step_reps} interleaved samples; "
        f"{machine}, load {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    print(text)
    print(
        f"Stacked vs list params after {CHECK_STEPS} steps (worst leaf's median "
        "relative difference): "
        + ", ".join(f"{o} {d:.2g}" for o, d in result["check"].items())
    )
    if args.json:
        result.update(
            args=vars(args),
            versions=versions,
            machine=machine,
            load_average={"before": load_before, "after": load_after},
            table=text,
        )
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
