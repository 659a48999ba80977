"""Runs the cells of the suite (optimiser x workload), one JSON per cell, resumable."""

import datetime
import json
import os
import pathlib
import platform
import re
import subprocess
import time

import jax
import numpy as np

from . import optimizers as opt_registry, protocol, report, workloads as wl_registry


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").lower()


def cell_path(out: pathlib.Path, workload: str, optimizer: str) -> pathlib.Path:
    return out / "cells" / f"{workload}__{slug(optimizer)}.json"


def environment() -> dict:
    """Versions and machine, recorded in every cell."""
    import equinox
    import jaxlib

    import eqopt

    root = pathlib.Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "versions": {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "equinox": equinox.__version__,
            "eqopt": getattr(eqopt, "__version__", ""),
            "numpy": np.__version__,
            "git_commit": commit,
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "devices": [str(d) for d in jax.devices()],
            "load_average": list(os.getloadavg()),
        },
    }


def fingerprint(workload, spec, seeds) -> dict:
    """What makes a cell's result: a finished cell with the same one is not rerun."""
    return {
        "workload_config": workload.config,
        "eval_every": workload.eval_every,
        "lrs": [float(x) for x in spec.lrs],
        "seeds": list(seeds),
    }


class _Progress:
    """tqdm if installed, else a line per cell."""

    def __init__(self, total: int):
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", smoothing=0.05)
        except ImportError:
            self.bar = None
        self.total, self.done = total, 0

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text)
        else:
            print(f"[{self.done}/{self.total} steps] {text}", flush=True)

    def __call__(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def plan(workloads, optimizers):
    """The cells to run: AdamW first on every workload (it sets the target)."""
    cells = []
    for w in workloads:
        names = [opt_registry.BASELINE]
        names += [n for n in optimizers if n not in names]
        for name in names:
            spec = opt_registry.OPTIMIZERS[name]
            if spec.only is None or w in spec.only:
                cells.append((w, name))
    return cells


def run_suite(
    out,
    workloads,
    optimizers,
    seeds=(0, 1, 2),
    overrides=None,
    time_single_run=True,
    log=print,
    figure_copy=None,
) -> dict:
    """Runs every missing cell, writes its JSON, then regenerates the report.

    `overrides[workload]` replaces arguments of the workload (sizes, steps).
    Returns `{"ran": [...], "skipped": [...], "summary": ...}`.
    """
    out = pathlib.Path(out)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    overrides = overrides or {}
    built = {w: wl_registry.get(w, **overrides.get(w, {})) for w in workloads}
    cells = plan(workloads, optimizers)
    todo, skipped = [], []
    for w, name in cells:
        spec = opt_registry.OPTIMIZERS[name]
        path = cell_path(out, w, name)
        want = fingerprint(built[w], spec, seeds)
        if path.exists() and json.loads(path.read_text()).get("fingerprint") == want:
            skipped.append((w, name))
        else:
            todo.append((w, name))
    env = environment()
    total = sum(
        built[w].steps * len(opt_registry.OPTIMIZERS[n].lrs) * len(seeds)
        for w, n in todo
    )
    progress = _Progress(total)
    ran = []
    for w, name in todo:
        spec, workload = opt_registry.OPTIMIZERS[name], built[w]
        progress.describe(f"{w} / {name}")
        record = {
            "schema": 1,
            "workload": w,
            "optimizer": name,
            "metric_name": workload.metric,
            "fingerprint": fingerprint(workload, spec, seeds),
            "schedule": spec.schedule,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            **env,
        }
        start = time.perf_counter()
        try:
            record.update(
                protocol.run_cell(workload, spec, seeds, progress, time_single_run)
            )
        except Exception as e:  # recorded, so the report shows it, and not rerun
            record["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            record["wall_seconds"] = time.perf_counter() - start
            log(f"{w} / {name} failed: {record['error']}")
        base = cell_path(out, w, opt_registry.BASELINE)
        if "runs" in record and base.exists() or name == opt_registry.BASELINE:
            base_cell = record if name == opt_registry.BASELINE else None
            base_cell = base_cell or json.loads(base.read_text())
            if "runs" in base_cell and "runs" in record:
                target = protocol.target_of(base_cell)
                record["result"] = protocol.best_setting(record, target)
        cell_path(out, w, name).write_text(json.dumps(record, default=float))
        ran.append((w, name))
        # A finished cell's programs are not used again: dropping them bounds the
        # process's memory maps (the full suite once ran out of them: LLVM's
        # "Cannot allocate memory" after 100 cells, with 65530 maps allowed).
        protocol.forget_programs()
    progress.close()
    summary = report.write_report(out, figure_copy)
    return {"ran": ran, "skipped": skipped, "summary": summary}
