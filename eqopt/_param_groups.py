"""Parameter groups, the transform: `eqopt.ParamGroups` and `eqopt.param_groups`.

Groups that only set multipliers (`lr_mult`, `wd_mult`, layer decay) keep the
optimiser one optimiser with one state: for each call, its
`eqopt.ScaleByLearningRate` and `eqopt.AddDecayedWeights` steps hold the
per-leaf factors (`_with_scales`, `eqopt._leaf_scales`), arrays kept in the
groups' state, so inputs of the compiled step. Groups that override a hyperparameter or bring their own
optimiser are branches of an `eqopt.Partition` (the default group is the
branch `"default"`), each branch with the multipliers too.
"""

import dataclasses
import functools
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax

from ._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    OptState,
    Params,
    Updates,
)
from ._combine import Partition
from ._entry import init_entry, update_entry
from ._groups import DEFAULT, Group, LayerDecay
from ._groups_resolve import Assignment, resolve
from ._hyper import modules
from ._hyperparameters import override
from ._interop import as_transform
from ._leaf_scales import LeafScales
from ._transform.basic import ScaleByLearningRate
from ._transform.decay import AddDecayedWeights
from ._typecheck import checked
from ._wrappers.inject import _AbstractInjectHyperparams


def _names_of(module: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(module)}


class _ScaledFactory:
    """An injected optimiser's factory whose optimiser gets the groups' multipliers."""

    def __init__(self, factory: Any, lr: LeafScales | None, wd: LeafScales | None):
        functools.update_wrapper(self, factory)
        self.factory, self.lr, self.wd = factory, lr, wd

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _with_scales(
            as_transform(self.factory(*args, **kwargs)), self.lr, self.wd
        )


def _is_scaled_step(x: Any) -> bool:
    return isinstance(
        x, (ScaleByLearningRate, AddDecayedWeights, _AbstractInjectHyperparams)
    )


def _with_scales(transform: Any, lr: LeafScales | None, wd: LeafScales | None) -> Any:
    """`transform` with the per-leaf multipliers on its learning-rate and decay steps."""

    def rewrite(node: Any) -> Any:
        if isinstance(node, ScaleByLearningRate) and lr is not None:
            return dataclasses.replace(node, scales=lr)
        if isinstance(node, AddDecayedWeights) and wd is not None:
            return dataclasses.replace(node, scales=wd)
        if isinstance(node, _AbstractInjectHyperparams):
            factory = _ScaledFactory(node.inner_factory, lr, wd)
            return eqx.tree_at(lambda n: n.inner_factory, node, factory)
        return node

    return jax.tree.map(rewrite, transform, is_leaf=_is_scaled_step)


class GroupRow(NamedTuple):
    """A group's leaves (in one layer, with layer decay) and their multipliers."""

    group: str
    layer: int | None
    label: str  # the branch that runs them: `"default"` or the group's name
    paths: tuple[str, ...]
    size: int
    lr_mult: float
    wd_mult: float

    @property
    def key(self) -> str:
        """The row's name in `eqopt.current_hyperparams`: `"head"`, `"default.layer3"`."""
        return self.group if self.layer is None else f"{self.group}.layer{self.layer}"


@checked
class ParamGroupsState(eqx.Module):
    """The state of `eqopt.ParamGroups`.

    `inner` is the optimiser's state (a `eqopt.PartitionState` keyed by branch
    when a group overrides a hyperparameter); `lr_scales` and `wd_scales` hold
    each leaf's learning-rate and weight-decay multiplier (arrays, one per
    distinct multiplier, or one per slice of a stack of layers; `None` when
    every multiplier is 1), inputs of the compiled step; `assignment`, static,
    records each leaf's group and layer, resolved at `init`.
    """

    inner: OptState
    lr_scales: LeafScales | None
    wd_scales: LeafScales | None
    assignment: Assignment = eqx.field(static=True)


