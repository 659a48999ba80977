"""Interoperation with Optax: Optax transforms inside eqopt, eqopt transforms for Optax's clients.

Neither direction imports Optax: an Optax transformation is any object with
`init` and `update` methods, and what `to_optax` returns is a plain NamedTuple of
two functions, which is all Optax's protocol asks for.
"""

from collections.abc import Callable
from typing import Any, NamedTuple, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PyTree

from ._base import (
    AbstractGradientTransformation,
    GradientTransformation,
    OptState,
    Params,
    Updates,
    is_none,
    is_trainable,
)
from ._checks import check_updates
from ._entry import init_entry, update_entry
from ._optax_tuple import OptaxTuple
from ._signatures import accepts_extra_args
from ._typecheck import checked


@checked
class FromOptaxState(eqx.Module, OptaxTuple):
    """The state of a `eqopt.FromOptax`: the Optax transform's own state.

    `inner_state` is what the Optax transform's `init` returned for the trainable
    leaves of the params (a NamedTuple, a tuple of them...), unchanged.
    """

    inner_state: PyTree[Any]


@no_type_check
def _trainable_part(params: Any) -> Any:
    # The trainable leaves, `None` elsewhere: `jax.tree.map` skips `None`, so
    # Optax's functions see only arrays they can train.
    return eqx.filter(params, is_trainable)


@checked
class FromOptax(AbstractGradientTransformation):
    r"""Runs an Optax gradient transformation inside eqopt, on whole models.

    $$ u \mapsto T_\text{optax}\big(\operatorname{filter}(u),\ s,\ \operatorname{filter}(\theta)\big) $$

    Optax's transforms expect a pytree of arrays; an Equinox model also holds
    functions, integers, strings. This wrapper hands the Optax transform only the
    trainable leaves (inexact arrays, with `None` in place of every other leaf,
    which `jax.tree.map` skips), and puts the result back in the model's
    structure. Stateful transforms work: the Optax state is kept, unchanged, in
    `eqopt.FromOptaxState`. Extra keyword arguments (`value`, `grad`,
    `value_fn`...) are forwarded when the Optax `update` accepts `**kwargs` (as
    `GradientTransformationExtraArgs` does) and dropped otherwise.

    A gradient of `None` at a trainable leaf (a leaf not differentiated) is given
    to the Optax transform as zeros, since it needs the same structure at every
    step, and comes back as `None`. With params the zeros have the param's shape;
    without, such a gradient is an error.

    The Optax transform is opaque: its hyperparameters live in closures, so they
    are not leaves (changing one means building a new transform), and the
    wrapper is not declared elementwise.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `transform`: an Optax `GradientTransformation` (any object with `init` and
        `update` methods).

    !!! example

        ```python
        import optax

        opt = eqopt.chain(eqopt.clip_by_global_norm(1.0), eqopt.from_optax(optax.adam(1e-3)))
        state = opt.init(model)  # a whole Equinox model
        ```
    """

    transform: Any
    forwards_extra_args: bool = eqx.field(static=True)

    def __init__(self, transform: Any):
        if not (
            callable(getattr(transform, "init", None))
            and callable(getattr(transform, "update", None))
        ):
            raise TypeError(
                "`from_optax` takes an Optax GradientTransformation (an object with "
                f"`init` and `update` methods), got {type(transform).__name__}."
            )
        self.transform = transform
        self.forwards_extra_args = accepts_extra_args(transform.update)

    @property
    def elementwise(self) -> bool:
        return False

    @init_entry
    def init(self, params: Params) -> FromOptaxState:
        return FromOptaxState(inner_state=self.transform.init(_trainable_part(params)))

    @update_entry
    def update(
        self,
        updates: Updates,
        state: FromOptaxState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, FromOptaxState]:
        trainable = None
        inner_updates = updates
        if params is not None:
            check_updates(updates, params)
            trainable = _trainable_part(params)
            inner_updates = jax.tree.map(
                lambda u, p: jnp.zeros_like(p) if u is None and p is not None else u,
                updates,
                trainable,
                is_leaf=is_none,
            )
        if self.forwards_extra_args:
            new_updates, inner_state = self.transform.update(
                inner_updates, state.inner_state, trainable, **extra_args
            )
        else:
            new_updates, inner_state = self.transform.update(
                inner_updates, state.inner_state, trainable
            )
        # `None` stays `None`, where the gradient was absent; an output not shaped
        # like the updates (a measurement, from Optax's `measure_with_ema`) is
        # passed on as it is.
        if jax.tree.structure(new_updates, is_leaf=is_none) == jax.tree.structure(
            updates, is_leaf=is_none
        ):
            new_updates = jax.tree.map(
                lambda u, new: None if u is None else new,
                updates,
                new_updates,
                is_leaf=is_none,
            )
        return new_updates, FromOptaxState(inner_state=inner_state)


