"""Every transform's docstring says its kind: element-wise, global or per layer.

The kind says what a layer stacked with `eqx.filter_vmap` gets: an element-wise
transform updates each entry from that entry alone, a global one reduces over
the whole tree (the stack's slices included), a per-layer one runs on each slice
of a stack as on the list of those layers. Combinators and wrappers have the
kind of what they wrap. Each class says exactly one, in the same words as the
others; a transform that declares itself `elementwise` is not documented as per
layer.
"""

import dataclasses
import importlib
import inspect
import pkgutil
import re

import equinox as eqx
import pytest
from helpers import make_model
from registry import ALL_CASES, build

import eqopt
from eqopt._base import AbstractGradientTransformation

ELEMENTWISE = (
    "**Element-wise**: each entry's update depends on that entry alone, so a layer "
    "stacked with `eqx.filter_vmap` is updated as the list of those layers."
)
PER_LAYER = (
    "**Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each "
    "slice, batched, as on the list of those layers."
)
PARTS = "**Kind of its parts**: element-wise, global or per layer as what it wraps is."
GLOBAL = re.compile(
    r"\*\*Global\*\*: one [\w -]+ over all the leaves, a stacked layer's slices "
    r"included\."
)
LABELS = {
    "element-wise": "**Element-wise**",
    "global": "**Global**",
    "per layer": "**Per layer**",
    "parts": "**Kind of its parts**",
}

#: Classes whose kind is set by an option: their docstring gives the default's kind
#: and names the option that makes them element-wise.
CONFIGURABLE = {"ScaleByMars": "`max_norm=None`", "Cautious": '`rescale="global"`'}


def _doc(cls: type) -> str:
    """The class's own docstring, its whitespace collapsed."""
    return " ".join((cls.__dict__.get("__doc__") or "").split())


def kind(cls: type) -> str:
    """The one kind `cls`'s docstring states, in the shared wording."""
    doc = _doc(cls)
    found = [name for name, label in LABELS.items() if label in doc]
    assert len(found) == 1, f"{cls.__name__}: states {found or 'no kind'}"
    (name,) = found
    if name == "global":
        assert GLOBAL.search(doc), f"{cls.__name__}: not the shared **Global** wording"
    else:
        sentence = {"element-wise": ELEMENTWISE, "per layer": PER_LAYER}.get(
            name, PARTS
        )
        assert sentence in doc, f"{cls.__name__}: not the shared {LABELS[name]} wording"
    return name


def transforms_in(tree, out: list) -> list:
    """Every transform inside `tree` (chains, wrappers and branches walked into)."""
    if isinstance(tree, AbstractGradientTransformation):
        out.append(tree)
    if isinstance(tree, eqx.Module):
        for field in dataclasses.fields(tree):
            transforms_in(getattr(tree, field.name, None), out)
    elif isinstance(tree, list | tuple):
        for item in tree:
            transforms_in(item, out)
    elif isinstance(tree, dict):
        for item in tree.values():
            transforms_in(item, out)
    return out


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.name)
def test_registry_transforms_state_their_kind(case):
    """Each transform a registry case builds (its parts included) states one kind,
    and one that declares itself elementwise is not documented as per layer."""
    transforms = transforms_in(build(case.make, make_model()), [])
    assert transforms, case.name
    for tx in transforms:
        cls = type(tx)
        name = kind(cls)
        if name == "per layer" and tx.elementwise:
            option = CONFIGURABLE.get(cls.__name__)
            assert option is not None, (
                f"{cls.__name__} declares elementwise=True but is documented per layer"
            )
            assert option in _doc(cls), f"{cls.__name__}: name {option}"


def _public_transform_classes() -> list[type]:
    for module in pkgutil.walk_packages(eqopt.__path__, "eqopt."):
        importlib.import_module(module.name)
    found, todo = [], [AbstractGradientTransformation]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            public = not sub.__name__.startswith("_")
            if (
                sub.__module__.startswith("eqopt")
                and public
                and not inspect.isabstract(sub)
            ):
                found.append(sub)
    return sorted(set(found), key=lambda c: (c.__module__, c.__name__))


def test_every_transform_class_states_its_kind():
    """Beyond the registry: every concrete transform class of eqopt states one kind."""
    classes = _public_transform_classes()
    assert len(classes) > 80
    kinds = {cls.__name__: kind(cls) for cls in classes}
    # A few anchors, one of each kind.
    assert kinds["ScaleByAdam"] == "element-wise"
    assert kinds["ClipByGlobalNorm"] == "global"
    assert kinds["ScaleByTrustRatio"] == "per layer"
    assert kinds["Chain"] == "parts"


def test_kind_rejects_two_kinds_and_none():
    """The check itself fails on a docstring with no kind or with two."""

    class NoKind:
        """Does something."""

    class TwoKinds:
        """Does something.

        **Element-wise**: each entry's update depends on that entry alone, so a layer
        stacked with `eqx.filter_vmap` is updated as the list of those layers.

        **Global**: one norm over all the leaves, a stacked layer's slices included.
        """

    for cls in (NoKind, TwoKinds):
        with pytest.raises(AssertionError, match="states"):
            kind(cls)
