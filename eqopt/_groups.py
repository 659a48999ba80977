"""Parameter groups, the configuration: which leaves a group selects, and layer decay.

`Group` says what a group selects (a regular expression over the leaf's
path, an Equinox layer type, `in_layer`, a filter spec, or a tuple of these)
and what it sets (multipliers, hyperparameter overrides, another optimiser).
`resolve` assigns every trainable leaf of a model to the first group that
selects it (the default group otherwise) and, with `LayerDecay`, to a layer:
the `Assignment`, a static record that the state keeps, so the groups are
resolved once, at `init`. The transform is `eqopt.ParamGroups`
(`_param_groups.py`).
"""

import math
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any, no_type_check

import equinox as eqx
import jax
import numpy as np
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

from ._filters import resolve_filter
from ._fused._pack import Packed, _Static, unpack_all
from ._leaves import InputError, is_none, is_trainable, outside_eqopt
from ._typecheck import checked

#: The name of the group of the leaves that no group selects.
DEFAULT = "default"


@no_type_check
def spell(path: Sequence[Any]) -> str:
    """A leaf's path as groups match it and the report prints it: `blocks[3].mlp.weight`.

    Attributes and string keys of dicts are joined by dots, indices are in brackets.
    """
    text = ""
    for key in path:
        if isinstance(key, GetAttrKey):
            text += f".{key.name}"
        elif isinstance(key, DictKey):
            name = key.key
            text += (
                f".{name}"
                if isinstance(name, str) and name.isidentifier()
                else f"[{name!r}]"
            )
        elif isinstance(key, SequenceKey):
            text += f"[{key.idx}]"
        elif isinstance(key, FlattenedIndexKey):
            text += f"[{key.key}]"
        else:
            text += str(key)
    return text.lstrip(".") or "<root>"


@checked
class InLayer(eqx.Module):
    """Selects the leaves inside any instance of the given layer types.

    Made by `eqopt.in_layer`. With `field`, only that field of the layer:
    `in_layer(eqx.nn.Linear, eqx.nn.Conv, field="bias")` is the bias of every
    linear and convolutional layer.
    """

    types: tuple[type, ...] = eqx.field(static=True)
    field: str | None = eqx.field(default=None, static=True)

    def __str__(self) -> str:
        names = " | ".join(t.__name__ for t in self.types)
        return f"{names}.{self.field}" if self.field else names


@checked
def in_layer(*types: type, field: str | None = None) -> InLayer:
    """A group selector: the leaves of any layer of these types (`field`: only that field).

    A layer type on its own (`eqx.nn.LayerNorm`) selects as `in_layer(eqx.nn.LayerNorm)`.

    !!! example

        ```python
        no_decay = eqopt.Group(
            select=(eqx.nn.LayerNorm, eqx.nn.Embedding,
                    eqopt.in_layer(eqx.nn.Linear, eqx.nn.Conv, field="bias")),
            name="no_decay", wd_mult=0.0,
        )
        ```
    """
    if not types:
        raise ValueError(
            "in_layer needs at least one layer type, e.g. in_layer(eqx.nn.Linear)."
        )
    return InLayer(types=tuple(types), field=field)


def _describe(select: Any) -> str:
    if isinstance(select, str):
        return repr(select)
    if isinstance(select, type):
        return select.__name__
    if isinstance(select, InLayer):
        return str(select)
    if isinstance(select, tuple):
        return " | ".join(_describe(s) for s in select)
    if callable(select):
        name = getattr(select, "__qualname__", type(select).__name__)
        return "a lambda" if "<lambda>" in name else name
    return f"a filter spec ({type(select).__name__})"


def _check_multiplier(group: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise ValueError(
            f"Group {group!r}: `{name}` must be a number, got {type(value).__name__}."
        )
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"Group {group!r}: `{name}` must be finite and >= 0, got {value}."
        )
    return value


