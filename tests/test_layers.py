"""The layers of eqopt: every module imports only its own layer and the layers below.

The table below is the one in docs/development.md ("Layers"), which a test here
keeps in step. Imports are read from the source (as `test_eqopt_never_imports_optax`
does), wherever they are written, with two exceptions that never run while a
module is imported: an `if TYPE_CHECKING:` block, and the PEP 562 `__getattr__`
of a package's `__init__.py` (a namespace may name a higher layer's object and
load it on first use, as `eqopt` and `eqopt.schedules` do).

Importing `a.b.c` runs the package `a.b` first, so a module that imports from a
package it is not inside depends on that package's `__init__.py` too; that is how
`eqopt.schedules` once imported `_wrappers.inject`, which imported
`eqopt.schedules._stateful`, and `import eqopt; eqopt.inject_hyperparams` failed.
"""

import ast
import fnmatch
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "eqopt"

# (name, what lives there, module patterns), lowest first. A module matches the
# first pattern that names it; `fnmatch` patterns, so `eqopt.contrib.*` takes any
# new module of `eqopt/contrib/`.
LAYERS: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "foundation",
        "what every module uses: leaves and paths, hyperparameter converters, "
        "the export table, type checking, path checks, numerics, sharding helpers, "
        "quantised moments, packing",
        (
            "eqopt",
            "eqopt._exports",
            "eqopt._backend",
            "eqopt._typecheck",
            "eqopt._leaves",
            "eqopt._layer_axes",
            "eqopt._checks",
            "eqopt._signatures",
            "eqopt._deprecation",
            "eqopt._quantize",
            "eqopt._quantize.*",
            "eqopt._structure",
            "eqopt._hyper",
            "eqopt._defaults",
            "eqopt._sharding",
            "eqopt._numerics",
            "eqopt._fused",
            "eqopt._fused._pack",
            "eqopt._fused._split",
            "eqopt._leaf_scales",
            "eqopt._optax_tuple",
        ),
    ),
    (
        "maths",
        "pytree maths and the namespaces that need no transform",
        (
            "eqopt.tree",
            "eqopt.tree.*",
            "eqopt.tree_utils",
            "eqopt.tree_utils.*",
            "eqopt._linalg",
            "eqopt.losses",
            "eqopt.losses.*",
            "eqopt.projections",
            "eqopt.projections.*",
            "eqopt.second_order",
            "eqopt.second_order.*",
            "eqopt.monte_carlo",
            "eqopt.monte_carlo.*",
            "eqopt.perturbations",
            "eqopt.perturbations.*",
            "eqopt.assignment",
            "eqopt.assignment.*",
        ),
    ),
    (
        "protocol",
        "the transform protocol and the entry of its methods, per-leaf helpers, "
        "filters, chains and partitions, applying updates, interop, the bucketed engine",
        (
            "eqopt._base",
            "eqopt._entry",
            "eqopt._leafwise",
            "eqopt._filters",
            "eqopt._typing",
            "eqopt._apply",
            "eqopt._scheduled",
            "eqopt._combine",
            "eqopt._interop",
            "eqopt._train_state",
            "eqopt._fused._bucketed",
        ),
    ),
    ("schedules", "schedules", ("eqopt.schedules", "eqopt.schedules.*")),
    (
        "transforms",
        "one file per family of transforms, with its Optax-spelled factories and "
        "the aliases built from transforms only",
        ("eqopt._transform", "eqopt._transform.*"),
    ),
    (
        "wrappers",
        "transforms that wrap transforms, state-layout policies over any transform, "
        "parameter groups and the one description of an optimiser's hyperparameters",
        (
            "eqopt._wrappers",
            "eqopt._wrappers.*",
            "eqopt.microbatching",
            "eqopt.experimental",
            "eqopt.experimental.*",
            "eqopt.transforms",
            "eqopt._zero",
            "eqopt._zero_rule",
            "eqopt._zero_plan",
            "eqopt._groups",
            "eqopt._groups_resolve",
            "eqopt._param_groups",
            "eqopt._hyperparameters",
        ),
    ),
    (
        "optimisers",
        "optimisers that combine transforms and wrappers, `eqopt.contrib`, and "
        "reading an optimiser's current hyperparameters",
        (
            "eqopt._alias",
            "eqopt.contrib",
            "eqopt.contrib.*",
            "eqopt._current",
            "eqopt._groups_report",
        ),
    ),
]


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int | None:
    for index, (_, _, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, pattern) for pattern in patterns):
            return index
    return None


