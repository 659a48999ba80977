"""Reading the hyperparameters an optimiser uses now: scheduled ones at the state's step."""

import dataclasses
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractGradientTransformation, OptState
from ._combine import Chain, Partition
from ._hyper import is_hyperparameter_field, weakly_typed
from ._wrappers.inject import InjectHyperparams, InjectStatefulHyperparams


def current_hyperparams(
    transform: AbstractGradientTransformation, state: OptState
) -> dict[str, Array]:
    """The value of every numeric hyperparameter that the next `update` uses.

    A hyperparameter given as a number is read from the optimiser; one given as
    a schedule is evaluated at the step count kept in `state`; one injected with
    [`eqopt.inject_hyperparams`][] is read from the state (where a user may have
    replaced it), its schedules evaluated at the state's count. This works for any
    optimiser, chain, partition or wrapper, inside `jit` too.

    A hyperparameter is keyed by its name (`"learning_rate"`, `"b1"`) where that
    name is unique in the optimiser, and otherwise by the names of the parts that
    lead to it, joined with dots (`"matrices.learning_rate"` and
    `"vectors.learning_rate"` for the two groups of a partition).

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
    found: list[tuple[tuple[str, ...], Any]] = []
    _collect(transform, state, (), found)
    # As `update` sees them: weakly typed (also NumPy ones, from `eqopt.on_host`).
    return {
        _key(path, found): weakly_typed(jnp.asarray(value)) for path, value in found
    }


def _key(path: tuple[str, ...], found: list) -> str:
    # The name alone if unique; else the fewest leading part names that tell it
    # apart from the others of the same name, then the name.
    others = [p for p, _ in found if p[-1] == path[-1] and p != path]
    for length in range(len(path)):
        if not any(p[:length] == path[:length] for p in others):
            return ".".join((*path[:length], path[-1]))
    return ".".join(path)


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
                count = getattr(state, "count", None)
                if count is None:
                    continue  # a schedule whose count this state does not show
                value = value(count)
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
