"""Optax's `tree_get`, `tree_set` and `tree_get_all_with_path`: paths with `NamedTupleKey`.

They find values as `eqopt.tree.get`, `set` and `get_all_with_path` do; the one
difference is the paths they give to `filtering` and return. Optax's states are
NamedTuples, and Optax's paths name a NamedTuple's field with a
`NamedTupleKey(class name, field)`; code written for Optax filters on it
(`path[-1].tuple_name == "ScaleByAdamState"`). Here the fields of eqopt's
states that have Optax's tuple protocol (and of NamedTuples) get the same key.
`eqopt.tree`'s functions give JAX's keys (`GetAttrKey`) instead.
"""

from typing import Any

from jaxtyping import PyTree

from .._typecheck import checked
from ..tree._paths import KeyPath
from ..tree._state import Filtering, find, get_one, set_all


@checked
def tree_get_all_with_path(
    tree: PyTree, key: Any, filtering: Filtering | None = None
) -> list[tuple[KeyPath, Any]]:
    """Finds every value of a pytree stored under a field name or key, with Optax's paths.

    Matching is as for `eqopt.tree.get_all_with_path`. In the paths, the field
    of a state with Optax's tuple protocol (or of a NamedTuple) is an
    `eqopt.tree_utils.NamedTupleKey` naming its class, as in Optax; every other
    step is JAX's key (`DictKey`, `SequenceKey`, `GetAttrKey`).

    **Arguments:**

    - `tree`: the pytree to search, typically an optimiser state.
    - `key`: the field name, dict key or class name to look for.
    - `filtering`: an optional predicate `filtering(path, value) -> bool` to keep
      only some matches; it sees the paths described above.

    **Returns:** a list of `(path, value)`, parents before their children, in
    leaf order.
    """
    return [(shown, node) for _, shown, node in find(tree, key, filtering, True)]


@checked
def tree_get(
    tree: PyTree, key: Any, default: Any = None, filtering: Filtering | None = None
) -> Any:
    """Reads the one value of a pytree stored under a field name or key, as Optax's does.

    As `eqopt.tree.get`, with `filtering` seeing the paths of
    `eqopt.tree_utils.tree_get_all_with_path` (a state's field is a
    `NamedTupleKey`).

    **Arguments:**

    - `tree`: the pytree to search, typically an optimiser state.
    - `key`: the field name, dict key or class name to look for.
    - `default`: returned when nothing matches.
    - `filtering`: an optional predicate `filtering(path, value) -> bool` to choose
      among several matches.

    **Returns:** the matching value (a quantised moment comes back dequantised).

    **Raises:** `KeyError` if several values match, or if `key` is a field of
    Optax's state that eqopt's state does not keep.
    """
    return get_one(tree, key, default, filtering, optax_keys=True)


@checked
def tree_set(
    tree: PyTree, filtering: Filtering | None = None, /, **kwargs: Any
) -> PyTree:
    """A copy of a pytree with the values under some field names or keys replaced, as Optax's.

    As `eqopt.tree.set`, with `filtering` seeing the paths of
    `eqopt.tree_utils.tree_get_all_with_path` (a state's field is a
    `NamedTupleKey`).

    **Arguments:**

    - `tree`: the pytree, typically an optimiser state.
    - `filtering`: an optional predicate `filtering(path, value) -> bool`; only
      matches passing it are replaced. Positional only.
    - `**kwargs`: `name=new_value` for each field name or key to replace.

    **Returns:** the new pytree.

    **Raises:** `KeyError` if some name matches nothing.
    """
    return set_all(tree, filtering, kwargs, optax_keys=True)
