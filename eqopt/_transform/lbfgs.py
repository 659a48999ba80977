"""Limited-memory BFGS: the preconditioner `scale_by_lbfgs` and the optimiser `lbfgs`."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .. import _sharding
from .._base import AbstractGradientTransformation, Params, Updates, is_none
from .._checks import check_updates
from .._combine import Chain
from .._defaults import DefaultTransform, resolve
from .._entry import init_entry, update_entry
from .._hyper import ScalarOrSchedule
from .._leafwise import zeros_like_trainable
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ._linesearch_common import _real_dtype, _real_inner
from .basic import Identity, Scale, ScaleByLearningRate
from .linesearch import ScaleByZoomLinesearch


@checked
class ScaleByLBFGSState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByLBFGS`.

    - `count`: the number of updates made.
    - `params`, `updates`: the params and incoming updates of the last step
      (`None` where a leaf is not trained).
    - `diff_params_memory`, `diff_updates_memory`: the last `memory_size`
      differences $s_i = w_{i+1} - w_i$ and $y_i = g_{i+1} - g_i$, each leaf
      stacked along a leading axis of size `memory_size` (a ring buffer).
    - `weights_memory`: $\\rho_i = 1 / \\langle s_i, y_i\\rangle$ for each pair
      (0 for an empty slot or a pair with $\\langle s_i, y_i\\rangle = 0$).
    """

    count: Int[Array, ""]
    params: Updates
    updates: Updates
    diff_params_memory: Updates
    diff_updates_memory: Updates
    weights_memory: Float[Array, " memory_size"]


@no_type_check
def _map(fn, *trees):
    """Maps `fn` over leaves, `None` where the first tree is `None`."""
    return jax.tree.map(
        lambda x, *rest: None if x is None else fn(x, *rest),
        *trees,
        is_leaf=is_none,
    )


@no_type_check
def _axpy(x, scalar, y):
    """`x + scalar * y`, in `x`'s dtype."""
    return _map(
        lambda a, b: (a + scalar.astype(a.real.dtype) * b).astype(a.dtype), x, y
    )


@eqx.filter_jit
@no_type_check
def _two_loop(updates, diff_params, diff_updates, weights, identity_scale, newest):
    """$P u$ by the two-loop recursion of Nocedal & Wright (Alg. 7.4).

    The pairs sit in a ring buffer whose newest entry is at index `newest`;
    empty slots have weight 0, which makes them no-ops.
    """
    memory_size = weights.shape[0]
    newest_first = (newest - jnp.arange(memory_size)) % memory_size

    def pair(index):
        return (
            _map(lambda m: m[index], diff_params),
            _map(lambda m: m[index], diff_updates),
            weights[index],
        )

    def backward(q, index):
        s, y, rho = pair(index)
        alpha = rho * _real_inner(s, q)
        return _axpy(q, -alpha, y), alpha

    q, alphas = jax.lax.scan(backward, updates, newest_first)
    r = _map(lambda x: (identity_scale.astype(x.real.dtype) * x).astype(x.dtype), q)

    def forward(r, index_and_alpha):
        index, alpha = index_and_alpha
        s, y, rho = pair(index)
        beta = rho * _real_inner(y, r)
        return _axpy(r, alpha - beta, s), None

    r, _ = jax.lax.scan(forward, r, (newest_first[::-1], alphas[::-1]))
    return r


