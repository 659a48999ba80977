"""The type checker eqopt's import hook applies: beartype, lazily, with short errors.

The import hook of `eqopt/_hook.py` decorates every function and Module of
eqopt with `jaxtyping.jaxtyped(typechecker=typechecker)` (built on first use),
so every annotation is checked by beartype (at trace time under `jit`). Two things differ from passing
`beartype.beartype` itself:

- **Lazily.** beartype builds a checking wrapper for a function on the first
  call, not when the module is imported: eqopt has over a thousand annotated
  functions, and decorating them all up front made `import eqopt` seconds
  slower than `import jax, equinox`.
- **Short errors.** A failed check raises [`eqopt.ArgumentTypeError`][], a
  `TypeError` whose message is one line: the function, the argument, what was
  expected and what came (with a hint when a state of another transform was
  passed). jaxtyping re-raises it as it is, instead of printing every argument
  of the call (a whole model, often hundreds of lines).

This module is imported before the hook is installed, so it is not checked itself.
"""

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
    choice, with the same one-line message as [`eqopt.ArgumentTypeError`][].
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
