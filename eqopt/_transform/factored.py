"""Factored second moments (Adafactor's scaling) and the Adafactor optimiser."""

from collections.abc import Callable
from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, Int

from .._base import (
    AbstractGradientTransformation,
    Params,
    Updates,
    is_none,
    is_trainable,
)
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._filters import FilterSpec
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_hyperparameter,
)
from .._layer_axes import stack_axes
from .._leafwise import per_slice
from .._numerics import abs_squared, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._structure import structure_mismatch_message
from .._typecheck import checked
from .basic import Scale, ScaleByLearningRate
from .block import ClipByBlockRms, ScaleByParamBlockRms
from .decay import AddDecayedWeights
from .momentum import Ema


def _decay_rate_pow(step: Any, decay_rate: Any = 0.8) -> Any:
    r"""Adafactor's increasing decay $\hat\beta_{2,t} = 1 - t^{-c}$, with $t$ = `step` + 1."""
    t = step + 1.0
    return 1.0 - t ** (-decay_rate)


@no_type_check
def factored_dims(
    shape: tuple[int, ...], factored: bool, min_dim_size_to_factor: int
) -> tuple[int, int] | None:
    """The axes a leaf of this shape is factored over, or `None` to keep it whole.

    A leaf is factored over its two largest axes, `(second_largest, largest)`
    (ties broken by position), when it has at least two axes and the second
    largest has at least `min_dim_size_to_factor` elements.
    """
    if not factored or len(shape) < 2:
        return None
    order = np.argsort(shape, kind="stable")
    if shape[order[-2]] < min_dim_size_to_factor:
        return None
    return int(order[-2]), int(order[-1])


