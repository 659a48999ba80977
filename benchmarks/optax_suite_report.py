"""The counts and failure classes of `benchmarks/optax_suite.py`.

Every failure of a run with `optax` resolved to eqopt gets one class:

- `baseline`: the test fails against the real Optax too (not eqopt's doing);
- `deliberate`: a difference listed on "Coming from Optax", with its reason;
- `private`: the test reaches a private Optax name (`_precondition_by_lbfgs`),
  which the shim does not map;
- `missing`: a public Optax name that eqopt lacks;
- `bug`: anything else, to be fixed (or, once understood, given a reason).

The first matching reason wins.
"""

from __future__ import annotations

import collections
import functools
import importlib
import re

KINDS = ("baseline", "deliberate", "private", "missing", "bug")


def _has(*patterns):
    return lambda r: any(re.search(p, r["message"]) for p in patterns)


def _in(*names):
    return lambda r: any(name in r["nodeid"] for name in names)


_PUBLIC_MODULES = (
    "optax assignment contrib experimental experimental.aggregating losses "
    "microbatching monte_carlo "
    "perturbations projections schedules second_order transforms tree tree_utils"
).split()


@functools.cache
def optax_public_names() -> frozenset[str]:
    """Every name that one of Optax's public modules exports (empty without Optax)."""
    names = set()
    try:
        optax = importlib.import_module("optax")
    except ImportError:
        return frozenset()
    for short_name in _PUBLIC_MODULES:
        module = optax
        for part in [] if short_name == "optax" else short_name.split("."):
            module = getattr(module, part, None)
        if module is not None:
            names.update(n for n in dir(module) if not n.startswith("_"))
    return frozenset(names)


def _unexported(r):
    """A name looked up in a private Optax module (`optax._src.utils`) that no
    public Optax module exports: an Optax internal, not part of its API."""
    found = re.search(r"module '([\w.]+)' \(eqopt shim\): eqopt has no public "
                      r"name '(\w+)'", r["message"])  # fmt: skip
    if found is None:
        return False
    module, name = found.groups()
    private = any(part.startswith("_") for part in module.split("."))
    return private and name not in optax_public_names()


# (reason, kind, test on the record).
REASONS = (
    ("private Optax name (not mapped)", "private", _has("private Optax name")),
    (
        "a name of a private Optax module that no public Optax module exports",
        "private",
        _unexported,
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
        "only inexact arrays are trained (a Python float or `None` param is not)",
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
        "loss inputs must share a shape exactly",
        "deliberate",
        lambda r: r["etype"] == "ShapeMismatchError",
    ),
    (
        "`dice_loss(apply_softmax=False)` does not check probabilities",
        "deliberate",
        _in("DiceLossTest::test_probability_validation"),
    ),
    (
        "every eqopt transform accepts extra arguments, so every one is a "
        "`GradientTransformationExtraArgs`",
        "deliberate",
        _in("ExtraArgsTest::test_isinstance"),
    ),
    (
        "out-of-range hyperparameters are refused when the optimiser is built "
        "(the test gives 1e-5 as a growth factor to check dtypes)",
        "deliberate",
        _has(r"Hyperparameter `\w+` must be in"),
    ),
    (
        "projections pass Python numbers through (a model's `Dropout.p`); "
        "the test projects tuples of floats",
        "deliberate",
        _in(
            "ProjectionsTest::test_projection_box",
            "ProjectionsTest::test_projection_non_negative",
            "ProjectionsTest::test_projection_halfspace_1",
            "ProjectionsTest::test_projection_hyperplane",
            "ProjectionsTest::test_projection_vector",
        ),
    ),
    (
        "extra arguments a transform does not use are ignored "
        "(docs/design.md, Extra arguments); Optax's line searches raise",
        "deliberate",
        _in("raises_on_unused_extra_args"),
    ),
    (
        "a masked state holds `None` at the leaves it does not train "
        "(Optax: `MaskedNode()`)",
        "deliberate",
        _in("MaskedTest::test_masked_state_structure"),
    ),
    (
        "a chain's state is a `ChainState`, not a tuple: the test compares it "
        "with a tuple, or its paths have `.states`",
        "deliberate",
        _has(
            r"(?s)ChainState\(.*\) != \(",
            r"\) != ChainState\(",
            r"PyTreeDef\(CustomNode\(ChainState",
            r"GetAttrKey\(name='states'\)",
        ),
    ),
    (
        "states are typed: one built by hand checks its fields (the test builds "
        "one with sharding specs or `None` in place of arrays; `tree_map_params` "
        "puts them there), and a chain's state is a `ChainState`",
        "deliberate",
        _in(
            "StateUtilsTest::test_adam",
            "StateUtilsTest::test_map_non_params_to_none",
        ),
    ),
    (
        "`tree_get_all_with_path` lists matches parents first in leaf order "
        "(Optax: shallower matches first)",
        "deliberate",
        lambda r: (
            "StateUtilsTest::test_tree_set" in r["nodeid"]
            and "DictKey(key='hparams')" in r["message"]
        ),
    ),
    (
        "callable dimension numbers are per-leaf (Optax calls them on the "
        "whole params)",
        "deliberate",
        _has("dimension-numbers spec is a per-leaf function"),
    ),
    (
        "a partition's group holds its transform's state (Optax: a masked "
        "state around it), with `None` where Optax has `MaskedNode()`",
        "deliberate",
        _in("MuonTest::test_dim_nums_combinations"),
    ),
    (
        "eqopt has no such public name",
        "missing",
        _has("eqopt has no public name", r"No module named '?eqopt\."),
    ),
    ("not understood yet", "bug", lambda r: True),
)


