"""Finding, reading and replacing named parts of optimiser states."""

import warnings
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import equinox as eqx
import jax
from jaxtyping import PyTree

from .._optax_tuple import OptaxTuple, not_stored, optax_aliases
from .._quantize import dequantize_all
from .._typecheck import checked
from ._keys import NamedTupleKey
from ._paths import KeyPath, children, is_none, path_str

Filtering = Callable[[KeyPath, Any], bool]


def _is_named_node(node: Any) -> bool:
    return isinstance(node, eqx.Module) or (
        isinstance(node, tuple) and hasattr(node, "_fields")
    )


def _key_name(key: Any) -> Any:
    if isinstance(key, jax.tree_util.DictKey):
        return key.key
    if isinstance(key, jax.tree_util.GetAttrKey):
        return key.name
    return _NO_NAME


class _NoName:
    """Marks a key (a sequence index) that never matches a name."""


_NO_NAME = _NoName()


def _walk(
    node: Any,
    path: KeyPath,
    names: tuple[Any, ...],
    optax_keys: bool = False,
    shown: KeyPath = (),
):
    """Yields `(path, node, names, shown)` for every node, parents first.

    `names` are the names a node is stored under: its field name or dict key,
    and Optax's names for that field of its parent's class (`count_m2` for
    AdEMAMix's `count`), so Optax's field names find eqopt's fields. `shown` is
    the path as Optax spells it when `optax_keys` (`NamedTupleKey` for the field
    of a state with Optax's tuple protocol, or of a NamedTuple), else `path`.
    """
    yield path, node, names, shown if optax_keys else path
    level = children(node)
    if level is None:
        return
    aliases = optax_aliases(type(node))
    for key, child in level[0]:
        name = _key_name(key)
        child_names = () if isinstance(name, _NoName) else (name,)
        child_names += tuple(alias for alias, field in aliases.items() if field == name)
        yield from _walk(
            child,
            (*path, key),
            child_names,
            optax_keys,
            (*shown, _optax_key(node, key)) if optax_keys else (),
        )


def _optax_key(parent: Any, key: Any) -> Any:
    """The key Optax's paths have for `parent`'s child at `key`.

    Optax's states are NamedTuples, whose fields its paths name with a
    `NamedTupleKey` (class name and field); eqopt's state Modules with the same
    tuple protocol get one too. Every other key is JAX's.
    """
    is_tuple_state = isinstance(parent, OptaxTuple) or (
        isinstance(parent, tuple) and hasattr(parent, "_fields")
    )
    if is_tuple_state and isinstance(key, jax.tree_util.GetAttrKey):
        return NamedTupleKey(type(parent).__name__, key.name)
    return key


def _matches(key: Any, node: Any, names: tuple[Any, ...]) -> bool:
    if any(_safe_equal(name, key) for name in names):
        return True
    return _is_named_node(node) and type(node).__name__ == key


def _names_in(tree: Any) -> list[str]:
    """Every field name and string dict key of a pytree, sorted."""
    found = {
        name
        for _, _, names, _ in _walk(tree, (), ())
        for name in names
        if isinstance(name, str)
    }
    return sorted(found)


def _not_stored_note(tree: Any, key: Any) -> str | None:
    """Why eqopt keeps no value under Optax's field name `key`, if it is one."""
    for _, node, _, _ in _walk(tree, (), ()):
        reason = not_stored(type(node)).get(key) if isinstance(key, str) else None
        if reason is not None:
            return (
                f"{type(node).__name__} has no field {key!r} ({reason}); the "
                f"names in the tree are {_names_in(tree)}."
            )
    return None


def _safe_equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # e.g. comparing an array-valued key
        return False


