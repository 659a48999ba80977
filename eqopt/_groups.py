"""Parameter groups, the configuration: which leaves a group selects, and layer decay.

`Group` says what a group selects (a regular expression over the leaf's
path, an Equinox layer type, `in_layer`, a filter spec, or a tuple of these)
and what it sets (multipliers, hyperparameter overrides, another optimiser);
`LayerDecay` how the layers' rates decay. `eqopt._groups_resolve` assigns
each trainable leaf (each layer of a stack) to its group and layer, at
`init`. The transform is `eqopt.ParamGroups` (`_param_groups.py`).
"""

import math
import re
from collections.abc import Callable
from typing import Any

import equinox as eqx
import numpy as np

from ._typecheck import checked

#: The name of the group of the leaves that no group selects.
DEFAULT = "default"


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
    - `**hyperparams`: overrides of the optimiser's hyperparameters, by the
      keys `eqopt.current_hyperparams` reports: the bare name where one
      hyperparameter has it (`b2=0.95`, `learning_rate=schedule`,
      `weight_decay=0.0`), the full key always
      (`**{"muon.scale_by_learning_rate.learning_rate": 0.02}`). A name that
      several hyperparameters share, or an argument of a schedule (`alpha`),
      is refused: give the full key, or a new schedule.

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

    A stack of layers (blocks built with `eqx.filter_vmap`, run with
    `lax.scan`) is a list of layers here: slice $k$ of the stack (flattened
    over nested stack axes) is layer $k+1$, and `layer_of` is given each
    slice's path (`blocks[3].mlp.weight`). A leaf inside the stack that eqopt
    cannot tell is stacked (a bare array) is an error until
    `eqopt.with_stack_axes` says so.
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
