"""A griffe extension that turns the public names in docstrings into links.

Docstrings name other public objects as code, in full: `` `eqopt.Freeze` ``,
which reads cleanly in `help()`. On the site each such name becomes a
cross-reference, as if the docstring had said ``[`eqopt.Freeze`][]``
(mkdocs-autorefs resolves it to the object's entry on the API pages; with
`strict: true` a link that does not resolve fails the build). A name is linked
where the docs render it: a `::: eqopt.X` line on a page, or a member that its
`members:` option lists (`eqopt.Packed.unpack`). Other names (a type alias, a
namespace, a member not shown) stay code, and so do code blocks and names
already written as links.

Used by `mkdocs.yml` (`extensions:` of the mkdocstrings Python handler), after
`griffe_equinox.py`.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

import griffe

# A backticked dotted name under `eqopt`, not already the text of a link
# (`[` before it, `]` after it).
_NAME = re.compile(r"(?<!\[)`(eqopt(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`(?!\])")
_FENCE = re.compile(r"^\s*(```|~~~)")
_RENDERED = re.compile(r"^:::\s*(eqopt[\w.]*)", re.M)
_DOCS = pathlib.Path(__file__).resolve().parent.parent


def rendered_names(docs: pathlib.Path = _DOCS) -> frozenset[str]:
    """The objects the docs pages render: each `::: eqopt.X` line, and the
    members its `members:` option lists (`eqopt.Packed.unpack`)."""
    names = set()
    for page in docs.rglob("*.md"):
        lines = page.read_text(encoding="utf-8").splitlines()
        for index, line in enumerate(lines):
            match = _RENDERED.match(line)
            if match is None:
                continue
            name = match.group(1)
            names.add(name)
            options = []
            for option in lines[index + 1 :]:
                if option.strip() and not option.startswith(" "):
                    break
                options.append(option)
            listed = re.search(r"members:\s*\[([^\]]*)\]", "\n".join(options))
            if listed is None:
                listed = re.search(
                    r"members:\s*\n((?:\s*- .+\n?)+)", "\n".join(options)
                )
            if listed is not None:
                members = re.split(r"[,\n]", listed.group(1))
                names.update(
                    f"{name}.{member.strip(' -')}"
                    for member in members
                    if member.strip(" -")
                )
    return frozenset(names)


def link_names(text: str, rendered: frozenset[str]) -> str:
    """`text` with each backticked name in `rendered` made a link, outside code
    blocks."""

    def link(match: re.Match) -> str:
        name = match.group(1)
        return f"[`{name}`][]" if name in rendered else match.group(0)

    lines = text.split("\n")
    in_fence = False
    for index, line in enumerate(lines):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines[index] = _NAME.sub(link, line)
    return "\n".join(lines)


class PublicNameLinks(griffe.Extension):
    """Make each backticked `eqopt.…` name in a docstring a cross-reference."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name == "eqopt":
            self._visit(pkg, rendered_names(), set())

    def _visit(self, obj: Any, rendered: frozenset[str], seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = link_names(obj.docstring.value, rendered)
        for member in list(obj.members.values()):
            if not member.is_alias:
                self._visit(member, rendered, seen)
