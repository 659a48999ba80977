"""The mean and variance of per-element gradients, over a batch and over time."""

from collections.abc import Sequence
from typing import Any, ClassVar, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .._base import (
    AbstractGradientTransformation,
    EmptyState,
    OptState,
    Params,
    Updates,
    is_none,
)
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._hyper import Scalar, ScalarLike, as_scalar, check_decays
from .._leafwise import full_like_trainable_real, leafwise, zeros_like_trainable
from .._numerics import abs_squared, debias, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._transform.basic import Identity
from .._typecheck import checked
from ..tree._state import get
from ._aggregate import (
    AggregatedUpdates,
    PerElementUpdates,
    Process,
    _axes,
    _per_element,
    get_batch_size_from_per_elt_updates,
)


@no_type_check
def _sum_sq_diff(x, axis):
    """$\\sum_i |x_i - \\bar x|^2$ over `axis`, real."""
    return jnp.sum(abs_squared(x - jnp.mean(x, axis=axis, keepdims=True)), axis=axis)


@checked
class PerElementMeanAndSumSqDiffGradsState(eqx.Module, OptaxTuple):
    """The state of `PerElementMeanAndSumSqDiffGrads` when it accumulates.

    - `micro_step`: the batches combined since the last emitted statistics.
    - `ready`: whether the last call emitted them.
    - `mean_grads`: the mean of the gradients seen so far, shaped like the params.
    - `sum_sq_diff_grads`: their sum of squared distances to that mean, real.
    """

    micro_step: Int[Array, ""]
    ready: Bool[Array, ""]
    mean_grads: Updates
    sum_sq_diff_grads: Updates


