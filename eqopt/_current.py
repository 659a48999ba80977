"""Reading the hyperparameters an optimiser uses now: scheduled ones at the state's step."""

import collections
import dataclasses
from collections.abc import Hashable
from typing import Any, cast

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractGradientTransformation, OptState
from ._combine import Chain, Partition
from ._groups import DEFAULT
from ._hyper import check_hyperparameters, is_hyperparameter_field, weakly_typed
from ._param_groups import ParamGroups, ParamGroupsState
from ._scheduled import ScaleByScheduleState
from ._typecheck import checked
from ._wrappers.inject import InjectHyperparams, InjectStatefulHyperparams
from ._wrappers.offload import Offload


@checked
def current_hyperparams(
    transform: AbstractGradientTransformation, state: OptState
) -> dict[str, Array]:
    """The value of every numeric hyperparameter that the next `update` uses.

    A hyperparameter given as a number is read from the optimiser; one given as
    a schedule is evaluated at the step count kept in `state`; one injected with
    `eqopt.inject_hyperparams` is read from the state (where a user may have
    replaced it), its schedules evaluated at the state's count. This works for any
    optimiser, chain, partition or wrapper, inside `jit` too.

    A transform of your own keeps its schedules' step count in its state, as
    `eqopt.init_count_if_scheduled` makes it: in the field `count`, or in any one
    field of the state (an integer field `count` works too). A schedule whose
    state holds no such count, or several, raises a `TypeError` that says so.

    Keys. Every hyperparameter is under its full key: the names of the parts
    that lead to it and its own name, joined with dots
    (`"scale_by_adam.b1"` and `"scale_by_learning_rate.learning_rate"` for
    `eqopt.adamw`; `"matrices.scale_by_learning_rate.learning_rate"` in the
    branch `matrices` of a partition; the bare name for a transform that is
    not a combinator or wrapper). A full key depends only on the path to the
    hyperparameter, so adding a part elsewhere never renames it: log these.
    Where a name is used by one hyperparameter only, it is also under that
    name alone (`"learning_rate"`), a shortcut that disappears once another
    part with a hyperparameter of the same name is added.

    **Arguments:**

    - `transform`: the optimiser.
    - `state`: its state, as `init` or `update` returned it.

    **Returns:**

    A dict from name to a scalar array.

    !!! example

        ```python
        opt = eqopt.adamw(eqopt.cosine_decay_schedule(1e-3, 1000), weight_decay=1e-2)
        state = opt.init(model)
        ...
        eqopt.current_hyperparams(opt, state)["learning_rate"]  # after the steps taken
        ```
    """
    check_hyperparameters(transform)
    found: list[tuple[tuple[str, ...], Any]] = []
    _collect(transform, state, (), found)
    names = collections.Counter(path[-1] for path, _ in found)
    values: dict[str, Array] = {}
    for path, value in found:
        # As `update` sees them: weakly typed (also NumPy ones, from `eqopt.on_host`).
        values[".".join(path)] = weakly_typed(jnp.asarray(value))
        if names[path[-1]] == 1:
            values[path[-1]] = values[".".join(path)]
    return values


