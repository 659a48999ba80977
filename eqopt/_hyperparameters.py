"""The one description of an optimiser's hyperparameters: names, values and places.

`describe(transform, state)` walks a transform tree (chains, partitions,
wrappers, `inject_hyperparams`, `eqopt.offload`, parameter groups through the
`parts` hook of `eqopt._param_groups`) and gives one `Hyperparameter` per
numeric hyperparameter: the names of the parts that lead to it and its own
(its full key, `"scale_by_adam.b1"`), its value (a number, or a schedule
with the hyperparameters of its own), the Module that holds it and where
that Module is in the tree, and with `state`, the state of that Module.
`keyed` is the one rule for its names: the full key always, the bare name
where one hyperparameter has it. `eqopt.current_hyperparams` reports what
it describes under these keys; a group of `eqopt.param_groups` overrides
the same hyperparameters under the same keys (`override`).
"""

import collections
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import equinox as eqx

from ._base import AbstractGradientTransformation
from ._combine import Chain, Partition
from ._hyper import is_hyperparameter_field
from ._wrappers.inject import InjectHyperparams, _AbstractInjectHyperparams
from ._wrappers.offload import Offload

#: A step from a Module to one of its parts: `("attr", name)` or `("item", key)`.
Step = tuple[str, Any]

#: The hook for transforms whose parts depend on their state (parameter groups):
#: `parts(transform, state, path)` gives `(name or None, part, its state, its
#: steps from the transform or None)` per part, or `None` for any other transform.
Parts = Callable[
    [Any, Any, tuple[str, ...]], list[tuple[str | None, Any, Any, tuple | None]] | None
]


@dataclasses.dataclass(frozen=True, eq=False)
class Hyperparameter:
    """One numeric hyperparameter of an optimiser, where it lives and what it is.

    - `path`: the names of the parts that lead to it, then its own name.
    - `value`: a number (a scalar array), `None` when switched off, or a
      schedule of the step count.
    - `owner`: the Module holding it (the `inject_hyperparams` wrapper for an
      injected one).
    - `state`: the owner's state, when described with one (else `None`).
    - `steps`: where the owner is, from the described transform (`None` where
      it is built from the state, as parameter groups build their optimiser).
    - `injected`: whether it is an argument of an `inject_hyperparams` factory.
    """

    path: tuple[str, ...]
    value: Any
    owner: Any
    state: Any
    steps: tuple[Step, ...] | None
    injected: bool

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def key(self) -> str:
        """The full key: `"scale_by_adam.b1"`."""
        return ".".join(self.path)

    @property
    def is_schedule(self) -> bool:
        return callable(self.value) and not eqx.is_array(self.value)

    @property
    def schedule_arguments(self) -> tuple[str, ...]:
        """The hyperparameters of its schedule itself (`alpha` of a cosine decay)."""
        if not isinstance(self.value, eqx.Module):
            return ()
        return tuple(
            field.name
            for field in dataclasses.fields(self.value)
            if is_hyperparameter_field(field)
        )


def describe(
    transform: Any, state: Any = None, parts: Parts | None = None
) -> tuple[Hyperparameter, ...]:
    """Every hyperparameter of `transform`, in the order of its parts.

    With `state` (as `init` or `update` returned it), each carries its
    owner's state, and injected ones are read from the state (where a user may
    have replaced them). A wrapper whose state does not show its inner
    transforms' states (`*state` fields, one per inner transform) is described
    without its inner transforms when a state is given.
    """
    found: list[Hyperparameter] = []
    _walk(transform, state, (), (), found, parts)
    return tuple(found)


def _walk(
    node: Any,
    state: Any,
    path: tuple[str, ...],
    steps: tuple[Step, ...] | None,
    found: list,
    parts: Parts | None,
) -> None:
    def down(name: Any, part: Any, part_state: Any, step: tuple | None) -> None:
        # A part, under its name (`None`: the node's own path), at `step` from it.
        where = None if steps is None or step is None else (*steps, *step)
        inside = path if name is None else (*path, str(name))
        _walk(part, part_state, inside, where, found, parts)

    expanded = None if parts is None else parts(node, state, path)
    if expanded is not None:
        for name, part, part_state, step in expanded:
            down(name, part, part_state, step)
        return
    if isinstance(node, Chain):
        for i, (name, part) in enumerate(zip(node.names, node.transforms, strict=True)):
            part_state = None if state is None else state.states[i]
            down(name, part, part_state, (("attr", "transforms"), ("item", i)))
        return
    if isinstance(node, Partition):
        for label, part in node.transforms.items():
            part_state = None if state is None else state.inner_states[label]
            down(label, part, part_state, (("attr", "transforms"), ("item", label)))
        return
    if isinstance(node, Offload):  # its state is the inner's
        down(None, node.inner, state, (("attr", "inner"),))
        return
    if isinstance(node, _AbstractInjectHyperparams):
        names = (
            sorted({*node.hyperparams, *node.schedules})
            if state is None
            else state.hyperparams
        )
        for name in names:
            if name in node.schedules and (
                state is None or isinstance(node, InjectHyperparams)
            ):
                value = node.schedules[name]
            else:
                value = (node.hyperparams if state is None else state.hyperparams)[name]
            found.append(Hyperparameter((*path, name), value, node, state, steps, True))
        return
    inner: list[tuple[str, Any]] = []
    for field in dataclasses.fields(node):
        value = getattr(node, field.name, None)
        if isinstance(value, AbstractGradientTransformation):
            inner.append((field.name, value))
        elif is_hyperparameter_field(field):
            found.append(
                Hyperparameter((*path, field.name), value, node, state, steps, False)
            )
    if state is None:
        for name, part in inner:
            down(name, part, None, (("attr", name),))
        return
    # A wrapper: its inner transforms' states are the state's `*state` fields, in order.
    inner_states = [
        getattr(state, f.name)
        for f in dataclasses.fields(state)
        if f.name.endswith("state") and f.name != "skip_state"
    ]
    if len(inner_states) == len(inner):
        for (name, part), part_state in zip(inner, inner_states, strict=True):
            down(name, part, part_state, (("attr", name),))