@checked
def get_all_with_path(
    tree: PyTree, key: Any, filtering: Filtering | None = None
) -> list[tuple[KeyPath, Any]]:
    """Finds every value of a pytree stored under a given field name or key.

    A node matches when it is stored under `key` (the name of a field of an
    `eqx.Module` or NamedTuple, or a dict key, or Optax's name for that field
    where eqopt's state names it otherwise, such as AdEMAMix's `count_m2`), or
    when it is an `eqx.Module` or NamedTuple whose class is named `key`. The search goes through every level,
    so it finds e.g. the `learning_rate` in the `hyperparams` dict of an
    injected-hyperparameters state, or the `mu` of an Adam state inside a chain.

    **Arguments:**

    - `tree`: the pytree to search, typically an optimiser state (or an optimiser:
      its hyperparameters are fields too).
    - `key`: the field name, dict key or class name to look for.
    - `filtering`: an optional predicate `filtering(path, value) -> bool` to keep
      only some matches; `path` is a tuple of JAX key entries
      (`jax.tree_util.GetAttrKey`, `DictKey`, `SequenceKey`...), printable with
      `jax.tree_util.keystr`.

    **Returns:** a list of `(path, value)`, parents before their children, in
    leaf order.

    !!! example

        ```python
        state = eqopt.chain(eqopt.clip(1.0), eqopt.scale_by_adam()).init(model)
        found = eqopt.tree.get_all_with_path(state, "count")
        [(jax.tree_util.keystr(path), value) for path, value in found]
        ```
    """
    return [(path, node) for path, _, node in find(tree, key, filtering)]


def find(
    tree: Any, key: Any, filtering: Filtering | None, optax_keys: bool = False
) -> list[tuple[KeyPath, KeyPath, Any]]:
    """`(path, shown path, value)` of every match (see `get_all_with_path`).

    `filtering` sees the shown path: JAX's keys, or Optax's with `optax_keys`.
    """
    return [
        (path, shown, node)
        for path, node, names, shown in _walk(tree, (), (), optax_keys)
        if _matches(key, node, names) and (filtering is None or filtering(shown, node))
    ]


@checked
def get(
    tree: PyTree, key: Any, default: Any = None, filtering: Filtering | None = None
) -> Any:
    """Reads the one value of a pytree stored under a given field name or key.

    Matching is as for `eqopt.tree.get_all_with_path`.

    **Arguments:**

    - `tree`: the pytree to search, typically an optimiser state.
    - `key`: the field name, dict key or class name to look for.
    - `default`: returned when nothing matches (`None` by default, as in Optax).
    - `filtering`: an optional predicate `filtering(path, value) -> bool` to choose
      among several matches.

    **Returns:** the matching value; a quantised moment
    (`eqopt.QuantizedArray`) in it comes back dequantised, as an array.

    **Raises:** `KeyError` naming the paths found if several values match, or
    if `key` is a field of Optax's state that eqopt's state does not keep
    (`ns_coeffs` of Muon's), with the reason and the names the tree has.

    !!! example

        ```python
        opt = eqopt.inject_hyperparams(eqopt.adam)(learning_rate=1e-3)
        state = opt.init(model)
        lr = eqopt.tree.get(state, "learning_rate")   # from an injected state
        mu = eqopt.tree.get(state, "mu")              # the Adam moment inside a chain
        ```
    """
    return get_one(tree, key, default, filtering)


def get_one(
    tree: Any,
    key: Any,
    default: Any = None,
    filtering: Filtering | None = None,
    optax_keys: bool = False,
) -> Any:
    """`get`, with `filtering` seeing Optax's paths when `optax_keys`."""
    found = find(tree, key, filtering, optax_keys)
    if len(found) == 1:
        return dequantize_all(found[0][2])
    if not found:
        note = _not_stored_note(tree, key)
        if note is not None:
            raise KeyError(f"get: {note}")
        return default
    paths = ", ".join(path_str(path) for path, _, _ in found)
    raise KeyError(
        f"get: found {len(found)} values under {key!r}"
        + _filter_note(filtering)
        + f", at {paths}. Pass `filtering=lambda path, value: ...` to choose one."
    )


def _filter_note(filtering: Filtering | None) -> str:
    return "" if filtering is None else " that pass `filtering`"


def _replace(node: Any, path: KeyPath, replacements: dict[KeyPath, Any]) -> Any:
    if path in replacements:
        return replacements[path]
    if not any(p[: len(path)] == path for p in replacements):
        return node
    level = children(node)
    if level is None:
        return node
    pairs, treedef = level
    return treedef.unflatten(
        [_replace(child, (*path, key), replacements) for key, child in pairs]
    )


