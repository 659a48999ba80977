"""eqopt is a typed package, and user code from the docs type-checks cleanly.

pyright is run, as a user would run it, on the Python code of the README and of
the Getting started page (each page's blocks joined into one file, in order).
"""

import json
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).parent.parent
PAGES = ["README.md", "docs/getting-started.md"]


def _python_blocks(path):
    # As in test_docs.py: the page's code, without the `>>>` sessions.
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / path).read_text(), re.S)
    return [b for b in blocks if not b.lstrip().startswith(">>>")]


def test_package_is_marked_typed():
    # PEP 561: without it, type checkers ignore the installed package's annotations.
    # hatchling ships every file under eqopt/ in the wheel.
    assert (ROOT / "eqopt" / "py.typed").is_file()
    assert 'packages = ["eqopt"]' in (ROOT / "pyproject.toml").read_text()


@pytest.fixture(scope="module")
def pyright_results(tmp_path_factory):
    executable = shutil.which("pyright")
    if executable is None:
        pytest.skip("the pyright executable is not on PATH (pip install pyright)")
    directory = tmp_path_factory.mktemp("snippets")
    files = {}
    for page in PAGES:
        name = page.replace("/", "_").replace(".md", ".py").replace("-", "_")
        (directory / name).write_text("\n\n".join(_python_blocks(page)))
        files[name] = page
    # This checkout's eqopt comes before any installed copy.
    config = {"extraPaths": [str(ROOT)], "typeCheckingMode": "standard"}
    (directory / "pyrightconfig.json").write_text(json.dumps(config))
    result = subprocess.run(
        [executable, "--outputjson", "-p", str(directory)],
        capture_output=True,
        text=True,
        cwd=directory,
        timeout=600,
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pyright gave no report:\n{result.stdout}\n{result.stderr}")
    assert report["summary"]["filesAnalyzed"] == len(files), report["summary"]
    by_page = {page: [] for page in PAGES}
    for diagnostic in report["generalDiagnostics"]:
        name = pathlib.Path(diagnostic["file"]).name
        by_page[files[name]].append(diagnostic)
    return by_page


@pytest.mark.parametrize("page", PAGES)
def test_pyright_is_clean_on_docs_code(pyright_results, page):
    problems = [
        f"{page} (joined code, line {d['range']['start']['line'] + 1}): "
        f"{d['severity']}: {d['message']}"
        for d in pyright_results[page]
        if d["severity"] in ("error", "warning")
    ]
    assert not problems, "\n".join(problems)
