"""What a vmapped learning-rate sweep costs: seconds per step of 1 rate, 5 rates
vmapped into one program, 5 rates one after another, and 1 rate again (an A/A row).

The four variants run interleaved, a chunk of `--chunk` steps of each in turn,
for `--rounds` rounds, so a load on the machine slows them alike; the table
gives the median seconds per step (compilation excluded) and the ratio to the
1-rate run. Uses the suite's workloads and its compiled programs.

    python benchmarks/choose_sweep_bench.py                       # digits_mlp, AdamW
    python benchmarks/choose_sweep_bench.py --workload char_lm --rounds 5
"""

import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(pathlib.Path(__file__).parent))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from choose import optimizers, protocol, workloads  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--workload", default="digits_mlp", choices=list(workloads.WORKLOADS)
    )
    parser.add_argument("--optimizer", default="AdamW")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--chunk", type=int, default=25, help="steps per timed call")
    args = parser.parse_args(argv)

    workload = workloads.get(args.workload)
    spec = optimizers.OPTIMIZERS[args.optimizer]
    lrs = np.asarray(spec.lrs[:5], np.float32)
    init1, chunk1, _ = protocol.programs(workload, spec, args.chunk, False)
    init5, chunk5, _ = protocol.programs(workload, spec, args.chunk, True)
    seed = jnp.asarray(0, jnp.uint32)
    runs = {
        "1 rate": [init1(jnp.asarray(lrs[2]), seed)],
        "5 rates vmapped": [init5(jnp.asarray(lrs), jnp.zeros(5, jnp.uint32))],
        "5 rates sequential": [init1(jnp.asarray(lr), seed) for lr in lrs],
        "1 rate (A/A)": [init1(jnp.asarray(lrs[2]), seed)],
    }
    fns = {name: chunk5 if "vmapped" in name else chunk1 for name in runs}
    seconds = {name: [] for name in runs}
    for r in range(args.rounds + 1):  # round 0 compiles
        for name, states in runs.items():
            start = time.perf_counter()
            for i, (opt, model, state, key) in enumerate(states):
                model, state, _, value = fns[name](
                    opt, model, state, key, jnp.asarray(r * args.chunk)
                )
                np.asarray(value)
                states[i] = (opt, model, state, key)
            if r:
                seconds[name].append((time.perf_counter() - start) / args.chunk)
    base = np.median(seconds["1 rate"])
    print(
        f"{args.workload}, {args.optimizer}: median seconds per step over "
        f"{args.rounds} rounds of {args.chunk} steps, interleaved"
    )
    print(f"{'variant':<20}{'ms/step':>10}{'x 1 rate':>10}")
    for name, values in seconds.items():
        median = np.median(values)
        print(f"{name:<20}{1e3 * median:>10.3f}{median / base:>10.2f}")


if __name__ == "__main__":
    main()
