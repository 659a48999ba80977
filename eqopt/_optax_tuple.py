"""Optax's view of eqopt's states: their fields in Optax's order, under Optax's names.

Optax's states are NamedTuples, and code written for Optax indexes and unpacks
them (`state[0]`, `count, mu, nu = state`, `fast, slow = params`,
`state._replace(count=...)`). eqopt's states are typed `eqx.Module`s read by
attribute; `OptaxTuple` gives them the same tuple protocol, in Optax's field
order, without changing what they are: their fields, pytree structure,
serialisation, printing and equality are the Module's.

The tables below say where eqopt's fields differ from Optax's (an Optax field
stored under another name, or not stored); `eqopt.tree.get` reads the same
tables, so `tree_get(state, "count_m2")` finds what Optax's name refers to.
"""

import dataclasses
import functools
from typing import Any

#: Optax's field order, for a state whose order or names differ from eqopt's
#: (state class name -> Optax's field names). Elsewhere the order is eqopt's,
#: which is Optax's.
OPTAX_ORDER: dict[str, tuple[str, ...]] = {
    "ScaleByAdemamixState": ("count", "count_m2", "m1", "m2", "nu"),
    "ScaleBySimplifiedAdEMAMixState": ("t", "m", "n"),
}

#: Optax's names of fields that eqopt keeps under another name
#: (state class name -> {Optax's name: eqopt's field}).
OPTAX_ALIASES: dict[str, dict[str, str]] = {
    # One step count serves both of AdEMAMix's schedules: Optax's two counts
    # always hold the same number.
    "ScaleByAdemamixState": {"count_m2": "count"},
    "ScaleBySimplifiedAdEMAMixState": {"t": "count"},
}

#: Fields of Optax's state that eqopt does not keep, with the reason
#: (state class name -> {Optax's name: why}). They are left out of the tuple.
NOT_STORED: dict[str, dict[str, str]] = {
    "MuonState": {
        "ns_coeffs": "the Newton-Schulz coefficients are the transform's field "
        "`ns_coeffs`, not state",
    },
    "MechanicState": {
        "x0": "eqopt keeps `delta`, the distance from the initial params, instead "
        "of the initial params",
    },
}


def optax_aliases(cls: type) -> dict[str, str]:
    """Optax's names of `cls`'s fields that eqopt names otherwise."""
    return OPTAX_ALIASES.get(cls.__name__, {})


def not_stored(cls: type) -> dict[str, str]:
    """Optax's fields of `cls` that eqopt does not keep, with the reason."""
    return NOT_STORED.get(cls.__name__, {})


@functools.cache
def optax_fields(cls: type) -> tuple[tuple[str, str], ...]:
    """`(Optax's name, eqopt's field)` of each element of `cls`'s tuple, in order.

    By default the Module's fields that hold data (static fields are part of
    the structure, not of Optax's tuple), under their own names.
    """
    order = OPTAX_ORDER.get(cls.__name__)
    if order is None:
        order = tuple(
            field.name
            for field in dataclasses.fields(cls)
            if not field.metadata.get("static", False)
        )
    aliases = optax_aliases(cls)
    missing = not_stored(cls)
    return tuple(
        (name, aliases.get(name, name)) for name in order if name not in missing
    )


class OptaxTuple:
    """The tuple protocol of Optax's NamedTuple states, for an eqopt state Module.

    A mixin of methods only (no fields, never instantiated alone), listed
    beside `eqx.Module` in a state's bases: `class ScaleByAdamState(eqx.Module,
    OptaxTuple)`. The state then indexes, slices, iterates, unpacks and has a
    `len` as Optax's tuple does, in Optax's field order, and has `_fields`,
    `_asdict()` and `_replace(**changes)` (which take Optax's field names).
    """

    __slots__ = ()

    def _values(self) -> tuple:
        return tuple(getattr(self, field) for _, field in optax_fields(type(self)))

    @property
    def _fields(self) -> tuple[str, ...]:
        return tuple(name for name, _ in optax_fields(type(self)))

    def __getitem__(self, index: int | slice) -> Any:
        return self._values()[index]

    def __iter__(self):
        return iter(self._values())

    def __len__(self) -> int:
        return len(optax_fields(type(self)))

    def _asdict(self) -> dict[str, Any]:
        return dict(zip(self._fields, self._values(), strict=True))

    def _replace(self, **changes: Any) -> Any:
        fields = dict(optax_fields(type(self)))
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise ValueError(
                f"{type(self).__name__}._replace: no field {unknown[0]!r}; the "
                f"fields are {tuple(fields)}."
            )
        return dataclasses.replace(
            self,  # pyright: ignore[reportArgumentType]
            **{fields[name]: value for name, value in changes.items()},
        )