@checked
def set(tree: PyTree, filtering: Filtering | None = None, /, **kwargs: Any) -> PyTree:
    """A copy of a pytree with the values under some field names or keys replaced.

    Matching is as for `eqopt.tree.get_all_with_path`; every match is
    replaced, and where matches are nested the outermost one is. The tree is
    rebuilt node by node, so frozen `eqx.Module` states work.

    **Arguments:**

    - `tree`: the pytree, typically an optimiser state.
    - `filtering`: an optional predicate `filtering(path, value) -> bool`; only
      matches passing it are replaced. Positional only.
    - `**kwargs`: `name=new_value` for each field name or key to replace.

    **Returns:** the new pytree; `tree` itself is not modified.

    **Raises:** `KeyError` if some name matches nothing, listing the names the
    tree has.

    !!! example

        ```python
        state = eqopt.inject_hyperparams(eqopt.adam)(learning_rate=1e-3).init(model)
        state = eqopt.tree.set(state, learning_rate=jnp.asarray(1e-4))
        ```
    """
    return set_all(tree, filtering, kwargs)


def set_all(
    tree: Any,
    filtering: Filtering | None,
    values: dict[str, Any],
    optax_keys: bool = False,
) -> Any:
    """`set`, with `filtering` seeing Optax's paths when `optax_keys`."""
    replacements: dict[KeyPath, Any] = {}
    for key, value in values.items():
        found = find(tree, key, filtering, optax_keys)
        if not found:
            note = _not_stored_note(tree, key)
            raise KeyError(
                f"set: {note}"
                if note is not None
                else f"set: found no value under {key!r}"
                + _filter_note(filtering)
                + f"; the names in the tree are {_names_in(tree)}."
            )
        for path, _, _ in found:
            replacements[path] = value
    # Keep only the outermost of nested matches.
    outermost = {
        path: value
        for path, value in replacements.items()
        if not any(
            other != path and path[: len(other)] == other for other in replacements
        )
    }
    return _replace(tree, (), outermost)


# ---------------------------------------------------------------------------
# map_params
# ---------------------------------------------------------------------------


@runtime_checkable
class _Initable(Protocol):
    def init(self, params: Any) -> Any: ...


class _ParamsPlaceholder:
    """Stands for the whole params tree while an optimiser's state is built.

    A pytree node with no children: a transform's `init` maps over it as over
    an empty tree and returns it unchanged, so it marks in the state every place
    that holds a tree shaped like the params.
    """


jax.tree_util.register_pytree_node(
    _ParamsPlaceholder, lambda _: ((), None), lambda _, __: _ParamsPlaceholder()
)


def _is_placeholder(x: Any) -> bool:
    return isinstance(x, _ParamsPlaceholder)


