"""Combinators: `chain`, `named_chain` and parameter groups (`partition`)."""

import abc
import re
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PyTree

from ._base import (
    AbstractGradientTransformation,
    OptState,
    Params,
    Updates,
    is_none,
    is_trainable,
    path_str,
)
from ._entry import init_entry, update_entry
from ._filters import (
    NOT_A_VALUE,
    call_per_leaf,
    is_pytree_node,
    is_spec_leaf,
    keep_selected,
    map_prefix,
    per_leaf_hint,
    refuse_whole_params_reading,
    resolve_filter,
    warn_if_selects_nothing,
)
from ._interop import as_transform
from ._layer_axes import one_layer, stack_axes_by_path
from ._optax_tuple import OptaxTuple
from ._typecheck import checked


def _snake_case(name: str) -> str:
    name = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    return name.lower()


def _default_names(transforms) -> tuple[str, ...]:
    names: list[str] = []
    for transform in transforms:
        base = _snake_case(type(transform).__name__)
        name, index = base, 1
        while name in names:
            name = f"{base}_{index}"
            index += 1
        names.append(name)
    return tuple(names)


class _AbstractNamedTuple(eqx.Module):
    """A tuple of named parts, readable by position, by name and by attribute."""

    names: eqx.AbstractVar[tuple[str, ...]]

    @abc.abstractmethod
    def _parts(self) -> tuple:
        """The parts, in order, one per name."""

    def __getitem__(self, key: int | str | slice):
        if isinstance(key, str):
            try:
                return self._parts()[self.names.index(key)]
            except ValueError:
                raise KeyError(
                    f"No part named {key!r}; the names are {self.names}."
                ) from None
        return self._parts()[key]

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("names", "states", "transforms"):
            raise AttributeError(name)
        names = self.__dict__.get("names", ())
        if name in names:
            return self._parts()[names.index(name)]
        raise AttributeError(
            f"{type(self).__name__} has no attribute or part named {name!r} "
            f"(its parts are {names})."
        )

    def __len__(self) -> int:
        return len(self._parts())


@checked
class ChainState(_AbstractNamedTuple):
    """The state of a `Chain`: the parts' states in order.

    Read a part's state by position (`state[0]`), by name (`state["scale_by_adam"]`)
    or as an attribute (`state.scale_by_adam.mu`). Like Optax's tuple it has a
    `len`, iterates over the parts' states and unpacks: `adam_state, _ = state`.
    """

    states: tuple[OptState, ...]
    names: tuple[str, ...] = eqx.field(static=True)

    def _parts(self) -> tuple:
        return self.states

    # Only the state iterates over its parts: a `Chain` iterates as Optax's
    # `(init, update)` pair (see `AbstractGradientTransformation.__iter__`).
    def __iter__(self):
        return iter(self.states)


