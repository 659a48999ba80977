"""Parameter groups, resolved: each trainable leaf's group and layer (`Assignment`).

`resolve` assigns every trainable leaf of a model to the first group that
selects it (the default group otherwise) and, with `LayerDecay`, to a layer:
the `Assignment`, a static record that the state keeps, so the groups are
resolved once, at `init`. A stack of layers (a leaf built by `eqx.filter_vmap`,
its stack axes read from `eqopt._layer_axes`) is its layers: each slice is
matched as the layer it is (`blocks[3].mlp.weight`), goes to its own group and
gets its own layer, as the same model written as a list of layers would.
"""

import dataclasses
import functools
import math
import re
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, no_type_check

import equinox as eqx
import jax
import numpy as np
from jax.tree_util import GetAttrKey, SequenceKey

from ._filters import resolve_filter
from ._fused._pack import unpack_all
from ._groups import DEFAULT, Group, InLayer, LayerDecay, _describe
from ._layer_axes import describe
from ._leaves import InputError, is_none, is_trainable, outside_eqopt, path_str

#: Per leaf of an `Assignment`: one value for the whole leaf, or, for a stack
#: of layers whose slices differ, one per slice (flattened over the stack axes).
PerSlice = Any


def _slice(value: PerSlice, k: int) -> Any:
    return value[k] if isinstance(value, tuple) else value


def _compress(values: list) -> PerSlice:
    # One value where every slice has it, else the tuple of the slices' values.
    return values[0] if len(set(values)) == 1 else tuple(values)


@dataclasses.dataclass(frozen=True, eq=False)
class Assignment:
    """Each leaf's group and layer, resolved once from the model (kept in the state).

    Per position of the model's leaves (`None` counted as a leaf):

    - `groups`: the index of the leaf's group in `names` (`None`: not trained);
    - `layers`: its layer with layer decay (`None` otherwise);
    - `paths`: its path as groups match it (`blocks[3].mlp.weight`);
    - `sizes`: its number of elements;
    - `stacks`: the shape of its stack axes (`()` for a leaf that is not a
      stack of layers).

    For a stack of layers (`eqx.filter_vmap`), `paths` holds the path of each
    slice (`blocks[0].mlp.weight`, ...) and `groups` and `layers` a value per
    slice where the slices differ (`PerSlice`), flattened over the stack axes.
    Interned (`Assignment.make`): equal assignments are one object, hashed by
    identity, so the state's static field costs `jit` nothing.
    """

    treedef: Any
    names: tuple[str, ...]
    groups: tuple[PerSlice, ...]
    layers: tuple[PerSlice, ...]
    n_layers: int | None
    paths: tuple[str | tuple[str, ...], ...]
    sizes: tuple[int, ...]
    stacks: tuple[tuple[int, ...], ...]

    _interned: ClassVar[weakref.WeakValueDictionary] = weakref.WeakValueDictionary()

    @classmethod
    def make(cls, **fields: Any) -> "Assignment":
        """The one `Assignment` with these fields."""
        key = tuple(fields[f.name] for f in dataclasses.fields(cls))
        found = cls._interned.get(key)
        if found is None:
            found = cls._interned[key] = cls(**fields)
        return found

    def __reduce__(self):
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return (functools.partial(Assignment.make, **fields), ())

    def slices(self, position: int) -> int:
        """The number of layers in the leaf at `position` (1 if not stacked)."""
        return math.prod(self.stacks[position])

    def units(self) -> Iterator[tuple[int, int, int, int | None, str, int]]:
        """Per trained layer of each leaf (each slice of a stack): its position,
        slice, group, layer, path and number of elements."""
        for position, (group, layer, path, size) in enumerate(
            zip(self.groups, self.layers, self.paths, self.sizes, strict=True)
        ):
            if group is None:
                continue
            n = self.slices(position)
            for k in range(n):
                spelled = path[k] if isinstance(path, tuple) else path
                yield (
                    position,
                    k,
                    _slice(group, k),
                    _slice(layer, k),
                    spelled,
                    size // n,
                )

    def labels(self, label_of: Callable[[str], str]) -> Any:
        """A tree shaped like the model: each trainable leaf's branch label (one
        per leaf: `resolve` keeps a stack's slices in one branch)."""
        leaves = [
            None if g is None else label_of(self.names[_slice(g, 0)])
            for g in self.groups
        ]
        return jax.tree.unflatten(self.treedef, leaves)