def _collect(transform: Any, state: Any, path: tuple[str, ...], found: list) -> None:
    if isinstance(transform, Chain):
        for name, part, part_state in zip(
            transform.names, transform.transforms, state.states, strict=True
        ):
            _collect(part, part_state, (*path, name), found)
        return
    if isinstance(transform, Partition):
        for label, part in transform.transforms.items():
            _collect(part, state.inner_states[label], (*path, str(label)), found)
        return
    if isinstance(transform, ParamGroups):
        _collect_groups(transform, state, path, found)
        return
    if isinstance(transform, Offload):  # its state is the inner's
        _collect(transform.inner, state, path, found)
        return
    if isinstance(transform, (InjectHyperparams, InjectStatefulHyperparams)):
        for name, value in state.hyperparams.items():
            schedule = transform.schedules.get(name)
            if isinstance(transform, InjectHyperparams) and schedule is not None:
                value = schedule(state.count)
            found.append(((*path, name), value))
        return
    inner: list[tuple[str, Any]] = []
    for field in dataclasses.fields(transform):
        value = getattr(transform, field.name, None)
        if isinstance(value, AbstractGradientTransformation):
            inner.append((field.name, value))
        elif is_hyperparameter_field(field) and value is not None:
            if callable(value) and not eqx.is_array(value):
                value = value(_step_count(transform, field.name, state))
            found.append(((*path, field.name), value))
    # A wrapper: its inner transforms' states are the state's `*state` fields, in order.
    inner_states = [
        getattr(state, f.name)
        for f in dataclasses.fields(state)
        if f.name.endswith("state") and f.name != "skip_state"
    ]
    if len(inner_states) == len(inner):
        for (name, part), part_state in zip(inner, inner_states, strict=True):
            _collect(part, part_state, (*path, name), found)


def _collect_groups(
    transform: ParamGroups, state: ParamGroupsState, path: tuple, found: list
) -> None:
    # The optimiser's own hyperparameters, then each group's (each group and
    # layer's) learning rate and weight decay: the optimiser's times the
    # multipliers, under one name each (`"head.learning_rate"`).
    inner = transform.running(state)
    _collect(inner, state.inner, path, found)
    # The groups' own branches (a group overriding hyperparameters); an
    # optimiser that is itself a partition (Muon's) is one branch.
    if transform.branches:
        assert isinstance(inner, Partition)
        branches = {
            label: (part, state.inner.inner_states[label])
            for label, part in inner.transforms.items()
        }
    else:
        branches = {DEFAULT: (inner, state.inner)}
    base: dict[Hashable, dict[str, Any]] = {}
    for label, (part, part_state) in branches.items():
        values: list = []
        _collect(part, part_state, (), values)
        base[label] = {
            name: next((v for p, v in values if p[-1] == name), None)
            for name in ("learning_rate", "weight_decay")
        }
    for row in transform.rows(state.assignment):
        for name, multiplier in (
            ("learning_rate", row.lr_mult),
            ("weight_decay", row.wd_mult),
        ):
            value = base[row.label][name]
            if value is not None:
                found.append(((*path, f"{row.key}.{name}"), value * multiplier))


def _is_count(value: Any) -> bool:
    return (
        eqx.is_array(value)
        and value.ndim == 0
        and jnp.issubdtype(value.dtype, jnp.integer)
    )


def _step_count(transform: Any, name: str, state: Any) -> Array:
    # The step count a transform's schedules are evaluated at, looked for in this
    # order: the state itself, or its field `count`, as `init_count_if_scheduled`
    # makes them (a `ScaleByScheduleState`) or as an integer; the one field that
    # holds a `ScaleByScheduleState`; the one integer field named `*_count`.
    if isinstance(state, ScaleByScheduleState):
        return state.count
    fields = dataclasses.fields(state) if dataclasses.is_dataclass(state) else ()
    values = {f.name: getattr(state, f.name, None) for f in fields}
    count = values.get("count")
    if isinstance(count, ScaleByScheduleState):
        return count.count
    if _is_count(count):
        return cast(Array, count)
    held = [k for k, v in values.items() if isinstance(v, ScaleByScheduleState)]
    named = [k for k, v in values.items() if k.endswith("_count") and _is_count(v)]
    for candidates in (held, named):
        if len(candidates) == 1:
            value = cast(Any, values[candidates[0]])
            return value.count if candidates is held else value
    several = held if len(held) > 1 else named
    what = (
        f"several step counts (`{'`, `'.join(several)}`)"
        if len(several) > 1
        else "no step count"
    )
    raise TypeError(
        f"`{type(transform).__name__}.{name}` is a schedule, but the state "
        f"`{type(state).__name__}` holds {what} to evaluate it at: keep what "
        "`eqopt.init_count_if_scheduled` returns in one field of the state (or the "
        "step count, an integer, in a field `count`) and advance it with "
        "`eqopt.current_value`."
    )
