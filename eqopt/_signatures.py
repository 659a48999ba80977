"""What a user's function accepts, read from its signature (no eqopt imports)."""

import inspect
from collections.abc import Callable


def accepts_extra_args(fn: Callable) -> bool:
    """Whether `fn` takes `**kwargs`, so that extra arguments of `update` can be
    forwarded to it (true when its signature cannot be read)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