@checked
class ScaleByLBFGS(AbstractGradientTransformation):
    r"""Preconditions the updates by the L-BFGS approximation of the inverse Hessian.

    With $s_i = w_{i+1} - w_i$ and $y_i = u_{i+1} - u_i$ the differences of
    params and incoming updates (gradients) over the last $m$ steps, and
    $\rho_i = 1 / \langle s_i, y_i \rangle$, the inverse Hessian estimate is

    $$
    \begin{aligned}
    P_{k, j+1} &= V_j^\top P_{k, j} V_j + \rho_j s_j s_j^\top, \qquad
    V_j = I - \rho_j y_j s_j^\top, \qquad j = k-m, \dots, k-1, \\
    P_{k, k-m} &= \gamma_k I, \qquad
    \gamma_k = \frac{\langle s_{k-1}, y_{k-1} \rangle}{\langle y_{k-1}, y_{k-1} \rangle},
    \end{aligned}
    $$

    and the output is $P_k u_k$, computed by the two-loop recursion without
    forming $P_k$. At the first step $\gamma_0 = \min(1, 1/\|u_0\|)$, so the
    first step has length at most 1 (a heuristic of Optax's, not in the
    papers). With `scale_init_precond=False`, $\gamma_k = 1$ throughout. A pair
    with $\langle s, y \rangle = 0$ is ignored, and $\gamma_k = 1$ when
    $y_{k-1} = 0$. Inner products of complex leaves are
    $\operatorname{Re}\langle \cdot, \cdot \rangle$.

    The output is not negated: chain a negative scaling and a line search after
    it, as `eqopt.lbfgs` does. `update` needs `params`.

    **Global**: one set of inner products over all the leaves, a stacked layer's slices
    included.

    **Arguments:**

    - `memory_size`: $m$, the number of pairs kept.
    - `scale_init_precond`: use $\gamma_k$ above rather than 1.

    **References:** Nocedal & Wright, *Numerical Optimization*, 2nd ed., 2006,
    Alg. 7.4 and 7.5; Liu & Nocedal, *On the limited memory BFGS method for
    large scale optimization*, Math. Programming 45, 1989.
    """

    memory_size: int = eqx.field(default=10, static=True)
    scale_init_precond: bool = eqx.field(default=True, static=True)

    @property
    def elementwise(self) -> bool:
        return False

    def __check_init__(self):
        if not isinstance(self.memory_size, int) or self.memory_size < 1:
            raise ValueError(
                f"ScaleByLBFGS: `memory_size` must be a positive int, got "
                f"{self.memory_size!r}."
            )

    @init_entry
    def init(self, params: Params) -> ScaleByLBFGSState:
        zeros = zeros_like_trainable(params)
        memory = _map(lambda p: _sharding.stacked_zeros(self.memory_size, p), zeros)
        return ScaleByLBFGSState(
            count=jnp.zeros([], jnp.int32),
            # Separate buffers for each field: a step that donates the state
            # cannot take one buffer twice.
            params=zeros,
            updates=zeros_like_trainable(params),
            diff_params_memory=memory,
            diff_updates_memory=_map(
                lambda p: _sharding.stacked_zeros(self.memory_size, p), zeros
            ),
            weights_memory=jnp.zeros([self.memory_size], _real_dtype()),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByLBFGSState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByLBFGSState]:
        if params is None:
            raise TypeError(
                "scale_by_lbfgs needs `params` (to form the differences of params): "
                "call `update(updates, state, params)`."
            )
        check_updates(updates, params)
        check_updates(updates, state.updates, reference_name="state.updates")
        # Leaves without an update (None) are left out of every inner product
        # and keep their state.
        params = _map(lambda u, p: p, updates, params)
        first = state.count == 0
        diff_params = _map(lambda p, old: p - old, params, state.params)
        diff_updates = _map(lambda u, old: u - old, updates, state.updates)
        curvature = _real_inner(diff_params, diff_updates)
        weight = jnp.where(curvature == 0, 0.0, 1.0 / curvature)
        newest = (state.count - 1) % self.memory_size

        def remember(memory, diff):
            if memory is None or diff is None:  # not trained, or no update this step
                return memory
            return jnp.where(first, memory, memory.at[newest].set(diff))

        diff_params_memory = jax.tree.map(
            remember, state.diff_params_memory, diff_params, is_leaf=is_none
        )
        diff_updates_memory = jax.tree.map(
            remember, state.diff_updates_memory, diff_updates, is_leaf=is_none
        )
        weights_memory = jnp.where(
            first,
            state.weights_memory,
            state.weights_memory.at[newest].set(weight.astype(_real_dtype())),
        )
        if self.scale_init_precond:
            squared_norm = _real_inner(diff_updates, diff_updates)
            later = jnp.where(squared_norm > 0, curvature / squared_norm, 1.0)
            updates_norm = jnp.sqrt(_real_inner(updates, updates))
            identity_scale = jnp.where(
                first, jnp.minimum(1.0, 1.0 / updates_norm), later
            )
        else:
            identity_scale = jnp.ones([], _real_dtype())
        preconditioned = _two_loop(
            updates,
            diff_params_memory,
            diff_updates_memory,
            weights_memory,
            identity_scale,
            newest,
        )
        keep = lambda new, old: old if new is None else new  # noqa: E731
        new_state = ScaleByLBFGSState(
            count=safe_int32_increment(state.count),
            params=jax.tree.map(keep, params, state.params, is_leaf=is_none),
            updates=jax.tree.map(keep, updates, state.updates, is_leaf=is_none),
            diff_params_memory=diff_params_memory,
            diff_updates_memory=diff_updates_memory,
            weights_memory=weights_memory,
        )
        return preconditioned, new_state