@checked
class PerElementMeanAndSumSqDiffGrads(AbstractGradientTransformation):
    r"""The mean of per-element gradients, with their sum of squared distances to it.

    For the $n$ gradients $g_1, \dots, g_n$ of a batch,

    $$ \bar g = \frac1n \sum_{i=1}^{n} g_i, \qquad
    M_2 = \sum_{i=1}^{n} |g_i - \bar g|^2 $$

    so that $M_2 / (n - 1)$ is their sample variance. It returns `(mean, aux)`
    with `aux = {"sum_sq_diff_grads": M_2, "sample_size": n}`, the extra
    arguments that `track_per_element_mean_and_variance_with_ema` takes (see
    `add_mean_variance_to_opt`). With `accumulation_steps` $k > 1$ the
    batches of $k$ calls are combined by the pairwise update of Chan, Golub &
    LeVeque: adding a batch $b$ of $n_b$ elements to $n_a$ elements,

    $$ \delta = \bar g_b - \bar g_a, \quad
    \bar g = \bar g_a + \frac{n_b}{n}\, \delta, \quad
    M_2 = M_{2,a} + M_{2,b} + |\delta|^2 \frac{n_a n_b}{n} $$

    and emitted at the $k$-th call (zeros before; the state's `ready` says
    when, for `process`). For complex gradients $|\cdot|^2$ is the squared
    modulus, so $M_2$ is real (Optax squares the complex difference).

    An `Aggregator`: it takes updates with a per-element axis.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `per_elt_axis`: the per-element axis, or several (static).
    - `accumulation_steps`: $k$, the number of batches combined (static, at
      least 1); with 1 the state is `EmptyState()`.

    **References:** Chan, Golub & LeVeque, *Updating Formulae and a Pairwise
    Algorithm for Computing Sample Variances*, COMPSTAT 1982.
    """

    per_elt_axis: int | tuple[int, ...] = eqx.field(
        default=0, static=True, converter=_axes
    )
    accumulation_steps: int = eqx.field(default=1, static=True)

    def __check_init__(self):
        super().__check_init__()
        if self.accumulation_steps < 1:
            raise ValueError(
                "get_per_element_mean_and_sum_sq_diff_grads: `accumulation_steps` "
                f"must be at least 1, got {self.accumulation_steps}."
            )

    @property
    def elementwise(self) -> bool:
        # Its updates have a per-element axis: never packed into flat buffers.
        return False

    #: It reduces per-element updates.
    per_example_updates: ClassVar[bool] = True

    @init_entry
    def init(self, params: Params) -> PerElementMeanAndSumSqDiffGradsState | EmptyState:
        if self.accumulation_steps == 1:
            return EmptyState()
        return PerElementMeanAndSumSqDiffGradsState(
            micro_step=jnp.zeros([], jnp.int32),
            ready=jnp.asarray(False),
            mean_grads=zeros_like_trainable(params),
            sum_sq_diff_grads=full_like_trainable_real(params, 0.0),
        )

    @update_entry
    def update(
        self,
        updates: PerElementUpdates,
        state: PerElementMeanAndSumSqDiffGradsState | EmptyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[AggregatedUpdates, PerElementMeanAndSumSqDiffGradsState | EmptyState]:
        # The aggregated updates are `(mean, aux)`: see the class's docstring.
        batch_size = get_batch_size_from_per_elt_updates(updates, self.per_elt_axis)
        axis = self.per_elt_axis
        mean = _per_element(lambda x: jnp.mean(x, axis=axis), updates)
        sum_sq = _per_element(lambda x: _sum_sq_diff(x, axis), updates)
        if self.accumulation_steps == 1:
            aux = {"sum_sq_diff_grads": sum_sq, "sample_size": batch_size}
            return (mean, aux), state
        if not isinstance(state, PerElementMeanAndSumSqDiffGradsState):
            raise TypeError(
                "get_per_element_mean_and_sum_sq_diff_grads: expected the state of "
                f"its `init`, got {type(state).__name__}."
            )
        seen = state.micro_step  # batches combined before this one
        micro_step = safe_int32_increment(seen)
        ready = micro_step == self.accumulation_steps
        # n_a n_b / n for n_a = seen * B, n_b = B, n = micro_step * B.
        weight = seen * batch_size / micro_step

        @no_type_check
        def combine(batch_mean, mean_a, sum_sq_a, batch_sum_sq):
            delta = batch_mean.astype(mean_a.dtype) - mean_a
            new_mean = mean_a + delta / micro_step
            new_sum_sq = (
                sum_sq_a
                + batch_sum_sq.astype(sum_sq_a.dtype)
                + weight * abs_squared(delta)
            ).astype(sum_sq_a.dtype)
            return new_mean, new_mean, new_sum_sq

        _, new_mean, new_sum_sq = leafwise(
            combine,
            mean,
            state.mean_grads,
            state.sum_sq_diff_grads,
            sum_sq,
            n_out=3,
            elementwise=True,
        )

        def emitted(tree):
            return _tree_where(ready, tree, _zeros(tree))

        def kept(tree):
            return _tree_where(ready, _zeros(tree), tree)

        aux = {
            "sum_sq_diff_grads": emitted(new_sum_sq),
            "sample_size": jnp.where(ready, micro_step * batch_size, 0),
        }
        return (emitted(new_mean), aux), PerElementMeanAndSumSqDiffGradsState(
            micro_step=jnp.where(ready, jnp.zeros_like(micro_step), micro_step),
            ready=ready,
            mean_grads=kept(new_mean),
            sum_sq_diff_grads=kept(new_sum_sq),
        )


def _zeros(tree: Any) -> Any:
    return jax.tree.map(
        lambda x: None if x is None else jnp.zeros_like(x), tree, is_leaf=is_none
    )


def _tree_where(condition: Any, on_true: Any, on_false: Any) -> Any:
    return jax.tree.map(
        lambda a, b: None if a is None else jnp.where(condition, a, b),
        on_true,
        on_false,
        is_leaf=is_none,
    )


@checked
def get_per_element_mean_and_sum_sq_diff_grads(
    per_elt_axis: int | Sequence[int] = 0, accumulation_steps: int = 1
) -> PerElementMeanAndSumSqDiffGrads:
    """Optax spelling of `eqopt.experimental.aggregating.PerElementMeanAndSumSqDiffGrads`."""
    return PerElementMeanAndSumSqDiffGrads(
        per_elt_axis=per_elt_axis, accumulation_steps=accumulation_steps
    )


@checked
class PerElementMeanAndVarianceEMAState(eqx.Module, OptaxTuple):
    """The state of `TrackPerElementMeanAndVarianceWithEMA`.

    - `count`: the updates seen.
    - `ema_decay`: the decay of the last update, for the bias correction of
      `get_unbiased_mean_and_variance_ema`.
    - `mean_grads_ema`: the moving average of the mean gradient.
    - `variance_grads_ema`: the moving average of the gradients' sample
      variance, real.
    """

    count: Int[Array, ""]
    ema_decay: Float[Array, ""]
    mean_grads_ema: Updates
    variance_grads_ema: Updates


@checked
class TrackPerElementMeanAndVarianceWithEMA(AbstractGradientTransformation):
    r"""Keeps moving averages of the mean and the variance of per-element gradients.

    Given the mean $\bar g_t$ (the updates) and, as extra arguments, the sum
    of squared distances $M_{2,t}$ (`sum_sq_diff_grads`) of $n_t$ gradients
    (`sample_size`), as `get_per_element_mean_and_sum_sq_diff_grads` gives
    them through `process(..., aggregator_has_aux=True)`:

    $$ m_t = \beta\, m_{t-1} + (1 - \beta)\, \bar g_t, \qquad
    v_t = \beta\, v_{t-1} + (1 - \beta)\, \frac{M_{2,t}}{n_t - 1} $$

    The updates pass through unchanged;
    `get_unbiased_mean_and_variance_ema` reads $m_t$ and $v_t$, bias-corrected.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `ema_decay`: $\beta$, in $[0, 1)$.
    """

    ema_decay: Scalar = eqx.field(default=0.9, converter=as_scalar)

    def __check_init__(self):
        super().__check_init__()
        check_decays(self, "ema_decay")

    @property
    def elementwise(self) -> bool:
        return True

    @init_entry
    def init(self, params: Params) -> PerElementMeanAndVarianceEMAState:
        return PerElementMeanAndVarianceEMAState(
            count=jnp.zeros([], jnp.int32),
            ema_decay=jnp.asarray(self.ema_decay, jnp.float32),
            mean_grads_ema=zeros_like_trainable(params),
            variance_grads_ema=full_like_trainable_real(params, 0.0),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: PerElementMeanAndVarianceEMAState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, PerElementMeanAndVarianceEMAState]:
        if "sum_sq_diff_grads" not in extra_args or "sample_size" not in extra_args:
            raise TypeError(
                "track_per_element_mean_and_variance_with_ema: `update` needs the "
                "extra arguments `sum_sq_diff_grads` and `sample_size`. Put it after "
                "`get_per_element_mean_and_sum_sq_diff_grads` in "
                "`process(..., aggregator_has_aux=True)` (as "
                "`add_mean_variance_to_opt` does)."
            )
        sample_size = extra_args["sample_size"]
        if isinstance(sample_size, int) and sample_size < 2:
            raise ValueError(
                "track_per_element_mean_and_variance_with_ema: the sample variance "
                f"needs at least two elements per batch, got {sample_size}."
            )
        decay = self.ema_decay
        one_minus_decay = 1 - decay
        inverse = 1 / (jnp.asarray(sample_size) - 1)

        @no_type_check
        def step(g, mean, variance, sum_sq):
            new_mean = decay * mean + one_minus_decay * g
            new_variance = decay * variance + one_minus_decay * (inverse * sum_sq)
            return g, new_mean.astype(mean.dtype), new_variance.astype(variance.dtype)

        updates, mean, variance = leafwise(
            step,
            updates,
            state.mean_grads_ema,
            state.variance_grads_ema,
            extra_args["sum_sq_diff_grads"],
            n_out=3,
            elementwise=True,
        )
        return updates, PerElementMeanAndVarianceEMAState(
            count=safe_int32_increment(state.count),
            ema_decay=jnp.asarray(decay, state.ema_decay.dtype),
            mean_grads_ema=mean,
            variance_grads_ema=variance,
        )


@checked
def track_per_element_mean_and_variance_with_ema(
    ema_decay: ScalarLike = 0.9,
) -> TrackPerElementMeanAndVarianceWithEMA:
    """Optax spelling of `eqopt.experimental.aggregating.TrackPerElementMeanAndVarianceWithEMA`."""
    return TrackPerElementMeanAndVarianceWithEMA(ema_decay=ema_decay)


@checked
def get_unbiased_mean_and_variance_ema(state: OptState) -> tuple[Updates, Updates]:
    r"""The bias-corrected moving averages of the mean and variance of the gradients.

    $$ \hat m_t = \frac{m_t}{1 - \beta^t}, \qquad \hat v_t = \frac{v_t}{1 - \beta^t} $$

    **Arguments:**

    - `state`: an optimiser state holding a `PerElementMeanAndVarianceEMAState`
      (that of `add_mean_variance_to_opt`), anywhere inside it.

    **Returns:** `(mean, variance)`, trees shaped like the params.

    **Raises:** `ValueError` if the state holds no
    `PerElementMeanAndVarianceEMAState`.
    """
    found = get(state, "PerElementMeanAndVarianceEMAState")
    if not isinstance(found, PerElementMeanAndVarianceEMAState):
        raise ValueError(
            "get_unbiased_mean_and_variance_ema: the state holds no "
            "PerElementMeanAndVarianceEMAState; pass the state of an optimiser "
            "made by `add_mean_variance_to_opt`."
        )
    correction = 1 - found.ema_decay**found.count

    def unbiased(tree: Any) -> Any:
        return jax.tree.map(
            lambda x: None if x is None else debias(x, correction),
            tree,
            is_leaf=is_none,
        )

    return unbiased(found.mean_grads_ema), unbiased(found.variance_grads_ema)


@checked
def add_mean_variance_to_opt(
    opt: Any,
    ema_decay: ScalarLike = 0.9,
    per_elt_axis: int | Sequence[int] = 0,
    accumulation_steps: int = 1,
) -> Process:
    """Runs `opt` on the mean of per-element gradients, tracking their mean and variance.

    The optimiser sees the mean of the per-element gradients (over
    `accumulation_steps` calls), as it would see the gradient of the mean
    loss; moving averages of that mean and of the gradients' sample variance
    are kept in the state, for `get_unbiased_mean_and_variance_ema`.

    **Arguments:**

    - `opt`: the optimiser (an eqopt transform, or an Optax-style pair).
    - `ema_decay`: the decay of the moving averages, in $[0, 1)$.
    - `per_elt_axis`: the per-element axis of the gradients, or several.
    - `accumulation_steps`: the number of batches per update.

    **Returns:** `process(identity(), get_per_element_mean_and_sum_sq_diff_grads(...),
    chain(track_per_element_mean_and_variance_with_ema(ema_decay), opt),
    aggregator_has_aux=True)`, an `Aggregator`.

    !!! example

        ```python
        from eqopt.experimental import aggregating


        def example_loss(model, x, y):  # one example: a batch of one inside
            return loss_fn(model, x[None], y[None])


        per_example_grad = jax.vmap(eqx.filter_grad(example_loss), in_axes=(None, 0, 0))
        opt = aggregating.add_mean_variance_to_opt(eqopt.sgd(0.1), ema_decay=0.9)
        state = opt.init(model)
        updates, state = opt.update(per_example_grad(model, x, y), state, model)
        model = eqopt.apply_updates(model, updates)
        mean, variance = aggregating.get_unbiased_mean_and_variance_ema(state)
        ```
    """
    return Process(
        preprocessor=Identity(),
        aggregator=PerElementMeanAndSumSqDiffGrads(
            per_elt_axis=per_elt_axis, accumulation_steps=accumulation_steps
        ),
        postprocessor=Chain(TrackPerElementMeanAndVarianceWithEMA(ema_decay), opt),
        aggregator_has_aux=True,
    )