class _Leaves:
    """The model's leaves as `resolve` reads them: paths, descriptions, stacks."""

    @no_type_check
    def __init__(self, params: Any):
        # The packed model's arrays in their places (a packed leaf is trainable).
        self.model = unpack_all(params)
        flat, self.treedef = jax.tree_util.tree_flatten_with_path(
            self.model, is_leaf=is_none
        )
        self.paths = [path for path, _ in flat]
        leaves = [leaf for _, leaf in flat]
        self.trained = [is_trainable(leaf) for leaf in leaves]
        self.sizes = [
            int(np.prod(leaf.shape)) if t else 0
            for leaf, t in zip(leaves, self.trained, strict=True)
        ]
        self.described = describe(self.model)
        self.stacks = [
            tuple(leaf.shape[: d.stack_axes]) if t and d is not None else ()
            for leaf, d, t in zip(leaves, self.described, self.trained, strict=True)
        ]
        self.spelled = [path_str(path, relative=True) for path in self.paths]
        self.containers = self._containers(leaves)
        self.slices = [
            self._slice_paths(position) if self.stacks[position] else [spelled]
            for position, spelled in enumerate(self.spelled)
        ]

    def _containers(self, leaves: list) -> list[int | None]:
        """Per stacked leaf: the length of its stack's path, the outermost node
        whose trainable leaves all stack the same layers (`blocks` for
        `blocks.mlp.weight`); `None` for other leaves."""
        under: dict[tuple, list[int]] = {}
        for position, path in enumerate(self.paths):
            if self.trained[position]:
                for length in range(len(path) + 1):
                    under.setdefault(tuple(path[:length]), []).append(position)

        def stacks_like(position: int, shape: tuple[int, ...]) -> bool:
            leaf, described = leaves[position], self.described[position]
            if described is None:  # not described: leading axes of the stack's shape
                return tuple(leaf.shape[: len(shape)]) == shape
            return self.stacks[position] == shape

        out: list[int | None] = []
        for position, path in enumerate(self.paths):
            shape = self.stacks[position]
            if not shape:
                out.append(None)
                continue
            out.append(
                next(
                    length
                    for length in range(len(path) + 1)
                    if all(stacks_like(j, shape) for j in under[tuple(path[:length])])
                )
            )
        return out

    def _slice_paths(self, position: int) -> list[str]:
        # `blocks.mlp.weight` stacked 4 deep: `blocks[0].mlp.weight`, ...
        path, length = self.paths[position], self.containers[position]
        assert length is not None
        return [
            path_str(
                (*path[:length], *(SequenceKey(int(i)) for i in index), *path[length:]),
                relative=True,
            )
            for index in np.ndindex(*self.stacks[position])
        ]

    def expand(self, flags: list) -> list[list]:
        """Per leaf, per slice: a leaf's one value repeated over its slices."""
        return [
            list(f) if isinstance(f, tuple) else [f] * len(slices)
            for f, slices in zip(flags, self.slices, strict=True)
        ]


def _typed_nodes(tree: Any, types: tuple[type, ...]) -> list[tuple]:
    """The paths of the nodes of `tree` that are instances of `types` (nested too)."""
    found: list[tuple] = []

    def visit(node: Any, prefix: tuple) -> None:
        flat = jax.tree_util.tree_flatten_with_path(
            node, is_leaf=lambda x: x is not node and isinstance(x, types)
        )[0]
        for path, child in flat:
            if isinstance(child, types) and child is not node:
                found.append((*prefix, *path))
                visit(child, (*prefix, *path))

    if isinstance(tree, types):
        found.append(())
    visit(tree, ())
    return found


def _in_layer(select: InLayer, leaves: _Leaves) -> list[bool]:
    prefixes = set(_typed_nodes(leaves.model, select.types))
    if select.field is not None:
        fields = {(*p, GetAttrKey(select.field)) for p in prefixes}
        return [tuple(path) in fields for path in leaves.paths]
    return [
        any(tuple(path[:n]) in prefixes for n in range(len(path) + 1))
        for path in leaves.paths
    ]


