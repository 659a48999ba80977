"""Which optimiser should I use? Time to target of eqopt's optimisers on small workloads.

For every optimiser x workload: a learning-rate sweep (5 rates, 3 seeds) trained
as one vmapped, compiled program; the best rate by AlgoPerf's rule (the best
median-over-seeds time to a target set by a tuned AdamW at 75% of the budget;
if none reaches it, the best final metric). One JSON per cell under
`OUT/cells/`; finished cells are not rerun. The table (`OUT/table.md`), the
performance profile (`OUT/profile.png`) and `OUT/summary.json` are regenerated
from the JSONs at the end, or alone with `--report-only`.

    python benchmarks/choose.py                       # the full suite
    python benchmarks/choose.py --quick               # 2 workloads, 5 optimisers
    python benchmarks/choose.py --workloads char_lm --optimizers AdamW Muon
    python benchmarks/choose.py --report-only --out benchmarks/choose_results
    python benchmarks/choose.py --list
"""

import argparse
import os
import pathlib
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(pathlib.Path(__file__).parent))

from choose import optimizers, report, suite, workloads  # noqa: E402

DEFAULT_OUT = pathlib.Path(__file__).parent / "choose_results"
DOCS_FIGURE = pathlib.Path(__file__).parent.parent / "docs" / "choosing_profile.png"


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="2 workloads, 5 optimisers"
    )
    parser.add_argument("--workloads", nargs="+", choices=list(workloads.WORKLOADS))
    parser.add_argument("--optimizers", nargs="+", metavar="NAME")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--steps-scale",
        type=float,
        default=1.0,
        help="multiply every workload's step budget (a shorter run; targets move)",
    )
    parser.add_argument(
        "--tiny", action="store_true", help="tiny workloads (smoke test)"
    )
    parser.add_argument(
        "--no-single-timing",
        action="store_true",
        help="skip the one-run timing; seconds per step are the sweep's, per run",
    )
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--list", action="store_true", help="the registries")
    args = parser.parse_args(argv)

    if args.list:
        for name, spec in optimizers.OPTIMIZERS.items():
            print(f"{name:<22} lrs {', '.join(f'{x:.3g}' for x in spec.lrs)}")
        print("workloads:", ", ".join(workloads.WORKLOADS))
        return
    out = pathlib.Path(args.out)
    # The docs page shows the default results' figure.
    figure = DOCS_FIGURE if out.resolve() == DEFAULT_OUT.resolve() else None
    if args.report_only:
        print(report.table(report.write_report(out, figure)))
        return
    names = args.workloads or (
        list(optimizers.QUICK_WORKLOADS) if args.quick else list(workloads.WORKLOADS)
    )
    opts = args.optimizers or (
        list(optimizers.QUICK_OPTIMIZERS) if args.quick else list(optimizers.OPTIMIZERS)
    )
    unknown = [n for n in opts if n not in optimizers.OPTIMIZERS]
    if unknown:
        parser.error(f"unknown optimiser(s) {unknown}; see --list")
    overrides = {}
    for name in names:
        sizes = dict(workloads.TINY[name]) if args.tiny else {}
        if args.steps_scale != 1.0:
            base = workloads.get(name, **sizes)
            steps = max(1, round(base.steps * args.steps_scale / base.eval_every))
            sizes["steps"] = steps * base.eval_every
        overrides[name] = sizes
    result = suite.run_suite(
        out,
        names,
        opts,
        seeds=tuple(range(args.seeds)),
        overrides=overrides,
        time_single_run=not args.no_single_timing,
        figure_copy=figure,
    )
    print(f"ran {len(result['ran'])} cell(s), {len(result['skipped'])} already done")
    print(report.table(result["summary"]))
    print(f"wrote {out / 'table.md'}, {out / 'profile.png'}, {out / 'summary.json'}")


if __name__ == "__main__":
    main()
