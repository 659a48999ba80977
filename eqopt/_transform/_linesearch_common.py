r"""The pieces the line searches share, and reusing their values (`value_and_grad_from_state`).

A line search is a transform whose `update` takes three extra keyword arguments
besides the direction `updates`: `value` and `grad`, the objective and its
gradient at `params`, and `value_fn`, the objective itself (a function of the
whole params, an Equinox model included). It evaluates the objective along the
direction, picks a step size $\eta$ and returns $\eta\,u$. Further extra
arguments whose names `value_fn` accepts (a batch, say) are passed on to it.
"""

import inspect
from collections.abc import Callable
from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .. import _sharding
from .._base import Params, Updates, is_none, path_str
from .._checks import check_updates
from .._leafwise import zeros_like_trainable
from .._typecheck import checked
from ..tree._state import get_all_with_path

# ---------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------


def _real_dtype() -> Any:
    # float32, or float64 when x64 is enabled: the dtype of values, slopes and steps.
    return jax.dtypes.canonicalize_dtype(jnp.float64)


@no_type_check
def _real_inner(x, y):
    """$\\operatorname{Re} \\sum_\\ell \\langle x_\\ell, y_\\ell\\rangle$ over leaves present in both.

    Each leaf's product is in the leaves' dtype and the sum in their promoted
    dtype (as Optax computes it), so `bfloat16` params give `bfloat16` products.
    """
    total = None
    for a, b in zip(
        jax.tree.leaves(x, is_leaf=is_none),
        jax.tree.leaves(y, is_leaf=is_none),
        strict=False,
    ):
        if a is None or b is None:
            continue
        product = _sharding.inner(a, b)
        dtype = (
            product.dtype if total is None else jnp.promote_types(dtype, product.dtype)
        )
        wide = product.astype(jnp.promote_types(product.dtype, jnp.float32))
        total = wide if total is None else total + wide
    if total is None:
        return jnp.zeros([], _real_dtype())
    return jnp.real(total.astype(dtype))


@no_type_check
def _slope(grad, updates):
    r"""The derivative of $\eta \mapsto f(w + \eta u)$ at 0: $\operatorname{Re}\sum g\,u$.

    JAX's gradient of a real function of complex inputs is the conjugate of the
    ascent direction, so the directional derivative is $\operatorname{Re}\sum g u$
    (not $\sum \bar g u$); for real inputs both are $\langle g, u\rangle$.
    """
    conjugate = jax.tree.map(
        lambda g: None if g is None else jnp.conj(g), grad, is_leaf=is_none
    )
    return _real_inner(conjugate, updates).astype(_real_dtype())


@no_type_check
def _along(params, stepsize, updates):
    """The params moved by `stepsize * updates`, each leaf kept in its dtype."""

    def move(u, p):
        if u is None:
            return p
        return (p + stepsize.astype(u.real.dtype) * u).astype(p.dtype)

    return jax.tree.map(move, updates, params, is_leaf=is_none)


@no_type_check
def _scale(stepsize, updates):
    def scale(u):
        return (
            None if u is None else (stepsize.astype(u.real.dtype) * u).astype(u.dtype)
        )

    return jax.tree.map(scale, updates, is_leaf=is_none)


@no_type_check
def _kwargs_for(value_fn, extra_args):
    """The extra arguments `value_fn` accepts by name (all of them if it takes `**kwargs`)."""
    try:
        parameters = inspect.signature(value_fn).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(extra_args)
    return {k: v for k, v in extra_args.items() if k in parameters}


@no_type_check
def _objective_inputs(owner, updates, params, extra_args):
    """Reads and checks `value`, `grad` and `value_fn` from the extra arguments."""
    missing = [k for k in ("value", "grad", "value_fn") if extra_args.get(k) is None]
    if missing or params is None:
        what = ", ".join(
            f"`{k}`" for k in missing + ([] if params is not None else ["params"])
        )
        raise TypeError(
            f"{owner} is a line search: its `update` needs the objective, but {what} "
            "was not given. Call `update(updates, state, params, value=value, "
            "grad=grad, value_fn=loss_fn)`, with `value, grad` the loss and its "
            "gradient at `params` (e.g. `eqx.filter_value_and_grad(loss_fn)(model)`) "
            "and `loss_fn(params)` returning the loss."
        )
    value, grad, value_fn = (
        extra_args["value"],
        extra_args["grad"],
        extra_args["value_fn"],
    )
    if not callable(value_fn):
        raise TypeError(
            f"{owner}: `value_fn` must be a function of the params returning the "
            f"loss, got {type(value_fn).__name__}."
        )
    value = jnp.asarray(value)
    if value.size != 1 or jnp.iscomplexobj(value):
        raise ValueError(
            f"{owner}: `value` must be the (real, scalar) loss at `params`, got an "
            f"array of dtype {value.dtype} and shape {tuple(value.shape)}."
        )
    check_updates(updates, params)
    check_updates(grad, params, name="grad", reference_name="params")
    update_leaves = jax.tree.leaves(updates, is_leaf=is_none)
    grad_leaves = jax.tree.leaves(grad, is_leaf=is_none)
    paths = jax.tree_util.tree_flatten_with_path(updates, is_leaf=is_none)[0]
    for (path, u), g in zip(paths, grad_leaves, strict=True):
        if u is not None and g is None:
            raise ValueError(
                f"{owner}: `grad` at {path_str(path)} is None but `updates` there is "
                "not: the gradient is needed wherever the line search moves."
            )
    del update_leaves
    rest = {
        k: v for k, v in extra_args.items() if k not in ("value", "grad", "value_fn")
    }
    return (
        value.reshape(()).astype(_real_dtype()),
        grad,
        value_fn,
        _kwargs_for(value_fn, rest),
    )


