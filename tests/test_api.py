"""The public API's contract: Optax spellings, abstract-or-final classes, docstrings."""

import abc
import ast
import importlib
import inspect
import pkgutil

import equinox as eqx
import optax
import pytest

import eqopt
from eqopt._defaults import DefaultTransform

NAMESPACES = [
    "losses",
    "schedules",
    "tree",
    "tree_utils",
    "transforms",
    "projections",
    "second_order",
    "monte_carlo",
    "perturbations",
    "assignment",
    "contrib",
    "microbatching",
]


def _modules():
    modules = [("", eqopt)]
    for name in NAMESPACES:
        try:
            modules.append((name, importlib.import_module(f"eqopt.{name}")))
        except ModuleNotFoundError:
            pass
    return modules


def _public(module):
    return {
        name: getattr(module, name)
        for name in dir(module)
        if not name.startswith("_") and not inspect.ismodule(getattr(module, name))
    }


def _optax_counterpart(namespace, name):
    module = optax if not namespace else getattr(optax, namespace, None)
    return getattr(module, name, None) if module is not None else None


def _shared_functions():
    for namespace, module in _modules():
        for name, obj in _public(module).items():
            if not name[0].islower() or not callable(obj):
                continue
            reference = _optax_counterpart(namespace, name)
            if (
                reference is None
                or not callable(reference)
                or inspect.isclass(reference)
            ):
                continue
            yield pytest.param(obj, reference, id=f"{namespace or 'eqopt'}.{name}")


@pytest.mark.parametrize("ours,reference", list(_shared_functions()))
def test_signature_matches_optax(ours, reference):
    """Every Optax parameter exists with the same name, default and kind.

    eqopt may add keyword-only parameters of its own (with defaults).
    """
    try:
        theirs = inspect.signature(reference).parameters
    except (TypeError, ValueError):
        pytest.skip("Optax's object has no signature")
    mine = inspect.signature(ours).parameters
    for name, parameter in theirs.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        assert name in mine, f"missing parameter {name!r}"
        assert (
            mine[name].kind == parameter.kind
            or parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,)
            and mine[name].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        ), name
        if parameter.default is not inspect.Parameter.empty:
            assert _same_default(mine[name].default, parameter.default), (
                f"default of {name!r}: {mine[name].default!r} != {parameter.default!r}"
            )
    for name, parameter in mine.items():
        if name not in theirs:
            assert (
                parameter.kind
                in (
                    inspect.Parameter.KEYWORD_ONLY,
                    inspect.Parameter.VAR_KEYWORD,
                )
                or parameter.default is not inspect.Parameter.empty
            ), f"extra required {name!r}"


def _same_default(ours, theirs) -> bool:
    if ours is theirs:
        return True
    # A default transform (Sophia's Hutchinson estimator, lbfgs's line search): an
    # eqopt transform stands for Optax's `GradientTransformation(ExtraArgs)` pair.
    # eqopt writes it as a recipe, built when the function is called (no JAX work
    # at import time).
    if isinstance(ours, DefaultTransform):
        ours = ours.build()
    if isinstance(ours, eqopt.AbstractGradientTransformation):
        return type(theirs).__name__.startswith("GradientTransformation")
    simple = (type(None), bool, int, float, complex, str, tuple)
    if isinstance(theirs, simple) or isinstance(ours, simple):
        return (
            type(ours) is type(theirs)
            and ours == theirs
            or (
                isinstance(ours, (int, float))
                and isinstance(theirs, (int, float))
                and not isinstance(ours, bool)
                and ours == theirs
            )
        )
    # Objects (a default noise distribution, a sentinel): the same kind of object.
    return type(ours).__name__ == type(theirs).__name__


def _public_classes():
    seen = {}
    for _, module in _modules():
        for obj in _public(module).values():
            if inspect.isclass(obj) and obj.__module__.startswith("eqopt"):
                seen[id(obj)] = obj
    return list(seen.values())


def _all_eqopt_classes():
    classes = {}
    for info in pkgutil.walk_packages(eqopt.__path__, "eqopt."):
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if inspect.isclass(obj) and obj.__module__.startswith("eqopt"):
                classes[id(obj)] = obj
    return list(classes.values())


def test_classes_are_abstract_or_final():
    """Every Module class of eqopt, private ones included, is abstract or final.

    An abstract class is named `Abstract*` (or `_Abstract*`) and has an abstract
    method or an `eqx.AbstractVar`; any other class is never subclassed.
    """
    classes = _all_eqopt_classes()
    for cls in classes:
        if not issubclass(cls, eqx.Module):
            continue
        subclasses = [c for c in classes if c is not cls and issubclass(c, cls)]
        if cls.__name__.lstrip("_").startswith("Abstract"):
            assert getattr(cls, "__abstractmethods__", None) or _has_abstract_vars(
                cls
            ), f"{cls.__name__} is named Abstract but has nothing abstract"
            continue
        assert not getattr(cls, "__abstractmethods__", None), (
            f"{cls.__name__} has abstract methods but is not named Abstract"
        )
        assert not subclasses, (
            f"{cls.__name__} is concrete but subclassed by {subclasses}"
        )


def _has_abstract_vars(cls):
    return any(
        "AbstractVar" in str(annotation) or "AbstractClassVar" in str(annotation)
        for annotation in getattr(cls, "__annotations__", {}).values()
    )


def test_every_public_symbol_is_documented():
    undocumented = []
    for namespace, module in _modules():
        for name, obj in _public(module).items():
            if not (callable(obj) or inspect.isclass(obj)):
                continue
            # Type aliases (`Callable[...]`, `PyTree[...]`) are documented on the API pages.
            if getattr(obj, "__module__", "").startswith(
                ("typing", "jaxtyping", "collections.abc")
            ):
                continue
            doc = inspect.getdoc(obj)
            if not doc or doc == inspect.getdoc(eqx.Module):
                undocumented.append(f"{namespace or 'eqopt'}.{name}")
    assert not undocumented, f"undocumented: {undocumented}"


def test_eqopt_never_imports_optax():
    # Import statements anywhere in the code (module level or inside a
    # function); docstring examples may show `import optax`.
    for info in pkgutil.walk_packages(eqopt.__path__, "eqopt."):
        spec = importlib.util.find_spec(info.name)
        with open(spec.origin) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n.split(".")[0] == "optax" for n in names), (
                f"{info.name} line {node.lineno} imports optax"
            )


def test_protocol_is_abstract():
    assert (
        abc.ABC in eqopt.AbstractGradientTransformation.__mro__
        or inspect.isabstract(eqopt.AbstractGradientTransformation)
    )
    with pytest.raises(TypeError):
        eqopt.AbstractGradientTransformation()
