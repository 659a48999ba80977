"""How much `import eqopt` costs on top of `import jax, equinox`.

Each repetition starts fresh interpreters that import `jax, equinox` and
`eqopt` (alone, then with the names a training script reads first, then with
every top-level name, since eqopt's names load on first use), alternating the
order, and the script prints the medians and their differences. Bytecode caching is left on (as for any installed package):
the first, untimed, round fills the caches.

    python benchmarks/import_time.py            # 15 repetitions
    python benchmarks/import_time.py --reps 31
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

STATEMENTS = {
    "jax, equinox": "import jax, equinox",
    "eqopt": "import eqopt",
    # eqopt's names load on first use: this is what a training script that uses
    # Adam pays (the modules behind `adam`, `chain` and `apply_updates`).
    "eqopt, adam": "import eqopt; eqopt.adam, eqopt.chain, eqopt.apply_updates",
    # ... and every top-level name at once.
    "eqopt, all": "import eqopt; [getattr(eqopt, n) for n in eqopt.__all__]",
    "optax": "import optax",
}
# Inside one interpreter: `import eqopt` once jax and equinox are loaded. This
# leaves out interpreter start-up and shutdown (the final garbage collection of
# every module's objects, which grows with what was imported).
IN_PROCESS = (
    "import time, jax, equinox; start = time.perf_counter(); import eqopt; "
    "middle = time.perf_counter(); eqopt.adam, eqopt.chain, eqopt.apply_updates; "
    "print(middle - start, time.perf_counter() - start)"
)


def _env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def once(statement: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True, env=_env())
    return time.perf_counter() - start


def in_process() -> float:
    result = subprocess.run(
        [sys.executable, "-c", IN_PROCESS],
        check=True,
        env=_env(),
        capture_output=True,
        text=True,
    )
    first, second = result.stdout.split()
    return float(first), float(second)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args(argv)
    names = list(STATEMENTS)
    for name in names:  # fill the bytecode caches
        once(STATEMENTS[name])
    samples = {name: [] for name in names}
    inside = []
    for rep in range(args.reps):
        order = names if rep % 2 == 0 else names[::-1]
        for name in order:
            samples[name].append(once(STATEMENTS[name]))
        inside.append(in_process())
    medians = {name: statistics.median(values) for name, values in samples.items()}
    for name in names:
        print(f"import {name:<14} median {medians[name]:.3f} s")
    for name in ("eqopt", "eqopt, adam", "eqopt, all"):
        extra = medians[name] - medians["jax, equinox"]
        print(f"import {name} on top of jax + equinox: {extra:+.3f} s")
    print("(target: `import eqopt` within 0.3 s of `import jax, equinox`)")
    print(
        "in one interpreter, after jax and equinox: `import eqopt` median "
        f"{statistics.median(i for i, _ in inside):.3f} s, with `adam`, `chain` and "
        f"`apply_updates` {statistics.median(a for _, a in inside):.3f} s"
    )


if __name__ == "__main__":
    main()