@no_type_check
def _value_and_grad_along(value_fn, fn_kwargs, params, updates, grad_like):
    """`stepsize -> (value, grad, slope)` of the objective at `params + stepsize * updates`.

    The gradient is kept where `grad_like` has a leaf, in its dtypes, so that it
    has the structure of the `grad` the caller gave.
    """
    value_and_grad = eqx.filter_value_and_grad(lambda p: value_fn(p, **fn_kwargs))

    def evaluate(stepsize):
        value, grad = value_and_grad(_along(params, stepsize, updates))
        grad = jax.tree.map(
            lambda ref, g: None if ref is None else jnp.asarray(g).astype(ref.dtype),
            grad_like,
            grad,
            is_leaf=is_none,
        )
        value = jnp.asarray(value).reshape(()).astype(_real_dtype())
        return value, grad, _slope(grad, updates)

    return evaluate


def _initial_grad(params: Params) -> Updates:
    return zeros_like_trainable(params)


@eqx.filter_jit
@no_type_check
def _run_search(
    transform, updates, state, params, value_init, grad, value_fn, fn_kwargs
):
    # Compiled once per transform, params structure and `value_fn`, so that a
    # loop run eagerly (as in Optax's examples) does not recompile the search
    # at every step; under an outer `jit` this is inlined.
    return transform._search(
        updates, state, params, value_init, grad, value_fn, fn_kwargs
    )


# ---------------------------------------------------------------------------
# Reusing the line search's value and gradient
# ---------------------------------------------------------------------------


class _SeveralFoundError(KeyError, ValueError):
    """The state holds several line searches' values: a `KeyError`, as Optax's
    `tree_get` raises there, and a `ValueError`, as for a state holding none."""

    __str__ = Exception.__str__


@checked
def value_and_grad_from_state(
    value_fn: Callable[..., Any],
) -> Callable[..., tuple[Float[Array, ""], Updates]]:
    r"""Like `eqx.filter_value_and_grad(value_fn)`, but reuses what a line search stored.

    A line search evaluates the objective and its gradient at the step it
    accepts, which are the value and gradient at the next params. The returned
    function `value_and_grad(params, *args, state, **kwargs)` reads them from
    the optimiser state (the one `value` and `grad` found in it, at any depth,
    e.g. in `eqopt.ScaleByZoomLinesearchState` inside an L-BFGS chain) and
    computes them with `eqx.filter_value_and_grad` only when the stored value
    is not finite (before the first step). Use it for deterministic objectives
    only: with a new batch each step the stored values are stale.

    **Arguments:**

    - `value_fn`: the objective, a function of the params (a whole model is
      fine) and optionally further arguments, returning a scalar.

    **Returns:** `value_and_grad(params, *args, state, **kwargs) -> (value, grad)`,
    `grad` shaped like `params` with `None` where a leaf is not trainable.

    **Raises:** `ValueError` if the state holds no `value`/`grad`, or if its
    `grad` is `None` (a backtracking search without `store_grad=True`); an error
    that is both a `KeyError` (as in Optax) and a `ValueError` if it holds several.

    !!! example

        ```python
        def loss(model):
            return loss_fn(model, x, y)

        opt = eqopt.lbfgs()
        state = opt.init(model)
        value_and_grad = eqopt.value_and_grad_from_state(loss)
        value, grad = value_and_grad(model, state=state)
        updates, state = opt.update(grad, state, model, value=value, grad=grad, value_fn=loss)
        ```
    """
    computed = eqx.filter_value_and_grad(value_fn)

    def value_and_grad(
        params: Params, *fn_args: Any, state: Any, **fn_kwargs: Any
    ) -> tuple[Float[Array, ""], Updates]:
        values = get_all_with_path(state, "value")
        grads = get_all_with_path(state, "grad")
        if len(values) != 1 or len(grads) != 1:
            several = len(values) > 1 or len(grads) > 1
            raise (_SeveralFoundError if several else ValueError)(
                "value_and_grad_from_state: expected one `value` and one `grad` in "
                f"the state, found {len(values)} and {len(grads)}. The state should "
                "come from an optimiser with one line search "
                "(e.g. `eqopt.lbfgs()` or a chain ending in `scale_by_zoom_linesearch`)."
            )
        (_, value), (_, grad) = values[0], grads[0]
        if grad is None:
            raise ValueError(
                "value_and_grad_from_state: the line search stored no gradient; "
                "build it with `scale_by_backtracking_linesearch(..., "
                "store_grad=True)`."
            )

        @no_type_check
        def compute():
            new_value, new_grad = computed(params, *fn_args, **fn_kwargs)
            try:
                new_grad = jax.tree.map(
                    lambda ref, g: None if ref is None else g.astype(ref.dtype),
                    grad,
                    new_grad,
                    is_leaf=is_none,
                )
            except ValueError:
                raise ValueError(
                    "value_and_grad_from_state: the gradient of `value_fn` at "
                    "`params` does not have the structure of the `grad` in the "
                    "state: was the state made for these params?"
                ) from None
            return jnp.asarray(new_value).reshape(()).astype(value.dtype), new_grad

        @no_type_check
        def stored():
            return value, grad

        return jax.lax.cond(jnp.isfinite(value), stored, compute)

    return value_and_grad
