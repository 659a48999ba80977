"""Hyperparameters: dynamic scalar leaves, schedules of the step count, and their checks.

A numeric hyperparameter is a field of a transform or schedule declared as

```python
b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
learning_rate: Scalar | Schedule = eqx.field(converter=as_scalar_or_schedule)
```

The converter turns a Python or NumPy number into a weakly-typed JAX scalar: a
dynamic leaf under `eqx.filter_jit` (changing it does not recompile) that
crosses the `jit` boundary without a copy. `init` and `update` see every real
0-d leaf weakly typed (`weakly_typed`), so a hyperparameter never promotes a
`bfloat16` computation, whether it is a JAX scalar, a user's strongly-typed
one, or a NumPy one (`on_host`: an optimiser that a step donating all its
arguments cannot delete). The converter's argument annotation is what type
checkers accept in the constructor, so `ScaleByAdam(b1=0.9)` is clean under
pyright. (pyright reads a converter only
when it is passed to `eqx.field` itself, which is why there is no wrapper
factory.) `check_fields`, run by the base classes' `__check_init__`, then refuses
anything a converter could not turn into what the annotation says, naming the
hyperparameter. A hyperparameter set after construction (`eqx.tree_at`) meets
the same check at the first `init` or `update` it reaches
(`check_hyperparameters`, run by their entries on a user's call).
"""

import dataclasses
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int, Real

from ._typecheck import ArgumentTypeError, checked

#: What a scalar hyperparameter field holds: a float JAX scalar (weakly typed
#: when made from a number), or a NumPy 0-d array after `eqopt.on_host`.
Scalar: TypeAlias = Float[Array | np.ndarray, ""]
#: What an integer hyperparameter field holds (see `Scalar`).
IntScalar: TypeAlias = Int[Array | np.ndarray, ""]
#: What a scalar hyperparameter accepts: a Python or NumPy number, or a 0-d array.
ScalarLike: TypeAlias = float | int | Real[ArrayLike, ""]
#: A schedule: any callable from the step count to a value (an
#: `eqopt.schedules.AbstractSchedule` or a plain function).
Schedule: TypeAlias = Callable[..., Any]
#: What a hyperparameter that may be scheduled accepts (Optax's `ScalarOrSchedule`).
ScalarOrSchedule: TypeAlias = ScalarLike | Schedule


def is_concrete(x: Any) -> bool:
    """Whether `x` is a concrete (not traced) array, so Python checks apply."""
    return eqx.is_array(x) and not isinstance(x, jax.core.Tracer)


def _to_scalar(value: Any) -> Any:
    # Numbers become weakly-typed float scalars; integers become floats, so that
    # `sgd(1)` and `sgd(1.0)` are the same optimiser. An array (JAX or NumPy) is
    # a JAX array of its own float dtype; a traced one (a `vmap` sweep, a
    # meta-gradient) is kept. Anything else is returned as it is, for
    # `check_fields` to refuse with the field's name.
    if isinstance(value, (bool, np.bool_)):
        return value
    if isinstance(value, (int, float, np.integer, np.floating)):
        return jnp.asarray(float(value))  # a Python float gives a weakly-typed array
    if isinstance(value, np.ndarray) or eqx.is_array(value):
        value = jnp.asarray(value)
        if jnp.issubdtype(value.dtype, jnp.integer):
            value = value.astype(jnp.result_type(float))
        return value
    return value


@checked
def on_host(tree: Any) -> Any:
    """`tree` (an optimiser, a schedule) with every concrete JAX array leaf held as
    a NumPy array in host memory, for a step that donates all its arguments.

    `eqx.filter_jit(donate="all")` donates every array argument, and XLA may
    reuse a donated buffer for an output of the same shape and dtype: with a
    step `train_step(model, opt_state, opt, batch)` that also returns a loss,
    the learning rate's float32 scalar was given to the loss, and the next call
    failed with "Array has been deleted". Only device buffers are donated, so an
    optimiser whose hyperparameters rest on the host survives such a step.
    Inside `init` and `update` a NumPy scalar is weakly typed, as a JAX one is:
    the numbers are the same.

    The price: each host array is copied to the device at every call of the
    step (measured per scalar and per call: about 1.5 µs on a CPU, 45-75 µs on
    an H200, where Adam's five made a small model's step 1.75 times as long;
    `benchmarks/hyperparameter_transfer.py`). Prefer a step that does not donate the optimiser:
    `donate="all-except-first"` with the optimiser as the first argument, or
    `eqopt.TrainState`, whose step returns it. Typed PRNG keys have no host
    form and are kept.

    !!! example

        ```python
        opt = eqopt.on_host(eqopt.adamw(1e-3))

        @eqx.filter_jit(donate="all")
        def train_step(model, opt_state, opt, x, y): ...
        ```
    """

    def host(x: Any) -> Any:
        if (
            isinstance(x, jax.Array)
            and not isinstance(x, jax.core.Tracer)
            and not jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
        ):
            return np.asarray(x)
        return x

    return jax.tree.map(host, tree)