@checked
def scale_by_lbfgs(
    memory_size: int = 10, scale_init_precond: bool = True
) -> ScaleByLBFGS:
    """Optax spelling of `eqopt.ScaleByLBFGS`."""
    return ScaleByLBFGS(memory_size=memory_size, scale_init_precond=scale_init_precond)


#: The line search `lbfgs` uses by default, as in Optax (built at each call).
_DEFAULT_LINESEARCH = DefaultTransform(
    ScaleByZoomLinesearch, max_linesearch_steps=20, initial_guess_strategy="one"
)


@checked
def lbfgs(
    learning_rate: ScalarOrSchedule | None = None,
    memory_size: int = 10,
    scale_init_precond: bool = True,
    linesearch: Any = _DEFAULT_LINESEARCH,
) -> Chain:
    r"""L-BFGS: quasi-Newton steps along $-P_k g_k$, sized by a line search.

    $$
    w_{k+1} = w_k - \eta_k\, P_k\, g_k
    $$

    with $P_k$ the limited-memory inverse Hessian estimate of
    `eqopt.ScaleByLBFGS` and $\eta_k$ chosen by the line search (by default
    a zoom line search for the strong Wolfe conditions starting from
    $\eta = 1$, at most 20 evaluations), times `learning_rate` if one is given.
    The chain is `scale_by_lbfgs`, then `scale` by $-1$ (or
    `scale_by_learning_rate`), then the line search (or `identity` when
    `linesearch=None`), in Optax's positions.

    With a line search, `update` needs the extra keyword arguments `value`,
    `grad` and `value_fn`; `eqopt.value_and_grad_from_state` reuses the
    value and gradient the line search computed at the new params. L-BFGS is
    for deterministic objectives of small to medium size: its memory is
    `2 * memory_size` copies of the trainable params.

    **Arguments:**

    - `learning_rate`: an extra factor on the step (a number or a schedule), or
      `None` to leave the step to the line search.
    - `memory_size`: the number of pairs of differences kept.
    - `scale_init_precond`: scale the initial inverse Hessian estimate (see
      `eqopt.ScaleByLBFGS`).
    - `linesearch`: a line search transform such as
      `eqopt.scale_by_zoom_linesearch` or
      `eqopt.scale_by_backtracking_linesearch`, or `None`.

    **Returns:** an `eqopt.Chain`.

    **References:** Nocedal & Wright, *Numerical Optimization*, 2nd ed., 2006,
    Alg. 7.4, 7.5, 3.5 and 3.6; Liu & Nocedal, *On the limited memory BFGS
    method for large scale optimization*, Math. Programming 45, 1989.

    !!! example

        ```python
        def loss(model):
            return loss_fn(model, x, y)

        opt = eqopt.lbfgs()
        state = opt.init(model)
        value_and_grad = eqopt.value_and_grad_from_state(loss)

        @eqx.filter_jit
        def step(model, state):
            value, grad = value_and_grad(model, state=state)
            updates, state = opt.update(
                grad, state, model, value=value, grad=grad, value_fn=loss
            )
            return eqopt.apply_updates(model, updates), state
        ```
    """
    if learning_rate is None:
        scaling = Scale(-1.0)
    else:
        scaling = ScaleByLearningRate(learning_rate)
    return Chain(
        ScaleByLBFGS(memory_size=memory_size, scale_init_precond=scale_init_precond),
        scaling,
        Identity() if linesearch is None else resolve(linesearch),
    )
