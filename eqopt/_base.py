"""The gradient-transformation protocol, its empty state and the shared input checks."""

import abc
import functools
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, no_type_check

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from ._fused._pack import (
    _layout_of,
    contains_packed,
    repack_like,
    unpack_all,
    worth_bucketing,
)
from ._hyper import check_fields, weak_hyperparameters
from ._leaves import (
    InexactTree as InexactTree,
    OptState as OptState,
    Params as Params,
    Updates as Updates,
    drop_float0,
    first_non_inexact,
    is_none as is_none,
    is_state_leaf,
    is_trainable as is_trainable,
    outside_eqopt,
    path_str as path_str,
)
from ._quantize import (
    DECODING,
    call_dequantized,
    is_quantized,
    is_quantized_format,
    moment_like,
)
from ._signatures import accepts_extra_args
from ._structure import structure_mismatch_message as structure_mismatch_message

# ---------------------------------------------------------------------------
# Path-aware checks
# ---------------------------------------------------------------------------


@no_type_check
def _paths(tree: Any) -> list[str]:
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_none)[0]
    return [path_str(path) for path, _ in leaves]


def _describe(x: Any) -> str:
    if x is None:
        return "None"
    if eqx.is_array(x):
        return f"{x.dtype}{list(x.shape)}"
    return type(x).__name__


def check_updates(
    updates: Any,
    reference: Any,
    *,
    name: str = "updates",
    reference_name: str = "params",
) -> None:
    """Checks `updates` against the params (or a moment tree shaped like them).

    Runs at trace time. Raises one `ValueError` naming the path of the first
    offending leaf: a different tree structure, an update that is not an array
    or `None`, an update for a leaf that is not trainable, a different shape,
    or a complex update for a real parameter.
    """
    leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    reference_leaves, reference_treedef = jax.tree.flatten(reference, is_leaf=is_none)
    if treedef != reference_treedef and contains_packed(updates) != contains_packed(
        reference
    ):
        packed, plain = (
            (name, reference_name)
            if contains_packed(updates)
            else (reference_name, name)
        )
        raise ValueError(
            f"`{packed}` is packed (`eqopt.pack`) but `{plain}` is not: pass the packed "
            "model wherever its packed gradients go, or unpack both."
        )
    if treedef != reference_treedef:
        raise ValueError(
            structure_mismatch_message(updates, reference, name, reference_name)
        )
    for index, (update, ref) in enumerate(zip(leaves, reference_leaves, strict=False)):
        if update is None:
            continue
        problem = None
        if not eqx.is_array(update):
            problem = f"is a {type(update).__name__}, expected a JAX array or None"
        elif not is_trainable(ref):
            problem = (
                f"is an array but the `{reference_name}` leaf there is "
                f"{_describe(ref)}, which is not trainable (not an inexact array)"
            )
        elif update.shape != ref.shape:
            problem = (
                f"has shape {tuple(update.shape)} but the `{reference_name}` leaf has "
                f"shape {tuple(ref.shape)}"
            )
        elif jnp.iscomplexobj(update) and not jnp.iscomplexobj(ref):
            problem = (
                f"is complex ({update.dtype}) but the `{reference_name}` leaf is real "
                f"({ref.dtype})"
            )
        if problem is not None:
            path = _paths(updates)[index]
            raise ValueError(f"`{name}` at {path} {problem}.")


@no_type_check
def check_structure(updates: Any, params: Any) -> None:
    """The input check every `update` runs first: `updates` has the structure of `params`.

    Run by `AbstractGradientTransformation` before an `update` method's body, so
    no wrapper maps over `updates` and `params` together before they are known
    to match. Cheap (two flattens, at trace time); on a mismatch it raises
    `check_updates`'s error, naming the first place where the trees differ.
    Shapes are left to the transforms (a per-example transform's updates have a
    batch axis). Nothing to check when `params` is `None`, nor when one of the
    trees is packed and the other not (see `_unpacking_update`). When `updates`
    is not a tree of inexact arrays (a state passed as `updates`, say), the type
    check of `updates` says what is wrong instead, which is more to the point.
    """
    if params is None:
        return
    if jax.tree.structure(updates, is_leaf=is_none) == jax.tree.structure(
        params, is_leaf=is_none
    ):
        return
    if first_non_inexact(updates) is not None:
        return
    if contains_packed(updates) != contains_packed(params):
        # Packed updates for unpacked params (or the reverse): the transforms that
        # take them unpack them; the others are given unpacked trees.
        return
    check_updates(updates, params)


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


