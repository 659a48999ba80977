"""Type checking at eqopt's public boundary: `@checked`, lazily, with short errors.

Every public constructor, `init`, `update`, schedule call, loss and tree
function of eqopt carries jaxtyping annotations, and is decorated where it is
defined: `@checked` on a function, a schedule's `__call__` or a public class
(whose constructor and fields are then checked), and the entries of
`eqopt/_entry.py` on a transform's `init` and `update` (which check the same
way). Private helpers are not checked in a user's process; the test suite
checks them too (`tests/_checking_hook.py`). `JAXTYPING_DISABLE=1` turns every
check off.

What `@checked` adds to `jaxtyping.jaxtyped(typechecker=beartype)`:

- **Lazily.** The checking wrapper of a function is built on its first call,
  not when the module is imported: eqopt has hundreds of public functions, and
  building them up front made `import eqopt` seconds slower.
- **Short errors.** A failed check raises `eqopt.ArgumentTypeError`, a
  `TypeError` whose message is one line: the function, the argument, what was
  expected and what came (with a hint when a state of another transform was
  passed). It is raised from the decorated function's own frame, not from
  the checker's wrappers.
- **Calls that do not bind** get Python's wording, naming the function, and
  a suggestion for a misspelt keyword.
"""

import contextvars
import dataclasses
import difflib
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

import jaxtyping


class ArgumentTypeError(jaxtyping.AnnotationError, jaxtyping.TypeCheckError):
    """An argument of an eqopt function has the wrong type or shape.

    A `TypeError` (and a `jaxtyping.TypeCheckError`, as without eqopt's
    wrapper). It also derives from `jaxtyping.AnnotationError`, which is how it
    reaches the user with its one-line message, untouched by jaxtyping.
    """


class ArgumentValueError(jaxtyping.AnnotationError, ValueError):
    """An argument of an eqopt function is not one of the values it may take.

    Raised for an argument annotated with a `Literal` (a choice among named
    options, such as `variant="sps"`): a `ValueError`, as Optax raises for a bad
    choice, with the same one-line message as `eqopt.ArgumentTypeError`.
    """


_PARAMETER = re.compile(r"parameter (\w+)=")


def _is_choice(fn: Callable, error: Exception) -> bool:
    # Whether the failed argument is annotated with Literals only (and maybe None).
    match = _PARAMETER.search(str(error))
    if match is None:
        return False
    try:
        annotation = inspect.signature(fn).parameters[match.group(1)].annotation
    except (TypeError, ValueError, KeyError):
        return False
    options = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    options = tuple(o for o in options if o is not type(None))
    return bool(options) and all(typing.get_origin(o) is Literal for o in options)


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"an array {dtype}{list(shape)}"
    name = type(value).__name__
    if isinstance(value, (bool, int, float, complex, str)) or value is None:
        text = repr(value)
        return f"{name} {text[:40]}"
    return f"a {name}"


_JAXTYPING = re.compile(r"jax(\w+)\[(\w+), '([^']*)'\]")
_LITERAL = re.compile(r"Literal\[([^\]]*)\]")
_SCALAR = "a real number (a Python number or a 0-d array)"


def _expected(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return "?"
    name = (
        getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    )
    # A jaxtyping array type is a class too; its name is cleaned up as in a union.
    text = name if name is not None and "[" not in name else None
    if text is None:
        text = f"jaxtyping.{name}" if name is not None else str(annotation)
        text = text.replace("typing.", "").replace("jaxlib._jax.", "")
        text = text.replace("collections.abc.", "").replace("numpy.", "np.")
        text = _JAXTYPING.sub(
            lambda m: f'{m.group(1)}[{m.group(2)}, "{m.group(3)}"]', text
        )
        text = _LITERAL.sub(lambda m: f"one of {m.group(1)}", text)
        if text.startswith("Union[") and text.endswith("]"):
            text = " | ".join(part.strip() for part in _split_top_level(text[6:-1]))
        # The hyperparameter aliases of eqopt._hyper, in words.
        scalar = 'float | int | Real[Array, ""] | Real[ndarray, ""] | np.number'
        text = text.replace(scalar, _SCALAR)
    return text if len(text) <= 160 else text[:157] + "..."


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def _owner(fn: Callable) -> str:
    qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", "function"))
    qualname = qualname.replace(".<locals>", "")
    if qualname.endswith(".__init__"):
        return qualname[: -len(".__init__")]
    return qualname


def _hint(value: Any, annotation: Any) -> str:
    # A state of another transform: name the transform that made it.
    name = type(value).__name__
    expected = getattr(annotation, "__name__", "")
    if name.endswith("State") and expected.endswith("State") and name != expected:
        maker = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name[: -len("State")]).lower()
        return (
            f" This looks like the state of `{maker}`: pass the state made by this "
            "transform's `init`."
        )
    return ""