@checked
class Group(eqx.Module):
    r"""One parameter group: which leaves, and what they get.

    **Arguments:**

    - `select`: which leaves: a regular expression searched in the leaf's path
      (`r"^head\."`, `r"\.bias$"`; paths are spelled `blocks[3].attn.query.weight`,
      as the report prints them), an Equinox layer type (every leaf of every
      `eqx.nn.LayerNorm`), `eqopt.in_layer(...)` (a field of layers), a filter
      spec (a bool, a per-leaf predicate such as `lambda x: x.ndim <= 1`, or a
      prefix pytree of these), or a tuple of these (their union).
    - `name`: the group's name in the report, errors and
      `eqopt.current_hyperparams`; by default, the selector spelled out.
    - `lr_mult`: multiplies the learning rate (and its schedule) on these leaves.
    - `wd_mult`: multiplies the weight decay on these leaves.
    - `optimiser`: another optimiser for these leaves (Muon on matrices, say).
    - `**hyperparams`: overrides of the optimiser's hyperparameters by name
      (`b2=0.95`, `learning_rate=schedule`, `weight_decay=0.0`).

    Multipliers keep one optimiser with one state; an override or an
    optimiser makes the group a branch of an `eqopt.partition` underneath.

    **The first matching group wins.** Groups are tried in the order given and
    a leaf joins the first whose `select` matches it (leaves that no group
    selects join the group `default`); later groups never see it. So a leaf
    that two rules apply to needs a group of its own, placed first, that says
    both: below, the head's bias gets the head's 10x rate and no weight decay,
    which neither of the two broader groups would give it.

    !!! example

        ```python
        class Classifier(eqx.Module):
            body: eqx.nn.MLP
            norm: eqx.nn.LayerNorm
            head: eqx.nn.Linear

        key1, key2 = jax.random.split(jax.random.key(0))
        model = Classifier(
            eqx.nn.MLP(8, 16, 16, 2, key=key1),
            eqx.nn.LayerNorm(16),
            eqx.nn.Linear(16, 3, key=key2),
        )
        opt = eqopt.param_groups(
            eqopt.adamw(1e-3, weight_decay=0.05),
            groups=[
                eqopt.Group(r"^head\.bias$", name="head_bias", lr_mult=10, wd_mult=0),
                eqopt.Group(r"^head\.", name="head", lr_mult=10),
                eqopt.Group((eqx.nn.LayerNorm, r"\.bias$"), name="no_decay", wd_mult=0),
            ],
        )
        state = opt.init(model)
        print(eqopt.param_groups_report(opt, state))
        ```
    """

    select: Any
    name: str
    lr_mult: float = eqx.field(static=True)
    wd_mult: float = eqx.field(static=True)
    optimiser: Any
    hyperparams: dict[str, Any]

    def __init__(
        self,
        select: Any,
        *,
        name: str | None = None,
        lr_mult: float | int = 1.0,
        wd_mult: float | int = 1.0,
        optimiser: Any = None,
        **hyperparams: Any,
    ):
        if isinstance(select, list):
            select = tuple(select)
        self.select = select
        if name is None:
            name = select if isinstance(select, str) else _describe(select)
        self.name = name
        self.lr_mult = _check_multiplier(self.name, "lr_mult", lr_mult)
        self.wd_mult = _check_multiplier(self.name, "wd_mult", wd_mult)
        self.optimiser = optimiser
        self.hyperparams = dict(hyperparams)
        for pattern in _patterns(select):
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(
                    f"Group {self.name!r}: {pattern!r} is not a valid regular expression "
                    f"({error})."
                ) from None

    @property
    def structural(self) -> bool:
        """Whether the group needs its own optimiser (an override or an optimiser)."""
        return self.optimiser is not None or bool(self.hyperparams)


def _patterns(select: Any) -> list[str]:
    if isinstance(select, str):
        return [select]
    if isinstance(select, tuple):
        return [p for s in select for p in _patterns(s)]
    return []


@checked
class LayerDecay(eqx.Module):
    r"""Layer-wise learning-rate decay: layer $i$ of $n$ gets $\text{rate}^{\,n-i}$.

    Made by `eqopt.layer_decay`; given to `eqopt.param_groups`. The layers
    are the entries of the model's longest list of layers (`blocks[i]`,
    `layers[i]`), or of the list at `layers` (its path, `"encoder.layers"`):
    entry $k$ is layer $k+1$. Leaves before the list in the model's order
    (embeddings; any `eqx.nn.Embedding`) are layer 0, leaves after it (the
    final norm, the head) layer $n$, the last, whose rate is the base rate: as
    in BEiT (Bao et al., *BEiT: BERT Pre-Training of Image Transformers*,
    ICLR 2022) and ELECTRA (Clark et al., ICLR 2020). `layer_of` gives the
    layer of a path instead (an int from 0 to $n$, the largest it returns).
    The multiplier multiplies the group's `lr_mult`.
    """

    rate: float = eqx.field(static=True)
    layers: str | None = eqx.field(default=None, static=True)
    layer_of: Callable[[str], int] | None = eqx.field(default=None, static=True)

    def __check_init__(self):
        if not (0 < self.rate <= 1):
            raise ValueError(f"layer_decay: `rate` must be in (0, 1], got {self.rate}.")