class PerformanceHint(UserWarning):
    """A warning that the step would run faster another way, with the way.

    Given once per process, by the outermost `init` of a default-path
    optimiser whose params have many small trainable leaves (see the
    Performance page, "When to use which"). Silence it with
    `warnings.filterwarnings("ignore", category=eqopt.PerformanceHint)`.
    """


#: The hint needs at least this many trainable leaves (besides `bucketed`'s own
#: rule): the whole-step gain was measured on hundreds of small leaves (200
#: residual layers, 400 leaves: 0.42-0.81 of Optax's step bucketed), and a
#: model of a few dozen gains too little to be worth a warning.
HINT_MIN_LEAVES = 128


class _InitDepth(threading.local):
    depth = 0
    hinted = False


_INIT = _InitDepth()


def _hint_bucketing(transform: Any, params: Any) -> None:
    """The default path's automatic choice: per leaf, or a hint to bucket or pack.

    The default path keeps its state shaped like the model (Optax-ported code
    reads `state[0].mu` as params-shaped), so it does not switch layouts
    behind the user's back; on params where `eqopt.bucketed` would choose to
    bucket, it says so once.
    """
    if _INIT.hinted or not getattr(transform, "advises_bucketing", True):
        return
    # Only an optimiser that runs on the buffers throughout; one with a per-leaf
    # part that unpacks (per-leaf norms, a freeze) would pay an unpacking and
    # repacking every step.
    if not getattr(transform, "runs_on_buffers", False):
        return
    if contains_packed(params):
        return
    layout = _layout_of(jax.tree.leaves(params))
    if len(layout.slots) < HINT_MIN_LEAVES or not worth_bucketing(layout):
        return
    _INIT.hinted = True
    n_leaves = len(layout.slots)
    mean = sum(layout.sizes()) / n_leaves
    warnings.warn(
        f"These params have {n_leaves} trainable leaves of {mean:.0f} elements "
        "on average: per-leaf overhead dominates this optimiser's step. "
        "`opt = eqopt.bucketed(opt)` keeps the state in one buffer per dtype "
        "(same numbers, state read with `state.unpacked()`), and `eqopt.pack(model)` "
        "packs the params too; see the Performance page. (Given once; silence "
        "it with `warnings.filterwarnings('ignore', category=eqopt.PerformanceHint)`.)",
        PerformanceHint,
        stacklevel=outside_eqopt(),
    )


@no_type_check
def _unpacking_init(method: Callable) -> Callable:
    @functools.wraps(method)
    def init(self, params):
        self = weak_hyperparameters(self)
        if _INIT.depth == 0:
            _hint_bucketing(self, params)
        _INIT.depth += 1
        try:
            if not (self.handles_packed or self.runs_on_buffers) and contains_packed(
                params
            ):
                return method(self, unpack_all(params))
            return method(self, params)
        finally:
            _INIT.depth -= 1

    return init