@checked
def as_scalar(value: ScalarLike) -> Scalar:
    """The field converter of a scalar hyperparameter: a number becomes a scalar leaf.

    A Python or NumPy number becomes a weakly-typed JAX scalar (an integer
    becomes a float), so the field is a dynamic leaf under `eqx.filter_jit`
    (changing it does not recompile) that does not promote `bfloat16`; an
    array stays an array of its dtype (seen weakly typed inside `init` and
    `update`). A traced value is kept as it is.

    Use it as `eqx.field(default=0.9, converter=eqopt.as_scalar)` with the
    annotation `eqopt.Scalar` (see "Writing your own transform" in the docs),
    and to set a new value: `eqx.tree_at(lambda o: o.b1, opt, eqopt.as_scalar(0.95))`.
    """
    return _to_scalar(value)


try:  # the one way to mark a traced value weakly typed; not public in JAX
    from jax._src.lax.lax import _convert_element_type as _convert_element_type
except ImportError:  # pragma: no cover
    _convert_element_type = None


def weakly_typed(x: Any) -> Any:
    """A real 0-d leaf as a weakly-typed JAX scalar; anything else as it is.

    A user's strongly-typed JAX scalar, and a NumPy one (`on_host`, which enters
    a `jit` strongly typed), are seen weakly typed by `init` and `update`, so
    that `b1 * mu` stays `bfloat16` for `bfloat16` moments, as with a Python
    number: a hyperparameter never decides a moment's dtype.
    """
    if isinstance(x, (np.ndarray, np.generic)):
        if x.ndim == 0 and x.dtype.kind in "fiu":
            return jnp.asarray(x.item())
        return x
    if (
        isinstance(x, jax.Array)
        and x.ndim == 0
        and not _is_weak(x)
        and (
            jnp.issubdtype(x.dtype, jnp.floating)
            or jnp.issubdtype(x.dtype, jnp.integer)
        )
        and _convert_element_type is not None
    ):
        return _convert_element_type(x, weak_type=True)
    return x


def _is_weak(x: Any) -> bool:
    aval = getattr(x, "aval", None)
    return bool(getattr(aval, "weak_type", False))


def weak_hyperparameters(module: Any) -> Any:
    """`module` with every real 0-d leaf weakly typed (see `weakly_typed`)."""
    leaves, treedef = jax.tree.flatten(module)
    weak = [weakly_typed(leaf) for leaf in leaves]
    if all(a is b for a, b in zip(weak, leaves, strict=True)):
        return module
    return jax.tree.unflatten(treedef, weak)


def as_optional_scalar(value: ScalarLike | None) -> Scalar | None:
    """Field converter for a scalar hyperparameter that may be `None`."""
    return _to_scalar(value)


@checked
def as_scalar_or_schedule(value: ScalarOrSchedule) -> Scalar | Schedule:
    """The field converter of a hyperparameter that may also be a schedule.

    A number becomes a scalar leaf as with `eqopt.as_scalar`; a schedule (any
    callable of the step count) is kept as it is. Pair it with
    `eqopt.init_count_if_scheduled` and `eqopt.current_value`.
    """
    return _to_scalar(value)


def as_optional_scalar_or_schedule(
    value: ScalarOrSchedule | None,
) -> Scalar | Schedule | None:
    """Field converter for a hyperparameter that may be a schedule or `None`."""
    return _to_scalar(value)