@checked
def map_params(
    initable: _Initable | Callable[[PyTree], PyTree],
    f: Callable[..., Any],
    state: PyTree,
    /,
    *rest: PyTree,
    transform_non_params: Callable[..., Any] | None = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> PyTree:
    """Maps a function over the parts of an optimiser state shaped like the params.

    The params-shaped parts (the `mu` and `nu` of Adam, a momentum trace...) are
    found as Optax finds them: `initable` is initialised on a placeholder that
    stands for the whole params tree, and wherever the placeholder shows up in
    the state it builds, the corresponding subtree of `state` is params-shaped.
    If that cannot be done (an `init` that inspects the params, such as a mask
    or a partition, rejects the placeholder) and `rest` is given, the parts are
    found by structure instead: every subtree of `state` with the tree structure
    of `rest[0]` (counting `None` as a leaf, so eqopt's moments with `None` at
    non-trainable leaves match the whole model).

    `f` is mapped over the leaves of each params-shaped part together with the
    matching leaves of `rest`. Typical use: derive sharding specs for an
    optimiser state from those of the params.

    **Arguments:**

    - `initable`: an optimiser (anything with an `init(params)` method) or an init
      function.
    - `f`: called as `f(leaf, *rest_leaves)` on each leaf of each params-shaped
      part of `state`. `None` leaves (eqopt's marker of a non-trainable
      parameter) stay `None` and `f` is not called there.
    - `state`: the optimiser state, as `initable.init(params)` returned it.
    - `*rest`: pytrees shaped like the params, whose leaves are passed to `f`.
    - `transform_non_params`: applied to every other leaf of `state` (step counts,
      hyperparameters...); by default those are left unchanged.
    - `is_leaf`: passed to `jax.tree.map` over the params-shaped parts, to stop at
      subtrees that are not to be descended into.

    **Returns:** a pytree shaped like `state`.

    **Raises:** `ValueError` if the params-shaped parts cannot be found.

    !!! example

        ```python
        opt = eqopt.adam(1e-3)
        state = opt.init(model)
        param_specs = jax.tree.map(lambda _: "replicated", model)  # e.g. PartitionSpecs
        specs = eqopt.tree.map_params(opt, lambda _, spec: spec, state, param_specs,
                                      transform_non_params=lambda _: None)
        ```
    """

    def none_or_leaf(x: Any) -> bool:
        return x is None or (is_leaf is not None and is_leaf(x))

    def map_part(value: Any) -> Any:
        return jax.tree.map(
            lambda leaf, *others: None if leaf is None else f(leaf, *others),
            value,
            *rest,
            is_leaf=none_or_leaf,
        )

    def map_other(value: Any) -> Any:
        return value if transform_non_params is None else transform_non_params(value)

    problem = _find_by_placeholder(initable, state)
    if not isinstance(problem, str):
        marked = problem
        return jax.tree.map(
            lambda marker, value: (
                map_part(value) if _is_placeholder(marker) else map_other(value)
            ),
            marked,
            state,
            is_leaf=_is_placeholder,
        )
    if not rest:
        raise ValueError(
            f"map_params: cannot find the params-shaped parts of `state`: {problem} "
            "Pass a pytree shaped like the params in `*rest` to find them by structure."
        )
    reference = jax.tree_util.tree_structure(rest[0], is_leaf=is_none)
    if reference.num_nodes == 1:
        raise ValueError(
            f"map_params: cannot find the params-shaped parts of `state`: {problem} "
            "Finding them by structure is ambiguous when the params are a single array."
        )

    def by_structure(node: Any) -> Any:
        if node is None:
            return None
        if jax.tree_util.tree_structure(node, is_leaf=is_none) == reference:
            return map_part(node)
        level = children(node)
        if level is None:
            return map_other(node)
        pairs, treedef = level
        return treedef.unflatten([by_structure(child) for _, child in pairs])

    return by_structure(state)


def _find_by_placeholder(initable: Any, state: Any) -> Any:
    """The state `initable` builds on a params placeholder, or why it cannot be used."""
    placeholder = _ParamsPlaceholder()
    try:
        # A placeholder holds no trainable leaf, so a mask selects none of it:
        # that warning is about the placeholder, not about the user's mask.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The .* selects no trainable leaf")
            if isinstance(initable, _Initable):
                marked = initable.init(placeholder)
            else:
                marked = initable(placeholder)
    except Exception as error:  # an init that inspects the params
        return (
            f"initialising on a placeholder failed ({type(error).__name__}: {error})."
        )
    found = _first_prefix_difference(marked, state)
    if found is not None:
        return (
            "the state built on a placeholder differs from `state` at "
            f"{path_str(found)}."
        )
    return marked


def _first_prefix_difference(
    marked: Any, state: Any, path: KeyPath = ()
) -> KeyPath | None:
    if _is_placeholder(marked):
        return None
    marked_level, state_level = children(marked), children(state)
    if marked_level is None:
        return None if state_level is None else path
    if state_level is None or marked_level[1] != state_level[1]:
        return path
    for (key, m), (_, s) in zip(marked_level[0], state_level[0], strict=True):
        found = _first_prefix_difference(m, s, (*path, key))
        if found is not None:
            return found
    return None