def _message(fn: Callable, error: Exception, args, kwargs) -> str:
    owner = _owner(fn)
    match = _PARAMETER.search(str(error))
    if match is None:
        return f"{owner}: {str(error).splitlines()[0][:300]}"
    name = match.group(1)
    try:
        signature = inspect.signature(fn)
        bound = signature.bind_partial(*args, **kwargs)
        value = bound.arguments.get(name, inspect.Parameter.empty)
        annotation = signature.parameters[name].annotation
    except (TypeError, ValueError, KeyError):
        return f"{owner}: argument `{name}` has the wrong type."
    got = "nothing" if value is inspect.Parameter.empty else _describe(value)
    explain = getattr(annotation, "explain", None)
    if callable(explain) and value is not inspect.Parameter.empty:
        # The annotation can say which part of the value is wrong (a leaf's path).
        reason = explain(value)
        if reason:
            return f"{owner}: argument `{name}` must be {reason}."
    return (
        f"{owner}: argument `{name}` must be {_expected(annotation)}, got {got}."
        + _hint(value, annotation)
    )


def typechecker(fn: Callable) -> Callable:
    """beartype `fn` on its first call, and turn a failed check into a one-line error."""
    checked: Callable | None = None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal checked
        # beartype itself is imported on the first check, not with eqopt.
        from beartype import beartype
        from beartype.roar import BeartypeCallHintViolation

        if checked is None:
            checked = beartype(fn)
        try:
            return checked(*args, **kwargs)
        except BeartypeCallHintViolation as error:
            kind = ArgumentValueError if _is_choice(fn, error) else ArgumentTypeError
            raise kind(_message(fn, error, args, kwargs)) from None

    return wrapper


def call_error(
    fn: Callable, error: TypeError, args: tuple, kwargs: dict, owner: str
) -> TypeError | None:
    """Python's own wording for a call that does not bind to `fn`'s signature.

    jaxtyping binds the arguments before checking them and raises binding's bare
    message (`got an unexpected keyword argument 'x'`), which names neither the
    function nor the fix. Returns `None` when the arguments do bind (the error
    came from the body), so that error is re-raised as it is. Only runs on the
    error path.
    """
    if isinstance(error, ArgumentTypeError):
        return None
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError as binding:
        message = str(binding)
    else:
        return None
    parameters = signature.parameters.values()
    names = [
        p.name
        for p in parameters
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"
    ]
    # As Python does, a misspelt keyword is reported as such, before what is missing.
    takes_any_keyword = any(p.kind is p.VAR_KEYWORD for p in parameters)
    unexpected = [k for k in kwargs if k not in names and not takes_any_keyword]
    if unexpected:
        message = f"got an unexpected keyword argument '{unexpected[0]}'"
        close = difflib.get_close_matches(unexpected[0], names, n=1)
        return TypeError(
            f"{owner}() {message}" + (f"; did you mean '{close[0]}'?" if close else "")
        )
    return TypeError(f"{owner}() {message}")


#: Whether an eqopt call is running in this context: set by the outermost
#: checked call (a public function, a constructor, a transform's `init` or
#: `update`) for as long as it runs. A call made meanwhile (a chain calling its
#: parts, a factory building its transforms, a transform building its state)
#: passes on what the outermost call checked, and is not checked again. The
#: rule is the same in a user's process and in the tests: it does not ask who
#: the caller is, only whether an eqopt call is already running. Modules that
#: pass on a user's call (a `TrainState`, a ZeRO plan, `to_optax`'s wrapper) are
#: not checked calls themselves, so the optimiser they call checks what they
#: pass on.
RUNNING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "eqopt_call_running", default=False
)


def nested_call() -> bool:
    """Whether an eqopt call is already running (this one passes on its checks)."""
    return RUNNING.get()


def state_checker(fn: Callable, owner: str) -> Callable[[Any], None]:
    """A check that the `state` given to `fn` (a transform's `update`) is of its
    annotated state class, for calls that pass on the other checks
    (`nested_call`).

    A chain's or wrapper's own check sees only its own state class: given the
    state of another optimiser with the same outer class (two chains), a part
    would otherwise read a field that is not there. One `isinstance` per part
    and call (once per trace under `jit`); the message is the one the full check gives.
    """
    annotation: Any = None
    classes: tuple[type, ...] = ()  # empty: no class to check against

    def check_state(state: Any) -> None:
        nonlocal annotation, classes
        if annotation is None:  # resolved on the first call: forward references
            try:
                annotation = typing.get_type_hints(fn).get("state", Any)
            except Exception:  # an annotation that does not resolve: no check
                annotation = Any
            found = (
                typing.get_args(annotation) if _is_union(annotation) else (annotation,)
            )
            if all(isinstance(c, type) and c is not Any for c in found):
                classes = found
        if not classes or isinstance(state, classes):
            return
        raise ArgumentTypeError(
            f"{owner}: argument `state` must be {_expected(annotation)}, got "
            f"{_describe(state)}." + _hint(state, classes[0])
        )

    return check_state