@checked
def from_optax(transform: Any) -> FromOptax:
    """Wraps an Optax transformation so that it runs in eqopt on whole models.

    Builds a `eqopt.FromOptax`, which documents the behaviour. An Optax
    transformation given to eqopt's combinators (`chain`, `masked`,
    `partition`...) is wrapped this way for you.

    **Arguments:**

    - `transform`: an Optax `GradientTransformation`.

    **Returns:**

    A `eqopt.FromOptax`.
    """
    return FromOptax(transform)


class OptaxTransformation(NamedTuple):
    """An `(init, update)` pair of plain functions: Optax's protocol, from `eqopt.to_optax`.

    The two functions close over an eqopt transform. The pair holds no arrays in
    its own pytree structure (its leaves are the two functions), so it can be a
    static attribute (Flax NNX's `Optimizer`, Flax's `TrainState`) and is accepted
    wherever Optax expects a `GradientTransformation`.
    """

    init: Callable[..., Any]
    update: Callable[..., Any]


@checked
def to_optax(transform: Any) -> OptaxTransformation:
    """Returns an object with Optax's protocol that runs an eqopt transform.

    For libraries that expect an Optax `GradientTransformation` and store it
    where arrays are not allowed: Flax NNX's `nnx.Optimizer` keeps its `tx` as a
    static attribute, and refuses an eqopt transform because its hyperparameters
    are array leaves. The result is an `eqopt.OptaxTransformation`: a
    NamedTuple of an `init` and an `update` function (forwarding extra keyword
    arguments) that close over the transform. Its states are eqopt's own.

    Because the hyperparameters are then constants inside closures, a changed
    learning rate needs a new `to_optax(...)` (and a new compilation). To change
    one during training, use `eqopt.inject_hyperparams` and set
    `state.hyperparams[...]`, as with Optax.

    **Arguments:**

    - `transform`: an eqopt transform (or any object with `init` and `update`).

    **Returns:**

    An `eqopt.OptaxTransformation`.

    !!! example "Flax NNX"

        ```python
        from flax import nnx

        model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, eqopt.to_optax(eqopt.adam(1e-3)), wrt=nnx.Param)
        ```
    """
    transform = as_transform(transform)

    def init(params: Params) -> OptState:
        return transform.init(params)

    def update(
        updates: Updates,
        state: OptState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, OptState]:
        return transform.update(updates, state, params, **extra_args)

    return OptaxTransformation(init=init, update=update)


def as_transform(transform: Any) -> AbstractGradientTransformation:
    """Accepts an eqopt transform, or wraps any object with `init` and `update`.

    An Optax transformation is wrapped with `eqopt.from_optax`, so that it
    sees only the trainable leaves of a whole Equinox model; any other object
    with `init` and `update` is wrapped in `eqopt.GradientTransformation`.
    """
    if isinstance(transform, AbstractGradientTransformation):
        return transform
    if type(transform).__module__.split(".")[0] == "optax":
        # An Optax transform expects a tree of arrays; `from_optax` gives it the
        # trainable leaves of a whole model.
        return FromOptax(transform)
    if callable(getattr(transform, "init", None)) and callable(
        getattr(transform, "update", None)
    ):
        return GradientTransformation(transform.init, transform.update)
    raise TypeError(
        f"Expected a gradient transformation, got {type(transform).__name__}."
    )