@no_type_check
def _unpacking_update(method: Callable) -> Callable:
    @functools.wraps(method)
    def update(self, updates, state, params=None, **extra_args):
        # Hyperparameters are weak here, also strongly-typed or NumPy ones.
        self = weak_hyperparameters(self)
        # `float0` gradients (integer leaves under `jax.grad(allow_int=True)`) mean
        # "no gradient": the same as `None`.
        updates = drop_float0(updates)
        if self.params_like_updates:
            check_structure(updates, params)
        if not (self.handles_packed or self.runs_on_buffers) and contains_packed(
            updates, params
        ):
            reference = updates if contains_packed(updates) else params
            quantized = [
                x
                for x in jax.tree.leaves(state, is_leaf=is_quantized)
                if is_quantized(x)
            ]
            # 4-bit codes pair elements two to a byte: see `unpack_all`.
            static = any(x.bits == 4 for x in quantized)
            unpacked = unpack_all(updates, static)
            outer, DECODING.on_unpacked_leaves = DECODING.on_unpacked_leaves, True
            try:
                new_updates, state = method(
                    self, unpacked, state, unpack_all(params, static), **extra_args
                )
            finally:
                DECODING.on_unpacked_leaves = outer
            # Repack what is shaped like the updates (a measurement, say, is not).
            if jax.tree.structure(new_updates, is_leaf=is_none) != jax.tree.structure(
                unpacked, is_leaf=is_none
            ):
                return new_updates, state
            # Quantised moments make each leaf's update a long expression
            # (decoding, Adam's arithmetic): concatenated, it was fused into one
            # pass over the buffer behind a branch per leaf (see `_assemble`).
            return repack_like(reference, new_updates, bool(quantized)), state
        return method(self, updates, state, params, **extra_args)

    return update


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

    #: Whether `init`/`update` take packed params ([`eqopt.pack`][]) as they are.
    #: Otherwise a transform that is not elementwise sees the unpacked model,
    #: so per-leaf computations stay per leaf. Combinators that only pass the
    #: trees on to their parts set this.
    handles_packed: ClassVar[bool] = False

    #: Whether `update`'s `params` have the structure of its `updates`, as they do
    #: for every transform but [`eqopt.lookahead`][] (whose params pair the fast
    #: and slow weights). Then every `update` checks this first, with one short
    #: error naming the first place where the two trees differ.
    params_like_updates: ClassVar[bool] = True

    #: Whether the outermost `init` may give a [`eqopt.PerformanceHint`][] that
    #: many small leaves would run faster bucketed ([`eqopt.bucketed`][] says no).
    advises_bucketing: ClassVar[bool] = True

    @no_type_check
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name, wrap in (("init", _unpacking_init), ("update", _unpacking_update)):
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "__isabstractmethod__", False):
                setattr(cls, name, wrap(method))

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

    @property
    @abc.abstractmethod
    def elementwise(self) -> bool:
        """Whether the update is the same on separate leaves and on their concatenation.

        Transforms that reduce over a leaf (per-leaf norms, factored moments,
        orthogonalisation) are not elementwise; reductions over the whole tree
        (global-norm clipping) do not break the property.
        """

    @property
    def runs_on_buffers(self) -> bool:
        """Whether the whole update runs on packed buffers, without unpacking.

        True for elementwise transforms, and for those that do their per-leaf
        part on the buffers themselves: a weight-decay mask selects segments of
        a buffer ([`eqopt.AddDecayedWeights`][]), and a quantised moment of a
        buffer is one quantised array ([`eqopt.Quantized`][]'s
        `packed_blocks`). Otherwise a packed model is unpacked for the
        transform. [`eqopt.bucketed`][] buckets, and the default path hints
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


class _EmptyStateMeta(type(eqx.Module)):
    # Optax's `EmptyState()` is an empty tuple, and a checkpoint restored without
    # a target may give `{}` or `None` for it: all are the state of a stateless
    # transform, so `state: EmptyState` accepts them.
    @no_type_check
    def __instancecheck__(cls, obj: Any) -> bool:
        if obj is None or (isinstance(obj, (tuple, list, dict)) and len(obj) == 0):
            return True
        return super().__instancecheck__(obj)


class EmptyState(eqx.Module, metaclass=_EmptyStateMeta):
    """The state of a stateless transform.

    A stateless transform's `update` also accepts Optax's spellings of an empty
    state (`optax.EmptyState()`, `()`, `{}` or `None`) and returns it unchanged,
    so `isinstance(x, EmptyState)` is true for each of them.
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

    def init(self, params: Params) -> OptState:
        return self.init_fn(params)

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
#: eqopt transform does, so it is [`eqopt.GradientTransformation`][] itself.
GradientTransformationExtraArgs = GradientTransformation


# ---------------------------------------------------------------------------
# Leafwise helpers used by the transforms
# ---------------------------------------------------------------------------


