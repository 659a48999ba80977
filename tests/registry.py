"""The registry of every transform and optimiser under test.

Each family's test module, `tests/test_<family>.py`, defines `TRANSFORM_CASES`: a
list of `helpers.Case`, one per configuration, beside the family's own tests. This
module collects them from every module of `tests/` that defines them. The generic tests in `test_registry.py` run every case:
init/update on an Equinox model with non-array leaves and `None` gradients, jit
without retrace when a hyperparameter changes, a typed state that survives
serialisation, parity with Optax over several steps on float32, bfloat16 and
complex parameters, and the elementwise claim.
"""

import importlib
import re
from pathlib import Path

from helpers import Case, build, spec_like

# `Case` and `spec_like` are re-exported for case files that import them from here
# (the family files import them from helpers).
__all__ = ["ALL_CASES", "Case", "build", "spec_like"]

_DEFINES_CASES = re.compile(r"^TRANSFORM_CASES\s*[:=]", re.MULTILINE)


def all_cases() -> list[Case]:
    """The `TRANSFORM_CASES` of every module of `tests/` that defines them, in file
    order: the family files `test_<family>.py`, and `_cases_<name>.py` for cases
    whose behaviour tests import the registry (a module cannot do both)."""
    cases: list[Case] = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if _DEFINES_CASES.search(path.read_text()):
            cases += importlib.import_module(path.stem).TRANSFORM_CASES
    names = [case.name for case in cases]
    duplicates = {name for name in names if names.count(name) > 1}
    assert not duplicates, f"duplicate case names: {duplicates}"
    return cases


ALL_CASES = all_cases()
