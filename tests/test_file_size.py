"""Every Python file of the package, its tests, benchmarks and examples is at most
600 lines (docs/development.md): a longer file holds several concerns, to be split
into focused modules behind the same imports (as `eqopt/_quantize/`)."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = ("eqopt", "tests", "benchmarks", "examples")
LIMIT = 600


def _line_count(path: pathlib.Path) -> int:
    with path.open("rb") as file:
        return sum(1 for _ in file)


def test_no_python_file_is_over_600_lines():
    counts = {
        path.relative_to(ROOT).as_posix(): _line_count(path)
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
    }
    assert counts, "found no Python file: is ROOT the repository?"
    offenders = {path: count for path, count in counts.items() if count > LIMIT}
    assert not offenders, (
        f"files over {LIMIT} lines (split them into focused modules): "
        + ", ".join(f"{path} ({count})" for path, count in sorted(offenders.items()))
    )
