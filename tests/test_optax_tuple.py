"""Optax's tuple protocol on eqopt's typed states (`eqopt/_optax_tuple.py`).

Optax's states are NamedTuples that code indexes and unpacks; eqopt's are
typed Modules that do the same, in Optax's field order, and stay Modules:
the same pytree, serialisation, printing, equality and attribute access.
"""

import dataclasses
import importlib
import inspect
import io
import pkgutil

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import optax.contrib
import pytest
from helpers import make_model
from registry import ALL_CASES, build

import eqopt
from eqopt._optax_tuple import (
    NOT_STORED,
    OPTAX_ALIASES,
    OPTAX_ORDER,
    OptaxTuple,
    optax_fields,
)


def _state_classes() -> list[type]:
    found = {}
    for info in pkgutil.walk_packages(eqopt.__path__, "eqopt."):
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, OptaxTuple)
                and obj is not OptaxTuple
            ):
                found[obj.__qualname__, obj.__module__] = obj
    return list(found.values())


STATE_CLASSES = _state_classes()


def _optax_class(name: str):
    for module in (optax, optax.contrib, optax.transforms, optax.schedules):
        cls = getattr(module, name, None)
        if inspect.isclass(cls) and issubclass(cls, tuple):
            return cls
    return None


def test_every_state_class_has_the_protocol():
    names = {cls.__name__ for cls in STATE_CLASSES}
    assert len(STATE_CLASSES) > 70
    assert {"ScaleByAdamState", "EmptyState", "LookaheadParams", "MaskedNode"} <= names
    # The tables name existing classes and existing fields.
    for table in (OPTAX_ORDER, OPTAX_ALIASES, NOT_STORED):
        assert set(table) <= names
    for cls in STATE_CLASSES:
        fields = {f.name for f in dataclasses.fields(cls)}
        for alias, field in OPTAX_ALIASES.get(cls.__name__, {}).items():
            assert field in fields and alias not in fields, cls.__name__


# eqopt's RMS states always keep their count: their tuple is that of Optax's
# state with a count (Optax's `bias_correction=True`), on "Coming from Optax".
WITH_COUNT = {
    "ScaleByRmsState": "ScaleByRmsWithCountState",
    "ScaleByStddevState": "ScaleByRStdDevWithCountState",
}


@pytest.mark.parametrize("cls", STATE_CLASSES, ids=lambda c: c.__name__)
def test_fields_in_optax_order(cls):
    """Where Optax has a NamedTuple of the same name, the tuple has its fields in order.

    A field Optax keeps and eqopt does not (`NOT_STORED`) is left out, and a
    field eqopt keeps in its place (Mechanic's `delta` for `x0`) stands there.
    """
    reference = _optax_class(WITH_COUNT.get(cls.__name__, cls.__name__))
    ours = tuple(name for name, _ in optax_fields(cls))
    replaced = NOT_STORED.get(cls.__name__, {})
    if reference is not None and replaced:
        ours = tuple(name for name in ours if name in reference._fields)
    if reference is None:
        data = tuple(
            f.name for f in dataclasses.fields(cls) if not f.metadata.get("static")
        )
        assert ours == data
        return
    kept = tuple(
        f for f in reference._fields if f not in NOT_STORED.get(cls.__name__, {})
    )
    assert ours == kept


def test_index_unpack_len_replace():
    params = {"w": jnp.arange(3.0)}
    state = eqopt.scale_by_adam().init(params)
    count, mu, nu = state
    assert count is state.count and mu is state.mu and nu is state.nu
    assert len(state) == 3 and state[0] is state.count and state[-1] is state.nu
    assert state[1:] == (state.mu, state.nu)
    assert state._fields == ("count", "mu", "nu")
    assert list(state._asdict()) == ["count", "mu", "nu"]
    new = state._replace(count=jnp.asarray(7, jnp.int32))
    assert isinstance(new, eqopt.ScaleByAdamState) and int(new.count) == 7
    assert new.mu is state.mu
    with pytest.raises(ValueError, match="no field 'mo'"):
        state._replace(mo=1)
    # Optax's own code unpacks the same way.
    reference = optax.scale_by_adam().init(params)
    assert len(reference) == len(state)
    assert reference._fields == state._fields


def test_renamed_fields_follow_optax():
    state = eqopt.contrib.scale_by_ademamix().init({"w": jnp.ones(2)})
    count, count_m2, m1, m2, nu = state
    assert count is state.count and count_m2 is state.count
    assert m1 is state.m1 and nu is state.nu
    assert state._replace(count_m2=jnp.asarray(3, jnp.int32)).count == 3
    simplified = eqopt.contrib.scale_by_simplified_ademamix().init({"w": jnp.ones(2)})
    assert simplified._fields == ("t", "m", "n") and simplified[0] is simplified.count


def test_lookahead_params_unpack():
    params = eqopt.LookaheadParams.init_synced({"w": jnp.ones(2)})
    fast, slow = params
    assert fast is params.fast and slow is params.slow and len(params) == 2


def test_empty_state_is_an_empty_tuple():
    state = eqopt.EmptyState()
    assert len(state) == 0 and list(state) == [] and state._fields == ()
    with pytest.raises(IndexError):
        state[0]


def test_chain_state_keeps_its_own_protocol():
    state = eqopt.adam(1e-3).init({"w": jnp.ones(2)})
    adam_state, rate_state = state
    assert isinstance(adam_state, eqopt.ScaleByAdamState) and len(state) == 2
    assert state["scale_by_adam"] is adam_state
    count, mu, nu = state[0]
    assert mu is state.scale_by_adam.mu


@pytest.mark.parametrize("case", ALL_CASES[:40], ids=lambda c: c.name)
def test_a_state_is_still_the_same_module(case):
    """Structure, serialisation, printing and equality are the Module's."""
    model = make_model()
    state = build(case.make, model).init(model)
    leaves, treedef = jax.tree.flatten(state)
    assert jax.tree.structure(jax.tree.unflatten(treedef, leaves)) == treedef
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, state)
    buffer.seek(0)
    restored = eqx.tree_deserialise_leaves(buffer, state)
    assert jax.tree.structure(restored) == treedef
    assert type(state).__name__ in repr(state)
    for node in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, OptaxTuple)):
        if isinstance(node, OptaxTuple):
            values = tuple(
                getattr(node, field) for _, field in optax_fields(type(node))
            )
            assert len(tuple(node)) == len(node) == len(values)
            assert all(a is b for a, b in zip(tuple(node), values, strict=True))
