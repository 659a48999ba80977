"""The Muon-versus-AdamW example runs in short mode, prints both accuracies and plots."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent


def test_muon_vs_adamw_example_short(tmp_path):
    plot = tmp_path / "muon_vs_adamw.png"
    # Import eqopt from this checkout, whatever is installed.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "muon_vs_adamw.py"),
            "--short",
            "--out",
            str(plot),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    accuracies = {
        name: float(value)
        for name, value in re.findall(
            r"(AdamW|Muon) test accuracy: ([0-9.]+)", result.stdout
        )
    }
    assert set(accuracies) == {"AdamW", "Muon"}, result.stdout
    # A few steps already beat chance (0.1) by far.
    assert all(value > 0.5 for value in accuracies.values()), result.stdout
    assert "%" in result.stderr or "step" in result.stderr  # the tqdm progress bars
    assert plot.exists() and plot.stat().st_size > 10_000
