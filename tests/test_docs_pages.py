"""The pages a user reads are guides, not a development log; docstrings read cleanly in `help()`.

A user-facing page (the README and `docs/*.md`, with the files they include)
names no issue number, no date of development work and no document outside
the repository; history belongs in `benchmarks/README.md` and the changelog's
entries. Docstrings name other objects as plain code (`` `eqopt.Freeze` ``):
the docs build makes those links (`docs/_ext/griffe_links.py`), and `help()`
shows no link syntax.
"""

import importlib
import inspect
import pathlib
import pkgutil
import pydoc
import re
import sys

import pytest

import eqopt

ROOT = pathlib.Path(__file__).parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("docs/*.md"))]
_SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.M)

# What a development log says and a guide does not.
_FORBIDDEN = {
    "an issue number": re.compile(r"\bissues?[\s-]*#?\d+", re.I),
    "an issue": re.compile(r"\bthe\s+issue('s)?\b|\bissue's\b", re.I),
    "a date": re.compile(r"\b20\d\d-\d\d(-\d\d)?\b"),
    "a design document": re.compile(r"\bDESIGN\b|DESIGN\.md|§\s*\d"),
    "a development session": re.compile(r"\bsessions?\b", re.I),
    "a scratch run": re.compile(r"\bscratch\b", re.I),
    "a path outside the repository": re.compile(r"/work/|/home/|~/"),
}
# A release's heading in the changelog carries its date.
_RELEASE = re.compile(r"^## \[[^\]]+\] - 20\d\d-\d\d-\d\d$", re.M)


def _text(path: str) -> str:
    # The page with the files it includes (`--8<--` snippets).
    text = (ROOT / path).read_text(encoding="utf-8")
    return _SNIPPET.sub(lambda m: (ROOT / m.group(1)).read_text(encoding="utf-8"), text)


@pytest.mark.parametrize("path", PAGES)
def test_page_is_a_guide_not_a_log(path):
    text = _RELEASE.sub("", _text(path))
    found = [
        f"{what}: {' '.join(match.group(0).split())!r}"
        for what, pattern in _FORBIDDEN.items()
        for match in pattern.finditer(text)
    ]
    assert not found, f"{path} names {found}"


_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("path", PAGES)
def test_page_links_stay_in_the_repository(path):
    # Relative links resolve to files of the repository (a document outside it
    # is not a page a reader can open).
    base = (ROOT / path).parent
    for target in _LINK.findall(_text(path)):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        resolved = (base / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(ROOT.resolve()), f"{path}: {target}"
        assert resolved.exists(), f"{path}: {target} does not exist"


def test_forbidden_patterns_catch_a_log():
    log = (
        "As issue 18's targets said (DESIGN §9a), a scratch A/B on 2026-11-26 "
        "in one session; see the\nissue's table."
    )
    caught = {what for what, pattern in _FORBIDDEN.items() if pattern.search(log)}
    assert caught == set(_FORBIDDEN) - {"a path outside the repository"}


# ---------------------------------------------------------------------------
# Docstrings: plain code in help(), links on the site
# ---------------------------------------------------------------------------

# The docs' cross-reference syntax: [`eqopt.X`][] and [text][eqopt.X].
_LINK_SYNTAX = re.compile(r"\]\[\]|\]\[eqopt[\w.]*\]")


def _public_objects():
    modules = [eqopt]
    for info in pkgutil.walk_packages(eqopt.__path__, "eqopt."):
        modules.append(importlib.import_module(info.name))
    seen = {}
    for module in modules:
        seen[module.__name__] = module
        for name, obj in vars(module).items():
            if name.startswith("__") or not (
                inspect.isclass(obj) or inspect.isfunction(obj)
            ):
                continue
            if not getattr(obj, "__module__", "").startswith("eqopt"):
                continue
            seen[f"{obj.__module__}.{obj.__qualname__}"] = obj
            if inspect.isclass(obj):
                for member, value in vars(obj).items():
                    if isinstance(value, (classmethod, staticmethod, property)):
                        value = getattr(value, "__func__", None) or value.fget
                    if callable(value):
                        seen[f"{obj.__module__}.{obj.__qualname__}.{member}"] = value
    return seen


def test_no_docstring_shows_link_syntax():
    found = [
        f"{where}: {match.group(0)!r}"
        for where, obj in _public_objects().items()
        for match in _LINK_SYNTAX.finditer(inspect.getdoc(obj) or "")
    ]
    assert not found, found[:20]


def test_help_reads_cleanly():
    text = pydoc.render_doc(eqopt.adamw, renderer=pydoc.plaintext)
    assert "an `eqopt.Chain`" in text  # the reference, as plain code
    assert not _LINK_SYNTAX.search(text), text


def test_docs_build_links_public_names():
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        griffe_links = importlib.import_module("griffe_links")
    finally:
        sys.path.pop(0)
    rendered = griffe_links.rendered_names()
    assert {"eqopt.Freeze", "eqopt.adamw", "eqopt.Packed"} <= rendered
    text = (
        "See `eqopt.Freeze`, `eqopt.Packed.unpack`, `eqopt.Scalar` and "
        "[`eqopt.adamw`][].\n```python\nx = `eqopt.Freeze`\n```"
    )
    assert griffe_links.link_names(text, rendered) == (
        "See [`eqopt.Freeze`][], [`eqopt.Packed.unpack`][], `eqopt.Scalar` and "
        "[`eqopt.adamw`][].\n```python\nx = `eqopt.Freeze`\n```"
    )
