"""The gradient-transformation protocol: the interface every transform follows, and its empty state."""

import abc
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, no_type_check

import equinox as eqx
import jax
import jax.core
import numpy as np

from ._entry import init_entry, update_entry
from ._hyper import check_fields
from ._leaves import (
    InexactTree as InexactTree,
    OptState as OptState,
    Params as Params,
    Updates as Updates,
    is_none as is_none,
    is_trainable as is_trainable,
    path_str as path_str,
)
from ._optax_tuple import OptaxTuple
from ._signatures import accepts_extra_args
from ._typecheck import checked

# ---------------------------------------------------------------------------
# The protocol
# ---------------------------------------------------------------------------


class _ScalarRepr:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return self.value if isinstance(self.value, str) else repr(self.value)


def _readable(x: Any) -> Any:
    if eqx.is_array(x) and not isinstance(x, jax.core.Tracer) and x.ndim == 0:
        # NumPy prints the shortest repr for the dtype: 0.9, not 0.8999999761581421.
        return _ScalarRepr(str(np.asarray(x)[()]))
    return x


def pretty(module: eqx.Module) -> str:
    """Pretty-prints a Module with its scalar hyperparameters shown by value."""
    return eqx.tree_pformat(jax.tree.map(_readable, module))


class AbstractGradientTransformation(eqx.Module):
    """The protocol every eqopt transform, wrapper, combinator and optimiser follows.

    A gradient transformation is a pair of pure functions held by a Module whose
    fields are its hyperparameters:

    - `init(params) -> state` builds the state from the parameters;
    - `update(updates, state, params=None, **extra_args) -> (updates, state)`
      maps gradients (or the updates of an earlier transform) to new updates.

    Parameters are any pytree, typically a whole Equinox model: its inexact
    arrays are trained, and every other leaf is left alone (the state holds
    `None` there). Updates are shaped like the parameters with `None` where a
    leaf is not trained, exactly as `eqx.filter_grad` produces gradients.

    Numeric hyperparameters are array leaves of the Module, so the transform can
    be passed into `eqx.filter_jit`, changed with `eqx.tree_at` without
    recompiling, `vmap`ped over and differentiated.

    Every subclass declares the property `elementwise`: `True` when its update
    gives the same result whether leaves are kept apart or concatenated into
    one flat buffer (the property that lets a fused engine merge leaves).

    Transforms hash and compare by identity, so Optax's idioms
    `jax.jit(tx.update)` and a transform as a static argument work; under
    `eqx.filter_jit` their array leaves stay dynamic as for any Module.
    """

    # -- Capabilities -------------------------------------------------------
    # What callers may ask of any transform, read directly (never probed with
    # `getattr`). Each says its default and who reads it; the table in
    # `docs/development.md` ("Capabilities") lists them all.

    #: Whether `init`/`update` take packed params (`eqopt.pack`) as they are.
    #: Otherwise a transform that does not run on buffers sees the unpacked
    #: model, so per-leaf computations stay per leaf. Combinators that only pass
    #: the trees on to their parts set this. Default `False`; read by the
    #: entries' packed adapter (`eqopt/_entry.py`).
    handles_packed: ClassVar[bool] = False

    #: Whether `update`'s `params` have the structure of its `updates`, as they do
    #: for every transform but `eqopt.lookahead` (whose params pair the fast
    #: and slow weights) and a few that take other params. Then every `update`
    #: checks this first, with one short error naming the first place where the
    #: two trees differ. Default `True`; read by the `update` entry.
    params_like_updates: ClassVar[bool] = True

    #: Whether the outermost `init` may give a `eqopt.PerformanceHint` that
    #: many small leaves would run faster bucketed (`eqopt.bucketed` says
    #: no). Default `True`; read by the `init` entry.
    advises_bucketing: ClassVar[bool] = True

    #: Whether this transform freezes leaves for the transforms after it in a
    #: chain (`eqopt.Freeze`, and a chain holding one). Default `False`;
    #: read by `eqopt.Chain`.
    freezes: ClassVar[bool] = False

    #: Whether `update` takes per-example updates (a leading batch axis on
    #: every leaf, as DP-SGD's aggregation does), so its updates are not shaped
    #: like the params. Default `False`; read by `eqopt.Chain`, whose first
    #: part decides.
    per_example_updates: ClassVar[bool] = False

    def frozen_selection(self, tree: Any) -> Any | None:
        """The leaves this transform freezes for the parts after it, or `None`.

        A tree of bools shaped like `tree` (the params, or the updates without
        params) where `freezes` holds; `None` (the default) when nothing is frozen. Read by
        `eqopt.Chain`.
        """
        return None

    def __check_init__(self):
        check_fields(self)

    # Identity, not value: a Module holding arrays has no useful value hash, and
    # `jax.jit(tx.update)` hashes the bound method, hence `tx`.
    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    # Optax's transformations are `(init, update)` pairs, and Optax code unpacks
    # them: `init, update = tx`.
    def __iter__(self) -> Iterator[Callable]:
        return iter((self.init, self.update))

    # ... and index them: `tx[0]` is `init`, `tx[1]` is `update` (a chain's `[i]`
    # is its part).
    def __getitem__(self, index: int) -> Callable:
        return (self.init, self.update)[index]

    @property
    @abc.abstractmethod
    def elementwise(self) -> bool:
        """Whether the update is the same on separate leaves and on their concatenation.

        No default: every transform says. Read by `runs_on_buffers` (its
        default), by combinators (a chain is elementwise when its parts are)
        and by `eqopt.bucketed`.

        Transforms that reduce over a leaf (per-leaf norms, factored moments,
        orthogonalisation) are not elementwise; reductions over the whole tree
        (global-norm clipping) do not break the property.
        """

    @property
    def runs_on_buffers(self) -> bool:
        """Whether the whole update runs on packed buffers, without unpacking.

        Default: `elementwise`.
        Read by the entries' packed adapter, `eqopt.bucketed`, the
        `init` entry's performance hint and the wrappers that pass it on.

        True for elementwise transforms, and for those that do their per-leaf
        part on the buffers themselves: a weight-decay mask selects segments of
        a buffer (`eqopt.AddDecayedWeights`), and a quantised moment of a
        buffer is one quantised array (`eqopt.Quantized`'s
        `packed_blocks`). Otherwise a packed model is unpacked for the
        transform. `eqopt.bucketed` buckets, and the default path hints
        to, only where this holds.
        """
        return self.elementwise

    @abc.abstractmethod
    def init(self, params: Params) -> OptState:
        """Builds the initial state.

        **Arguments:**

        - `params`: the parameters, any pytree (a whole Equinox model is fine).

        **Returns:** the state, an `eqx.Module` (`EmptyState()` if stateless).
        """

    @abc.abstractmethod
    def update(
        self,
        updates: Updates,
        state: OptState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, OptState]:
        """Transforms the updates and advances the state.

        **Arguments:**

        - `updates`: gradients or the output of an earlier transform, shaped like
          the params with `None` where a leaf is not trained.
        - `state`: the state from `init` or the previous `update`.
        - `params`: the current parameters, needed by some transforms (weight
          decay, for example).
        - `**extra_args`: extra keyword arguments such as `value`, `grad`,
          `value_fn` or `loss`; ignored by transforms that do not use them and
          forwarded by every combinator.

        **Returns:** a tuple `(updates, state)`.
        """

    def __repr__(self) -> str:
        return pretty(self)