def as_int_scalar(value: int | Int[ArrayLike, ""]) -> IntScalar:
    """Field converter for an integer hyperparameter that is a dynamic leaf.

    Like `eqopt.as_scalar`, a number becomes a weakly-typed JAX scalar; an
    array is kept as it is.
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return jnp.asarray(int(value))
    if eqx.is_array(value):
        return jnp.asarray(value)
    return value  # pyright: ignore[reportReturnType]


def as_number(value: Any) -> Any:
    """A Python, NumPy or JAX number as a JAX scalar of its own kind.

    Unlike `as_scalar`, integers stay integers: `inject_hyperparams` keeps an
    integer hyperparameter (a number of steps, say) as it was given. A number
    gives a weakly-typed scalar; an array is kept (a NumPy one as a JAX array).
    """
    if isinstance(value, jax.core.Tracer):
        return value
    if isinstance(value, (np.number, np.bool_)):
        value = value.item()
    return jnp.asarray(value)


def as_scalar_or_infinity(value: ScalarLike) -> Scalar:
    """Field converter for a scalar hyperparameter that may be $+\\infty$ (a line
    search's `curv_rtol`: no curvature condition); `as_scalar`'s must be finite."""
    return as_scalar(value)


# What each converter allows besides a real scalar array: (what it is, a
# schedule, `None`); `as_scalar_or_infinity` alone allows infinite values.
_KINDS: dict[Any, tuple[str, bool, bool]] = {
    as_scalar: ("a real number (a Python number or a 0-d array)", False, False),
    as_scalar_or_infinity: (
        "a real number (a Python number or a 0-d array)",
        False,
        False,
    ),
    as_optional_scalar: (
        "a real number (a Python number or a 0-d array) or None",
        False,
        True,
    ),
    as_scalar_or_schedule: (
        "a real number (a Python number or a 0-d array) or a schedule",
        True,
        False,
    ),
    as_optional_scalar_or_schedule: (
        "a real number (a Python number or a 0-d array), a schedule or None",
        True,
        True,
    ),
    as_int_scalar: ("an integer (a Python int or a 0-d integer array)", False, False),
}


def is_hyperparameter_field(field: dataclasses.Field) -> bool:
    """Whether a dataclass field holds a hyperparameter (its converter is one of these)."""
    return field.metadata.get("converter") in _KINDS


def _describe(value: Any) -> str:
    if eqx.is_array(value) or isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {tuple(value.shape)}"
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def _passes_unchecked(value: Any, schedule_allowed: bool, none_allowed: bool) -> bool:
    # `None` or a schedule, where the converter allows one.
    if value is None:
        return none_allowed
    return schedule_allowed and callable(value) and not eqx.is_array(value)


def check_fields(module: eqx.Module, values: bool = True) -> None:
    """Checks every hyperparameter field of `module` against what it may hold.

    A field is a hyperparameter when its converter is one of this module's. A
    value of the wrong kind (a string, `None` where not allowed, an array that
    is not 0-d, a complex or boolean number) raises one `TypeError`; with
    `values`, a concrete value that is not finite raises a `ValueError`. Both
    name the class and the field. Traced values are checked for shape and dtype
    only.
    """
    for field in dataclasses.fields(module):
        if field.name == "dtype" or field.name.endswith("_dtype"):
            _check_dtype(type(module).__name__, field.name, getattr(module, field.name))
        kind = _KINDS.get(field.metadata.get("converter"))
        if kind is None:
            continue
        expected, schedule_allowed, none_allowed = kind
        value: Any = getattr(module, field.name)
        if _passes_unchecked(value, schedule_allowed, none_allowed):
            continue
        owner = type(module).__name__
        integer = field.metadata.get("converter") is as_int_scalar
        dtype_ok = eqx.is_array(value) and (
            jnp.issubdtype(value.dtype, jnp.integer)
            if integer
            else jnp.issubdtype(value.dtype, jnp.floating)
        )
        if not dtype_ok or value.ndim != 0:
            hint = ""
            if eqx.is_array(value) and value.ndim > 0:
                hint = " To sweep over several values, `jax.vmap` over the optimiser."
            elif isinstance(value, str):
                hint = " Pass a number, not a string."
            raise TypeError(
                f"{owner}: hyperparameter `{field.name}` must be {expected}, "
                f"got {_describe(value)}.{hint}"
            )
        # In NumPy: checked in Python even while tracing (a `jnp` function of a
        # NumPy constant is staged out under `jit`).
        finite = field.metadata.get("converter") is not as_scalar_or_infinity
        if (
            values
            and finite
            and is_concrete(value)
            and not np.isfinite(np.asarray(value))
        ):
            raise ValueError(
                f"{owner}: hyperparameter `{field.name}` must be finite, got {value.item()}."
            )


# The optimisers whose hyperparameters `check_hyperparameters` has checked, by
# identity: Modules are immutable, so a checked one stays valid (`eqx.tree_at`
# makes a new object). The entry goes when the object does.
_CHECKED: dict[int, weakref.ref] = {}


def modules(tree: Any) -> Iterator[eqx.Module]:
    """Every Module in `tree` (fields, tuples, lists, dict values), outermost first."""
    stack = [tree]
    seen: dict[int, Any] = {}  # kept alive, so that no id is reused
    while stack:
        node = stack.pop()
        if isinstance(node, eqx.Module):
            # A function held in a field reads back as a method bound to the
            # Module (a new Module each time), which leads back to it.
            if id(node) in seen:
                continue
            seen[id(node)] = node
            yield node
            stack.extend(getattr(node, f.name, None) for f in dataclasses.fields(node))
        elif isinstance(node, (tuple, list)):
            stack.extend(node)
        elif isinstance(node, dict):
            stack.extend(node.values())


def check_hyperparameters(transform: Any) -> None:
    """Checks the hyperparameters of `transform` and of every Module inside it.

    What the constructors check (`check_fields`, types and shapes), for a value
    set after construction, such as `eqx.tree_at(..., opt, "1e-3")`: one
    `eqopt.ArgumentTypeError` naming the class and the hyperparameter. Run by
    the entries of a user's `init` and `update`: at trace time under `jit`, and
    once per optimiser object when eager.
    """
    key = id(transform)
    known = _CHECKED.get(key)
    if known is not None and known() is transform:
        return
    try:
        for module in modules(transform):
            check_fields(module, values=False)
    except TypeError as error:
        raise ArgumentTypeError(str(error)) from None
    try:
        _CHECKED[key] = weakref.ref(
            transform, lambda _, key=key: _CHECKED.pop(key, None)
        )
    except TypeError:  # not weakly referable: checked at every call
        pass


def _check_dtype(owner: str, name: str, value: Any) -> None:
    # A dtype field is static and used only at `init`: a misspelt name such as
    # "bf16" would fail there, far from where it was written.
    if not isinstance(value, (str, type, np.dtype)):
        return  # None, or a storage format object, checked where it is used
    try:
        jnp.dtype(value)
    except TypeError:
        raise ValueError(
            f"{owner}: `{name}={value!r}` is not a dtype. Pass a JAX dtype such as "
            "`jnp.bfloat16`, or its name (`'bfloat16'`)."
        ) from None


def check_hyperparameter(
    name: str,
    value: Any,
    *,
    low: float | int | None = None,
    high: float | int | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = False,
    finite: bool = True,
) -> None:
    """Raises a `ValueError` naming `name` if a concrete scalar is out of range.

    Traced values and schedules are not checked (they have no value yet).
    """
    if not is_concrete(value) or value.ndim != 0 or jnp.iscomplexobj(value):
        return
    v = float(value.item())
    if finite and not np.isfinite(v):
        raise ValueError(f"Hyperparameter `{name}` must be finite, got {v}.")
    low_text = "-inf" if low is None else f"{low}"
    high_text = "inf" if high is None else f"{high}"
    interval = (
        ("[" if low_inclusive else "(")
        + f"{low_text}, {high_text}"
        + ("]" if high_inclusive else ")")
    )
    if low is not None and (v < low or (v == low and not low_inclusive)):
        raise ValueError(f"Hyperparameter `{name}` must be in {interval}, got {v}.")
    if high is not None and (v > high or (v == high and not high_inclusive)):
        raise ValueError(f"Hyperparameter `{name}` must be in {interval}, got {v}.")


def check_decays(module: eqx.Module, *names: str, high_inclusive: bool = False) -> None:
    """Checks that each named field, when concrete, is a decay rate in `[0, 1)`.

    With `high_inclusive=True` the interval is `[0, 1]`.
    """
    for name in names:
        check_hyperparameter(
            name,
            getattr(module, name),
            low=0.0,
            high=1.0,
            high_inclusive=high_inclusive,
        )
