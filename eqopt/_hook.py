"""The import hook that type-checks eqopt, deferring each check's setup to first use.

Every function, method and class of the package (except those marked
`@typing.no_type_check`, and closures with no annotations, which have nothing
to check) is checked with `jaxtyping.jaxtyped(typechecker=...)`
and beartype (see `eqopt/_typecheck.py`), as jaxtyping's own
`install_import_hook` would do. The difference is *when* the checking wrapper is
built: jaxtyping's hook builds it for all of eqopt's ~2,000 functions while
`import eqopt` runs (over half of the import time); this hook decorates each
function with a thin wrapper that builds the `jaxtyped` wrapper on the
function's first call. Classes (dataclasses and Modules, whose fields are
checked after `__init__`) are decorated as they are defined, which is cheap.

The hook rewrites the source of `eqopt.*` modules (adding the decorators) and
caches the result beside the ordinary bytecode under its own tag, so the
rewriting happens once per source change. The tag is derived from this file's
own source and the optimisation level (`python -O` strips asserts), so a change
to the rewriting, or another `-O`, never loads stale bytecode. This module and `_typecheck` are
imported before the hook is installed, so they are not checked themselves.
"""

import ast
import dataclasses
import functools
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import marshal
import sys
from collections.abc import Callable
from typing import Any

import jaxtyping

from ._typecheck import call_error, typechecker


def _cache_tag() -> str:
    """The tag of the cached, rewritten bytecode: a digest of this file, which
    decides the rewriting, and the optimisation level it was compiled at."""
    try:
        with open(__file__, "rb") as file:
            source = file.read()
    except OSError:  # no source installed: the tag still changes with the code
        source = marshal.dumps(_AddChecks.visit_Module.__code__)
    digest = hashlib.sha256(source).hexdigest()[:16]
    # `cache_from_source` takes an alphanumeric tag.
    return f"eqoptcheck{digest}opt{sys.flags.optimize}"


_ALIAS = "_eqopt_hook_"


def check_function(fn: Callable) -> Callable:
    """`jaxtyped(typechecker=...)(fn)`, built on the first call."""
    checked: Callable | None = None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal checked
        if checked is None:
            checked = jaxtyping.jaxtyped(typechecker=typechecker)(fn)
        try:
            return checked(*args, **kwargs)
        except TypeError as error:
            better = call_error(fn, error, args, kwargs, fn.__name__)
            if better is None:
                raise
            raise better from None

    return wrapper


def _name_call_errors(cls: type) -> None:
    # `cls.__init__` is jaxtyping's wrapper: a call that does not bind gets
    # Python's wording, naming the class (see `call_error`).
    init = cls.__init__

    @functools.wraps(init)
    def named(self, *args, **kwargs):
        try:
            return init(self, *args, **kwargs)
        except TypeError as error:
            better = call_error(init, error, (self, *args), kwargs, cls.__name__)
            if better is None:
                raise
            raise better from None

    cls.__init__ = named  # pyright: ignore


def check_class(cls: type) -> type:
    """`jaxtyped(typechecker=...)(cls)`, applied at the first instantiation.

    For a dataclass (every Module) `jaxtyped` wraps `__init__` to check the
    fields once it has run. Until the first instance is made, a placeholder
    `__init__` stands in: it puts the class's own `__init__` back (or removes
    itself, when the class inherits its `__init__`), lets `jaxtyped` wrap it, and
    calls the result.
    """
    if not dataclasses.is_dataclass(cls):
        return jaxtyping.jaxtyped(typechecker=typechecker)(cls)
    own = cls.__dict__.get("__init__")

    @functools.wraps(own if own is not None else cls.__init__)
    def placeholder(self, *args, **kwargs):
        if cls.__dict__.get("__init__") is placeholder:
            if own is None:
                delattr(cls, "__init__")
            else:
                cls.__init__ = own  # pyright: ignore
            jaxtyping.jaxtyped(typechecker=typechecker)(cls)
            _name_call_errors(cls)
        return cls.__init__(self, *args, **kwargs)  # pyright: ignore

    cls.__init__ = placeholder  # pyright: ignore
    return cls


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
        # `import eqopt._hook as _eqopt_hook_` (already imported: costs a lookup).
        import_hook = ast.Import(names=[ast.alias(name="eqopt._hook", asname=_ALIAS)])
        node.body.insert(position, import_hook)
        self.generic_visit(node)
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        if any(_is_no_type_check(d) for d in node.decorator_list):
            return node
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
        if not (self._depth and not _annotated(node)):
            node.decorator_list.append(_decorator("check_function", node))
        self._depth += 1
        try:
            self.generic_visit(node)
        finally:
            self._depth -= 1
        return node

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function


_CACHE_TAG = _cache_tag()


class _CheckingLoader(importlib.machinery.SourceFileLoader):
    """Loads a module of eqopt with the checks added, caching the rewritten bytecode."""

    def source_to_code(self, data, path, *, _optimize=-1):  # pyright: ignore
        source = data if isinstance(data, str) else importlib.util.decode_source(data)  # pyright: ignore
        tree = ast.parse(source, filename=path)
        tree = ast.fix_missing_locations(_AddChecks().visit(tree))
        return compile(tree, path, "exec", dont_inherit=True, optimize=_optimize)

    def get_code(self, fullname):  # pyright: ignore
        source_path = self.get_filename(fullname)
        cache_path = importlib.util.cache_from_source(
            source_path, optimization=_CACHE_TAG
        )
        stats = self.path_stats(source_path)
        header = (
            importlib.util.MAGIC_NUMBER
            + (0).to_bytes(4, "little")
            + (int(stats["mtime"]) & 0xFFFFFFFF).to_bytes(4, "little")
            + (int(stats["size"]) & 0xFFFFFFFF).to_bytes(4, "little")
        )
        try:
            cached = self.get_data(cache_path)
        except OSError:
            cached = None
        if cached is not None and cached[:16] == header:
            return marshal.loads(cached[16:])
        code = self.source_to_code(self.get_data(source_path), source_path)
        if not sys.dont_write_bytecode:
            try:
                self.set_data(cache_path, header + marshal.dumps(code))
            except OSError:  # a read-only install: compile each time
                pass
        return code


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
_UNCHECKED = frozenset({"eqopt._hook", "eqopt._typecheck"})


def install() -> None:
    """Installs the hook once (it only touches modules named `eqopt.*`)."""
    if not any(isinstance(finder, _CheckingFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _CheckingFinder())
