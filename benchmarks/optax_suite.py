"""Run Optax's own tests with `optax` resolved to eqopt.

    JAX_PLATFORMS=cpu python benchmarks/optax_suite.py --optax --json optax.json
    JAX_PLATFORMS=cpu python benchmarks/optax_suite.py --baseline optax.json

`benchmarks/optax_suite_baseline.json` is the `--optax` run of Optax 0.2.8
(2507 of 2512 pass on the CPU), so `--baseline
benchmarks/optax_suite_baseline.json` needs no second run.

The test files are every `*_test.py` of the installed Optax package (52 in
Optax 0.2.8: `_src/`, `contrib/`, `losses/`, `schedules/`, `transforms/`,
`tree_utils/`, `microbatching/`, `projections/`, `perturbations/`,
`assignment/`, `experimental/` and `optax_test.py`). They are copied to a
temporary directory and run there by pytest, with a `conftest.py` that puts a
shim first on `sys.meta_path`: every `optax` module a test imports is a shim
whose attributes are looked up in eqopt's module of the same name
(`optax.tree_utils` in `eqopt.tree_utils`, `optax.transforms` in
`eqopt.transforms`...; the map is printed with `--show-map`). Only two Optax
files are used as they are, both test helpers: `optax._src.test_utils` (tree
assertions on plain arrays) and `optax._src.alias_test` (imported by the
schedule tests); their own `optax` imports go to the shim too. Nothing of
Optax's library code runs.

A private Optax name (`transform._precondition_by_lbfgs`) is not mapped: the
test fails with an AttributeError and is listed as "private". Each failure
gets a class (`optax_suite_report.py`): deliberate (with its reason, on
"Coming from Optax"), private, missing public name, bug, or "fails against
Optax too" (given `--baseline`).

`--optax` runs the same files against the real Optax (the baseline count);
`--baseline FILE` (its `--json`) prints both counts per file as a Markdown
table. `-n N` runs N pytest-xdist workers. `--eqopt-path DIR` puts DIR first
on the path, to run another eqopt checkout (`git archive REV eqopt | tar -x
-C DIR`). `--json FILE` writes the results; `--keep` keeps the temporary
directory, and `--records DIR/results.jsonl` summarises a kept run again
without running it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from optax_suite_report import file_of, summarise

# Every test file Optax ships (52 in Optax 0.2.8): `_src/`, `contrib/`,
# `losses/`, `schedules/`, `transforms/`, `tree_utils/`, `microbatching/`,
# `projections/`, `perturbations/`, `assignment/`, `experimental/` and the
# top-level `optax_test.py`.
SUITES = ("*_test.py", "*/*_test.py")

# Optax module (or package prefix) -> the eqopt modules its names are looked up
# in, in order: each Optax module goes to eqopt's module of the same name. The
# longest matching prefix wins; a private submodule
# (`optax.losses._classification`) resolves as its package, then as `eqopt`
# (Optax's private modules hold names its packages do not export).
SHIM_MAP = {
    "optax": ("eqopt",),
    "optax._src": ("eqopt",),
    "optax._src.schedule": ("eqopt.schedules", "eqopt"),
    "optax.transforms": ("eqopt.transforms",),
    "optax.schedules": ("eqopt.schedules", "eqopt"),
    "optax.losses": ("eqopt.losses",),
    "optax.tree": ("eqopt.tree",),
    "optax.tree_utils": ("eqopt.tree_utils",),
    "optax.contrib": ("eqopt.contrib",),
    "optax.projections": ("eqopt.projections",),
    "optax.second_order": ("eqopt.second_order",),
    "optax.assignment": ("eqopt.assignment",),
    "optax.microbatching": ("eqopt.microbatching",),
    "optax.perturbations": ("eqopt.perturbations",),
    "optax.monte_carlo": ("eqopt.monte_carlo",),
    "optax.experimental": ("eqopt.experimental",),
    # Optax's private module, exported as `optax.experimental.aggregating`.
    "optax.experimental._aggregating": ("eqopt.experimental.aggregating",),
    "optax.experimental.aggregating": ("eqopt.experimental.aggregating",),
}

# Optax names spelt differently in eqopt, looked up before the map: Optax's
# type aliases for a tree and a shape (`base.Shape`), and its stateful-schedule protocol (eqopt's base class
# for stateful schedules; eqopt accepts any object with the protocol as well).
RENAMES = {
    "ArrayTree": ("typing", "Any"),
    "Shape": ("typing", "Any"),
    "StatefulSchedule": ("eqopt", "AbstractStatefulSchedule"),
}

# Helpers of Optax's private modules that the tests use to compute what they
# expect (not what they test), defined in the conftest as Optax defines them.
TEST_HELPERS = {
    "abs_sq": "optax._src.numerics: (x.conj() * x).real",
    "x64_precision": "optax._src.utils: a context manager setting jax_enable_x64",
    "PRNGKey": "optax._src.base: jax.Array",
}

# Optax test helpers loaded from their own source (they hold no library code).
REAL_HELPERS = ("optax._src.test_utils", "optax._src.alias_test")

CONFTEST = '''
"""Written by benchmarks/optax_suite.py: `optax` resolved to eqopt."""
import contextlib
import importlib
import importlib.abc
import importlib.util
import json
import sys
import types

import jax
import pytest

SHIM_MAP = {shim_map!r}
REAL_HELPERS = {real_helpers!r}
OPTAX_MODULES = {optax_modules!r}
RENAMES = {renames!r}
HELPER_DIR = {helper_dir!r}
RESULTS = {results!r}


def abs_sq(x):
    return (x.conj() * x).real


@contextlib.contextmanager
def x64_precision(enable_x64_precision=True):
    old = jax.config.jax_enable_x64
    try:
        jax.config.update("jax_enable_x64", enable_x64_precision)
        yield
    finally:
        jax.config.update("jax_enable_x64", old)


TEST_HELPERS = dict(abs_sq=abs_sq, x64_precision=x64_precision, PRNGKey=jax.Array)


def _chain(fullname):
    parts = fullname.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in SHIM_MAP:
            chain = SHIM_MAP[prefix]
            if parts[-1].startswith("_") and "eqopt" not in chain:
                chain = chain + ("eqopt",)
            return chain
    return None


class _Shim(types.ModuleType):
    """An Optax module whose public names are eqopt's."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        sub = self.__name__ + "." + name
        # `from optax._src import lookahead` is Optax's module, not eqopt's
        # function of that name.
        if sub in SHIM_MAP or sub in OPTAX_MODULES:
            return importlib.import_module(sub)
        if name.startswith("_"):
            raise AttributeError(
                f"module {{self.__name__!r}} (eqopt shim) has no attribute "
                f"{{name!r}}: private Optax name, not mapped"
            )
        if name in TEST_HELPERS:
            return TEST_HELPERS[name]
        if name in RENAMES:
            modname, attr = RENAMES[name]
            return getattr(importlib.import_module(modname), attr)
        chain = self.__dict__["_eqopt_chain"]
        looked = []
        for modname in chain:
            try:
                mod = importlib.import_module(modname)
            except ModuleNotFoundError:
                looked.append(modname + " (no such module)")
                continue
            looked.append(modname)
            try:
                return getattr(mod, name)
            except AttributeError:
                continue
        raise AttributeError(
            f"module {{self.__name__!r}} (eqopt shim): eqopt has no public "
            f"name {{name!r}} (looked in {{', '.join(looked)}})"
        )


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in REAL_HELPERS:
            src = HELPER_DIR + "/" + fullname.rsplit(".", 1)[1] + ".py"
            return importlib.util.spec_from_file_location(fullname, src)
        if fullname == "optax" or fullname.startswith("optax."):
            chain = _chain(fullname)
            if chain is not None:
                return importlib.util.spec_from_loader(
                    fullname, self, is_package=True
                )
        return None

    def create_module(self, spec):
        module = _Shim(spec.name)
        module.__dict__["_eqopt_chain"] = _chain(spec.name)
        return module

    def exec_module(self, module):
        module.__path__ = []


