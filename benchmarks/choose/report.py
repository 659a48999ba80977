"""The report, regenerated from the cells' JSONs: targets, best settings, the
per-workload table (markdown), the performance profile (PNG) and a summary JSON.

    python benchmarks/choose.py --report-only --out DIR
"""

import json
import math
import pathlib
import shutil

import numpy as np

from .protocol import best_setting, target_of

BASELINE = "AdamW"


def load_cells(out: pathlib.Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]


def summarise(cells: list[dict]) -> dict:
    """`{workload: {"target", "metric", "rows": {optimizer: result}}}`; the target
    is AdamW's (the AlgoPerf way: a tuned AdamW's metric at 75% of the budget)."""
    out: dict = {}
    by_workload: dict[str, list[dict]] = {}
    for cell in cells:
        by_workload.setdefault(cell["workload"], []).append(cell)
    for workload, group in sorted(by_workload.items()):
        base = [c for c in group if c["optimizer"] == BASELINE and "runs" in c]
        if not base:
            continue
        target = target_of(base[0])
        base_bytes = base[0]["state_bytes"]
        rows = {}
        for cell in group:
            if "runs" not in cell:  # the optimiser failed to build or to run
                rows[cell["optimizer"]] = {"error": cell.get("error", "failed")}
                continue
            result = best_setting(cell, target)
            result.update(
                seconds_per_step=cell["seconds_per_step"],
                state_bytes=cell["state_bytes"],
                state_vs_adamw=cell["state_bytes"] / base_bytes,
                failed_runs=len(cell["failures"]),
                runs=len(cell["runs"]),
                mode=cell["mode"],
            )
            rows[cell["optimizer"]] = result
        out[workload] = {
            "target": target,
            "metric": base[0]["metric_name"],
            "budget": base[0]["eval_steps"][-1],
            "rows": rows,
        }
    return out


def profile(summary: dict, taus: np.ndarray) -> dict[str, np.ndarray]:
    """AlgoPerf's performance profile: for each optimiser, the fraction of
    workloads on which its seconds to target are within `tau` of the best
    optimiser's (a workload it did not reach, or did not run, counts against it)."""
    names = sorted({n for w in summary.values() for n in w["rows"]})
    ratios = {n: [] for n in names}
    for w in summary.values():
        times = {n: r.get("seconds_to_target", math.inf) for n, r in w["rows"].items()}
        best = min(times.values())
        for n in names:
            t = times.get(n, math.inf)
            ratios[n].append(t / best if np.isfinite(best) and best > 0 else math.inf)
    count = len(summary)
    return {
        n: np.asarray([np.sum(np.asarray(r) <= tau) / count for tau in taus])
        for n, r in ratios.items()
    }


def _fmt(x, spec=".3g"):
    return "-" if x is None or not np.isfinite(x) else format(x, spec)


def table(summary: dict) -> str:
    """One markdown table per workload, sorted by seconds to target."""
    lines = []
    for workload, w in summary.items():
        lines += [
            f"**{workload}**: target {w['metric']} {w['target']:.4g} "
            f"(AdamW at 75% of {w['budget']} steps)",
            "",
            "| optimiser | best lr | steps to target | seconds to target | "
            f"final {w['metric']} | ms/step | state vs AdamW | failed runs |",
            "|---|---|---|---|---|---|---|---|",
        ]

        def key(item):
            r = item[1]
            return (r.get("seconds_to_target", math.inf), r.get("final_metric", 1e30))

        for name, r in sorted(w["rows"].items(), key=key):
            if "error" in r:
                lines.append(f"| {name} | error: {r['error'][:60]} | | | | | | |")
                continue
            lines.append(
                f"| {name} | {r['lr']:.3g} | {_fmt(r['steps_to_target'], '.0f')} | "
                f"{_fmt(r['seconds_to_target'], '.2f')} | {r['final_metric']:.4g} | "
                f"{1e3 * r['seconds_per_step']:.2f} | {r['state_vs_adamw']:.2f} | "
                f"{r['failed_runs']}/{r['runs']} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot_profile(summary: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    taus = np.logspace(0, 1.5, 200)
    curves = profile(summary, taus)
    fig, ax = plt.subplots(figsize=(8, 5))
    order = sorted(curves, key=lambda n: -float(np.trapezoid(curves[n], taus)))
    for i, name in enumerate(order):
        style = "-" if i < 10 else "--"
        ax.step(taus, curves[name], where="post", label=name, ls=style)
    ax.set(
        xscale="log",
        xlabel="tau: seconds to target within tau x the best optimiser's",
        ylabel="fraction of workloads",
        ylim=(-0.02, 1.02),
        title=f"Performance profile over {len(summary)} workload(s)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: pathlib.Path, figure_copy: pathlib.Path | None = None) -> dict:
    """Regenerates `summary.json`, `table.md` and `profile.png` under `out` (and
    the figure at `figure_copy` too, for the docs)."""
    out = pathlib.Path(out)
    summary = summarise(load_cells(out))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    (out / "table.md").write_text(table(summary))
    if summary:
        plot_profile(summary, out / "profile.png")
        if figure_copy is not None:
            shutil.copyfile(out / "profile.png", figure_copy)
    return summary
