"""The low-memory example runs in short mode, prints its memory table and plots."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent


def _run(*arguments: str) -> str:
    # Import eqopt from this checkout, whatever is installed.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    script = str(ROOT / "examples" / "low_memory.py")
    return subprocess.run(
        [sys.executable, script, *arguments],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
        env={**os.environ, "PYTHONPATH": path, "MPLBACKEND": "Agg"},
    ).stdout


def test_low_memory_example_short(tmp_path):
    plot = tmp_path / "low_memory.png"
    stdout = _run("--short", "--out", str(plot))
    rows = {
        name: [float(v.strip().rstrip("%")) for v in values.split("|")]
        for name, values in re.findall(r"^\| ([^|]+?) \| (\d[^\n]*?) \|$", stdout, re.M)
    }
    assert set(rows) == {
        "float32",
        "8-bit",
        "8-bit (nearest)",
        "4-bit",
        "4-bit rank-1",
        "4-bit (nearest)",
        "bf16 + master",
        "bf16 + SR",
        "bf16 (nearest)",
    }, stdout
    # Columns: param bytes, state bytes/param, LM loss, vs float32, held-out,
    # digits loss, vs float32, digits test loss.
    assert rows["float32"][1] == 8.0
    assert rows["8-bit"][1] < 2.2 and rows["4-bit"][1] < 1.2, stdout
    # Rank-1 scales on small matrices cost more than blocks (rows + columns).
    assert rows["4-bit (nearest)"][1] == rows["4-bit"][1] < rows["4-bit rank-1"][1]
    assert rows["bf16 + master"][0] == 2 and rows["bf16 + master"][1] == 12.0
    # After a few steps the 8-bit run follows float32 closely.
    assert abs(rows["8-bit"][3]) < 1.0, stdout
    assert plot.exists() and plot.stat().st_size > 10_000


def test_low_memory_seed_study_short():
    """`--seeds`: the digits task over seeds, each variant's gap to float32 on the
    same seed (mean, spread, range)."""
    stdout = _run("--seeds", "2", "--digits-steps", "40")
    gaps = {
        name: float(mean)
        for name, mean in re.findall(
            r"^\| ([^|]+?) \| [\d.]+ ± [\d.]+ \| ([+-][\d.]+)% ± ", stdout, re.M
        )
    }
    assert len(gaps) == 9 and gaps["float32"] == 0.0, stdout
    # Early in training (loss ~0.2) 8-bit Adam follows float32 within a percent.
    assert abs(gaps["8-bit"]) < 1.0, stdout
