"""The registry of every transform and optimiser under test.

One `Case` per configuration. The generic tests in `test_transforms.py` run every
case: init/update on an Equinox model with non-array leaves and `None`
gradients, jit without retrace when a hyperparameter changes, a typed state
that survives serialisation, parity with Optax over several steps on float32,
bfloat16 and complex parameters, and the elementwise claim.

Cases are split across `_cases_*.py` files by family; each exports `CASES`.
"""

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import jax


@dataclasses.dataclass(frozen=True)
class Case:
    #: Test id, e.g. "scale_by_adam-nesterov".
    name: str
    #: Builds the eqopt transform: no argument, or `p`, the params it will train (to
    #: build masks and label trees shaped like them with `spec_like`).
    make: Callable[..., Any]
    #: Builds the Optax transform to compare against (same convention; its params
    #: are a dict of the trainable arrays), or None when there is no oracle.
    optax: Callable[..., Any] | None = None
    #: Parameter dtypes for the parity test. Complex only where Optax supports it.
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    #: Extra keyword arguments passed to both `update`s.
    extra_args: Callable[[Any, Any], dict] | None = None
    #: Tolerances for float32 parity; bfloat16 uses loose ones. eqopt keeps
    #: hyperparameters as float32 leaves, so `1 - b2` is rounded in float32 where
    #: Optax computes it in Python's float64 (a relative 1e-5 in Adam's second
    #: moment; see test_adam_complement_rounding), hence rtol 5e-5.
    rtol: float = 5e-5
    atol: float = 1e-5
    #: Number of steps to compare.
    steps: int = 4
    #: Whether the transform needs `params` in `update`.
    needs_params: bool = True
    #: Whether the update is random (compared by statistics, not values): skip parity.
    random: bool = False
    #: Why parity is skipped, if it is.
    no_parity_reason: str | None = None


def all_cases() -> list[Case]:
    from _cases_core import CASES as core

    cases = list(core)
    for module in ("_cases_more", "_cases_alias", "_cases_wrappers"):
        try:
            cases += __import__(module).CASES
        except ModuleNotFoundError as error:
            if error.name != module:
                raise
    names = [c.name for c in cases]
    duplicates = {n for n in names if names.count(n) > 1}
    assert not duplicates, f"duplicate case names: {duplicates}"
    return cases



def build(factory: Callable[..., Any], params: Any) -> Any:
    """Calls a case's factory, passing the params if it takes an argument named `p`."""
    if "p" in inspect.signature(factory).parameters:
        return factory(params)
    return factory()


def spec_like(params: Any, default: Any = False, **values: Any) -> Any:
    """A tree shaped like `params` whose leaf under the field or key `name` is `values[name]`.

    Works for the dict params given to Optax and the Equinox model given to eqopt,
    so one case can state a mask or a label tree once for both.
    """

    def value(path, leaf):
        key = path[-1]
        name = getattr(key, "name", getattr(key, "key", None))
        return values.get(name, default)

    return jax.tree_util.tree_map_with_path(value, params, is_leaf=lambda x: x is None)


ALL_CASES = all_cases()
