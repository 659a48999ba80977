"""Reading the hyperparameters an optimiser uses now: scheduled ones at the state's step."""

import dataclasses
from typing import Any, cast

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractGradientTransformation, OptState
from ._groups import DEFAULT
from ._hyper import check_hyperparameters, weakly_typed
from ._hyperparameters import Hyperparameter, describe, keyed
from ._param_groups import ParamGroups, ParamGroupsState, hyperparameter_parts
from ._scheduled import ScaleByScheduleState
from ._typecheck import checked


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
    part with a hyperparameter of the same name is added. The groups of
    `eqopt.param_groups` add each group's rates (`"head.learning_rate"`:
    the optimiser's times the group's multipliers), which are not
    hyperparameters and take no name from them. A group overrides
    hyperparameters by these same keys (`eqopt.Group(..., b2=0.95)`), from
    the one description of them in `eqopt/_hyperparameters.py`; a schedule's
    own arguments (its `alpha`) are not among them: its value is.

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
    groups: list[tuple[ParamGroups, ParamGroupsState, tuple[str, ...]]] = []

    def parts(node: Any, part_state: Any, path: tuple[str, ...]) -> Any:
        expanded = hyperparameter_parts(node, part_state, path)
        if expanded is not None:
            groups.append((node, part_state, path))
        return expanded

    described = [h for h in describe(transform, state, parts) if h.value is not None]
    # As `update` sees them: weakly typed (also NumPy ones, from `eqopt.on_host`).
    found = {h.path: weakly_typed(jnp.asarray(_value(h))) for h in described}
    values = {key: found[path] for key, path in keyed(found).items()}
    for node, part_state, path in groups:
        for key, value in _group_rates(node, part_state, path, described):
            values[key] = weakly_typed(jnp.asarray(value))
    return values


def _value(hyperparameter: Hyperparameter) -> Any:
    """Its value now: a schedule evaluated at its owner's step count."""
    if not hyperparameter.is_schedule:
        return hyperparameter.value
    state = hyperparameter.state
    count, what = _find_count(state)
    if count is None:
        raise TypeError(
            f"`{type(hyperparameter.owner).__name__}.{hyperparameter.name}` is a "
            f"schedule, but the state `{type(state).__name__}` holds {what} to "
            "evaluate it at: keep what `eqopt.init_count_if_scheduled` returns in "
            "one field of the state (or the step count, an integer, in a field "
            "`count`) and advance it with `eqopt.current_value`."
        )
    return hyperparameter.value(count)


def _group_rates(
    transform: ParamGroups,
    state: ParamGroupsState,
    path: tuple[str, ...],
    described: list[Hyperparameter],
) -> list[tuple[str, Any]]:
    # Each group's (each group and layer's) learning rate and weight decay: the
    # rate of its branch (the optimiser's, without overrides) times the
    # group's multipliers, under one key each (`"head.learning_rate"`). They
    # are not hyperparameters: they take no part in the rule of bare names.
    prefix = len(path) + (1 if transform.branches else 0)
    base: dict[tuple[str, str], Any] = {}
    for h in described:
        if h.path[: len(path)] == path and len(h.path) > prefix:
            label = h.path[len(path)] if transform.branches else DEFAULT
            base.setdefault((label, h.name), h)  # the first one, in the parts' order
    out = []
    for row in transform.rows(state.assignment):
        for name, multiplier in (
            ("learning_rate", row.lr_mult),
            ("weight_decay", row.wd_mult),
        ):
            found = base.get((row.label, name))
            if found is not None:
                key = ".".join((*path, f"{row.key}.{name}"))
                out.append((key, _value(found) * multiplier))
    return out


def _is_count(value: Any) -> bool:
    return (
        eqx.is_array(value)
        and value.ndim == 0
        and jnp.issubdtype(value.dtype, jnp.integer)
    )


def _find_count(state: Any) -> tuple[Any, str]:
    # The step count a part's schedules are evaluated at, looked for in this
    # order: the state itself, or its field `count`, as `init_count_if_scheduled`
    # makes them (a `ScaleByScheduleState`) or as an integer; the one field that
    # holds a `ScaleByScheduleState`; the one integer field named `*_count`.
    # With none or several, `None` and what was found.
    if isinstance(state, ScaleByScheduleState):
        return state.count, ""
    fields = dataclasses.fields(state) if dataclasses.is_dataclass(state) else ()
    values = {f.name: getattr(state, f.name, None) for f in fields}
    count = values.get("count")
    if isinstance(count, ScaleByScheduleState):
        return count.count, ""
    if _is_count(count):
        return cast(Array, count), ""
    held = [k for k, v in values.items() if isinstance(v, ScaleByScheduleState)]
    named = [k for k, v in values.items() if k.endswith("_count") and _is_count(v)]
    for candidates in (held, named):
        if len(candidates) == 1:
            value = cast(Any, values[candidates[0]])
            return (value.count if candidates is held else value), ""
    several = held if len(held) > 1 else named
    if len(several) > 1:
        return None, f"several step counts (`{'`, `'.join(several)}`)"
    return None, "no step count"


def step_count(transform: Any, state: Any) -> int | None:
    """The step count of the optimiser's parts, found in each part's state as
    a schedule's is (`_find_count`), where they agree on one: `None` where no
    part keeps one, or one is ambiguous, or they differ. Outside `jit`."""
    counts: set[int] = set()
    for h in describe(transform, state, hyperparameter_parts):
        count, what = _find_count(h.state)
        if count is None and what != "no step count":
            return None
        if count is not None:
            counts.add(int(count))
    return counts.pop() if len(counts) == 1 else None