@no_type_check
def _selection(select, params, leaves: _Leaves, what) -> list:
    """Per leaf, which of its slices `select` takes (before first-match-wins): a
    bool for the whole leaf, or per slice of a stack, a tuple of bools."""
    if isinstance(select, tuple):
        parts = [leaves.expand(_selection(s, params, leaves, what)) for s in select]
        if not parts:
            return [False] * len(leaves.paths)
        return [
            tuple(map(any, zip(*flags, strict=True)))
            for flags in zip(*parts, strict=True)
        ]
    if isinstance(select, str):
        # A stack's slice is taken where the pattern finds its path as a layer
        # (`blocks[3].mlp.weight`) or the stack's (`blocks.mlp.weight`).
        pattern = re.compile(select)
        return [
            pattern.search(spelled) is not None
            or tuple(pattern.search(s) is not None for s in slices)
            for spelled, slices in zip(leaves.spelled, leaves.slices, strict=True)
        ]
    if isinstance(select, type):
        select = InLayer(types=(select,))
    if isinstance(select, InLayer):
        return _in_layer(select, leaves)
    resolved = resolve_filter(select, unpack_all(params), what=what)
    return [bool(flag) for flag in jax.tree.leaves(resolved, is_leaf=is_none)]


def _layer_ids(decay: LayerDecay, leaves: _Leaves) -> tuple[list[list], int]:
    """Per trained leaf, per slice: its layer; and the number of the last layer."""
    if decay.layer_of is not None:
        ids = [
            [int(decay.layer_of(s)) for s in slices] if t else [None]
            for slices, t in zip(leaves.slices, leaves.trained, strict=True)
        ]
        return ids, max((i for row in ids for i in row if i is not None), default=0)
    # The lists of layers (`blocks[i]`) and the stacks (`blocks`, stacked).
    containers: dict[str, set[int]] = {}
    stacks: dict[str, tuple] = {}
    where: list[list[int] | None] = []
    names: list[str | None] = []
    for position, (path, t) in enumerate(
        zip(leaves.paths, leaves.trained, strict=True)
    ):
        index = next(
            (i for i, key in enumerate(path) if isinstance(key, SequenceKey)), None
        )
        length = leaves.containers[position]
        if t and length is not None and (index is None or index >= length):
            name = path_str(path[:length], relative=True)
            stacks[name] = tuple(path[:length])
            indices = list(range(len(leaves.slices[position])))
        elif t and index is not None:
            name = path_str(path[:index], relative=True)
            indices = [path[index].idx] * len(leaves.slices[position])
        else:
            names.append(None)
            where.append(None)
            continue
        names.append(name)
        where.append(indices)
        containers.setdefault(name, set()).update(indices)
    if decay.layers is not None:
        chosen = decay.layers
        if chosen not in containers:
            raise ValueError(
                f"layer_decay(layers={chosen!r}): the model has no list or stack of "
                f"layers at that path; it has {sorted(containers) or 'none'}."
            )
    elif containers:
        chosen = max(containers, key=lambda c: len(containers[c]))
    else:
        raise ValueError(
            "layer_decay found no list of layers in the model (a path like "
            "`blocks[i]`) and no stack of layers (`eqx.filter_vmap` of a known "
            "layer, or stack axes given with `eqopt.with_stack_axes`): give "
            "`layers=` the path of the list, or `layer_of=` a function from a "
            "leaf's path to its layer."
        )
    # Entry k of the list (slice k of the stack) is layer k + 1; the leaves
    # after it are layer n.
    n = max(containers[chosen]) + 2
    inside = stacks.get(chosen)
    ids: list[list] = []
    seen_layers = False
    for position, (t, name, indices) in enumerate(
        zip(leaves.trained, names, where, strict=True)
    ):
        path = leaves.paths[position]
        if not t:
            ids.append([None])
        elif name == chosen and indices is not None:
            seen_layers = True
            ids.append([i + 1 for i in indices])
        elif inside is not None and tuple(path[: len(inside)]) == inside:
            raise InputError(
                f"layer_decay: {leaves.spelled[position]} is inside the stack of "
                f"layers {chosen} but has no stack axes: say how many it has with "
                "`eqopt.with_stack_axes`."
            )
        else:
            layer = getattr(leaves.described[position], "layer", None)
            embedding = layer is not None and issubclass(layer, eqx.nn.Embedding)
            ids.append([0 if embedding or not seen_layers else n])
    return ids, n


