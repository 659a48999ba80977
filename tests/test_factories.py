"""Every lowercase Optax-spelled factory builds its CamelCase class with the class's defaults.

A factory (`scale_by_adam`) and its class (`ScaleByAdam`) state their defaults
separately, so they can drift apart; `scale_by_adam()` must equal
`ScaleByAdam()`, and every argument that both give a default must have the same
one. The pairs are found from the public names: a factory returning the class
(its return annotation), or named as the class in snake case.
"""

import dataclasses
import inspect
import re

import equinox as eqx
import numpy as np
import pytest

import eqopt

NAMESPACES = ("", "schedules", "contrib", "monte_carlo", "perturbations", "projections")


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def _pairs():
    for namespace in NAMESPACES:
        module = getattr(eqopt, namespace) if namespace else eqopt
        public = {name: getattr(module, name) for name in dir(module) if name[0] != "_"}
        classes = {
            name: obj
            for name, obj in public.items()
            if inspect.isclass(obj) and dataclasses.is_dataclass(obj)
        }
        factories = {
            name: obj
            for name, obj in public.items()
            if inspect.isfunction(obj) and name[0].islower()
        }
        returns = [inspect.signature(f).return_annotation for f in factories.values()]
        for name, factory in factories.items():
            returned = inspect.signature(factory).return_annotation
            # A class that many optimisers return (`Chain`) is a container, not
            # their CamelCase form.
            found = [
                cls
                for cls in classes.values()
                if cls is returned and returns.count(cls) <= 3
            ]
            found += [cls for key, cls in classes.items() if _snake(key) == name]
            for cls in dict.fromkeys(found):
                label = f"{namespace}.{name}" if namespace else name
                yield pytest.param(factory, cls, id=f"{label}-{cls.__name__}")


PAIRS = list(_pairs())


def _class_default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _same(a, b) -> bool:
    if a is b:
        return True
    if type(a) is not type(b) and not (
        isinstance(a, (int, float)) and isinstance(b, (int, float))
    ):
        return False
    try:
        return bool(np.all(np.asarray(a == b)))
    except Exception:
        return bool(eqx.tree_equal(a, b))


def test_pairs_found():
    names = {param.id for param in PAIRS}
    assert len(PAIRS) > 120
    assert {
        "scale_by_adam-ScaleByAdam",
        "schedules.linear_schedule-LinearSchedule",
    } <= (names)


@pytest.mark.parametrize("factory, cls", PAIRS)
def test_factory_defaults_are_the_class_defaults(factory, cls):
    fields = {field.name: field for field in dataclasses.fields(cls)}
    different = []
    for parameter in inspect.signature(factory).parameters.values():
        field = fields.get(parameter.name)
        if field is None or parameter.default is inspect.Parameter.empty:
            continue
        default = _class_default(field)
        # The class may require what the factory defaults (`ScheduleFree` takes
        # a learning rate), and a factory's `None` may stand for the class's
        # default (`scale_by_galore(base_optimizer=None)` is Adam).
        if default is dataclasses.MISSING or parameter.default is None:
            continue
        if not _same(parameter.default, default):
            different.append(f"{parameter.name}: {parameter.default!r} != {default!r}")
    assert different == [], f"{factory.__name__} vs {cls.__name__}: {different}"


def _buildable_without_arguments(fn) -> bool:
    return all(
        p.default is not inspect.Parameter.empty
        or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in inspect.signature(fn).parameters.values()
    )


BUILT = [
    p
    for p in PAIRS
    if _buildable_without_arguments(p.values[0])
    and _buildable_without_arguments(p.values[1])
]


def test_some_pairs_build_without_arguments():
    assert len(BUILT) > 40


@pytest.mark.parametrize("factory, cls", BUILT)
def test_factory_with_no_arguments_is_the_class_with_none(factory, cls):
    built, default = factory(), cls()
    assert type(built) is cls
    assert eqx.tree_equal(built, default), (built, default)