def keyed(paths: Iterable[tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The one rule for the names of hyperparameters: each under its full key
    (`"scale_by_adam.b1"`), and under its bare name (`"b1"`) where no other
    has that name. Maps each key to its path."""
    paths = list(paths)
    names = collections.Counter(path[-1] for path in paths)
    out: dict[str, tuple[str, ...]] = {}
    for path in paths:
        out[".".join(path)] = path
        if names[path[-1]] == 1:
            out[path[-1]] = path
    return out


def overridable(described: Iterable[Hyperparameter]) -> dict[str, Hyperparameter]:
    """The keys a group may override, as `eqopt.current_hyperparams` reports them:
    full keys and unique bare names of the hyperparameters with a value; a
    switched-off one (`None`) by its full key, or its bare name where unique."""
    described = list(described)
    by_path = {h.path: h for h in described}
    table = keyed(h.path for h in described)
    table.update(keyed(h.path for h in described if h.value is not None))
    return {key: by_path[path] for key, path in table.items()}


def override(
    transform: Any, values: Mapping[str, Any], who: str, parts: Parts | None = None
) -> Any:
    """`transform` with the hyperparameters named in `values` (by the keys of
    `overridable`) set to the values given, converted as the constructors do.

    A name that several parts share (Muon's `learning_rate`, in its Muon and
    its Adam part; `shared`) sets it in every part that has it, as a group's
    learning rate should. An argument of a schedule, or a name the optimiser
    does not have, raises one `ValueError` that begins with `who` and says
    which keys there are.
    """
    described = describe(transform, parts=parts)
    table = overridable(described)
    chosen: dict[tuple[Step, ...], tuple[Any, dict[str, Any]]] = {}
    for key, value in values.items():
        matches = [table[key]] if key in table else shared(key, described)
        if not matches:
            raise ValueError(f"{who} {_refusal(key, described, table)}")
        for found in matches:
            assert found.steps is not None
            _, changes = chosen.setdefault(found.steps, (found, {}))
            changes[found.name] = value
    for steps, (found, changes) in chosen.items():
        owner = found.owner
        if found.injected:
            new = owner.with_arguments(changes)
        else:
            new = dataclasses.replace(owner, **changes)
        if not steps:
            transform = new
        else:
            transform = eqx.tree_at(
                lambda t, steps=steps: _follow(t, steps), transform, new
            )
    return transform


def shared(key: str, described: Iterable[Hyperparameter]) -> list[Hyperparameter]:
    """The hyperparameters (with a value) whose full key ends with `key`, as a
    whole dotted name: `learning_rate` or `scale_by_learning_rate.learning_rate`
    names both of Muon's rates, `muon.scale_by_learning_rate.learning_rate` one."""
    return [
        h
        for h in described
        if h.value is not None and (h.key == key or h.key.endswith("." + key))
    ]


def _follow(node: Any, steps: tuple[Step, ...]) -> Any:
    for kind, key in steps:
        node = getattr(node, key) if kind == "attr" else node[key]
    return node


def _refusal(key: str, described: tuple[Hyperparameter, ...], table: dict) -> str:
    scheduled = [h for h in described if key in h.schedule_arguments]
    if scheduled:
        return (
            f"overrides {key}, an argument of the schedule of {scheduled[0].key}, "
            "not a hyperparameter of the optimiser (`eqopt.current_hyperparams` "
            f"reports the schedule's value): give the group its own schedule, "
            f"`{scheduled[0].name}=...`."
        )
    shortest = {h.path: k for k, h in sorted(table.items(), key=lambda kv: -len(kv[0]))}
    return (
        f"overrides {key}, which its optimiser does not have; its hyperparameters "
        f"are {', '.join(sorted(shortest.values()))}."
    )
