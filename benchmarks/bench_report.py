"""The result table of `step_bench.py`: summaries of the rounds and their formatting.

Split from `step_bench.py`, which imports (and re-exports) these.
"""

import math
import statistics
import sys
import time

#: What is timed (see `step_bench.py`).
LIBRARIES = ("optax", "optax-aa", "eqopt", "eqopt-bucketed", "eqopt-packed")

#: Minimum bytes moved per parameter by one step (read grad, params and state,
#: write params and state), float32 state. Clipping by the global norm reads the
#: gradient once more: no update can start before the whole norm is known.
BYTES_PER_PARAM = {
    "sgdm": 20,
    "adam": 28,
    "adamw": 28,
    "clip+adamw+cos": 32,
    "lion": 20,
    "rmsprop": 20,
    "adafactor": 12,
}


def geometric_mean(xs):
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else math.nan


def summarise(result):
    """Adds `median_ms`, `ratio` (and `roofline` for the one-big tree) to a result.

    Every number is taken round by round and then combined with a geometric
    mean: a variant's time is the mean of its per-round medians, and its ratio
    the mean of its per-round ratios to Optax. Steps run slower in later rounds
    (every compile makes the process's later executables slower), so pooling the
    samples of all rounds would give a two-humped sample whose median jumps
    between the humps.
    """
    samples = result["samples_s"]
    # Without step timings there is nothing to chunk: any size serves.
    per_round = {"step": max(1, result["step_reps_per_round"])}

    def chunks(values, metric):
        size = per_round.get(metric, 1)
        return [values[i : i + size] for i in range(0, len(values), size)]

    median_ms = {}
    ratio = {}
    for lib in LIBRARIES:
        median_ms[lib], ratio[lib] = {}, {}
        for metric, by_clock in samples[lib].items():
            median_ms[lib][metric], ratio[lib][metric] = {}, {}
            for clock, values in by_clock.items():
                mine = [statistics.median(c) for c in chunks(values, metric)]
                base = [
                    statistics.median(c)
                    for c in chunks(samples["optax"][metric][clock], metric)
                ]
                median_ms[lib][metric][clock] = 1e3 * geometric_mean(mine)
                ratio[lib][metric][clock] = geometric_mean(
                    [a / b for a, b in zip(mine, base, strict=True)]
                )
    result["median_ms"] = median_ms
    result["ratio"] = ratio
    if "bandwidth_GBps" in result:
        floor_ms = (
            1e3
            * BYTES_PER_PARAM[result["case"]]
            * result["params"]
            / (result["bandwidth_GBps"] * 1e9)
        )
        result["roofline"] = {
            lib: median_ms[lib]["step"]["wall"] / floor_ms for lib in LIBRARIES
        }
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
        "step eqopt",
        "step bucketed",
        "step packed",
        "step A/A",
        "compile eqopt",
        "compile bucketed",
        "compile packed",
        "compile A/A",
        "roofline optax / eqopt / bucketed / packed",
        "step ms optax",
        "compile ms optax",
    )
    rows = []
    for r in results:
        ratio, ms = r["ratio"], r["median_ms"]
        roofline = r.get("roofline")
        rows.append(
            (
                r["case"],
                r["tree"],
                str(r["leaves"]),
                fmt_count(r["params"]),
                fmt_ratio(ratio["eqopt"]["step"]["wall"]),
                fmt_ratio(ratio["eqopt-bucketed"]["step"]["wall"]),
                fmt_ratio(ratio["eqopt-packed"]["step"]["wall"]),
                fmt_ratio(ratio["optax-aa"]["step"]["wall"]),
                fmt_ratio(ratio["eqopt"]["compile"]["wall"]),
                fmt_ratio(ratio["eqopt-bucketed"]["compile"]["wall"]),
                fmt_ratio(ratio["eqopt-packed"]["compile"]["wall"]),
                fmt_ratio(ratio["optax-aa"]["compile"]["wall"]),
                "-"
                if roofline is None
                else " / ".join(
                    fmt_ratio(roofline[lib])
                    for lib in ("optax", "eqopt", "eqopt-bucketed", "eqopt-packed")
                ),
                fmt_ms(ms["optax"]["step"]["wall"]),
                fmt_ms(ms["optax"]["compile"]["wall"]),
            )
        )
    return markdown_table(header, rows, numeric=set(range(2, len(header))))


def markdown_table(header, rows, numeric):
    """`rows` under `header` as a markdown table, the `numeric` columns right-aligned."""
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]

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


def finish_args(parser, args, argv, variants, base, quick):
    """The command line's variants (in `variants`' order, `base` always) and, with
    `--quick`, the `quick` values of every option not given."""
    chosen = set(args.variants.split(","))
    unknown = chosen - set(variants)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}: choose from {variants}")
    args.variants = tuple(v for v in variants if v in chosen | {base})
    if args.quick:
        given = {
            a.lstrip("-").split("=")[0].replace("-", "_")
            for a in (argv or sys.argv[1:])
        }
        for key, value in quick.items():
            if key not in given:
                setattr(args, key, value)
    return args


def stderr_log():
    """A `log(message)` that prints to stderr with the seconds since it was made."""
    start = time.perf_counter()

    def log(message):
        print(
            f"[{time.perf_counter() - start:7.1f}s] {message}",
            file=sys.stderr,
            flush=True,
        )

    return log
