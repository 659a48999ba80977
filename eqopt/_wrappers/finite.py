"""Guarding against bad steps: `apply_if_finite`, `skip_not_finite`, `skip_large_updates`."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree, Real

from .._base import AbstractGradientTransformation, AbstractWrapper, Params, Updates
from .._entry import init_entry, update_entry
from .._hyper import IntScalar, as_int_scalar, check_hyperparameter
from .._interop import as_transform
from .._numerics import abs_squared, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._control import select, zeros_like_output


def _array_leaves(updates: Any) -> list[Array]:
    return [leaf for leaf in jax.tree.leaves(updates) if eqx.is_array(leaf)]


def _all_finite(updates: Any) -> Bool[Array, ""]:
    leaves = _array_leaves(updates)
    if not leaves:
        return jnp.asarray(True)
    return jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves]).all()


@checked
class ApplyIfFiniteState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ApplyIfFinite` (Optax's fields).

    - `notfinite_count`: consecutive steps whose gradients had an Inf or a NaN
      (reset to 0 by a finite step).
    - `last_finite`: whether the last step's gradients were all finite.
    - `total_notfinite`: steps with an Inf or a NaN since `init` (never reset).
    - `inner_state`: the wrapped transform's state.
    """

    notfinite_count: Int[Array, ""]
    last_finite: Bool[Array, ""]
    total_notfinite: Int[Array, ""]
    inner_state: Any


@checked
class ApplyIfFinite(AbstractWrapper):
    r"""Skips the steps whose gradients hold an Inf or a NaN, up to a limit.

    With $c_t$ the number of consecutive non-finite steps up to step $t$ and
    $M$ = `max_consecutive_errors`,

    $$
    c_t = \begin{cases} 0 & g_t \text{ finite} \\ c_{t-1} + 1 & \text{otherwise}
    \end{cases}, \qquad
    (u_t, s_t) = \begin{cases} \texttt{inner.update}(g_t, s_{t-1}) &
    g_t \text{ finite or } c_t > M \\ (0, s_{t-1}) & \text{otherwise} \end{cases}
    $$

    A skipped step returns zero updates and leaves the inner state unchanged.
    After more than $M$ consecutive bad steps the wrapper gives up and applies
    the update (so that a run that has truly diverged does not stall silently).

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `inner`: the transform to guard.
    - `max_consecutive_errors`: $M$, the number of consecutive non-finite steps
      to skip before applying one anyway.

    !!! example

        ```python
        opt = eqopt.apply_if_finite(eqopt.adam(1e-3), max_consecutive_errors=5)
        state = opt.init(model)
        bad = jax.tree.map(lambda g: jnp.full_like(g, jnp.nan), grads)
        updates, state = opt.update(bad, state, model)   # skipped: zero updates
        state.notfinite_count, state.last_finite         # 1, False
        updates, state = opt.update(grads, state, model)  # a normal step
        ```
    """

    inner: AbstractGradientTransformation
    max_consecutive_errors: IntScalar = eqx.field(converter=as_int_scalar)

    def __init__(self, inner: Any, max_consecutive_errors: int | Int[Array, ""]):
        self.inner = as_transform(inner)
        self.max_consecutive_errors = max_consecutive_errors  # pyright: ignore[reportAttributeAccessIssue]

    def __check_init__(self):
        super().__check_init__()
        check_hyperparameter(
            "max_consecutive_errors", self.max_consecutive_errors, low=0
        )

    @init_entry
    def init(self, params: Params) -> ApplyIfFiniteState:
        return ApplyIfFiniteState(
            notfinite_count=jnp.zeros([], jnp.int32),
            last_finite=jnp.asarray(True),
            total_notfinite=jnp.zeros([], jnp.int32),
            inner_state=self.inner.init(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ApplyIfFiniteState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ApplyIfFiniteState]:
        finite = _all_finite(updates)
        notfinite_count = jnp.where(
            finite,
            jnp.zeros([], jnp.int32),
            safe_int32_increment(state.notfinite_count),
        )
        total_notfinite = jnp.where(
            finite, state.total_notfinite, safe_int32_increment(state.total_notfinite)
        )
        apply = jnp.logical_or(finite, notfinite_count > self.max_consecutive_errors)
        inner_updates, inner_state = self.inner.update(
            updates, state.inner_state, params, **extra_args
        )
        zeros = zeros_like_output(eqx.filter_eval_shape(lambda: inner_updates))
        return select(apply, inner_updates, zeros), ApplyIfFiniteState(
            notfinite_count=notfinite_count,
            last_finite=finite,
            total_notfinite=total_notfinite,
            inner_state=select(apply, inner_state, state.inner_state),
        )


@checked
def apply_if_finite(inner: Any, max_consecutive_errors: int) -> ApplyIfFinite:
    """Optax spelling of `eqopt.ApplyIfFinite`."""
    return ApplyIfFinite(inner, max_consecutive_errors)


@checked
def skip_not_finite(
    updates: PyTree[Any],
    gradient_step: Int[ArrayLike, ""],
    params: Params | None,
) -> tuple[Bool[Array, ""], dict[str, Array]]:
    r"""A `should_skip_update_fn` for `eqopt.MultiSteps`: skip a step holding an Inf or a NaN.

    $$ \text{skip} \iff \exists i:\ g_i \notin \mathbb{R} $$

    **Arguments:**

    - `updates`: the mini-step's gradients (`None` leaves are ignored).
    - `gradient_step`: the inner step count (unused).
    - `params`: the parameters (unused).

    **Returns:** `(should_skip, {"should_skip": ..., "num_not_finite": ...})`,
    the second element being the number of non-finite entries.
    """
    del gradient_step, params
    leaves = _array_leaves(updates)
    if leaves:
        num_not_finite = sum(
            jnp.sum(~jnp.isfinite(leaf), dtype=jnp.int32) for leaf in leaves
        )
    else:
        num_not_finite = jnp.zeros([], jnp.int32)
    num_not_finite = jnp.asarray(num_not_finite, jnp.int32)
    should_skip = num_not_finite > 0
    return should_skip, {"should_skip": should_skip, "num_not_finite": num_not_finite}


@checked
def skip_large_updates(
    updates: PyTree[Any],
    gradient_step: Int[ArrayLike, ""],
    params: Params | None,
    max_squared_norm: Real[ArrayLike, ""],
) -> tuple[Bool[Array, ""], dict[str, Array]]:
    r"""A `should_skip_update_fn` for `eqopt.MultiSteps`: skip a step with a large norm.

    $$ \text{skip} \iff \neg\big(\|g\|_2^2 < N\big) $$

    Use it as `functools.partial(eqopt.skip_large_updates, max_squared_norm=N)`.
    A step is kept only if its squared norm is below $N$, so a step with an Inf
    or a NaN is skipped too.

    **Arguments:**

    - `updates`: the mini-step's gradients (`None` leaves are ignored).
    - `gradient_step`: the inner step count (unused).
    - `params`: the parameters (unused).
    - `max_squared_norm`: $N$, the largest squared global norm accepted.

    **Returns:** `(should_skip, {"should_skip": ..., "norm_squared": ...})`.
    """
    del gradient_step, params
    leaves = _array_leaves(updates)
    if leaves:
        norm_squared = sum(jnp.sum(abs_squared(leaf)) for leaf in leaves)
    else:
        norm_squared = jnp.zeros([])
    norm_squared = jnp.asarray(norm_squared)
    should_skip = jnp.logical_not(norm_squared < max_squared_norm)
    return should_skip, {"should_skip": should_skip, "norm_squared": norm_squared}