@no_type_check
def resolve(
    groups: tuple[Group, ...],
    decay: LayerDecay | None,
    params: Any,
    strict: bool,
    frozen: Any | None,
) -> Assignment:
    """The `Assignment` of `params`' leaves: first match wins, then the default group.

    A stack of layers is its layers: each slice goes to the first group that
    takes it, and with layer decay gets its own layer. Warns for a group that
    selects nothing; raises for unmatched leaves with `strict`, for a
    multiplier or override on a leaf `frozen` selects, and for a stack whose
    slices would run in different branches.
    """
    leaves = _Leaves(params)
    names = tuple(g.name for g in groups) + (DEFAULT,)
    default = len(groups)
    assigned: list[list] = [
        [default] * len(slices) if t else [None]
        for slices, t in zip(leaves.slices, leaves.trained, strict=True)
    ]
    for index, group in enumerate(groups):
        flags = leaves.expand(
            _selection(
                group.select, params, leaves, f"filter spec of group {group.name!r}"
            )
        )
        took = matched = 0
        earlier = set()
        for position, row in enumerate(flags):
            if not leaves.trained[position]:
                continue
            for k, flag in enumerate(row):
                if not flag:
                    continue
                matched += 1
                if assigned[position][k] == default:
                    assigned[position][k] = index
                    took += 1
                else:
                    earlier.add(names[assigned[position][k]])
        if not took:
            why = (
                f"every parameter it matches went to an earlier group ({', '.join(sorted(earlier))})"
                if matched
                else "it matches no trainable parameter"
            )
            warnings.warn(
                f"param_groups: group {group.name!r} ({_describe(group.select)}) selects "
                f"nothing: {why}.",
                UserWarning,
                stacklevel=outside_eqopt(),
            )
    unmatched = [
        s
        for row, slices in zip(assigned, leaves.slices, strict=True)
        for g, s in zip(row, slices, strict=False)
        if g == default
    ]
    if strict and unmatched:
        shown = ", ".join(unmatched[:8]) + (", ..." if len(unmatched) > 8 else "")
        raise InputError(
            f"param_groups(strict=True): {len(unmatched)} parameters are in no group: "
            f"{shown}. Add a group for them, or pass strict=False to put them in the "
            "default group."
        )
    for position, row in enumerate(assigned):
        branches = {
            groups[g].name if g != default and groups[g].structural else DEFAULT
            for g in row
            if g is not None
        }
        if len(branches) > 1:
            raise InputError(
                f"param_groups: the slices of the stack of layers "
                f"{leaves.spelled[position]} are in groups that run different "
                f"optimisers ({', '.join(sorted(branches))}): a group with its own "
                "optimiser or overrides takes whole stacks; select the stack's "
                "path, or give the group multipliers only."
            )
    if frozen is not None:
        flat = jax.tree.leaves(frozen, is_leaf=is_none)
        for position, row in enumerate(assigned):
            if not flat[position]:
                continue
            for g in row:
                if g is None or g == default:
                    continue
                group = groups[g]
                if group.lr_mult != 1 or group.wd_mult != 1 or group.structural:
                    raise InputError(
                        f"param_groups: group {group.name!r} sets multipliers or "
                        f"overrides on {leaves.spelled[position]}, which the "
                        "optimiser freezes: take it out of the group or unfreeze it."
                    )
    layers: list[list] = [[None]] * len(leaves.paths)
    n_layers = None
    if decay is not None:
        layers, n_layers = _layer_ids(decay, leaves)
    return Assignment.make(
        treedef=leaves.treedef,
        names=names,
        groups=tuple(_compress(row) for row in assigned),
        layers=tuple(_compress(row) for row in layers),
        n_layers=n_layers,
        paths=tuple(
            tuple(slices) if stack else slices[0]
            for slices, stack in zip(leaves.slices, leaves.stacks, strict=True)
        ),
        sizes=tuple(leaves.sizes),
        stacks=tuple(leaves.stacks),
    )