@checked
class ParamGroups(AbstractWrapper):
    """An optimiser with parameter groups: multipliers and overrides by path or layer type.

    Made by `eqopt.param_groups`, whose docstring says it all.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.
    """

    optimiser: AbstractGradientTransformation
    groups: tuple[Group, ...]
    branches: dict[str, AbstractGradientTransformation]
    layer_decay: LayerDecay | None
    strict: bool = eqx.field(static=True)

    def __init__(
        self,
        optimiser: Any,
        groups: Sequence[Group] = (),
        layer_decay: LayerDecay | None = None,
        strict: bool = False,
    ):
        self.optimiser = as_transform(optimiser)
        self.groups = tuple(groups)
        self.layer_decay = layer_decay
        self.strict = strict
        names = [g.name for g in self.groups]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(
                f"param_groups: the group names {repeated} are used twice: give each "
                "group its own `name=`."
            )
        branches = {}
        for group in self.groups:
            base = (
                self.optimiser
                if group.optimiser is None
                else as_transform(group.optimiser)
            )
            if group.structural:
                # By the keys `eqopt.current_hyperparams` reports (`_hyperparameters.py`).
                overridden = override(
                    base,
                    group.hyperparams,
                    f"param_groups: group {group.name!r}",
                    hyperparameter_parts,
                )
                if group.name == DEFAULT:
                    raise ValueError(
                        f"param_groups: a group that overrides hyperparameters cannot be "
                        f"named {DEFAULT!r}: that is the group of the unselected leaves."
                    )
                branches[group.name] = overridden
        self.branches = branches
        everything = [self.optimiser, *branches.values()]
        wants_lr = layer_decay is not None or any(g.lr_mult != 1 for g in self.groups)
        wants_wd = any(g.wd_mult != 1 for g in self.groups)
        for wanted, kind, name in (
            (wants_lr, ScaleByLearningRate, "lr_mult"),
            (wants_wd, AddDecayedWeights, "wd_mult"),
        ):
            if wanted and not any(
                isinstance(m, (kind, _AbstractInjectHyperparams))
                for t in everything
                for m in modules(t)
            ):
                raise ValueError(
                    f"param_groups: `{name}` multiplies the rate of the optimiser's "
                    f"`{kind.__name__}` step, and it has none: override the "
                    "hyperparameter in the group instead "
                    f"(`Group(..., {'learning_rate' if name == 'lr_mult' else 'weight_decay'}=...)`)."
                )
        if wants_lr and any(
            not isinstance(m, (ScaleByLearningRate, Partition))
            and "learning_rate" in _names_of(m)
            for t in everything
            for m in modules(t)
        ):
            raise ValueError(
                "param_groups: this optimiser uses its learning rate beyond a "
                "`ScaleByLearningRate` step, so `lr_mult` and layer decay would scale "
                "only part of it: override `learning_rate=` in each group instead."
            )

    @property
    def elementwise(self) -> bool:
        return False

    @property
    def runs_on_buffers(self) -> bool:
        return not self.branches and self.optimiser.runs_on_buffers

    @property
    def handles_packed(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return not self.branches

    @property
    def inner(self) -> AbstractGradientTransformation:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.optimiser

    def _label(self, name: str) -> str:
        return name if name in self.branches else DEFAULT

    def _multipliers(
        self, assignment: Assignment, group: int, layer: int | None
    ) -> tuple[float, float]:
        """The one formula of a group's multipliers on a layer: the learning rate's
        `lr_mult * rate ** (n - layer)`, the weight decay's `wd_mult`."""
        spec = next((g for g in self.groups if g.name == assignment.names[group]), None)
        decay, n = self.layer_decay, assignment.n_layers
        by_layer = (
            1.0
            if decay is None or layer is None or n is None
            else decay.rate ** (n - layer)
        )
        if spec is None:  # the default group
            return by_layer, 1.0
        return spec.lr_mult * by_layer, spec.wd_mult

    def multipliers(self, assignment: Assignment) -> tuple[list, list]:
        """Per leaf position: its learning-rate and weight-decay multipliers (`None`
        at untrained leaves; for a stack of layers whose slices differ, one per
        slice, as nested tuples over the stack axes)."""
        per_leaf: list[tuple[list, list]] = [
            ([], []) for _ in range(len(assignment.groups))
        ]
        for position, _, group, layer, _, _ in assignment.units():
            lr_mult, wd_mult = self._multipliers(assignment, group, layer)
            per_leaf[position][0].append(lr_mult)
            per_leaf[position][1].append(wd_mult)
        lr_factors, wd_factors = [], []
        for position, (lr, wd) in enumerate(per_leaf):
            stack = assignment.stacks[position]
            lr_factors.append(_factor(lr, stack))
            wd_factors.append(_factor(wd, stack))
        return lr_factors, wd_factors

    def scales(
        self, assignment: Assignment
    ) -> tuple[LeafScales | None, LeafScales | None]:
        """The multipliers as the state keeps them: `None` where all are 1."""
        return tuple(  # pyright: ignore[reportReturnType]
            None
            if set(factors) <= {None, 1.0}
            else LeafScales.build(assignment.treedef, tuple(factors))
            for factors in self.multipliers(assignment)
        )

    def running(self, state: ParamGroupsState) -> AbstractGradientTransformation:
        """The transform that runs: the optimiser (or the partition of its branches)
        with each leaf's multipliers, read from `state`."""
        assignment, lr, wd = state.assignment, state.lr_scales, state.wd_scales
        return self._inner(assignment, lr, wd)

    def _inner(
        self,
        assignment: Assignment,
        lr: LeafScales | None,
        wd: LeafScales | None,
    ) -> AbstractGradientTransformation:
        if not self.branches:
            return _with_scales(self.optimiser, lr, wd)
        used = {
            self._label(assignment.names[g]) for g in assignment.groups if g is not None
        }
        transforms: dict[Hashable, Any] = {
            label: _with_scales(transform, lr, wd)
            for label, transform in ((DEFAULT, self.optimiser), *self.branches.items())
            if label in used
        }
        return Partition(transforms, assignment.labels(self._label))

    @init_entry
    def init(self, params: Params) -> ParamGroupsState:
        frozen = (
            self.optimiser.frozen_selection(params) if self.optimiser.freezes else None
        )
        assignment = resolve(self.groups, self.layer_decay, params, self.strict, frozen)
        lr, wd = self.scales(assignment)
        return ParamGroupsState(
            inner=self._inner(assignment, lr, wd).init(params),
            lr_scales=lr,
            wd_scales=wd,
            assignment=assignment,
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ParamGroupsState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ParamGroupsState]:
        new_updates, inner_state = self.running(state).update(
            updates, state.inner, params, **extra_args
        )
        return new_updates, dataclasses.replace(state, inner=inner_state)

    def rows(self, assignment: Assignment) -> tuple[GroupRow, ...]:
        """Per group (per group and layer, with layer decay): its leaves and multipliers,
        in the groups' order, the default group last. A stack of layers is its
        layers: each slice is a path (`blocks[3].mlp.weight`) in its group and layer."""
        collected: dict[tuple[int, int], tuple[list[str], int]] = {}
        for _, _, group, layer, path, size in assignment.units():
            paths, total = collected.get((group, layer or 0), ([], 0))
            collected[(group, layer or 0)] = ([*paths, path], total + size)
        out = []
        for (group, layer), (paths, size) in sorted(collected.items()):
            name = assignment.names[group]
            layer_of = None if self.layer_decay is None else layer
            lr_mult, wd_mult = self._multipliers(assignment, group, layer_of)
            out.append(
                GroupRow(
                    group=name,
                    layer=layer_of,
                    label=self._label(name),
                    paths=tuple(paths),
                    size=size,
                    lr_mult=lr_mult,
                    wd_mult=wd_mult,
                )
            )
        return tuple(out)


def _factor(values: list[float], stack: tuple[int, ...]) -> Any:
    # A leaf's one multiplier, or (a stack whose slices differ) its slices'
    # multipliers as nested tuples over the stack axes; `None` for no slice.
    if not values:
        return None
    if len(set(values)) == 1:
        return values[0]

    def nest(flat: list[float], shape: tuple[int, ...]) -> tuple:
        if len(shape) == 1:
            return tuple(flat)
        step = len(flat) // shape[0]
        return tuple(
            nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])
        )

    return nest(values, stack)


