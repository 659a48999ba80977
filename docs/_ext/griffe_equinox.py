"""A griffe extension that gives Equinox Modules their constructor signatures.

An `eqx.Module` gets its `__init__` from its dataclass fields when Python runs it,
so static analysis sees none, and the API pages would show `ScaleByAdam` with no
arguments. For every eqopt class that is an `eqx.Module` without an `__init__` of
its own, this extension builds one:

- names, order, kinds and defaults from the runtime signature (the truth, with
  inherited fields and keyword-only fields as Python sees them);
- annotations from the source, as written: a field declared with
  `eqx.field(converter=f)` shows the annotation of `f`'s argument (what the
  constructor accepts, e.g. `ScalarLike`), any other field its own annotation.

A state Module (a Module whose name ends in `State` and is not a transform) also
gets a **Fields:** list, unless its docstring already names every field.

Used by `mkdocs.yml` (`extensions:` of the mkdocstrings Python handler).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any

import griffe


def _runtime_object(path: str) -> Any:
    module_path, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_path), name)
    except Exception:  # noqa: BLE001  (documentation must build regardless)
        return None


def _static_attribute(cls: griffe.Class, name: str) -> griffe.Attribute | None:
    try:
        chain = [cls, *cls.mro()]
    except ValueError:
        chain = [cls]
    for klass in chain:
        member = klass.members.get(name)
        if isinstance(member, griffe.Attribute):
            return member
    return None


def _field_call_arguments(attribute: griffe.Attribute) -> dict[str, Any] | None:
    value = attribute.value
    if isinstance(value, griffe.ExprCall) and value.canonical_path in (
        "equinox.field",
        "dataclasses.field",
    ):
        return {
            argument.name: argument.value
            for argument in value.arguments
            if isinstance(argument, griffe.ExprKeyword)
        }
    return None


def _converter_annotation(converter: Any, collection: Any) -> Any:
    if not isinstance(converter, griffe.Expr):
        return None
    try:
        function = collection[converter.canonical_path]
    except Exception:  # noqa: BLE001  (not ours, e.g. jnp.asarray)
        return None
    if isinstance(function, griffe.Alias):
        function = function.final_target
    if isinstance(function, griffe.Function) and len(function.parameters) > 0:
        return function.parameters[0].annotation
    return None


_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: griffe.ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: griffe.ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: griffe.ParameterKind.var_keyword,
}


def _default_repr(value: Any) -> str:
    if isinstance(value, type):
        return f"{value.__module__.replace('jax.numpy', 'jnp')}.{value.__qualname__}"
    return repr(value)


def _parameters(cls: griffe.Class, runtime: type, collection: Any) -> list:
    parameters = [
        griffe.Parameter(
            "self", kind=griffe.ParameterKind.positional_or_keyword, annotation=None
        )
    ]
    for parameter in inspect.signature(runtime).parameters.values():
        annotation: Any = None
        default: Any = None
        attribute = _static_attribute(cls, parameter.name)
        if attribute is not None:
            annotation = attribute.annotation
            field = _field_call_arguments(attribute)
            if field is not None:
                annotation = (
                    _converter_annotation(field.get("converter"), collection)
                    or annotation
                )
                default = field.get("default")
                if "default_factory" in field:
                    default = f"{field['default_factory']}()"
            elif attribute.value is not None:
                default = attribute.value
        if parameter.default is not inspect.Parameter.empty and default is None:
            default = _default_repr(parameter.default)
        if parameter.default is inspect.Parameter.empty:
            default = None
        parameters.append(
            griffe.Parameter(
                parameter.name,
                annotation=annotation,
                kind=_KINDS[parameter.kind],
                default=default,
            )
        )
    return parameters


def _fields_section(cls: griffe.Class, runtime: type) -> str | None:
    fields = [f for f in dataclasses.fields(runtime) if f.init]
    docstring = cls.docstring.value if cls.docstring else ""
    if not fields or all(f"`{f.name}`" in docstring for f in fields):
        return None
    lines = ["**Fields:**", ""]
    for field in fields:
        attribute = _static_attribute(cls, field.name)
        annotation = attribute.annotation if attribute is not None else None
        suffix = f": `{annotation}`" if annotation is not None else ""
        lines.append(f"- `{field.name}`{suffix}")
    return "\n".join(lines)


class EquinoxModules(griffe.Extension):
    """Synthesise `__init__` (and a field list for states) for Equinox Modules."""

    def __init__(self) -> None:
        super().__init__()
        self._done: set[str] = set()

    def on_package(self, *, pkg: griffe.Module, loader: Any = None, **kwargs: Any):
        if pkg.name != "eqopt":
            return
        import equinox as eqx

        collection = loader.modules_collection if loader is not None else None
        transform_base = _runtime_object("eqopt._base.AbstractGradientTransformation")
        self._visit(pkg, eqx, transform_base, collection)

    def _visit(self, obj: Any, eqx: Any, transform_base: Any, collection: Any):
        for member in list(obj.members.values()):
            if member.is_alias:
                continue
            if isinstance(member, griffe.Module):
                self._visit(member, eqx, transform_base, collection)
            elif isinstance(member, griffe.Class):
                self._class(member, eqx, transform_base, collection)

    def _class(self, cls: griffe.Class, eqx: Any, transform_base: Any, collection):
        if cls.path in self._done:
            return
        self._done.add(cls.path)
        runtime = _runtime_object(cls.path)
        if not (isinstance(runtime, type) and issubclass(runtime, eqx.Module)):
            return
        if "__init__" not in cls.members and not inspect.isabstract(runtime):
            try:
                parameters = _parameters(cls, runtime, collection)
            except (TypeError, ValueError):
                parameters = None
            if parameters is not None:
                cls.set_member(
                    "__init__",
                    griffe.Function(
                        "__init__",
                        parent=cls,
                        parameters=griffe.Parameters(*parameters),
                        returns="None",
                    ),
                )
        is_transform = transform_base is not None and issubclass(
            runtime, transform_base
        )
        if cls.name.endswith("State") and not is_transform and cls.docstring:
            section = _fields_section(cls, runtime)
            if section is not None:
                cls.docstring.value = cls.docstring.value.rstrip() + "\n\n" + section