class AbstractWrapper(AbstractGradientTransformation):
    """A transform around one inner transform, with the inner one's capabilities.

    Every capability (`elementwise`, `runs_on_buffers`, `params_like_updates`,
    `per_example_updates`, `advises_bucketing`, `freezes`, `frozen_selection`)
    is the inner transform's unless the wrapper overrides it, so a `freeze` or a
    per-example aggregation inside any wrapper is seen by the chain around it as
    it is bare. A wrapper overrides only what it changes (a mask by leaf is not
    elementwise, `eqopt.lookahead`'s params are pairs). `handles_packed` is not
    forwarded: it says what the wrapper's own `init`/`update` accept.

    Subclasses provide `inner`, as a field or a property.
    """

    inner: eqx.AbstractVar[AbstractGradientTransformation]

    @property
    def elementwise(self) -> bool:
        return self.inner.elementwise

    @property
    def runs_on_buffers(self) -> bool:
        return self.inner.runs_on_buffers

    @property
    def params_like_updates(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.inner.params_like_updates

    @property
    def per_example_updates(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.inner.per_example_updates

    @property
    def advises_bucketing(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.inner.advises_bucketing

    @property
    def freezes(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.inner.freezes

    def frozen_selection(self, tree: Any) -> Any | None:
        """The leaves the inner transform freezes (see `eqopt.Freeze`), or `None`."""
        return self.inner.frozen_selection(tree)


class _EmptyStateMeta(type(eqx.Module)):
    # Optax's `EmptyState()` is an empty tuple, and a checkpoint restored without
    # a target may give `{}` or `None` for it: all are the state of a stateless
    # transform, so `state: EmptyState` accepts them.
    @no_type_check
    def __instancecheck__(cls, obj: Any) -> bool:
        if obj is None or (isinstance(obj, (tuple, list, dict)) and len(obj) == 0):
            return True
        return super().__instancecheck__(obj)


@checked
class EmptyState(eqx.Module, OptaxTuple, metaclass=_EmptyStateMeta):
    """The state of a stateless transform.

    A stateless transform's `update` also accepts Optax's spellings of an empty
    state (`optax.EmptyState()`, `()`, `{}` or `None`) and returns it unchanged,
    so `isinstance(x, EmptyState)` is true for each of them.
    """


@checked
class MaskedNode(eqx.Module, OptaxTuple, metaclass=_EmptyStateMeta):
    """Marks a leaf that a mask leaves out, in a masked transform's inner state.

    eqopt keeps `None` there (what `eqx.filter` gives), where Optax keeps an
    empty `MaskedNode()`; `isinstance(x, MaskedNode)` is true for both, so code
    that skips Optax's masked leaves (`is_leaf=lambda x: isinstance(x,
    MaskedNode)`) skips eqopt's too. It has no fields and is an empty tuple.
    """


class _AnyTransformMeta(type(eqx.Module)):
    # In Optax every transformation is a `GradientTransformation` (most are
    # `GradientTransformationExtraArgs`), and code checks
    # `isinstance(tx, optax.GradientTransformation)`. Here every transform is an
    # `AbstractGradientTransformation` and forwards extra arguments, so both
    # checks mean "is an eqopt transform".
    # (Read from the MRO: `issubclass` would recurse through ABCMeta's checks.)
    @no_type_check
    def __instancecheck__(cls, obj: Any) -> bool:
        return AbstractGradientTransformation in type(obj).__mro__


_MISSING: Any = object()


@checked
class GradientTransformation(
    AbstractGradientTransformation, metaclass=_AnyTransformMeta
):
    """Makes an eqopt transform from an Optax-style pair of plain functions.

    `init(params) -> state` and `update(updates, state, params=None) ->
    (updates, state)`, given positionally or by Optax's keywords `init` and
    `update` (`init_fn` and `update_fn` are accepted too). If `update` takes
    `**kwargs`, extra arguments are forwarded to it; otherwise they are dropped.
    Code written for Optax's `GradientTransformation` or
    `GradientTransformationExtraArgs` ports by changing the import: the object
    unpacks as `init, update = tx`, and
    `isinstance(tx, eqopt.GradientTransformation)` (or `...ExtraArgs`) is true
    for every eqopt transform, as it is for every Optax one in Optax.

    The functions are kept as the fields `init_fn` and `update_fn`; `tx.init` and
    `tx.update` are the methods that call them, so they behave as in Optax.

    Such a pair is opaque to eqopt: it is not declared elementwise, and its
    hyperparameters (captured in closures) are not leaves.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `init`: builds the state from the params.
    - `update`: maps `(updates, state, params)` to `(updates, state)`.
    """

    init_fn: Callable
    update_fn: Callable
    forwards_extra_args: bool = eqx.field(static=True)

    @property
    def elementwise(self) -> bool:
        return False

    def __init__(
        self,
        init: Callable = _MISSING,
        update: Callable = _MISSING,
        *,
        init_fn: Callable = _MISSING,
        update_fn: Callable = _MISSING,
    ):
        self.init_fn = _one_of("init", init, "init_fn", init_fn)
        self.update_fn = _one_of("update", update, "update_fn", update_fn)
        self.forwards_extra_args = accepts_extra_args(self.update_fn)

    @init_entry
    def init(self, params: Params) -> OptState:
        return self.init_fn(params)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: OptState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, OptState]:
        if self.forwards_extra_args:
            return self.update_fn(updates, state, params, **extra_args)
        return self.update_fn(updates, state, params)


def _one_of(name: str, value: Any, old_name: str, old_value: Any) -> Callable:
    if value is _MISSING and old_value is _MISSING:
        raise TypeError(f"GradientTransformation: missing the function `{name}`.")
    if value is not _MISSING and old_value is not _MISSING:
        raise TypeError(
            f"GradientTransformation: got both `{name}` and `{old_name}`; pass one."
        )
    function = old_value if value is _MISSING else value
    if not callable(function):
        raise TypeError(
            f"GradientTransformation: `{name}` must be callable, got "
            f"{type(function).__name__}."
        )
    return function


#: Optax's name for a transformation whose update accepts extra arguments. Every
#: eqopt transform does, so it is `eqopt.GradientTransformation` itself.
GradientTransformationExtraArgs = GradientTransformation
