"""Optimiser state per device, replicated against ZeRO-1, on 8 simulated devices.

For adam, adamw, lion, adafactor and muon on the `resnet` and `transformer`
trees of `step_bench.py` (~11M and ~26M parameters), replicated over a mesh
`("data", 8)` as in data-parallel training, this prints:

- the bytes of optimiser state on the most loaded device, with the state
  replicated (`opt.init(params)`: every device holds all of it) and with
  ZeRO-1 (`eqopt.zero_plan(...).init`: each device holds its part), and their
  ratio (the ideal is 1/8 = 0.125, plus the leaves too small to split);
- the time of one jitted step (`update` and `apply_updates` on fixed
  gradients, params and state donated), ZeRO-1 against replicated, and
  replicated against itself (an A/A pair, for the noise): the geometric mean
  over rounds of the ratio of medians, the variants alternating within each
  round.

The 8 devices are simulated on the CPU (`--xla_force_host_platform_device_count=8`):
they share the machine's cores, so a replicated step does 8 times the work of
one device, and a step time here says nothing about accelerators. Time is
reported, not targeted.

    python benchmarks/memory_bench.py               # both trees, all optimisers
    python benchmarks/memory_bench.py --quick       # smaller trees, fewer rounds

With `--offload`, it reports instead the state kept in host memory
(`eqopt.offload`) against the state on the device, on one device: the state's
device bytes, the step time, and the whole training step's peak device memory
(`benchmarks/offload_bench.py`).

    python benchmarks/memory_bench.py --offload
"""

import os
import sys

# Before JAX starts: 8 CPU devices (keep any other flags).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402
from step_bench import TREE_MAKERS, parse_args as step_bench_args  # noqa: E402

import eqopt  # noqa: E402

OPTIMISERS = {
    "adam": lambda: eqopt.adam(1e-3),
    "adamw": lambda: eqopt.adamw(1e-3, weight_decay=1e-4),
    "lion": lambda: eqopt.lion(1e-4, weight_decay=1e-4),
    "adafactor": lambda: eqopt.adafactor(1e-3),
    "muon": lambda: eqopt.contrib.muon(1e-3),
}
TREES = ("resnet", "transformer")


def per_device_bytes(tree) -> int:
    """The bytes of `tree`'s arrays on its most loaded device."""
    totals: dict = {}
    for leaf in jax.tree.leaves(eqx.filter(tree, eqx.is_array)):
        for shard in leaf.addressable_shards:
            totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
    return max(totals.values())


def make_step(opt, plan):
    def update(params, state, grads):
        if plan is None:
            updates, state = opt.update(grads, state, params)
        else:
            updates, state = plan.update(opt, grads, state, params)
        return eqopt.apply_updates(params, updates), state

    return jax.jit(update, donate_argnums=(0, 1))


def timed(step, params, state, grads, n):
    start = time.perf_counter()
    for _ in range(n):
        params, state = step(params, state, grads)
    jax.block_until_ready((params, state))
    return (time.perf_counter() - start) / n, params, state


def bench(name, tree_name, params, grads, mesh, args):
    opt = OPTIMISERS[name]()
    replicated_state = opt.init(params)
    plan = eqopt.zero_plan(opt, params, mesh, axis="data")
    zero_state = plan.init(opt, params)
    row = {
        "replicated": per_device_bytes(replicated_state),
        "zero": per_device_bytes(zero_state),
        "unsplit": len(plan.unsplit),
    }
    del replicated_state, zero_state
    if not args.rounds:
        return row
    variants = {
        "replicated": (make_step(opt, None), lambda: opt.init(params)),
        "replicated-aa": (make_step(opt, None), lambda: opt.init(params)),
        "zero": (make_step(opt, plan), lambda: plan.init(opt, params)),
    }
    copy = lambda tree: jax.tree.map(lambda x: x.copy(), tree)  # noqa: E731
    carried = {}
    for variant, (step, init) in variants.items():
        _, *carried[variant] = timed(step, copy(params), init(), grads, 2)  # compile
    ratios = {"zero": [], "replicated-aa": []}
    for _ in range(args.rounds):
        times = {variant: [] for variant in variants}
        for _ in range(args.reps):
            for variant, (step, _) in variants.items():
                seconds, *carried[variant] = timed(
                    step, *carried[variant], grads, args.steps
                )
                times[variant].append(seconds)
        base = statistics.median(times["replicated"])
        for variant in ratios:
            ratios[variant].append(statistics.median(times[variant]) / base)
    for variant, values in ratios.items():
        row[f"time {variant}"] = math.exp(statistics.fmean(map(math.log, values)))
    row["step ms"] = base * 1e3
    del carried
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller trees")
    parser.add_argument("--optimisers", default=",".join(OPTIMISERS))
    parser.add_argument("--trees", default=",".join(TREES))
    parser.add_argument("--rounds", type=int, default=3, help="0: memory only")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--offload", action="store_true", help="state in host memory (one device)"
    )
    parser.add_argument("--offload-optimisers", default="adam,adam-8bit")
    parser.add_argument(
        "--tree-args",
        action="append",
        default=[],
        help="step_bench.py's size flags for --offload (--tree-args=--tf-width=1024)",
    )
    parser.add_argument("--batch", type=int, default=4, help="--offload's step")
    parser.add_argument("--context", type=int, default=64, help="--offload's step")
    parser.add_argument(
        "--no-training-step", dest="training_step", action="store_false"
    )
    parser.add_argument("--json", help="--offload: also write the results here")
    args = parser.parse_args()
    if args.offload:
        import offload_bench

        return offload_bench.run(args)
    sizes = step_bench_args(["--quick"] if args.quick else [])
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    replicated = NamedSharding(mesh, P())
    print(
        f"{jax.device_count()} simulated devices on {os.cpu_count()} cores "
        f"(load average {os.getloadavg()[0]:.1f}); mesh ('data', 8)"
    )
    header = (
        f"{'tree':12}{'optimiser':11}{'params':>8}{'replicated':>12}{'ZeRO-1':>10}"
        f"{'ratio':>7}{'unsplit':>8}{'time ZeRO/rep':>15}{'A/A':>7}"
    )
    print(header)
    for tree_name in args.trees.split(","):
        tree = TREE_MAKERS[tree_name](sizes, jax.random.key(0))
        params = jax.device_put(tree, replicated)
        rng = np.random.default_rng(1)
        grads = jax.device_put(
            jax.tree.map(
                lambda x, rng=rng: rng.standard_normal(x.shape, np.float32) * 1e-3,
                tree,
            ),
            replicated,
        )
        count = sum(x.size for x in jax.tree.leaves(tree))
        for name in args.optimisers.split(","):
            row = bench(name, tree_name, params, grads, mesh, args)
            timing = (
                f"{row['time zero']:>15.2f}{row['time replicated-aa']:>7.2f}"
                if "time zero" in row
                else ""
            )
            print(
                f"{tree_name:12}{name:11}{count / 1e6:>7.1f}M"
                f"{row['replicated'] / 2**20:>10.1f}MB{row['zero'] / 2**20:>8.1f}MB"
                f"{row['zero'] / row['replicated']:>7.3f}{row['unsplit']:>8}{timing}",
                flush=True,
            )


if __name__ == "__main__":
    main()