def _describe(index: int) -> str:
    return f"layer {index} '{LAYERS[index][0]}'"


def _is_type_checking(test: ast.expr) -> bool:
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", "")
    return name.lstrip("_") == "TYPE_CHECKING"


def _import_nodes(tree: ast.Module, is_package: bool) -> list[ast.stmt]:
    # Every import statement that can run while the module is imported or used.
    found: list[ast.stmt] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit(other, top)
                continue
            if (
                top
                and is_package
                and isinstance(child, ast.FunctionDef)
                and child.name == "__getattr__"
            ):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child, False)

    visit(tree, True)
    return found


def _dependencies(
    name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]
) -> dict[str, int]:
    """The eqopt modules (and packages) that importing or running `name` imports,
    with the line of the first import of each."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    targets: dict[str, int] = {}
    for node in _import_nodes(tree, is_package):
        if isinstance(node, ast.Import):
            imported = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from package import x` imports the module `package.x` if there is
            # one, and otherwise takes a name from the package's `__init__.py`.
            imported = [
                f"{module}.{alias.name}"
                if f"{module}.{alias.name}" in modules
                else module
                for alias in node.names
            ]
        for target in imported:
            if target.split(".")[0] != "eqopt":
                continue
            # The target and every package above it that is not above `name`
            # (those are already imported when `name` runs).
            parts = target.split(".")
            for end in range(len(parts), 0, -1):
                step = ".".join(parts[:end])
                if step == name or name.startswith(step + "."):
                    break
                targets.setdefault(step, node.lineno)
    return targets


def _graph() -> dict[str, dict[str, int]]:
    modules = _modules()
    return {name: _dependencies(name, path, modules) for name, path in modules.items()}


def test_every_module_is_in_a_layer():
    missing = [name for name in _modules() if layer_of(name) is None]
    assert not missing, (
        f"{', '.join(missing)} is in no layer: add it to LAYERS in "
        "tests/test_layers.py and to the table of docs/development.md ('Layers')"
    )


def test_no_module_imports_a_higher_layer():
    problems = []
    for name, targets in _graph().items():
        own = layer_of(name)
        if own is None:
            continue
        for target, line in targets.items():
            theirs = layer_of(target)
            if theirs is None or theirs <= own:
                continue
            allowed = ", ".join(LAYERS[i][0] for i in range(own + 1))
            problems.append(
                f"{name} ({_describe(own)}) imports {target} ({_describe(theirs)}) "
                f"at line {line}. A module in '{LAYERS[own][0]}' may import only the "
                f"layers {allowed}: move the shared code down to the lowest layer that "
                "uses it, or the module up (docs/development.md, 'Layers')."
            )
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    graph = _graph()
    # Tarjan's strongly connected components; a component of several modules is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_checker_sees_what_it_must(tmp_path):
    # The reading of imports, on a made-up module of `eqopt/_transform/`.
    source = tmp_path / "made_up.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from .._base import leafwise\n"  # a module
        "from . import adam\n"  # a sibling module
        "from ..schedules._base import AbstractSchedule\n"  # and its package
        "if TYPE_CHECKING:\n"
        "    from .._alias import sgd\n"  # never runs
        "def f():\n"
        "    from ..contrib import muon\n",  # runs when `f` does
        encoding="utf-8",
    )
    deps = _dependencies("eqopt._transform.made_up", source, _modules())
    assert set(deps) == {
        "eqopt._base",
        "eqopt._transform.adam",
        "eqopt.schedules._base",
        "eqopt.schedules",
        "eqopt.contrib",
    }
    assert layer_of("eqopt.contrib._new") == layer_of("eqopt.contrib")
    assert layer_of("eqopt._wrappers._new") == layer_of("eqopt._zero")
    assert layer_of("eqopt._new_module") is None


@pytest.mark.parametrize("index", range(len(LAYERS)))
def test_docs_show_the_layer_table(index):
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    name, _, patterns = LAYERS[index]
    row = re.search(rf"^\| {index} \| {name} \|.*$", text, flags=re.MULTILINE)
    assert row, f"docs/development.md has no row '| {index} | {name} |' in 'Layers'"
    documented = set(re.findall(r"`([^`]+)`", row.group(0)))
    assert set(patterns) <= documented, sorted(set(patterns) - documented)