@no_type_check
def _without(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return tuple(n for i, n in enumerate(shape) if i != axis)


def _real_dtype(dtype: Any) -> Any:
    return jnp.finfo(dtype).dtype


@checked
class ScaleByFactoredRmsState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByFactoredRms`.

    For a leaf factored over axes `(a, b)` (`b` the largest), `v_row` is the
    running mean of $|g|^2$ over axis `b` (the leaf's shape without `b`) and
    `v_col` over axis `a` (the shape without `a`); `v` is `None` there. For a
    leaf kept whole, `v` has its shape and `v_row`, `v_col` are `None`. All
    three are `None` at leaves that are not trained.
    """

    count: Int[Array, ""]
    v_row: Updates
    v_col: Updates
    v: Updates


@checked
class ScaleByFactoredRms(AbstractGradientTransformation):
    r"""Scales updates by a factored estimate of the second moment (Adafactor's scaling).

    For a matrix leaf $G_t \in \mathbb{R}^{n \times m}$ (more generally, over
    the two largest axes of a leaf, the others being kept), only the row and
    column means of $|G|^2$ are tracked:

    $$
    \begin{aligned}
    \hat\beta_t &= f(t - 1 - t_0,\ c) \quad \big(= 1 - (t - t_0)^{-c} \text{ by default}\big) \\
    R_t &= \hat\beta_t R_{t-1} + (1 - \hat\beta_t)\, \operatorname{mean}_{\text{cols}}\big(|G_t|^2 + \epsilon_1\big) \\
    C_t &= \hat\beta_t C_{t-1} + (1 - \hat\beta_t)\, \operatorname{mean}_{\text{rows}}\big(|G_t|^2 + \epsilon_1\big) \\
    \hat V_t &= R_t C_t^{\top} / \operatorname{mean}(R_t), \qquad
    U_t = G_t / \sqrt{\hat V_t}
    \end{aligned}
    $$

    which needs $O(n + m)$ memory instead of $O(nm)$. A leaf with fewer than two
    axes, or whose second largest axis is shorter than
    `min_dim_size_to_factor`, keeps a full second moment
    $V_t = \hat\beta_t V_{t-1} + (1 - \hat\beta_t)(|G_t|^2 + \epsilon_1)$,
    $U_t = G_t / \sqrt{V_t}$. Complex gradients use $|g|^2 = g\bar g$ and the
    moments are stored as real arrays.

    The state holds `None`, not Optax's placeholder arrays of shape `(1,)`, in
    the moments a leaf does not use. The transform reduces over each leaf, so
    it is not elementwise.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `factored`: whether to factor the second moment of leaves with two or
      more axes at all.
    - `decay_rate`: $c$, the exponent of the default decay schedule.
    - `step_offset`: $t_0$, subtracted from the step count before the decay
      is computed.
    - `min_dim_size_to_factor`: the smallest second-largest axis for which a
      leaf is factored (static: it decides the state's shapes).
    - `epsilon`: $\epsilon_1$, added to $|g|^2$.
    - `decay_rate_fn`: $f(\text{step}, c)$, the decay at a (zero-based) step;
      default $1 - (\text{step} + 1)^{-c}$.

    **References:** Shazeer & Stern, *Adafactor: Adaptive Learning Rates with
    Sublinear Memory Cost*, ICML 2018.
    """

    factored: bool = eqx.field(default=True, static=True)
    decay_rate: Scalar = eqx.field(default=0.8, converter=as_scalar)
    step_offset: Scalar = eqx.field(default=0.0, converter=as_scalar)
    min_dim_size_to_factor: int = eqx.field(default=128, static=True)
    epsilon: Scalar = eqx.field(default=1e-30, converter=as_scalar)
    decay_rate_fn: Callable[[Any, Any], Any] = _decay_rate_pow

    @property
    def elementwise(self) -> bool:
        return False

    def __check_init__(self):
        check_hyperparameter("epsilon", self.epsilon, low=0.0)
        if (
            not isinstance(self.min_dim_size_to_factor, (int, np.integer))
            or isinstance(self.min_dim_size_to_factor, bool)
            or self.min_dim_size_to_factor < 1
        ):
            raise ValueError(
                "ScaleByFactoredRms: `min_dim_size_to_factor` must be a positive "
                f"Python int, got {self.min_dim_size_to_factor!r}."
            )
        if not callable(self.decay_rate_fn):
            raise TypeError(
                "ScaleByFactoredRms: `decay_rate_fn` must be a function of "
                f"(step, decay_rate), got {type(self.decay_rate_fn).__name__}."
            )

    def _dims(self, shape: tuple[int, ...]) -> tuple[int, int] | None:
        return factored_dims(shape, self.factored, self.min_dim_size_to_factor)

    @init_entry
    def init(self, params: Params) -> ScaleByFactoredRmsState:
        def moments(p):
            if not is_trainable(p):
                return (None, None, None)
            dtype = _real_dtype(p.dtype)
            dims = self._dims(p.shape)
            if dims is None:
                return (None, None, jnp.zeros_like(p, dtype))  # p's sharding
            second, largest = dims
            return (
                jnp.zeros(_without(p.shape, largest), dtype),
                jnp.zeros(_without(p.shape, second), dtype),
                None,
            )

        leaves, treedef = jax.tree.flatten(params, is_leaf=is_none)
        # Per layer: a stacked leaf's moments are factored slice by slice.
        per_leaf = [
            per_slice(moments, stack)(p) if is_trainable(p) else moments(p)
            for p, stack in zip(leaves, stack_axes(params), strict=True)
        ]
        v_row, v_col, v = (
            jax.tree.unflatten(treedef, [m[i] for m in per_leaf]) for i in range(3)
        )
        return ScaleByFactoredRmsState(
            count=jnp.zeros([], jnp.int32), v_row=v_row, v_col=v_col, v=v
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByFactoredRmsState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByFactoredRmsState]:
        # One decay per step, computed once rather than per leaf.
        decay = jnp.asarray(
            self.decay_rate_fn(state.count - self.step_offset, self.decay_rate)
        )
        mixing = 1 - decay
        epsilon = self.epsilon

        @no_type_check
        def step(g, v_row, v_col, v):
            dims = self._dims(g.shape)
            squared = abs_squared(g) + epsilon
            if dims is None:
                if v is None or v.shape != g.shape:
                    return None
                new_v = decay * v + mixing * squared
                update = g * jax.lax.rsqrt(new_v).astype(g.dtype)
                return update, v_row, v_col, new_v.astype(v.dtype)
            second, largest = dims
            if (
                v_row is None
                or v_col is None
                or v_row.shape != _without(g.shape, largest)
                or v_col.shape != _without(g.shape, second)
            ):
                return None
            new_row = decay * v_row + mixing * jnp.mean(squared, axis=largest)
            new_col = decay * v_col + mixing * jnp.mean(squared, axis=second)
            # Position of `second` in v_row, whose `largest` axis is gone.
            second_in_row = second - 1 if second > largest else second
            row_mean = jnp.mean(new_row, axis=second_in_row, keepdims=True)
            row_factor = jax.lax.rsqrt(new_row / row_mean)
            col_factor = jax.lax.rsqrt(new_col)
            scale = jnp.expand_dims(row_factor, largest) * jnp.expand_dims(
                col_factor, second
            )
            update = g * scale.astype(g.dtype)
            return (
                update,
                new_row.astype(v_row.dtype),
                new_col.astype(v_col.dtype),
                v,
            )

        leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
        state_leaves = []
        for name in ("v_row", "v_col", "v"):
            tree = getattr(state, name)
            tree_leaves, tree_def = jax.tree.flatten(tree, is_leaf=is_none)
            if tree_def != treedef:
                raise ValueError(
                    structure_mismatch_message(
                        updates, tree, "updates", f"state.{name}"
                    )
                )
            state_leaves.append(tree_leaves)
        outs = []
        paths = None
        stacks = stack_axes(updates)
        for index, (g, *moments) in enumerate(zip(leaves, *state_leaves, strict=True)):
            if g is None:
                outs.append((None, *moments))
                continue
            out = per_slice(step, stacks[index])(g, *moments)
            if out is None:
                if paths is None:
                    paths = jax.tree_util.tree_flatten_with_path(
                        updates, is_leaf=is_none
                    )[0]
                raise ValueError(
                    f"`updates` at {jax.tree_util.keystr(paths[index][0])} has shape "
                    f"{tuple(g.shape)}, but the state of scale_by_factored_rms there "
                    "was made for another shape: was the state made for other params?"
                )
            outs.append(out)
        new_updates, v_row, v_col, v = (
            jax.tree.unflatten(treedef, [o[i] for o in outs]) for i in range(4)
        )
        return new_updates, ScaleByFactoredRmsState(
            count=safe_int32_increment(state.count), v_row=v_row, v_col=v_col, v=v
        )


@checked
def scale_by_factored_rms(
    factored: bool = True,
    decay_rate: ScalarLike = 0.8,
    step_offset: ScalarLike = 0,
    min_dim_size_to_factor: int = 128,
    epsilon: ScalarLike = 1e-30,
    decay_rate_fn: Callable[[Any, Any], Any] = _decay_rate_pow,
) -> ScaleByFactoredRms:
    """Optax spelling of `eqopt.ScaleByFactoredRms`."""
    return ScaleByFactoredRms(
        factored=factored,
        decay_rate=decay_rate,
        step_offset=step_offset,
        min_dim_size_to_factor=min_dim_size_to_factor,
        epsilon=epsilon,
        decay_rate_fn=decay_rate_fn,
    )


@checked
def adafactor(
    learning_rate: ScalarOrSchedule | None = None,
    min_dim_size_to_factor: int = 128,
    decay_rate: ScalarLike = 0.8,
    decay_offset: ScalarLike = 0,
    multiply_by_parameter_scale: bool = True,
    clipping_threshold: ScalarLike | None = 1.0,
    momentum: ScalarLike | None = None,
    dtype_momentum: DTypeLike = jnp.float32,
    weight_decay_rate: ScalarOrSchedule | None = None,
    eps: ScalarLike = 1e-30,
    factored: bool = True,
    weight_decay_mask: FilterSpec | None = None,
) -> Chain:
    r"""Adafactor: factored second moments, update clipping and relative step sizes.

    $$
    \begin{aligned}
    U_t &= G_t / \sqrt{\hat V_t} && \text{factored second moment, see } \texttt{ScaleByFactoredRms} \\
    \tilde U_t &= U_t / \max\big(1, \mathrm{RMS}(U_t) / d\big) && \text{update clipping} \\
    \Delta_t &= \eta_t\, \max\big(\epsilon_2, \mathrm{RMS}(\theta_{t-1})\big)\, \tilde U_t
      && \text{relative step size} \\
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, \Delta_t && \text{optional momentum} \\
    u_t &= -\big(m_t + \lambda\, \theta_{t-1}\big) && \text{optional weight decay}
    \end{aligned}
    $$

    per leaf, with $\epsilon_2 = 10^{-3}$. The chain is, in Optax's order,
    `eqopt.ScaleByFactoredRms`, then (each when enabled)
    `eqopt.ClipByBlockRms`, `eqopt.ScaleByLearningRate` (unflipped),
    `eqopt.ScaleByParamBlockRms`, `eqopt.Ema` (not debiased),
    `eqopt.AddDecayedWeights`, and `eqopt.Scale` by $-1$. As in Optax,
    disabled parts are left out of the chain, so the positions of the later
    parts depend on the arguments: read them by name
    (`state.scale_by_factored_rms.v_row`).

    The weight decay is added after the learning rate, so it is not scaled by
    it. `weight_decay_mask` is an Equinox filter spec (a per-leaf predicate
    such as `lambda x: x.ndim > 1`, or a prefix pytree of bools and
    predicates; a full boolean pytree still works). Unlike Optax, a callable
    is always a per-leaf predicate, never a function of the whole params.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule; `None` leaves the step
      unscaled (with `multiply_by_parameter_scale`, steps are then relative to
      the parameters' scale).
    - `min_dim_size_to_factor`: leaves whose second-largest axis is shorter are
      not factored.
    - `decay_rate`: $c$ in $\hat\beta_{2,t} = 1 - t^{-c}$.
    - `decay_offset`: subtracted from the step count in that decay.
    - `multiply_by_parameter_scale`: scale each leaf's step by the RMS of its
      parameters.
    - `clipping_threshold`: $d$, or `None` for no update clipping.
    - `momentum`: $\beta_1$, or `None` for no momentum.
    - `dtype_momentum`: dtype of the momentum buffer. For complex parameters
      give a complex dtype: the default `float32` buffer keeps only the real
      part of the updates (as in Optax).
    - `weight_decay_rate`: $\lambda$, a number or a schedule, or `None`.
    - `eps`: $\epsilon_1$, added to $|g|^2$.
    - `factored`: whether to factor second moments at all.
    - `weight_decay_mask`: the filter spec of the leaves to decay (default: all).

    **Returns:** an `eqopt.Chain`; `update` needs `params` when
    `multiply_by_parameter_scale` or `weight_decay_rate` is used.

    !!! example

        ```python
        big = eqx.nn.Linear(256, 512, key=jax.random.key(1))
        opt = eqopt.adafactor(learning_rate=1e-2)
        state = opt.init(big)
        # The weight's second moment is kept as a row and a column (factored).
        factored = state.scale_by_factored_rms
        print(factored.v_row.weight.shape, factored.v_col.weight.shape)
        ```

    **References:** Shazeer & Stern, *Adafactor: Adaptive Learning Rates with
    Sublinear Memory Cost*, ICML 2018.
    """
    parts: list[AbstractGradientTransformation] = [
        ScaleByFactoredRms(
            factored=factored,
            decay_rate=decay_rate,
            step_offset=decay_offset,
            min_dim_size_to_factor=min_dim_size_to_factor,
            epsilon=eps,
        )
    ]
    if clipping_threshold is not None:
        parts.append(ClipByBlockRms(threshold=clipping_threshold))
    if learning_rate is not None:
        parts.append(ScaleByLearningRate(learning_rate, flip_sign=False))
    if multiply_by_parameter_scale:
        parts.append(ScaleByParamBlockRms())
    if momentum is not None:
        parts.append(Ema(momentum, debias=False, accumulator_dtype=dtype_momentum))
    if weight_decay_rate is not None:
        parts.append(
            AddDecayedWeights(weight_decay=weight_decay_rate, mask=weight_decay_mask)
        )
    parts.append(Scale(-1.0))
    return Chain(*parts)
