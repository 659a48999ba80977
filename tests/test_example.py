"""The README's first command: the digits example trains, reports accuracy and saves a plot."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent


def test_train_digits_example(tmp_path):
    plot = tmp_path / "digits.png"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "train_digits.py"),
            "--steps",
            "300",
            "--plot",
            str(plot),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        # The eqopt of this checkout, whatever `pip install -e` points at.
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
            ),
        },
    )
    accuracy = float(re.search(r"held-out accuracy: ([0-9.]+)", result.stdout).group(1))
    assert accuracy >= 0.9, result.stdout
    assert plot.exists() and plot.stat().st_size > 10_000
