"""The optimiser suite of `benchmarks/choose.py`: its rules, its JSON, resuming, and
that the vmapped sweep trains each rate as a run of its own would."""

import json
import pathlib
import sys

import numpy as np
import pytest

import eqopt

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "benchmarks"))

from choose import optimizers, protocol, report, suite, workloads  # noqa: E402

LRS = (1e-3, 1e-2)
TINY = dict(workloads.TINY["teacher_student"], steps=15)


def _cell(curves_by_lr, eval_steps):
    runs = [
        {"lr": lr, "seed": s, "metric": list(m), "loss": [0.0] * len(m)}
        for lr, curves in curves_by_lr.items()
        for s, m in enumerate(curves)
    ]
    return {"eval_steps": eval_steps, "runs": runs, "seconds_per_step": 0.5}


def test_steps_to_target():
    steps = [0, 10, 20, 30, 40]
    assert protocol.steps_to_target(steps, [5, 3, 2, 1, 0.5], 2.0) == 20
    assert protocol.steps_to_target(steps, [5, 3, np.nan, 1, 0.5], 1.5) == 30
    assert protocol.steps_to_target(steps, [5, 4, 3, 3, 3], 2.0) == np.inf


def test_target_and_best_setting():
    steps = [0, 10, 20, 30, 40]
    cell = _cell(
        {
            # reaches 1.0 at 20, 30, 40: median 30, final median 0.5
            0.1: [[5, 2, 1, 0.6, 0.5], [5, 2, 1.5, 1, 0.5], [5, 3, 2, 1.5, 1]],
            # reaches at 10, 10, inf: median 10, the best time despite one seed
            0.3: [[5, 1, 0.9, 0.9, 0.9], [5, 1, 0.9, 0.9, 0.9], [5, 4, 4, 4, 4]],
            # never reaches
            1.0: [[5, 4, 4, 4, np.nan]] * 3,
        },
        steps,
    )
    # AdamW's rule: the best final median (0.1: 0.5), its median at step 30.
    assert protocol.target_of(cell) == 1.0
    best = protocol.best_setting(cell, 1.0)
    assert (best["lr"], best["steps_to_target"]) == (0.3, 10)
    assert best["steps_to_target_per_seed"] == [10, 10, np.inf]
    assert best["seconds_to_target"] == 5.0 and best["reached"]
    # Nobody reaches: the best median final metric wins.
    best = protocol.best_setting(cell, 0.1)
    assert (best["lr"], best["final_metric"], best["reached"]) == (0.1, 0.5, False)


def test_performance_profile():
    rows = lambda a, b: {"A": {"seconds_to_target": a}, "B": {"seconds_to_target": b}}  # noqa: E731
    summary = {"w1": {"rows": rows(1.0, 2.0)}, "w2": {"rows": rows(np.inf, 3.0)}}
    curves = report.profile(summary, np.asarray([1.0, 1.9, 2.0]))
    np.testing.assert_array_equal(curves["A"], [0.5, 0.5, 0.5])
    np.testing.assert_array_equal(curves["B"], [0.5, 0.5, 1.0])


# Two rates each; the same objects in every test, so compiled programs are reused.
SPECS = {
    "AdamW": optimizers.Spec(lambda lr, ctx: eqopt.adamw(lr, weight_decay=1e-2), LRS),
    "Muon": optimizers.Spec(optimizers.OPTIMIZERS["Muon"].factory, LRS),
}


@pytest.fixture
def two_optimizers(monkeypatch):
    for name, spec in SPECS.items():
        monkeypatch.setitem(optimizers.OPTIMIZERS, name, spec)
    return list(SPECS)


def test_vmapped_sweep_matches_one_rate(two_optimizers):
    # The suite's own AdamW cell (its compiled program is kept for the next test).
    workload = workloads.get("teacher_student", **TINY)
    spec = optimizers.OPTIMIZERS["AdamW"]
    batched, *_ = protocol.sweep(workload, spec, LRS, [0], True, lambda n: None)
    single, *_ = protocol.sweep(workload, spec, LRS[1:], [0], False, lambda n: None)
    assert batched[1]["lr"] == single[0]["lr"] == LRS[1]
    for field in ("metric", "loss"):
        np.testing.assert_allclose(
            batched[1][field][1:], single[0][field][1:], rtol=1e-5, atol=1e-6
        )
    assert batched[0][field] != batched[1][field]


def test_suite_writes_json_and_resumes(tmp_path, two_optimizers):
    kwargs = dict(
        seeds=(0,),
        overrides={"teacher_student": TINY},
        time_single_run=False,
        log=lambda *a: None,
    )
    first = suite.run_suite(tmp_path, ["teacher_student"], two_optimizers, **kwargs)
    assert first["ran"] == [("teacher_student", "AdamW"), ("teacher_student", "Muon")]
    cell = json.loads(suite.cell_path(tmp_path, "teacher_student", "Muon").read_text())
    for key in ("versions", "machine", "fingerprint", "runs", "eval_steps", "mode"):
        assert key in cell
    for key in ("seconds_per_step", "state_bytes", "compile_seconds", "failures"):
        assert key in cell
    assert cell["mode"] == "vmap" and cell["versions"]["jax"]
    assert [(r["lr"], r["seed"]) for r in cell["runs"]] == [(LRS[0], 0), (LRS[1], 0)]
    assert len(cell["runs"][0]["metric"]) == len(cell["eval_steps"]) == 4
    assert set(cell["result"]) >= {"lr", "steps_to_target", "seconds_to_target"}
    assert (tmp_path / "table.md").read_text().count("| Muon |") == 1
    assert (tmp_path / "profile.png").stat().st_size > 0
    mtime = suite.cell_path(tmp_path, "teacher_student", "AdamW").stat().st_mtime_ns

    again = suite.run_suite(tmp_path, ["teacher_student"], two_optimizers, **kwargs)
    assert again["ran"] == [] and len(again["skipped"]) == 2
    path = suite.cell_path(tmp_path, "teacher_student", "AdamW")
    assert path.stat().st_mtime_ns == mtime
    assert again["summary"] == first["summary"]
