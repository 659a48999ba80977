"""`NamedTupleKey`: Optax's key type for a field of a NamedTuple in a path."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class NamedTupleKey:
    """A step of a pytree path into a field of a NamedTuple, as Optax spells it.

    Optax's `tree_get_all_with_path` names a NamedTuple's field in a path with
    this key, so a `filtering(path, value)` function can tell apart the fields
    of two states by their class. `eqopt.tree_utils.tree_get_all_with_path`,
    `tree_get` and `tree_set` name the field of an eqopt state (or of a
    NamedTuple) with it too; `eqopt.tree`'s functions give JAX's own keys
    (`jax.tree_util.GetAttrKey`).

    **Arguments:**

    - `tuple_name`: the name of the NamedTuple's class, such as `"ScaleByAdamState"`.
    - `name`: the name of the field, such as `"mu"`.
    """

    tuple_name: str
    name: str

    def __str__(self) -> str:
        return f"{self.tuple_name}.{self.name}"