def file_of(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return path.split("tests/", 1)[-1] if "tests/" in path else path


def short(nodeid: str) -> str:
    return nodeid.split("tests/", 1)[-1]


def classify(record: dict, baseline_failed: frozenset[str] = frozenset()):
    """(reason, kind) of a failed test."""
    if short(record["nodeid"]) in baseline_failed:
        return "fails against Optax too", "baseline"
    for reason, kind, test in REASONS:
        if test(record):
            return reason, kind
    raise AssertionError("unreachable")


def outcomes(records: list[dict]) -> dict[str, dict]:
    """One outcome per test: its first failure (a setup or teardown error, a
    failing subtest, a file that does not import) if any, else passed or skipped."""
    outcome: dict[str, dict] = {}
    for r in records:
        prev = outcome.get(r["nodeid"])
        failed = r["outcome"] in ("failed", "error") or r["when"] == "collect"
        if prev is None or (failed and prev["outcome"] in ("passed", "skipped")):
            outcome[r["nodeid"]] = dict(r, outcome="failed" if failed else r["outcome"])
    return outcome


def summarise(records: list[dict], target: str, baseline=None, verbose=False):
    """Prints the counts per file and the failures by class; with `baseline` (the
    summary of an `--optax` run), both counts per file and the classes as a
    Markdown table. Returns the summary (what `--json` writes)."""
    failed_there = frozenset(
        short(r["nodeid"]) for r in (baseline or {}).get("failures", [])
    )
    per_file: dict[str, collections.Counter] = collections.defaultdict(
        collections.Counter
    )
    failures = []
    for nodeid, r in outcomes(records).items():
        c = per_file[file_of(nodeid)]
        if r["outcome"] in ("passed", "skipped"):
            c[r["outcome"]] += 1
            continue
        c["failed" if r["when"] == "call" else "error"] += 1
        reason, kind = classify(r, failed_there)
        c[kind] += 1
        failures.append(dict(r, reason=reason, kind=kind))
    total = collections.Counter()
    for c in per_file.values():
        total.update(c)
    width = max([len(f) for f in per_file] + [5])
    print(f"\n{'file':<{width}}  passed  failed  errors  skipped")
    for f in sorted(per_file) + ["total"]:
        c = total if f == "total" else per_file[f]
        print(
            f"{f:<{width}}  {c['passed']:6d}  {c['failed']:6d}  "
            f"{c['error']:6d}  {c['skipped']:7d}"
        )
    ran = total["passed"] + total["failed"] + total["error"]
    print(
        f"\n{total['passed']} of {ran} pass with `optax` resolved to {target}", end=""
    )
    print(f" ({total['skipped']} skipped)" if total["skipped"] else "")
    groups: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for r in failures:
        groups[r["reason"], r["kind"]].append(r)
    for (reason, kind), rs in sorted(
        groups.items(), key=lambda kv: KINDS.index(kv[0][1])
    ):
        print(f"\n[{kind}] {reason}: {len(rs)}")
        for r in rs:
            print(f"  {short(r['nodeid'])}")
            if kind in ("missing", "bug") or verbose:
                msg = " ".join(r["message"].split())[:300]
                where = f" (at eqopt/{r['where']})" if r["where"] else ""
                print(f"      {r['etype']}: {msg}{where}")
    summary = dict(
        target=target,
        passed=total["passed"],
        ran=ran,
        skipped=total["skipped"],
        per_file={f: dict(c) for f, c in per_file.items()},
        failures=[dict(r, nodeid=short(r["nodeid"])) for r in failures],
    )
    if baseline is not None:
        compare(summary, baseline)
    return summary


def compare(summary: dict, baseline: dict) -> None:
    """Per file: the tests that pass against Optax, those of them that pass
    against eqopt, and eqopt's failures by class, as a Markdown table."""
    files = sorted(set(summary["per_file"]) | set(baseline["per_file"]))
    print(
        "\n| file | pass with Optax | pass with eqopt | deliberate | private "
        "| missing | bug | fail with Optax too |"
    )
    print("|---|---|---|---|---|---|---|---|")
    total = collections.Counter()
    for f in files + ["total"]:
        if f == "total":
            ours, theirs = total, total
            there = total["baseline passed"]
        else:
            ours = summary["per_file"].get(f, {})
            theirs = baseline["per_file"].get(f, {})
            there = theirs.get("passed", 0)
            total["baseline passed"] += there
            total.update({k: ours.get(k, 0) for k in ("passed", *KINDS)})
        counts = " | ".join(str(ours.get(k, 0)) for k in KINDS[1:])
        print(
            f"| {f} | {there} | {ours.get('passed', 0)} | {counts} "
            f"| {ours.get('baseline', 0)} |"
        )
    # Of the tests that pass with Optax, those that pass with eqopt too (its
    # failures other than "fails with Optax too" are all among them).
    there = total["baseline passed"]
    both = there - sum(total[k] for k in KINDS[1:])
    public = there - total["private"]
    print(
        f"\n{both} of the {there} tests that pass with Optax pass with eqopt "
        f"({100 * both / max(there, 1):.1f}%); without the {total['private']} "
        "that reach a private Optax name (tests of Optax's internals), "
        f"{both} of {public} ({100 * both / max(public, 1):.1f}%)."
    )