@checked
def layer_decay(
    rate: float | int,
    *,
    layers: str | None = None,
    layer_of: Callable[[str], int] | None = None,
) -> LayerDecay:
    """Layer-wise learning-rate decay for `eqopt.param_groups`: see `eqopt.LayerDecay`.

    !!! example

        ```python
        opt = eqopt.param_groups(
            eqopt.adamw(1e-4, weight_decay=0.05),
            groups=[eqopt.Group(select=eqx.nn.LayerNorm, wd_mult=0.0)],
            layer_decay=eqopt.layer_decay(0.75),
        )
        ```
    """
    return LayerDecay(rate=float(rate), layers=layers, layer_of=layer_of)


class Assignment(_Static):
    """Each leaf's group and layer, resolved once from the model (kept in the state).

    Per position of the model's leaves (`None` counted as a leaf): the index of
    the group in `names` (or `None`, not trained), the layer (or `None`), the
    path and the number of elements.
    """

    __slots__ = ()

    @property
    def treedef(self) -> Any:
        return self._key[0]

    @property
    def names(self) -> tuple[str, ...]:
        return self._key[1]

    @property
    def groups(self) -> tuple[int | None, ...]:
        return self._key[2]

    @property
    def layers(self) -> tuple[int | None, ...]:
        return self._key[3]

    @property
    def n_layers(self) -> int | None:
        return self._key[4]

    @property
    def paths(self) -> tuple[str, ...]:
        return self._key[5]

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._key[6]

    def labels(self, label_of: Callable[[str], str]) -> Any:
        """A tree shaped like the model: each trainable leaf's branch label."""
        leaves = [None if g is None else label_of(self.names[g]) for g in self.groups]
        return jax.tree.unflatten(self.treedef, leaves)


def _model(params: Any) -> tuple[Any, list, list[bool], list[int]]:
    """The model (`None` at packed leaves), its paths, which are trained, their sizes."""
    if isinstance(params, Packed):
        model = params.rest
        flat = jax.tree_util.tree_flatten_with_path(model, is_leaf=is_none)[0]
        trained = [False] * len(flat)
        sizes = [0] * len(flat)
        for slot in params.layout.slots:
            trained[slot.leaf_index] = True
            sizes[slot.leaf_index] = int(np.prod(slot.shape, dtype=np.int64))
    else:
        model = params
        flat = jax.tree_util.tree_flatten_with_path(model, is_leaf=is_none)[0]
        trained = [is_trainable(leaf) for _, leaf in flat]
        sizes = [
            int(np.prod(leaf.shape)) if t else 0
            for (_, leaf), t in zip(flat, trained, strict=True)
        ]
    return model, [path for path, _ in flat], trained, sizes


@no_type_check
def _ancestors(model: Any, path: Sequence[Any]) -> list[tuple[Any, Any]]:
    """The nodes along `path` from the root, each with the key that leaves it."""
    out, node = [], model
    for key in path:
        out.append((node, key))
        try:
            if isinstance(key, GetAttrKey):
                node = getattr(node, key.name)
            elif isinstance(key, (SequenceKey,)):
                node = node[key.idx]
            elif isinstance(key, DictKey):
                node = node[key.key]
            else:
                break
        except (AttributeError, KeyError, IndexError, TypeError):
            break
    return out


def _in_layer(select: InLayer, ancestors: list[tuple[Any, Any]]) -> bool:
    if select.field is None:
        return any(isinstance(node, select.types) for node, _ in ancestors)
    if not ancestors:
        return False
    node, key = ancestors[-1]
    return (
        isinstance(node, select.types)
        and isinstance(key, GetAttrKey)
        and key.name == select.field
    )


@no_type_check
def _selection(select, model, params, paths, spelled, ancestors, what) -> list[bool]:
    """Which leaves `select` takes (before first-match-wins)."""
    if isinstance(select, tuple):
        parts = [
            _selection(s, model, params, paths, spelled, ancestors, what)
            for s in select
        ]
        return (
            [any(flags) for flags in zip(*parts, strict=True)]
            if parts
            else [False] * len(paths)
        )
    if isinstance(select, str):
        pattern = re.compile(select)
        return [pattern.search(text) is not None for text in spelled]
    if isinstance(select, type):
        select = InLayer(types=(select,))
    if isinstance(select, InLayer):
        return [_in_layer(select, chain) for chain in ancestors()]
    resolved = resolve_filter(select, unpack_all(params), what=what)
    return [bool(flag) for flag in jax.tree.leaves(resolved, is_leaf=is_none)]


