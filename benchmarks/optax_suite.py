"""Run Optax's own tests with `optax` resolved to eqopt.

    JAX_PLATFORMS=cpu python benchmarks/optax_suite.py

The test files come from the installed Optax package (`_src/alias_test.py`,
`_src/transform_test.py`, `_src/combine_test.py`, `transforms/*_test.py`,
`schedules/*_test.py`, `losses/*_test.py`). They are copied to a temporary
directory and run there by pytest in one process, with a `conftest.py` that
puts a shim first on `sys.meta_path`: every `optax` module a test imports is a
shim whose attributes are looked up in eqopt (the map is printed with
`--show-map`). Only two Optax files are used as they are, both test helpers:
`optax._src.test_utils` (tree assertions on plain arrays) and
`optax._src.alias_test` (imported by the schedule tests); their own `optax`
imports go to the shim too. Nothing of Optax's library code runs.

A private Optax name (`transform._precondition_by_lbfgs`) is not mapped: the
test fails with an AttributeError and is listed as "private".

`--optax` runs the same files against the real Optax (the baseline count).
`--eqopt-path DIR` puts DIR first on the path, to run another eqopt checkout
(`git archive REV eqopt | tar -x -C DIR`). `--json FILE` writes the results.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SUITES = (
    "_src/alias_test.py",
    "_src/transform_test.py",
    "_src/combine_test.py",
    "transforms/*_test.py",
    "schedules/*_test.py",
    "losses/*_test.py",
)

# Optax module (or package prefix) -> the eqopt modules its names are looked up
# in, in order. The longest matching prefix wins; a private submodule
# (`optax.losses._classification`) resolves as its package.
SHIM_MAP = {
    "optax": ("eqopt",),
    "optax._src": ("eqopt",),
    "optax._src.schedule": ("eqopt.schedules", "eqopt"),
    "optax.transforms": ("eqopt",),
    "optax.schedules": ("eqopt.schedules", "eqopt"),
    "optax.losses": ("eqopt.losses",),
    "optax.tree": ("eqopt.tree",),
    "optax.tree_utils": ("eqopt.tree",),
    "optax.contrib": ("eqopt.contrib",),
    "optax.projections": ("eqopt.projections",),
    "optax.second_order": ("eqopt.second_order",),
    "optax.assignment": ("eqopt.assignment",),
    "optax.microbatching": ("eqopt.microbatching",),
    "optax.perturbations": ("eqopt.perturbations",),
    "optax.monte_carlo": ("eqopt.monte_carlo",),
}

# Optax names spelt differently in eqopt, looked up before the map: Optax's
# type alias for a tree, and its stateful-schedule protocol (eqopt's base class
# for stateful schedules; eqopt accepts any object with the protocol as well).
RENAMES = {
    "ArrayTree": ("typing", "Any"),
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
            return SHIM_MAP[prefix]
    return None


class _Shim(types.ModuleType):
    """An Optax module whose public names are eqopt's."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        sub = self.__name__ + "." + name
        if sub in SHIM_MAP:
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
        for modname in chain:
            mod = importlib.import_module(modname)
            try:
                return getattr(mod, name)
            except AttributeError:
                continue
        raise AttributeError(
            f"module {{self.__name__!r}} (eqopt shim): eqopt has no public "
            f"name {{name!r}} (looked in {{', '.join(chain)}})"
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


# (reason, kind, test on the record). Kinds: "wording" (Optax's text, to fix),
# "deliberate" (a difference listed on Coming from Optax), "private" (an Optax
# private helper, not mapped), "other" (to look at). First match wins.
def _has(*patterns):
    return lambda r: any(re.search(p, r["message"]) for p in patterns)


REASONS = (
    ("private Optax name (not mapped)", "private", _has("private Optax name")),
    (
        "deprecation warning's wording differs from Optax's",
        "wording",
        lambda r: (
            "does not match" in r["message"]
            and re.search(r"optimistic_adam|generalized_kl|deprecat", r["message"])
        ),
    ),
    (
        "a bad `mode` is refused when the optimiser is built, not at `update`",
        "deliberate",
        lambda r: "mode" in r["nodeid"].lower() and "must be one of" in r["message"],
    ),
    (
        "callable masks and label functions are per-leaf "
        "(Optax calls them on the whole params)",
        "deliberate",
        _has("per-leaf predicate", "per-leaf label function"),
    ),
    (
        "integer gradients or updates are refused",
        "deliberate",
        _has("must be a pytree of floating or complex arrays"),
    ),
    (
        "only inexact arrays are trained (a Python float param is not)",
        "deliberate",
        _has(r"not trainable \(not an inexact array\)"),
    ),
    (
        "a chain's state is a `ChainState`, not a `tuple` instance",
        "deliberate",
        _has("is not an instance of <class 'tuple'>"),
    ),
    (
        "`freeze` freezes for the whole chain: its state is not a masked state",
        "deliberate",
        _has("'EmptyState' object has no attribute 'inner_state'"),
    ),
    (
        "a mask of the wrong structure: eqopt's error names the path "
        "(the test matches JAX's message)",
        "deliberate",
        _has(r"does not match .*not a prefix of the params' structure"),
    ),
    (
        "loss inputs must share a shape exactly",
        "deliberate",
        lambda r: r["etype"] == "ShapeMismatchError",
    ),
    (
        "`dice_loss(apply_softmax=False)` does not check probabilities",
        "deliberate",
        lambda r: (
            "dice" in r["nodeid"].lower() and "probability_validation" in r["nodeid"]
        ),
    ),
    (
        "eqopt has no such public name",
        "missing",
        _has("eqopt has no public name"),
    ),
    ("other", "other", lambda r: True),
)


def optax_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("optax")
    if spec is None or spec.origin is None:
        sys.exit("optax is not installed: its test files come from the package")
    return os.path.dirname(spec.origin)


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
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "-p", "no:xdist", "-p", "no:randomly", "--import-mode=importlib",
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


def file_of(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return path.split("tests/", 1)[-1] if "tests/" in path else path


def classify(record: dict) -> tuple[str, str]:
    for reason, kind, test in REASONS:
        if test(record):
            return reason, kind
    raise AssertionError("unreachable")


def summarise(records: list[dict], args) -> dict:
    # One outcome per test: its first failure (a setup or teardown error, a
    # failing subtest) if any, else passed or skipped.
    outcome: dict[str, dict] = {}
    for r in records:
        prev = outcome.get(r["nodeid"])
        failed = r["outcome"] in ("failed", "error") or r["when"] == "collect"
        if prev is None or (failed and prev["outcome"] in ("passed", "skipped")):
            outcome[r["nodeid"]] = dict(r, outcome="failed" if failed else r["outcome"])
    per_file: dict[str, collections.Counter] = collections.defaultdict(
        collections.Counter
    )
    failures = []
    for nodeid, r in outcome.items():
        f = file_of(nodeid)
        if r["when"] == "collect":
            per_file[f]["error"] += 1
        elif r["outcome"] in ("passed", "skipped"):
            per_file[f][r["outcome"]] += 1
        elif r["when"] == "call":
            per_file[f]["failed"] += 1
        else:
            per_file[f]["error"] += 1
        if r["outcome"] == "failed":
            failures.append(r)
    total = collections.Counter()
    width = max([len(f) for f in per_file] + [5])
    print(f"\n{'file':<{width}}  passed  failed  errors  skipped")
    for f in sorted(per_file):
        c = per_file[f]
        total.update(c)
        print(
            f"{f:<{width}}  {c['passed']:6d}  {c['failed']:6d}  "
            f"{c['error']:6d}  {c['skipped']:7d}"
        )
    print(
        f"{'total':<{width}}  {total['passed']:6d}  {total['failed']:6d}  "
        f"{total['error']:6d}  {total['skipped']:7d}"
    )
    groups_of_files = {
        "alias, transform, combine, schedules, losses": (
            "_src/",
            "schedules/",
            "losses/",
        ),
        "transforms/ (per-module transform tests)": ("transforms/",),
    }
    for label, prefixes in groups_of_files.items():
        sub = collections.Counter()
        for f, c in per_file.items():
            if f.startswith(prefixes):
                sub.update(c)
        n = sub["passed"] + sub["failed"] + sub["error"]
        if n:
            print(f"  {label}: {sub['passed']} of {n} pass")
    ran = total["passed"] + total["failed"] + total["error"]
    target = "the real Optax" if args.optax else "eqopt"
    print(
        f"\n{total['passed']} of {ran} pass with `optax` resolved to {target}", end=""
    )
    print(f" ({total['skipped']} skipped)" if total["skipped"] else "")
    groups: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for r in failures:
        groups[classify(r)].append(r)
    order = {"wording": 0, "deliberate": 1, "private": 2, "missing": 3, "other": 4}
    for (reason, kind), rs in sorted(groups.items(), key=lambda kv: order[kv[0][1]]):
        print(f"\n[{kind}] {reason}: {len(rs)}")
        for r in rs:
            print(f"  {r['nodeid'].split('tests/', 1)[-1]}")
            if kind in ("missing", "other") or args.verbose:
                msg = " ".join(r["message"].split())[:300]
                where = f" (at eqopt/{r['where']})" if r["where"] else ""
                print(f"      {r['etype']}: {msg}{where}")
    return dict(
        target=target,
        passed=total["passed"],
        ran=ran,
        skipped=total["skipped"],
        per_file={f: dict(c) for f, c in per_file.items()},
        failures=[
            dict(r, reason=classify(r)[0], kind=classify(r)[1]) for r in failures
        ],
    )


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
        "--keep", action="store_true", help="keep the temporary directory"
    )
    parser.add_argument("--show-map", action="store_true", help="print the shim's map")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show every message"
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
    summary = summarise(run(args), args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
