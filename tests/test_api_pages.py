"""Every public name of eqopt and of its namespaces has an entry on an API page."""

import importlib
import inspect
import pathlib
import re

import pytest
from test_api import NAMESPACES as API_NAMESPACES

import eqopt

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Those of the Optax checks, and `eqopt.microbatching` (which Optax keeps elsewhere).
NAMESPACES = tuple(dict.fromkeys((*API_NAMESPACES, "microbatching")))


def _pages() -> dict[str, str]:
    return {
        path.name: path.read_text(encoding="utf-8")
        for path in sorted((ROOT / "docs" / "api").glob("*.md"))
    }


def _entries() -> set[str]:
    return {
        entry
        for text in _pages().values()
        for entry in re.findall(r"^::: (eqopt[\w.]*)", text, flags=re.MULTILINE)
    }


def _resolve(path: str):
    module, *attributes = path.split(".")
    obj = importlib.import_module(module)
    for attribute in attributes:
        obj = getattr(obj, attribute)
    return obj


def _public_names():
    for namespace in ("", *NAMESPACES):
        module = getattr(eqopt, namespace) if namespace else eqopt
        for name in dir(module):
            if name.startswith("_") or inspect.ismodule(getattr(module, name)):
                continue
            yield f"eqopt.{namespace}.{name}" if namespace else f"eqopt.{name}"


def test_every_entry_names_a_public_object():
    broken = []
    for entry in sorted(_entries()):
        try:
            _resolve(entry)
        except AttributeError:
            broken.append(entry)
    assert broken == []


def test_every_public_name_has_an_entry_on_an_api_page():
    # An object reachable under two names (`eqopt.l2_loss` and
    # `eqopt.losses.l2_loss`) needs one entry. A type alias has no page of its
    # own: it is named in backticks on an API page instead.
    entries = _entries()
    documented = {id(_resolve(entry)) for entry in entries}
    text = "\n".join(_pages().values())
    missing = []
    for name in _public_names():
        obj = _resolve(name)
        # `eqopt.tree_utils.tree_norm` wraps `eqopt.tree.norm` (Optax's rule for
        # Python numbers, said on its page): the wrapped one's entry documents it.
        if (
            name in entries
            or {id(obj), id(getattr(obj, "__wrapped__", None))} & documented
        ):
            continue
        is_alias = (
            not (inspect.isclass(obj) or inspect.isfunction(obj))
            or getattr(obj, "__name__", "") != name.rpartition(".")[2]
            or getattr(obj, "__module__", "").startswith(
                ("typing", "jaxtyping", "collections.abc")
            )
        )
        if is_alias and f"`{name}`" in text:
            continue
        missing.append(name)
    assert missing == [], (
        "no `::: name` entry on any page of docs/api/ for: " + ", ".join(missing)
    )


@pytest.mark.parametrize("page", sorted(_pages()))
def test_each_api_page_is_in_the_nav(page):
    assert f"api/{page}" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