@checked
def param_groups(
    optimiser: Any,
    groups: Sequence[Group] = (),
    *,
    layer_decay: LayerDecay | None = None,
    strict: bool = False,
) -> ParamGroups:
    r"""Parameter groups: learning-rate and weight-decay multipliers, overrides, layer decay.

    Each trainable leaf goes to the first group whose `select` takes it (see
    `eqopt.Group`: a regular expression over its path, a layer type, a filter
    spec), and to the default group (named `"default"`: the optimiser as
    given) when none does. A group's `lr_mult` multiplies the learning rate
    (the schedule's value at each step) on its leaves, `wd_mult` the weight
    decay; `layer_decay` (`eqopt.layer_decay`) multiplies the rate of
    layer $i$ of $n$ by $\text{rate}^{\,n-i}$, in every group. The rate in use
    on a leaf is the optimiser's rate times its multipliers: in AdamW,
    $u = -\eta\, m_\eta\, (\hat m / (\sqrt{\hat v} + \epsilon) + \lambda\, m_\lambda\, \theta)$,
    as PyTorch's parameter groups (Paszke et al., NeurIPS 2019) with per-group
    `lr` and `weight_decay` give it.

    Multipliers keep one optimiser with one state (the multipliers are arrays
    in the state, inputs of the compiled step: per leaf, per segment of a
    packed or bucketed buffer, or per slice of a stack of layers). A stack of
    layers (`eqx.filter_vmap`) is its layers: each slice is matched by its
    path as a layer (`blocks[3].mlp.weight`) and gets its own group and layer,
    so the numbers are those of the same blocks in a list; a group that
    overrides a hyperparameter or brings an optimiser takes whole stacks. A group that overrides a hyperparameter (`b2=0.95`,
    `learning_rate=schedule`) or brings its own `optimiser=` is a branch of an
    `eqopt.partition` underneath, with its own state.

    The groups are resolved at `init` (a group that selects nothing warns,
    naming it) and kept in the state, so a restored checkpoint has the same
    groups. `eqopt.param_groups_report(opt, state)` prints who got what; `eqopt.current_hyperparams`
    gives each group's rates (`"head.learning_rate"`).

    **Arguments:**

    - `optimiser`: the optimiser (any eqopt transform or Optax-style pair).
    - `groups`: the groups, first match wins.
    - `layer_decay`: optional `eqopt.LayerDecay`.
    - `strict`: a leaf that no group selects is an error listing the paths
      (default: it goes to the default group).

    **Returns:** an `eqopt.ParamGroups`.

    **Raises:** `ValueError` at construction for an invalid regular expression,
    a negative multiplier, two groups of one name, an override of a
    hyperparameter the optimiser does not have (or of a name several share,
    or of a schedule's argument), or a multiplier the optimiser has no step
    for; at `init`, for a multiplier on a leaf the optimiser
    freezes and, with `strict`, for unmatched leaves.

    !!! example

        ```python
        schedule = eqopt.cosine_decay_schedule(1e-3, decay_steps=1000)
        opt = eqopt.param_groups(
            eqopt.adamw(learning_rate=schedule, weight_decay=0.05),
            groups=[
                eqopt.Group(select=r"^layers\[2\]\.", name="head", lr_mult=10.0),
                eqopt.Group(
                    select=eqopt.in_layer(eqx.nn.Linear, field="bias"),
                    name="no_decay",
                    wd_mult=0.0,
                ),
            ],
            layer_decay=eqopt.layer_decay(0.75),
        )
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        print(eqopt.param_groups_report(opt, state))  # who got what, the rates now
        eqopt.current_hyperparams(opt, state)["head.layer3.learning_rate"]
        ```
    """
    return ParamGroups(optimiser, groups, layer_decay=layer_decay, strict=strict)


def hyperparameter_parts(
    node: Any, state: Any, path: tuple[str, ...]
) -> list[tuple[str | None, Any, Any, tuple | None]] | None:
    """The parts of `eqopt.ParamGroups` for `eqopt._hyperparameters.describe`
    (`None` for any other transform): with a state, the optimiser that runs
    (the partition of its branches when a group overrides a hyperparameter),
    with none, the optimiser and the branches (`"default"` and each group's);
    neither adds a name of its own to the keys."""
    del path
    if not isinstance(node, ParamGroups):
        return None
    if state is not None:
        return [(None, node.running(state), state.inner, None)]
    if not node.branches:
        return [(None, node.optimiser, None, (("attr", "optimiser"),))]
    return [
        (DEFAULT, node.optimiser, None, (("attr", "optimiser"),)),
        *(
            (name, branch, None, (("attr", "branches"), ("item", name)))
            for name, branch in node.branches.items()
        ),
    ]