def run_checked(
    fn: Callable, checked: Callable, args: tuple, kwargs: dict, owner: str
) -> Any:
    """`checked(*args, **kwargs)` (`fn` with its checks), its errors made short.

    A failed check is raised again from here: the checker's own frames tell
    the user nothing. A call that does not bind gets Python's wording, naming
    `owner` (`call_error`).
    """
    try:
        return checked(*args, **kwargs)
    except (ArgumentTypeError, ArgumentValueError) as error:
        raise error.with_traceback(None) from None
    except TypeError as error:
        better = call_error(fn, error, args, kwargs, owner)
        if better is None:
            raise
        raise better from None


def lazily_checked(fn: Callable, owner: str) -> Callable:
    """`fn` with `jaxtyped(typechecker=typechecker)`, built on the first call,
    run by `run_checked`."""
    built: Callable | None = None

    def check(*args, **kwargs):
        nonlocal built
        if built is None:
            built = jaxtyping.jaxtyped(typechecker=typechecker)(fn)
        return run_checked(fn, built, args, kwargs, owner)

    return check


def checked_function(fn: Callable, *, always: bool = False) -> Callable:
    """`fn` checked when it is the outermost eqopt call (`lazily_checked`,
    `nested_call`), or on every call with `always=True` (the test suite's
    check of private helpers, which leaves the running call as it is)."""
    checked = lazily_checked(fn, fn.__name__)

    @functools.wraps(fn)
    def check(*args, **kwargs):
        if always:
            return checked(*args, **kwargs)
        if RUNNING.get():
            return fn(*args, **kwargs)
        token = RUNNING.set(True)
        try:
            return checked(*args, **kwargs)
        finally:
            RUNNING.reset(token)

    check.__eqopt_checked__ = True  # pyright: ignore[reportAttributeAccessIssue]
    return check


def _name_call_errors(cls: type, unchecked: Callable, always: bool) -> None:
    # `cls.__init__` is jaxtyping's wrapper: a call that does not bind gets
    # Python's wording, naming the class (see `call_error`). Constructions made
    # while an eqopt call runs (a state made in `update`) call `unchecked`.
    init = cls.__init__

    @functools.wraps(init)
    def named(self, *args, **kwargs):
        if always:
            return run_checked(init, init, (self, *args), kwargs, cls.__name__)
        if RUNNING.get():
            return unchecked(self, *args, **kwargs)
        token = RUNNING.set(True)
        try:
            return run_checked(init, init, (self, *args), kwargs, cls.__name__)
        finally:
            RUNNING.reset(token)

    cls.__init__ = named  # pyright: ignore


def checked_class(cls: type, *, always: bool = False) -> type:
    """`jaxtyped(typechecker=typechecker)(cls)`, applied at the first instantiation.

    The constructor is checked when it is the outermost eqopt call
    (`nested_call`), or on every call with `always=True` (the test suite's
    check of private classes).

    For a dataclass (every Module) `jaxtyped` wraps `__init__` to check the
    fields once it has run. Until the first instance is made, a placeholder
    `__init__` stands in: it puts the class's own `__init__` back (or removes
    itself, when the class inherits its `__init__`), lets `jaxtyped` wrap it, and
    calls the result.
    """

    if not dataclasses.is_dataclass(cls):
        return jaxtyping.jaxtyped(typechecker=typechecker)(cls)
    own = cls.__dict__.get("__init__")

    @functools.wraps(own if own is not None else cls.__init__)
    def placeholder(self, *args, **kwargs):
        if cls.__dict__.get("__init__") is placeholder:
            if own is None:
                delattr(cls, "__init__")
            else:
                cls.__init__ = own  # pyright: ignore
            unchecked = cls.__init__
            jaxtyping.jaxtyped(typechecker=typechecker)(cls)
            _name_call_errors(cls, unchecked, always)
        return cls.__init__(self, *args, **kwargs)  # pyright: ignore

    cls.__init__ = placeholder  # pyright: ignore
    cls.__eqopt_checked__ = True  # pyright: ignore[reportAttributeAccessIssue]
    return cls


_T = typing.TypeVar("_T")


def checked(obj: _T) -> _T:
    """Checks a public function's (or class's constructor's) annotations on every call.

    On a function or method: its arguments and return value, with jaxtyping's
    shape annotations and beartype, the checker built on the first call. On a
    class (an `eqx.Module` or dataclass): its constructor's arguments and then
    its fields. A failed check is one `eqopt.ArgumentTypeError` (or
    `eqopt.ArgumentValueError` for a choice among named options). Under
    `jit` the check runs when tracing, so it costs nothing per step.
    """
    if isinstance(obj, type):
        return typing.cast(_T, checked_class(obj))
    return typing.cast(_T, checked_function(typing.cast(Callable, obj)))
