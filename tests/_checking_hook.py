"""The test suite's type checking of eqopt's private helpers (never in a user's process).

In a user's process eqopt checks its public boundary only: the decorators
`@checked`, `@init_entry` and `@update_entry` where each public function,
class and transform method is defined (`eqopt/_typecheck.py`,
`eqopt/_entry.py`). The tests check every other annotated function and class
of the package too: `conftest.py` installs this import hook before importing
eqopt, and it adds the same check (`eqopt._typecheck.checked_function` /
`checked_class`) to every function and class of `eqopt.*` that is not already
decorated, marked `@typing.no_type_check`, or an unannotated closure.
"""

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from eqopt._typecheck import checked_class, checked_function

_ALIAS = "_eqopt_hook_"


def check_function(fn: Callable) -> Callable:
    """`checked_function`, for a private helper: on every call (a helper is
    called inside a running eqopt call, whose own checks pass it by)."""
    return checked_function(fn, always=True)


def check_class(cls: type) -> type:
    """`checked_class`, for a private class: on every construction."""
    return checked_class(cls, always=True)


_VISIBLE = ("checked", "init_entry", "update_entry")


def _is_visible_check(decorator: ast.expr) -> bool:
    # Already checked by the package's own decorators.
    if isinstance(decorator, ast.Name):
        return decorator.id in _VISIBLE
    return isinstance(decorator, ast.Attribute) and decorator.attr in _VISIBLE


def _is_no_type_check(decorator: ast.expr) -> bool:
    if isinstance(decorator, ast.Call):
        decorator = decorator.func
    if isinstance(decorator, ast.Name):
        return decorator.id == "no_type_check"
    if isinstance(decorator, ast.Attribute):
        return decorator.attr == "no_type_check"
    return False


def _is_preamble(statement: ast.stmt) -> bool:
    """A module docstring or a `from __future__` import."""
    if isinstance(statement, ast.Expr):
        return isinstance(statement.value, ast.Constant)
    return isinstance(statement, ast.ImportFrom) and statement.module == "__future__"


def _decorator(name: str, node: ast.AST) -> ast.expr:
    expression = ast.Attribute(
        value=ast.Name(id=_ALIAS, ctx=ast.Load()), attr=name, ctx=ast.Load()
    )
    return ast.copy_location(expression, node)


def _annotated(node: Any) -> bool:
    """Whether a function definition annotates any argument or its return."""
    arguments = node.args
    every = [
        *arguments.posonlyargs,
        *arguments.args,
        *arguments.kwonlyargs,
        *(a for a in (arguments.vararg, arguments.kwarg) if a is not None),
    ]
    return node.returns is not None or any(a.annotation is not None for a in every)


class _AddChecks(ast.NodeTransformer):
    """Adds `check_class` (outermost) to classes and `check_function` (innermost) to functions.

    Innermost for functions, so that decorators such as `jax.custom_jvp` or
    `property` wrap the checked function and keep their own behaviour. Nothing
    inside a `@no_type_check` class or function is decorated.
    """

    def visit_Module(self, node: ast.Module) -> ast.Module:
        # After the docstring and `from __future__` imports.
        position = next(
            (index for index, child in enumerate(node.body) if not _is_preamble(child)),
            len(node.body),
        )
        # `import _checking_hook as _eqopt_hook_` (already imported: a lookup).
        import_hook = ast.Import(names=[ast.alias(name=__name__, asname=_ALIAS)])
        node.body.insert(position, import_hook)
        self.generic_visit(node)
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        if any(_is_no_type_check(d) for d in node.decorator_list):
            return node
        if not any(_is_visible_check(d) for d in node.decorator_list):
            node.decorator_list.insert(0, _decorator("check_class", node))
        self.generic_visit(node)
        return node

    _depth = 0  # how many functions enclose the node being visited

    def _visit_function(self, node: Any) -> Any:
        if any(_is_no_type_check(d) for d in node.decorator_list):
            return node
        # A closure without annotations has nothing to check, and a user never
        # calls it: its wrapper would only cost time, at every call (once per
        # leaf at trace time for the per-leaf helpers of `update`).
        visible = any(_is_visible_check(d) for d in node.decorator_list)
        if not visible and not (self._depth and not _annotated(node)):
            node.decorator_list.append(_decorator("check_function", node))
        self._depth += 1
        try:
            self.generic_visit(node)
        finally:
            self._depth -= 1
        return node

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function


class _CheckingLoader(importlib.machinery.SourceFileLoader):
    """Loads a module of eqopt with the checks added (no bytecode is cached)."""

    def source_to_code(self, data, path, *, _optimize=-1):  # pyright: ignore
        source = data if isinstance(data, str) else importlib.util.decode_source(data)  # pyright: ignore
        tree = ast.parse(source, filename=path)
        tree = ast.fix_missing_locations(_AddChecks().visit(tree))
        return compile(tree, path, "exec", dont_inherit=True, optimize=_optimize)

    def get_code(self, fullname):  # pyright: ignore
        source_path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(source_path), source_path)


class _CheckingFinder(importlib.abc.MetaPathFinder):
    """Finds the submodules of eqopt and gives them the checking loader."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("eqopt.") or fullname in _UNCHECKED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or not isinstance(
            spec.loader, importlib.machinery.SourceFileLoader
        ):
            return None
        spec.loader = _CheckingLoader(spec.loader.name, spec.loader.path)
        return spec


# Imported before the hook (they implement it).
_UNCHECKED = frozenset({"eqopt", "eqopt._typecheck"})


def install() -> None:
    """Installs the hook once (it only touches modules named `eqopt.*`), before eqopt is imported."""
    if any(n.startswith("eqopt.") and n not in _UNCHECKED for n in sys.modules):
        raise RuntimeError("install the checking hook before importing eqopt's modules")
    if not any(isinstance(finder, _CheckingFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _CheckingFinder())