def require_params(
    params: Any, name: str, call: str = "update(updates, state, params)"
) -> None:
    """Raises the one `ValueError` of transforms that need `params` and got none."""
    if params is None:
        raise ValueError(f"{name} needs `params`: call `{call}`.")


def zeros_like_trainable(params: Params, dtype: Any = None) -> Updates:
    """A tree shaped like `params`: zeros at trainable leaves, `None` elsewhere.

    `dtype` may be a [`eqopt.Quantized`][] format: the zeros are then a signed
    (first) moment stored in it.
    """
    if is_quantized_format(dtype):
        return moment_like(params, dtype)

    def zeros(p):
        if not is_trainable(p):
            return None
        return jnp.zeros_like(p, dtype=dtype if dtype is not None else p.dtype)

    return jax.tree.map(zeros, params)


def full_like_trainable_real(params: Params, value: Any) -> Updates:
    """A tree shaped like `params`: `value` at trainable leaves, `None` elsewhere.

    The arrays are real, in the real dtype of each parameter (`float32` for a
    `complex64` parameter): they hold squared moduli.
    """

    def full(p):
        if not is_trainable(p):
            return None
        # `full_like` keeps the parameter's sharding; `full(p.shape, ...)` would not.
        return jnp.full_like(p, value, dtype=jnp.finfo(p.dtype).dtype)

    return jax.tree.map(full, params)


@no_type_check
def leafwise(
    fn: Callable,
    updates: Updates,
    *trees: Any,
    n_out: int | None = None,
    elementwise: bool = False,
) -> Any:
    """Maps `fn` over the leaves of `updates` and trees shaped like it.

    Where an update is `None`, `fn` is not called: the output is `None` (or, when
    `fn` returns a tuple of `n_out` values, `None` followed by the corresponding
    inputs from `trees` unchanged, so moments of untouched leaves are kept).

    With `elementwise` (`fn` acts on each element alone), quantised moments
    may be computed in their rows of blocks (`call_dequantized`).

    Returns a tree, or with `n_out` a tuple of `n_out` trees.
    """
    leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    others = []
    for tree in trees:
        other_leaves, other_treedef = jax.tree.flatten(tree, is_leaf=is_state_leaf)
        if other_treedef != treedef:
            raise ValueError(
                structure_mismatch_message(updates, tree, "updates", "state")
            )
        others.append(other_leaves)
    for index, (u, *rest) in enumerate(zip(leaves, *others, strict=False)):
        if u is None:
            continue
        for other in rest:
            if (eqx.is_array(other) or is_quantized(other)) and tuple(
                other.shape
            ) != tuple(u.shape):
                path = _paths(updates)[index]
                raise ValueError(
                    f"`updates` at {path} has shape {tuple(u.shape)} but the state (or "
                    f"params) there has shape {tuple(other.shape)}: was the state made "
                    "for other params?"
                )

    @no_type_check
    def call(index: int, u: Any, rest: list) -> Any:
        try:
            # A quantised moment is dequantised for `fn` and its result re-quantised.
            return call_dequantized(fn, u, rest, elementwise)
        except (TypeError, AttributeError) as error:
            # A `None` where the update is an array: `init` saw a leaf that is not
            # trainable. (A transform may keep `None` on purpose and handle it, so
            # only a failure is reported.)
            if not any(other is None for other in rest):
                raise
            raise ValueError(
                f"`updates` at {_paths(updates)[index]} is an array but the state "
                "(or params) holds nothing there: `init` saw a leaf that is not "
                "trainable (not an inexact array). Give that leaf no gradient "
                "(`None`), or make it an array before `init`."
            ) from error

    if n_out is None:
        out = [
            None if u is None else call(index, u, rest)
            for index, (u, *rest) in enumerate(zip(leaves, *others, strict=False))
        ]
        return jax.tree.unflatten(treedef, out)
    outs = []
    for index, (u, *rest) in enumerate(zip(leaves, *others, strict=False)):
        if u is None:
            outs.append((None, *rest[: n_out - 1]))
        else:
            outs.append(call(index, u, rest))
    return tuple(
        jax.tree.unflatten(treedef, [o[i] for o in outs]) for i in range(n_out)
    )
