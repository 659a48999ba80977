"""Importing the oracles: the independent implementations the tests compare eqopt with.

A test that needs an oracle imports it with `import_oracle`. When the oracle is
not installed, or does not import, the test skips with the reason (shown in the
summary that `-ra` prints), so the README's test command runs anywhere. With
`EQOPT_REQUIRE_ORACLES=1` in the environment, as `.ci/run` sets it, the test
fails instead: in CI a missing oracle is an error, never a silent skip. The
oracles and their versions are the `oracles` extra of `pyproject.toml`.
"""

import importlib
import os
from typing import Any, NoReturn

import pytest

REQUIRE_ORACLES = "EQOPT_REQUIRE_ORACLES"


def oracles_required() -> bool:
    """Whether a missing oracle fails (`EQOPT_REQUIRE_ORACLES` set, and not to 0)."""
    return os.environ.get(REQUIRE_ORACLES, "") not in ("", "0")


def missing_oracle(package: str, error: BaseException) -> NoReturn:
    """Skips the test (or, when oracles are required, fails it) with the reason."""
    reason = (
        f"oracle {package} is not installed or does not import "
        f"({type(error).__name__}: {error}); install the `oracles` extra: "
        "pip install -e '.[oracles]'"
    )
    if not oracles_required():
        pytest.skip(reason)
    try:
        pytest.fail(f"{reason} ({REQUIRE_ORACLES} is set)", pytrace=False)
    except pytest.fail.Exception as failure:
        failure.__suppress_context__ = True  # the reason already names the error
        raise


def import_oracle(module: str, package: str | None = None) -> Any:
    """The module `module` of an oracle (the distribution `package`, for the message)."""
    try:
        return importlib.import_module(module)
    except Exception as error:  # noqa: BLE001 - any import failure is a missing oracle
        missing_oracle(package or module, error)


# The tests that skipped for a missing oracle, recorded for `.ci/run`: it runs
# the README's test command in a fresh environment without the oracles, then
# installs them and runs exactly these tests again with EQOPT_REQUIRE_ORACLES=1.
SKIPS_FILE = "EQOPT_ORACLE_SKIPS_FILE"
_MARK = "install the `oracles` extra"


def is_oracle_skip(report: Any) -> bool:
    """Whether a test report is a skip for a missing oracle (`missing_oracle`)."""
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return False
    return _MARK in str(report.longrepr[-1])


def write_oracle_skips(nodeids: set[str]) -> None:
    """Writes the node ids to the file named by `EQOPT_ORACLE_SKIPS_FILE`, one a line.

    pytest reads such a file as its arguments (`pytest @file`).
    """
    path = os.environ.get(SKIPS_FILE)
    if path:
        with open(path, "w", encoding="utf-8") as file:
            file.writelines(f"{nodeid}\n" for nodeid in sorted(nodeids))
