"""Saying where and how two pytrees differ in structure."""

import dataclasses
from typing import Any, no_type_check

import equinox as eqx
import jax

from ._leaves import is_none


@no_type_check
def _is_leaf(x: Any) -> bool:
    return x is None or jax.tree_util.treedef_is_leaf(
        jax.tree.structure(x, is_leaf=is_none)
    )


@no_type_check
def _children(x: Any) -> list[tuple[Any, Any]]:
    # One level of `x`: (key, child) pairs, None children included.
    pairs, _ = jax.tree_util.tree_flatten_with_path(
        x, is_leaf=lambda y: y is not x or y is None
    )
    return [(path[0], child) for path, child in pairs]


def _key_str(key: Any) -> str:
    return jax.tree_util.keystr((key,))


def _describe(x: Any) -> str:
    if x is None:
        return "None"
    if eqx.is_array(x):
        return f"a {x.dtype}{list(x.shape)} array"
    if _is_leaf(x):
        return f"a leaf ({type(x).__name__})"
    return f"a {type(x).__name__}"


@no_type_check
def _static_difference(a: Any, b: Any) -> str | None:
    # Two Modules (or dataclasses) of one class whose static fields differ.
    if not dataclasses.is_dataclass(a):
        return None
    for field in dataclasses.fields(a):
        if not field.metadata.get("static", False):
            continue
        value_a, value_b = getattr(a, field.name, None), getattr(b, field.name, None)
        try:
            equal = bool(value_a == value_b)
        except Exception:  # arrays or other objects without a plain `==`
            equal = value_a is value_b
        if not equal:
            return f"`{field.name}={value_a!r}`", f"`{field.name}={value_b!r}`"
    return None


@no_type_check
def first_difference(
    tree: Any, reference: Any, path: str = "", *, prefix: bool = False
) -> tuple[str, str, str] | None:
    """The first place where two pytrees differ: `(path, what tree has, what reference has)`.

    `None` is a leaf. Two leaves never differ (their values are not compared).
    With `prefix`, `tree` need only be a prefix of `reference`: a leaf of `tree`
    matches any subtree of `reference` (a state holding a tuple per parameter).
    """
    found = _difference(tree, reference, path, prefix)
    return None if found is None else found[:3]


@no_type_check
def _difference(
    tree: Any, reference: Any, path: str, prefix: bool
) -> tuple[str, str, str, str | None] | None:
    # `first_difference`, and the class of the Module whose static field differs
    # (None where the difference is not a static field).
    where = path or "<root>"
    tree_leaf, reference_leaf = _is_leaf(tree), _is_leaf(reference)
    if tree_leaf and (reference_leaf or prefix):
        return None
    if tree_leaf != reference_leaf:
        return where, _describe(tree), _describe(reference), None
    if type(tree) is not type(reference):
        return where, _describe(tree), _describe(reference), None
    static = _static_difference(tree, reference)
    if static is not None:
        return where, *static, type(tree).__name__
    children = _children(tree)
    reference_children = _children(reference)
    keys = [key for key, _ in children]
    reference_keys = [key for key, _ in reference_children]
    if keys != reference_keys:
        missing = [k for k in reference_keys if k not in keys]
        extra = [k for k in keys if k not in reference_keys]
        if missing:
            return (
                path + _key_str(missing[0]),
                "nothing",
                _describe(dict(reference_children)[missing[0]]),
                None,
            )
        if extra:
            return (
                path + _key_str(extra[0]),
                _describe(dict(children)[extra[0]]),
                "nothing",
                None,
            )
        return (
            where,
            f"keys in the order {keys}",
            f"keys in the order {reference_keys}",
            None,
        )
    for (key, child), (_, reference_child) in zip(
        children, reference_children, strict=True
    ):
        found = _difference(child, reference_child, path + _key_str(key), prefix)
        if found is not None:
            return found
    treedef = jax.tree.structure(tree, is_leaf=is_none)
    reference_treedef = jax.tree.structure(reference, is_leaf=is_none)
    if treedef.node_data() != reference_treedef.node_data():
        return where, f"a {type(tree).__name__} with other metadata", "another", None
    return None


def _fix(name: str, reference_name: str) -> str:
    # The likely cause, in the terms of the call that raised.
    if reference_name.startswith("params"):
        return (
            " These look like the gradients of another model: take them with "
            f"`eqx.filter_grad` of the same model you pass as `{reference_name}` "
            "(`eqx.filter_grad(loss)(model, ...)`)."
        )
    if reference_name.startswith("state"):
        return (
            " The state was made by `init` for another model, or the gradients "
            "come from one: `init` the optimiser on the model you take the "
            "gradients of (`eqx.filter_grad(loss)(model, ...)`)."
        )
    return ""


def structure_mismatch_message(
    tree: Any, reference: Any, name: str, reference_name: str, *, prefix: bool = False
) -> str:
    """A message naming the first node at which two pytrees differ, how, and the likely fix.

    With `prefix`, `tree` need only be a prefix of `reference` (see `first_difference`).
    A static field (set when a Module is built, not a leaf) is named as such, with
    the Module's class and path.
    """
    fix = _fix(name, reference_name)
    found = _difference(tree, reference, "", prefix)
    if found is None:
        return f"The structure of `{name}` does not match `{reference_name}`.{fix}"
    where, got, expected, module = found
    if module is not None:
        # A static field of a Module: `got` and `expected` are `field=value`.
        at = "" if where == "<root>" else f"at {where}, "
        field = got.strip("`").partition("=")[0]
        return (
            f"The structure of `{name}` does not match `{reference_name}`: {at}"
            f"`{name}` has `{module}({got.strip('`')}, ...)` where `{reference_name}` "
            f"has `{module}({expected.strip('`')}, ...)`: `{field}` is fixed when the "
            f"`{module}` is built (a static field, not a leaf).{fix}"
        )
    return (
        f"The structure of `{name}` does not match `{reference_name}`: at {where}, "
        f"`{name}` has {got} where `{reference_name}` has {expected}.{fix}"
    )
