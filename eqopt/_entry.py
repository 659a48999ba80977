"""The entry of every transform's `init` and `update`: what runs before its own code.

A transform's `init` and `update` are decorated where they are defined:

```python
class ScaleByAdam(AbstractGradientTransformation):
    @init_entry
    def init(self, params): ...

    @update_entry
    def update(self, updates, state, params=None, **extra_args): ...
```

and the decorator is all that runs between the caller and the method's body.
In order, for `update`:

0. **Hyperparameters checked** (`eqopt._hyper.check_hyperparameters`) on a
   user's call: one set after construction (`eqx.tree_at`) meets the
   constructor's check, at trace time under `jit`, once per optimiser object
   when eager.
1. **Hyperparameters weakly typed** (`eqopt._hyper.weak_hyperparameters`): a
   NumPy or strongly-typed scalar hyperparameter never promotes a `bfloat16`
   computation. Already-weak leaves are kept, so nested transforms pay a
   flatten and nothing more.
2. **`float0` gradients dropped**: `jax.grad(..., allow_int=True)` gives them
   for integer leaves; they mean "no gradient", as `None` does.
3. **The structure check** (`eqopt._checks.check_structure`), when the
   transform's `params` are shaped like its updates: one error naming the first
   place where the trees differ or the first leaf of another shape, before any
   per-leaf code runs.
4. **Packed params meet the one adapter** (`_update`, `_call_unpacked`): a
   transform that neither runs on packed buffers nor handles them itself
   (`AbstractGradientTransformation.runs_on_buffers`, `.handles_packed`) is
   given the unpacked model and its updates are packed again (its `init` is
   given the unpacked model too); for the call, its quantised moments are
   marked as moments of cut leaves (`eqopt._quantize.with_lookup`). Everything else
   about storage (bucketed state, quantised moments, ZeRO splits, master
   weights) is held by the state and the wrappers: the entry does not know them.
5. **The type check** of the method's annotations (`eqopt._typecheck`):
   jaxtyping and beartype, built on the first call, one short error.

Steps 0, 3 and 5 run in the outermost eqopt call only
(`eqopt._typecheck.nested_call`): a chain calling its parts passes on what
its own entry checked. `init` runs steps 0, 1, 4 and 5, and gives the
`eqopt.PerformanceHint` (once per process) when it is the outermost call.

An input error (an `eqopt.ArgumentTypeError`, or the `ValueError` of a
path check) is raised again from the outermost entry's frame, so a user's
traceback shows their call and one message, not every transform it went
through. Set `EQOPT_FULL_TRACEBACKS=1` to keep every frame.
"""

import functools
import os
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, no_type_check

import jax

from ._checks import check_structure
from ._fused._pack import (
    _layout_of,
    contains_packed,
    repack_like,
    unpack_all,
    worth_bucketing,
)
from ._hyper import check_hyperparameters, weak_hyperparameters
from ._leaves import InputError, drop_float0, is_none, outside_eqopt
from ._quantize import is_quantized, with_lookup
from ._typecheck import (
    RUNNING,
    ArgumentTypeError,
    ArgumentValueError,
    checked,
    lazily_checked,
    nested_call,
    state_checker,
)

_Method = TypeVar("_Method", bound=Callable)

#: The errors re-raised from the outermost entry's frame.
_INPUT_ERRORS = (ArgumentTypeError, ArgumentValueError, InputError)
_FULL_TRACEBACKS = os.environ.get("EQOPT_FULL_TRACEBACKS", "") not in ("", "0")


@checked
def init_entry(method: _Method) -> _Method:
    """Decorates a transform's `init`: the entry of every eqopt transform's `init`.

    Before the method's body: the transform's hyperparameters weakly typed (a
    number never promotes `bfloat16`), the method's annotations checked when
    it is the outermost eqopt call, packed params (`eqopt.pack`)
    unpacked for a transform that does not run on buffers, and the
    `eqopt.PerformanceHint` of the outermost `init`. Use it on the `init`
    of your own transforms (see "Writing your own transform").

    !!! example

        ```python
        class Doubled(eqopt.AbstractGradientTransformation):
            @property
            def elementwise(self) -> bool:
                return True

            @eqopt.init_entry
            def init(self, params):
                return eqopt.EmptyState()

            @eqopt.update_entry
            def update(self, updates, state, params=None, **extra_args):
                return eqopt.leafwise(lambda g: 2 * g, updates), state

        opt = Doubled()
        updates, state = opt.update(grads, opt.init(model), model)
        ```
    """
    check = lazily_checked(method, method.__qualname__)

    @functools.wraps(method)
    def init(self, params):
        given, self = self, weak_hyperparameters(self)
        if nested_call():
            # A part's `init`, called by its chain or wrapper.
            return _init(method, self, params)
        token = RUNNING.set(True)  # the outermost `init`
        try:
            _hint_bucketing(self, params)
            check_hyperparameters(given)
            return _init(check, self, params)
        except _INPUT_ERRORS as error:
            if _FULL_TRACEBACKS:
                raise
            raise error.with_traceback(None) from None
        finally:
            RUNNING.reset(token)

    init.__eqopt_entry__ = "init"  # pyright: ignore[reportAttributeAccessIssue]
    return init  # pyright: ignore[reportReturnType]