@checked
class Chain(_AbstractNamedTuple, AbstractGradientTransformation):
    r"""Applies transforms one after the other.

    $$ u \mapsto T_n(\dots T_2(T_1(u))) $$

    Each part is named: by default after its class in snake case
    (`ScaleByAdam` becomes `scale_by_adam`, a repeat gets a suffix `_1`), or
    explicitly with `named_chain`. A part and its state can be read by position,
    name or attribute: `opt[0]`, `opt["scale_by_adam"]`, `state.scale_by_adam`.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `*transforms`: the transforms, in the order they apply. An object with
      `init` and `update` methods (an Optax transformation) is wrapped in
      `GradientTransformation`.
    - `names`: optional names for the parts, one per transform.
    """

    transforms: tuple[AbstractGradientTransformation, ...]
    names: tuple[str, ...] = eqx.field(static=True)

    def __init__(self, *transforms: Any, names: tuple[str, ...] | None = None):
        self.transforms = tuple(as_transform(t) for t in transforms)
        if names is None:
            names = _default_names(self.transforms)
        names = tuple(names)
        if len(names) != len(self.transforms):
            raise ValueError(
                f"Got {len(names)} names for {len(self.transforms)} transforms."
            )
        if len(set(names)) != len(names):
            raise ValueError(
                f"The names of a chain's parts must be unique, got {names}."
            )
        self.names = names

    def _parts(self) -> tuple:
        return self.transforms

    @property
    def elementwise(self) -> bool:
        return all(t.elementwise for t in self.transforms)

    @property
    def handles_packed(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        # A frozen selection is by leaf: a chain that freezes sees unpacked trees.
        # (Every chain can say what it freezes; only one holding a `Freeze`,
        # directly or in a nested chain, freezes anything.)
        return not self.freezes

    @property
    def runs_on_buffers(self) -> bool:
        # A `Freeze` is not elementwise, so a chain holding one (nested or not)
        # does not run on the buffers either.
        return all(t.runs_on_buffers for t in self.transforms)

    @property
    def freezes(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        """Whether a part of this chain, or of a chain nested in it, freezes leaves."""
        return any(t.freezes for t in self.transforms)

    @property
    def per_example_updates(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        """Whether the chain takes per-example updates (its first part does)."""
        return bool(self.transforms) and self.transforms[0].per_example_updates

    def frozen_selection(self, tree: Any) -> Any | None:
        """The leaves a part of this chain freezes (see `eqopt.Freeze`), or `None`."""
        return _union(*(_frozen_by(t, tree) for t in self.transforms))

    @init_entry
    def init(self, params: Params) -> ChainState:
        states, frozen = [], None
        for transform in self.transforms:
            states.append(transform.init(_drop(params, frozen)))
            frozen = _union(frozen, _frozen_by(transform, params))
        return ChainState(tuple(states), self.names)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ChainState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ChainState]:
        if len(state.states) != len(self.transforms):
            raise ValueError(
                f"Chain.update: the chain has {len(self.transforms)} parts "
                f"{list(self.names)} but `state` has {len(state.states)} "
                f"{list(state.names)}: pass the state made by this transform's `init`."
            )
        reference = updates if params is None else params
        gradients, frozen = updates, None
        new_states = []
        for transform, part_state in zip(self.transforms, state.states, strict=True):
            # Called on the class: `transform.update` would build a bound-method
            # Module for each part at every eager step.
            updates, part_state = type(transform).update(
                transform,
                _drop(updates, frozen),
                part_state,
                _drop(params, frozen),
                **extra_args,
            )
            new_states.append(part_state)
            frozen = _union(frozen, _frozen_by(transform, reference))
        if frozen is not None:
            # Frozen leaves get zero updates, as `freeze` alone gives.
            updates = jax.tree.map(
                lambda new, gradient, is_frozen: (
                    jnp.zeros_like(gradient)
                    if is_frozen and gradient is not None
                    else new
                ),
                _drop(updates, frozen),
                gradients,
                frozen,
                is_leaf=is_none,
            )
        return updates, ChainState(tuple(new_states), self.names)


def _frozen_by(transform: AbstractGradientTransformation, tree: Any) -> Any | None:
    # Only `Freeze` and chains holding one freeze leaves for the parts after them.
    if tree is None or not transform.freezes:
        return None
    return transform.frozen_selection(tree)


def _union(*selections: Any) -> Any | None:
    selections = tuple(s for s in selections if s is not None)
    if not selections:
        return None
    return jax.tree.map(lambda *bools: any(bools), *selections, is_leaf=is_none)


def _drop(tree: Any, frozen: Any | None) -> Any:
    # The frozen leaves become `None`, as for a leaf that is not differentiated.
    if frozen is None or tree is None:
        return tree
    return jax.tree.map(
        lambda leaf, is_frozen: None if is_frozen else leaf,
        tree,
        frozen,
        is_leaf=is_none,
    )


@checked
def chain(*args: Any) -> Chain:
    """Optax spelling of `eqopt.Chain`: applies transforms one after the other."""
    return Chain(*args)


@checked
def named_chain(*args: tuple[str, Any]) -> Chain:
    """Optax spelling: a `eqopt.Chain` whose parts have the given names.

    **Arguments:**

    - `*args`: `(name, transform)` pairs.
    """
    names = tuple(name for name, _ in args)
    return Chain(*(t for _, t in args), names=names)


# ---------------------------------------------------------------------------
# Parameter groups
# ---------------------------------------------------------------------------

#: The groups of a `Partition`: a dict from label to filter spec, or a prefix
#: pytree of labels and per-leaf callables returning a label.
ParamLabels: TypeAlias = PyTree[Hashable | Callable[[Any], Hashable]]


@checked
class PartitionState(eqx.Module, OptaxTuple):
    """The state of a `Partition`: one inner state per group, keyed by label."""

    inner_states: dict[Hashable, OptState]


def _looks_like_filter_specs(param_labels: Any, labels: set) -> bool:
    if not isinstance(param_labels, Mapping) or set(param_labels.keys()) != labels:
        return False
    leaves = jax.tree.leaves(param_labels, is_leaf=is_spec_leaf)
    return all(
        leaf is None or isinstance(leaf, (bool, np.bool_)) or callable(leaf)
        for leaf in leaves
    )


def _resolve_labels(param_labels: Any, params: Params, labels: list) -> Any:
    """A tree shaped like params: the group label of each trainable leaf, None elsewhere."""
    if _looks_like_filter_specs(param_labels, set(labels)):
        masks = {
            label: resolve_filter(
                param_labels[label],
                params,
                what=f"filter spec of group {label!r}",
                fix="partition(transforms, {label: spec_fn(params), ...})",
            )
            for label in labels
        }
        flat_params = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_none)[0]
        flat_masks = {label: jax.tree.leaves(masks[label]) for label in labels}
        out = []
        for index, (path, leaf) in enumerate(flat_params):
            if not is_trainable(leaf):
                out.append(None)
                continue
            groups = [label for label in labels if flat_masks[label][index]]
            if len(groups) != 1:
                where = "no group" if not groups else f"several groups {groups}"
                raise ValueError(
                    f"The parameter at {path_str(path)} is in {where}; every trainable "
                    "leaf must belong to exactly one group."
                )
            out.append(groups[0])
        return jax.tree.unflatten(jax.tree.structure(params, is_leaf=is_none), out)

    # A label tree: a prefix pytree of labels, or per-leaf callables returning labels.
    def is_label_leaf(x):
        return x is None or (
            (isinstance(x, Hashable) or callable(x)) and not is_pytree_node(x)
        )

    hint = per_leaf_hint(
        "`param_labels`", "label function", "partition(transforms, label_fn(params))"
    )
    what = "label function in `param_labels`"
    # A label function sees one layer of a stacked leaf.
    stacks = stack_axes_by_path(params)

    def resolve_subtree(spec, subtree, prefix):
        flat = jax.tree_util.tree_flatten_with_path(subtree, is_leaf=is_none)[0]
        sub_out = []
        for path, leaf in flat:
            if not is_trainable(leaf):
                sub_out.append(None)
                continue
            where = path_str(prefix + path)
            if not callable(spec) or isinstance(spec, str):
                label = spec
            else:
                one = one_layer(leaf, stacks.get(prefix + path, 0))
                label = call_per_leaf(spec, one, prefix + path, what, hint)
                if not _is_label(label):
                    # Optax's spelling: a function of the whole params, returning a tree.
                    raise ValueError(
                        f"The {what} returned {_a(label)} for the parameter at "
                        f"{where}, not a label (one of {labels}). {hint}"
                    )
            if label not in labels:
                raise ValueError(
                    f"The parameter at {where} has label {label!r}, which is in no "
                    f"group; the groups are {labels}."
                    + (f" {hint}" if callable(spec) else "")
                )
            sub_out.append(label)
        treedef = jax.tree.structure(subtree, is_leaf=is_none)
        return jax.tree.unflatten(treedef, sub_out)

    resolved = map_prefix(
        resolve_subtree,
        param_labels,
        params,
        is_leaf=is_label_leaf,
        what="`param_labels`",
    )
    if callable(param_labels) and is_label_leaf(param_labels):
        refuse_whole_params_reading(
            param_labels,
            params,
            resolved,
            what,
            hint,
            lambda value: value if _is_label(value) else NOT_A_VALUE,
        )
    return resolved


def _a(x: Any) -> str:
    if eqx.is_array(x):
        return "an array"
    name = type(x).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def _is_label(x: Any) -> bool:
    # A label is a hashable leaf: not a pytree (a dict of labels), nor an array.
    return (
        isinstance(x, Hashable)
        and not eqx.is_array(x)
        and (x is None or not is_pytree_node(x))
    )


def _group_mask(labels: Any, label: Hashable) -> Any:
    """A tree of bools: which leaves have the given label."""
    return jax.tree.map(lambda x: x == label, labels, is_leaf=is_none)


@checked
class Partition(AbstractGradientTransformation):
    """Applies a different transform to each group of parameters.

    Every trainable leaf belongs to exactly one group; a leaf in no group or in
    two is an error naming its path. Each inner transform sees, and keeps state
    for, its own group only (the other leaves are `None` to it).

    Groups are given in one of two ways:

    - **filter specs** (the Equinox way): `param_labels` is a dict with the same
      keys as `transforms`, each value a filter spec (a bool, a per-leaf
      predicate, or a prefix pytree of these), e.g.
      `{"matrices": lambda x: x.ndim > 1, "rest": lambda x: x.ndim <= 1}`;
    - **a label tree** (the Optax way): a prefix pytree of the params whose
      leaves are labels (keys of `transforms`) or per-leaf callables returning a
      label.

    A callable is applied to each leaf, never to the whole params, as `eqx.filter`
    applies it (see "Masks are filter specs" in Coming from Optax).

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `transforms`: a dict from label to transform.
    - `param_labels`: the groups, as above.
    - `warn_empty`: whether `init` warns of a group that selects no trainable
      leaf (default `True`; Muon's family passes `False`, whose group of the
      non-matrix leaves is empty on a model of matrices alone).

    !!! example

        ```python
        opt = eqopt.partition(
            {"matrices": eqopt.adam(1e-3), "vectors": eqopt.sgd(1e-2)},
            {"matrices": lambda x: x.ndim > 1, "vectors": lambda x: x.ndim <= 1},
        )
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        state.inner_states["matrices"]   # Adam's state, with None at the vectors
        ```
    """

    transforms: dict[Hashable, AbstractGradientTransformation]
    # Labels, bools and predicates are not arrays, so `eqx.filter_jit` treats them
    # as static; a prefix pytree of them is kept as an ordinary field.
    param_labels: ParamLabels
    warn_empty: bool = eqx.field(static=True)

    def __init__(
        self,
        transforms: Mapping[Hashable, Any],
        param_labels: ParamLabels,
        *,
        warn_empty: bool = True,
    ):
        self.transforms = {label: as_transform(t) for label, t in transforms.items()}
        self.param_labels = param_labels
        self.warn_empty = warn_empty

    @property
    def elementwise(self) -> bool:
        # Different leaves get different rules: flattening leaves together would mix groups.
        return False

    def _labels(self, params: Params) -> Any:
        return _resolve_labels(self.param_labels, params, list(self.transforms))

    @init_entry
    def init(self, params: Params) -> PartitionState:
        labels = self._labels(params)
        inner_states = {}
        for label, transform in self.transforms.items():
            mask = _group_mask(labels, label)
            spec = (
                self.param_labels[label]
                if _looks_like_filter_specs(self.param_labels, set(self.transforms))
                else self.param_labels
            )
            if self.warn_empty:
                warn_if_selects_nothing(
                    mask,
                    f"group {label!r} of partition",
                    spec,
                    "its transform trains nothing",
                )
            inner_states[label] = transform.init(keep_selected(params, mask))
        return PartitionState(inner_states)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: PartitionState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, PartitionState]:
        if set(state.inner_states) != set(self.transforms):
            raise ValueError(
                f"Partition.update: `state` has the groups {list(state.inner_states)} "
                f"but this partition's groups are {list(self.transforms)}: pass the state "
                "made by this transform's `init`."
            )
        reference = updates if params is None else params
        labels = self._labels(reference)
        new_updates = updates
        inner_states = {}
        for label, transform in self.transforms.items():
            mask = _group_mask(labels, label)
            group_updates = keep_selected(updates, mask)
            group_params = None if params is None else keep_selected(params, mask)
            group_updates, inner_states[label] = transform.update(
                group_updates, state.inner_states[label], group_params, **extra_args
            )
            new_updates = jax.tree.map(
                lambda new, old, selected: new if selected else old,
                group_updates,
                new_updates,
                mask,
                is_leaf=is_none,
            )
        return new_updates, PartitionState(inner_states)


@checked
def partition(
    transforms: Mapping[Hashable, Any],
    param_labels: ParamLabels,
    *,
    mask_compatible_extra_args: bool = False,
) -> Partition:
    """Optax spelling of `eqopt.Partition`: a transform per group of parameters.

    `mask_compatible_extra_args` is accepted for Optax compatibility: eqopt
    forwards every extra argument to every group unchanged.
    """
    return Partition(transforms=transforms, param_labels=param_labels)


@checked
def multi_transform(
    transforms: Mapping[Hashable, Any],
    param_labels: ParamLabels,
    *,
    mask_compatible_extra_args: bool = False,
) -> Partition:
    """Optax's older name for `eqopt.partition`."""
    return Partition(transforms=transforms, param_labels=param_labels)
