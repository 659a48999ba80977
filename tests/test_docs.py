"""The code in the README and in Getting started runs as written."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parent.parent


def _python_blocks(path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / path).read_text(), re.S)
    return [b for b in blocks if not b.lstrip().startswith(">>>")]


@pytest.mark.parametrize("path", ["README.md", "docs/getting-started.md"])
def test_code_blocks_run(path, capsys):
    namespace = {}
    for block in _python_blocks(path):
        exec(compile(block, path, "exec"), namespace)


def test_printed_optimiser_matches_getting_started():
    import eqopt

    text = str(eqopt.adamw(1e-3))
    page = (ROOT / "docs/getting-started.md").read_text()
    for line in (
        "ScaleByAdam(b1=0.9, b2=0.999, eps=1e-08, eps_root=0.0)",
        "AddDecayedWeights(weight_decay=1e-04)",
        "ScaleByLearningRate(learning_rate=0.001)",
    ):
        assert line in text and line in page