def _layer_ids(decay: LayerDecay, model, paths, spelled, trained, ancestors):
    """Each trained leaf's layer and the number of the last layer."""
    if decay.layer_of is not None:
        ids = [
            int(decay.layer_of(s)) if t else None
            for s, t in zip(spelled, trained, strict=True)
        ]
        return ids, max((i for i in ids if i is not None), default=0)
    containers: dict[str, set[int]] = {}
    where: list[tuple[str, int] | None] = []
    for path, t in zip(paths, trained, strict=True):
        index = next(
            (i for i, key in enumerate(path) if isinstance(key, SequenceKey)), None
        )
        if not t or index is None:
            where.append(None)
            continue
        container = spell(path[:index])
        where.append((container, path[index].idx))
        containers.setdefault(container, set()).add(path[index].idx)
    if decay.layers is not None:
        chosen = decay.layers
        if chosen not in containers:
            raise ValueError(
                f"layer_decay(layers={chosen!r}): the model has no list of layers at "
                f"that path; its lists are {sorted(containers) or 'none'}."
            )
    elif containers:
        chosen = max(containers, key=lambda c: len(containers[c]))
    else:
        raise ValueError(
            "layer_decay found no list of layers in the model (a path like "
            "`blocks[i]`): give `layers=` the path of the list, or `layer_of=` a "
            "function from a leaf's path to its layer. (Layers stacked into one "
            "array by `eqx.filter_vmap` have no index in their paths.)"
        )
    # Entry k of the list is layer k + 1; the leaves after it are layer n.
    n = max(containers[chosen]) + 2
    ids: list[int | None] = []
    seen_layers = False
    chains = ancestors()
    for position, (t, found) in enumerate(zip(trained, where, strict=True)):
        if not t:
            ids.append(None)
        elif found is not None and found[0] == chosen:
            seen_layers = True
            ids.append(found[1] + 1)
        elif any(isinstance(node, eqx.nn.Embedding) for node, _ in chains[position]):
            ids.append(0)
        else:
            ids.append(n if seen_layers else 0)
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

    Warns for a group that selects nothing; raises for unmatched leaves with
    `strict` and for a multiplier or override on a leaf `frozen` selects.
    """
    model, paths, trained, sizes = _model(params)
    spelled = [spell(path) for path in paths]
    cache: list = []

    def ancestors():
        if not cache:
            cache.append([_ancestors(model, path) for path in paths])
        return cache[0]

    names = tuple(g.name for g in groups) + (DEFAULT,)
    assigned: list[int | None] = [None if not t else len(groups) for t in trained]
    for index, group in enumerate(groups):
        flags = _selection(
            group.select,
            model,
            params,
            paths,
            spelled,
            ancestors,
            f"filter spec of group {group.name!r}",
        )
        took = matched = 0
        earlier = set()
        for position, flag in enumerate(flags):
            if not (flag and trained[position]):
                continue
            matched += 1
            if assigned[position] == len(groups):
                assigned[position] = index
                took += 1
            else:
                earlier.add(names[assigned[position]])
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
    unmatched = [s for s, g in zip(spelled, assigned, strict=True) if g == len(groups)]
    if strict and unmatched:
        shown = ", ".join(unmatched[:8]) + (", ..." if len(unmatched) > 8 else "")
        raise InputError(
            f"param_groups(strict=True): {len(unmatched)} parameters are in no group: "
            f"{shown}. Add a group for them, or pass strict=False to put them in the "
            "default group."
        )
    if frozen is not None:
        flat = jax.tree.leaves(frozen, is_leaf=is_none)
        for position, g in enumerate(assigned):
            if g is None or g == len(groups) or not flat[position]:
                continue
            group = groups[g]
            if group.lr_mult != 1 or group.wd_mult != 1 or group.structural:
                raise InputError(
                    f"param_groups: group {group.name!r} sets multipliers or overrides "
                    f"on {spelled[position]}, which the optimiser freezes: take it out "
                    "of the group or unfreeze it."
                )
    layers: list[int | None] = [None] * len(paths)
    n_layers = None
    if decay is not None:
        layers, n_layers = _layer_ids(decay, model, paths, spelled, trained, ancestors)
    return Assignment.make(
        jax.tree.structure(model, is_leaf=is_none),
        names,
        tuple(assigned),
        tuple(layers),
        n_layers,
        tuple(spelled),
        tuple(sizes),
    )


def layer_multiplier(
    decay: LayerDecay | None, layer: int | None, n: int | None
) -> float:
    """`rate ** (n - layer)`; 1 without layer decay."""
    if decay is None or layer is None or n is None:
        return 1.0
    return decay.rate ** (n - layer)
