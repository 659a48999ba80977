"""Optax's typing aliases, for code that annotates with them."""

from collections.abc import Callable
from typing import TypeAlias

from ._base import OptState, Params, Updates
from ._filters import FilterSpec
from ._hyper import Schedule as Schedule

#: Optax's type of an `init` function.
TransformInitFn: TypeAlias = Callable[[Params], OptState]
#: Optax's type of an `update` function.
TransformUpdateFn: TypeAlias = Callable[
    [Updates, OptState, Params | None], tuple[Updates, OptState]
]
#: Optax's type of an `update` function taking extra keyword arguments.
TransformUpdateExtraArgsFn: TypeAlias = Callable[..., tuple[Updates, OptState]]
#: Optax's type of a mask. In eqopt a mask is an Equinox filter spec: a callable is
#: applied per leaf, never to the whole params.
MaskOrFn: TypeAlias = FilterSpec | None
