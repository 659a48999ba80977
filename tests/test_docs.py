"""The code in the README, the docs pages and the docstrings' examples runs as written."""

import importlib
import importlib.util
import inspect
import os
import pathlib
import pkgutil
import re
import subprocess
import sys
import textwrap

import pytest

import eqopt

ROOT = pathlib.Path(__file__).parent.parent


def _python_blocks(path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / path).read_text(), re.S)
    return [b for b in blocks if not b.lstrip().startswith(">>>")]


@pytest.mark.parametrize(
    "path",
    [
        "README.md",
        "docs/getting-started.md",
        "docs/checkpointing.md",
        "docs/custom-transforms.md",
    ],
)
def test_code_blocks_run(path, capsys):
    namespace = {}
    for block in _python_blocks(path):
        if "import orbax" in block and importlib.util.find_spec("orbax") is None:
            continue  # Orbax is optional.
        exec(compile(block, path, "exec"), namespace)


def test_sharding_page_runs_on_eight_devices():
    # The page's script sets XLA_FLAGS before importing JAX: a fresh process.
    code = "\n\n".join(_python_blocks("docs/sharding.md"))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [
        "P('model',)",
        "P()",
        "P('model',",
        "None)",
        "P('model',",
        "None)",
        "P(None,",
        "None)",
    ], result.stdout


def test_printed_optimiser_matches_getting_started():
    text = str(eqopt.adamw(1e-3))
    page = (ROOT / "docs/getting-started.md").read_text()
    for line in (
        "ScaleByAdam(b1=0.9, b2=0.999, eps=1e-08, eps_root=0.0)",
        "AddDecayedWeights(weight_decay=1e-04)",
        "ScaleByLearningRate(learning_rate=0.001)",
    ):
        assert line in text and line in page


# Examples in docstrings (`!!! example` boxes on the API pages) start from the setup
# shown on the first API page.
_EXAMPLE = re.compile(r"^!!! example[^\n]*\n((?:[ \t]*\n|    [^\n]*\n)+)", re.M)


def _docstring_examples():
    seen = {}
    modules = [eqopt]
    for info in pkgutil.walk_packages(eqopt.__path__, "eqopt."):
        modules.append(importlib.import_module(info.name))
    for module in modules:
        for name, obj in vars(module).items():
            if name.startswith("__") or not (
                inspect.isclass(obj) or inspect.isfunction(obj)
            ):
                continue
            if not getattr(obj, "__module__", "").startswith("eqopt"):
                continue
            where = f"{obj.__module__}.{obj.__qualname__}"
            docs = [(where, inspect.getdoc(obj) or "")]
            if inspect.isclass(obj):
                docs += [
                    (f"{where}.{m}", inspect.getdoc(v) or "")
                    for m, v in vars(obj).items()
                    if callable(v) or isinstance(v, (classmethod, staticmethod))
                ]
            for label, doc in docs:
                for index, match in enumerate(_EXAMPLE.finditer(doc + "\n")):
                    body = textwrap.dedent(match.group(1))
                    for block in re.findall(r"```python\n(.*?)```", body, re.S):
                        seen[f"{label}[{index}]"] = block
    return sorted(seen.items())


EXAMPLES = _docstring_examples()


def test_docstrings_have_examples():
    assert len(EXAMPLES) >= 20, [name for name, _ in EXAMPLES]


@pytest.fixture(scope="module")
def example_setup():
    namespace = {}
    exec(compile(_python_blocks("docs/api/core.md")[0], "setup", "exec"), namespace)
    return namespace


@pytest.mark.parametrize(
    "block", [b for _, b in EXAMPLES], ids=[n for n, _ in EXAMPLES]
)
def test_docstring_example_runs(block, example_setup, capsys):
    namespace = dict(example_setup)
    exec(compile(block, "example", "exec"), namespace)