@checked
def update_entry(method: _Method) -> _Method:
    """Decorates a transform's `update`: the entry of every eqopt transform's `update`.

    Before the method's body: the transform's hyperparameters weakly typed,
    `float0` gradients dropped, and, in the outermost eqopt call,
    the method's annotations checked and `updates` checked against `params`
    (one error naming the first leaf that differs); packed params
    (`eqopt.pack`) are unpacked for a transform that does not run on
    buffers, and its updates packed again. Use it on the `update` of your own
    transforms (see "Writing your own transform").
    """
    check = lazily_checked(method, method.__qualname__)
    check_state = state_checker(method, method.__qualname__)

    @functools.wraps(method)
    def update(self, updates, state, params=None, **extra_args):
        given, self = self, weak_hyperparameters(self)
        # (Dropped at every entry: eqopt's own callers of a whole optimiser, a
        # `TrainState` or a ZeRO plan, pass the user's gradients on.)
        updates = drop_float0(updates)
        if updates is None and params is not None and self.params_like_updates:
            # No gradient at all: `None` at every leaf, which is not trained.
            updates = jax.tree.map(lambda _: None, params, is_leaf=is_none)
        if nested_call():
            # A part's `update`, called by its chain or wrapper with what the
            # outer entry checked, but for the state's class (`state_checker`).
            check_state(state)
            return _update(method, self, updates, state, params, extra_args)
        token = RUNNING.set(True)  # the outermost `update`
        try:
            check_hyperparameters(given)
            if self.params_like_updates:
                check_structure(
                    updates, params, not self.per_example_updates, _unpacks(self)
                )
            return _update(check, self, updates, state, params, extra_args)
        except _INPUT_ERRORS as error:
            if _FULL_TRACEBACKS:
                raise
            raise error.with_traceback(None) from None
        finally:
            RUNNING.reset(token)

    update.__eqopt_entry__ = "update"  # pyright: ignore[reportAttributeAccessIssue]
    return update  # pyright: ignore[reportReturnType]


# ---------------------------------------------------------------------------
# Packed params: the one adapter
# ---------------------------------------------------------------------------


def _unpacks(transform: Any) -> bool:
    # A transform that neither runs on packed buffers nor passes them on.
    return not (transform.handles_packed or transform.runs_on_buffers)


@no_type_check
def _init(init, self, params):
    """`init(self, params)`, given the unpacked model where the transform unpacks."""
    if _unpacks(self) and contains_packed(params):
        return init(self, unpack_all(params))
    return init(self, params)


@no_type_check
def _update(update, self, updates, state, params, extra_args):
    """`update(self, updates, state, params)`, through the adapter where it unpacks."""
    if _unpacks(self) and contains_packed(updates, params):
        return _call_unpacked(update, self, updates, state, params, extra_args)
    return update(self, updates, state, params, **extra_args)


@no_type_check
def _call_unpacked(check, self, updates, state, params, extra_args):
    """Runs `update` on the unpacked model and packs its updates again.

    For a transform that computes per leaf (a norm, a factored moment): it must
    see the leaves, not the buffers they are packed in.
    """
    reference = updates if contains_packed(updates) else params
    quantized = [
        x for x in jax.tree.leaves(state, is_leaf=is_quantized) if is_quantized(x)
    ]
    # 4-bit codes pair elements two to a byte: see `unpack_all`.
    static = any(x.bits == 4 for x in quantized)
    unpacked = unpack_all(updates, static)
    # Moments of leaves cut from the buffers are not decoded by a lookup, in
    # this call only: the state the caller gets back is as it gave it.
    if quantized:
        state = with_lookup(state, False)
    new_updates, state = check(
        self, unpacked, state, unpack_all(params, static), **extra_args
    )
    if quantized:
        state = with_lookup(state, True)
    # Repack what is shaped like the updates (a measurement, say, is not).
    if jax.tree.structure(new_updates, is_leaf=is_none) != jax.tree.structure(
        unpacked, is_leaf=is_none
    ):
        return new_updates, state
    # Quantised moments make each leaf's update a long expression (decoding,
    # Adam's arithmetic): concatenated, it was fused into one pass over the
    # buffer behind a branch per leaf (see `_assemble`).
    return repack_like(reference, new_updates, bool(quantized)), state


# ---------------------------------------------------------------------------
# The performance hint of the outermost `init`
# ---------------------------------------------------------------------------


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

#: Whether the hint was given in this process (it is given once).
_hinted = [False]


@no_type_check
def _hint_bucketing(transform: Any, params: Any) -> None:
    """The default path's automatic choice: per leaf, or a hint to bucket or pack.

    The default path keeps its state shaped like the model (Optax-ported code
    reads `state[0].mu` as params-shaped), so it does not switch layouts
    behind the user's back; on params where `eqopt.bucketed` would choose to
    bucket, it says so once.
    """
    if _hinted[0] or not transform.advises_bucketing:
        return
    # Only an optimiser that runs on the buffers throughout; one with a per-leaf
    # part that unpacks (per-leaf norms, a freeze) would pay an unpacking and
    # repacking every step.
    if not transform.runs_on_buffers:
        return
    if contains_packed(params):
        return
    layout = _layout_of(jax.tree.leaves(params))
    n_leaves = layout.n_leaves()
    if n_leaves < HINT_MIN_LEAVES or not worth_bucketing(layout):
        return
    _hinted[0] = True
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