for _name in [m for m in sys.modules if m == "optax" or m.startswith("optax.")]:
    del sys.modules[_name]
sys.meta_path.insert(0, _Finder())
import optax  # noqa: E402,F401  (the shim, before any test module)


def _write(record):
    with open(RESULTS, "a") as f:
        f.write(json.dumps(record) + "\\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.outcome == "passed" and report.when != "call":
        return
    if report.outcome == "skipped" and report.when == "teardown":
        return
    message = ""
    etype = ""
    where = ""
    if call.excinfo is not None:
        etype = call.excinfo.typename
        message = str(call.excinfo.value)[:1500]
        for entry in reversed(call.excinfo.traceback):
            path = str(entry.path)
            if "/eqopt/" in path:
                where = path.split("/eqopt/")[-1] + ":" + str(entry.lineno + 1)
                break
    _write(dict(nodeid=item.nodeid, when=report.when, outcome=report.outcome,
                etype=etype, message=message, where=where))


def pytest_collectreport(report):
    if report.failed:
        _write(dict(nodeid=report.nodeid, when="collect", outcome="error",
                    etype="CollectError",
                    message=str(report.longreprtext)[-1500:], where=""))
'''

CONFTEST_REAL = """
import json
import pytest

RESULTS = {results!r}


def _write(record):
    with open(RESULTS, "a") as f:
        f.write(json.dumps(record) + "\\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.outcome == "passed" and report.when != "call":
        return
    if report.outcome == "skipped" and report.when == "teardown":
        return
    etype = call.excinfo.typename if call.excinfo is not None else ""
    message = str(call.excinfo.value)[:1500] if call.excinfo is not None else ""
    _write(dict(nodeid=item.nodeid, when=report.when, outcome=report.outcome,
                etype=etype, message=message, where=""))


def pytest_collectreport(report):
    if report.failed:
        _write(dict(nodeid=report.nodeid, when="collect", outcome="error",
                    etype="CollectError",
                    message=str(report.longreprtext)[-1500:], where=""))
"""


def optax_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("optax")
    if spec is None or spec.origin is None:
        sys.exit("optax is not installed: its test files come from the package")
    return os.path.dirname(spec.origin)


def optax_modules(root: str) -> list[str]:
    """The dotted names of Optax's modules and packages (not its tests)."""
    names = []
    for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
        rel = os.path.relpath(path, root)[: -len(".py")].split(os.sep)
        if rel[-1] == "__init__":
            rel = rel[:-1]
        if not rel[-1:] or not rel[-1].endswith("_test"):
            names.append(".".join(["optax", *rel]))
    return sorted(set(names))


def test_files(root: str) -> list[str]:
    files = []
    for pattern in SUITES:
        files += sorted(glob.glob(os.path.join(root, pattern)))
    return [os.path.relpath(f, root) for f in files]


def run(args) -> list[dict]:
    root = optax_dir()
    files = test_files(root)
    if args.only:
        files = [f for f in files if any(s in f for s in args.only)]
    tmp = tempfile.mkdtemp(prefix="optax_suite_")
    results = os.path.join(tmp, "results.jsonl")
    tests = os.path.join(tmp, "tests")
    for rel in files:
        os.makedirs(os.path.join(tests, os.path.dirname(rel)), exist_ok=True)
        shutil.copy(os.path.join(root, rel), os.path.join(tests, rel))
    with open(os.path.join(tmp, "pytest.ini"), "w") as f:
        f.write("[pytest]\n")
    if args.optax:
        conftest = CONFTEST_REAL.format(results=results)
    else:
        conftest = CONFTEST.format(
            shim_map=SHIM_MAP,
            real_helpers=REAL_HELPERS,
            optax_modules=optax_modules(root),
            renames=RENAMES,
            helper_dir=os.path.join(root, "_src"),
            results=results,
        )
    with open(os.path.join(tests, "conftest.py"), "w") as f:
        f.write(conftest)
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if args.eqopt_path:
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.abspath(args.eqopt_path)]
            + env.get("PYTHONPATH", "").split(os.pathsep)
        )
    workers = ["-n", str(args.n)] if args.n else ["-p", "no:xdist"]
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        *workers, "-p", "no:randomly", "--import-mode=importlib",
        "-c", os.path.join(tmp, "pytest.ini"), "--rootdir", tmp,
        "-o", "addopts=", "--continue-on-collection-errors", "--tb=no", "--no-header", "-W", "default",
        tests,
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    tail = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
    print(f"pytest: {tail[0]}  ({elapsed:.0f} s, exit {proc.returncode})")
    if proc.returncode not in (0, 1):
        print(proc.stdout[-3000:], proc.stderr[-3000:])
    records = []
    if os.path.exists(results):
        with open(results) as f:
            records = [json.loads(line) for line in f]
    if args.keep:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--optax", action="store_true", help="run against the real Optax"
    )
    parser.add_argument("--eqopt-path", help="directory put first on PYTHONPATH")
    parser.add_argument(
        "--only", nargs="*", help="run the files whose path contains one of these"
    )
    parser.add_argument("--json", help="write the counts and failures here")
    parser.add_argument(
        "--baseline",
        help="a --json file of an --optax run: print both counts per file",
    )
    parser.add_argument(
        "-n", type=int, default=0, help="pytest-xdist workers (default: none)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the temporary directory"
    )
    parser.add_argument("--show-map", action="store_true", help="print the shim's map")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show every message"
    )
    parser.add_argument(
        "--records",
        nargs="+",
        help="summarise kept results.jsonl files (a later file's test files "
        "replace an earlier one's: a rerun of some files with --only)",
    )
    args = parser.parse_args()
    if args.show_map:
        print("optax module (and its submodules) -> eqopt modules searched, in order")
        for name, chain in SHIM_MAP.items():
            print(f"  {name:<22} -> {', '.join(chain)}")
        for name, (modname, attr) in RENAMES.items():
            print(f"  any optax module's {name} -> {modname}.{attr}")
        for name, what in TEST_HELPERS.items():
            print(f"  {name} (a test helper, defined as in {what})")
        print("loaded from Optax's own source: " + ", ".join(REAL_HELPERS))
        print("private names (a leading underscore) are not mapped")
    if args.records:
        records = []
        for path in args.records:
            with open(path) as f:
                new = [json.loads(line) for line in f]
            rerun = {file_of(r["nodeid"]) for r in new}
            records = [r for r in records if file_of(r["nodeid"]) not in rerun] + new
    else:
        records = run(args)
    baseline = None
    if args.baseline:
        with open(args.baseline) as f:
            baseline = json.load(f)
    target = "the real Optax" if args.optax else "eqopt"
    summary = summarise(records, target, baseline, args.verbose)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
