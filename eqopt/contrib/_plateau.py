"""Reducing the learning rate when a monitored value stops improving."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, Real

from .._base import AbstractGradientTransformation, Params, Updates, is_trainable
from .._entry import init_entry, update_entry
from .._hyper import (
    IntScalar,
    Scalar,
    ScalarLike,
    as_int_scalar,
    as_scalar,
    check_hyperparameter,
    is_concrete,
)
from .._leaf_scales import scale_updates
from .._numerics import safe_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from ..tree._casting import dtype as tree_dtype


@checked
class ReduceLROnPlateauState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ReduceOnPlateau`.

    `scale` multiplies the updates; `best_value` is the best (lowest) average
    value so far; `plateau_count` counts evaluations without improvement;
    `cooldown_count` the evaluations left before counting again; `count` and
    `avg_value` accumulate the values of the current evaluation.
    """

    scale: Float[Array, ""]
    best_value: Float[Array, ""]
    plateau_count: Int[Array, ""]
    cooldown_count: Int[Array, ""]
    count: Int[Array, ""]
    avg_value: Float[Array, ""]


@checked
class ReduceOnPlateau(AbstractGradientTransformation):
    r"""Multiplies the updates by a scale that drops when the loss plateaus.

    `update` takes the monitored value as `value=` (a loss, or a validation
    metric to minimise). Values are averaged over `accumulation_size` calls;
    then, with $\bar v$ that average and $v^*$ the best one so far:

    $$
    \begin{aligned}
    &\text{improved} \iff \bar v < (1 - r)\, v^* - a
      \qquad(\text{then } v^* \leftarrow \bar v,\ n \leftarrow 0,
      \text{ else } n \leftarrow n + 1) \\
    &\text{if } n = \text{patience} \text{ (outside a cooldown)}:\quad
      s \leftarrow \max(f s,\ s_{\min}),\ n \leftarrow 0,\
      \text{cooldown for } \texttt{cooldown} \text{ evaluations}
    \end{aligned}
    $$

    and the updates are $u \mapsto s\, u$. Chain it after an optimiser to scale
    its learning rate.

    **Global**: one scale over all the leaves, a stacked layer's slices included.

    **Arguments:**

    - `factor`: $f \in (0, 1)$, by which the scale is multiplied.
    - `patience`: evaluations without improvement before reducing.
    - `rtol`: $r \in [0, 1]$, the relative improvement required.
    - `atol`: $a \ge 0$, the absolute improvement required (`rtol` and `atol`
      may not both be 0).
    - `cooldown`: evaluations after a reduction during which nothing is counted.
    - `accumulation_size`: the number of `update` calls whose values are
      averaged into one evaluation.
    - `min_scale`: $s_{\min}$, the floor of the scale.

    **References:** the `ReduceLROnPlateau` scheduler of PyTorch and Keras.
    """

    factor: Scalar = eqx.field(default=0.1, converter=as_scalar)
    patience: IntScalar = eqx.field(default=10, converter=as_int_scalar)
    rtol: Scalar = eqx.field(default=1e-4, converter=as_scalar)
    atol: Scalar = eqx.field(default=0.0, converter=as_scalar)
    cooldown: IntScalar = eqx.field(default=0, converter=as_int_scalar)
    accumulation_size: IntScalar = eqx.field(default=1, converter=as_int_scalar)
    min_scale: Scalar = eqx.field(default=0.0, converter=as_scalar)

    def __check_init__(self):
        check_hyperparameter(
            "factor", self.factor, low=0.0, high=1.0, low_inclusive=False
        )
        check_hyperparameter("rtol", self.rtol, low=0.0, high=1.0, high_inclusive=True)
        check_hyperparameter("atol", self.atol, low=0.0)
        check_hyperparameter("min_scale", self.min_scale, low=0.0)
        if (
            is_concrete(self.rtol)
            and is_concrete(self.atol)
            and float(self.rtol) == 0.0
            and float(self.atol) == 0.0
        ):
            raise ValueError(
                "reduce_on_plateau: at least one of `rtol` and `atol` must be positive."
            )
        for name in ("patience", "accumulation_size"):
            check_hyperparameter(name, getattr(self, name), low=1)
        check_hyperparameter("cooldown", self.cooldown, low=0)

    @property
    def elementwise(self) -> bool:
        return True

    @init_entry
    def init(self, params: Params) -> ReduceLROnPlateauState:
        trainable = eqx.filter(params, is_trainable)
        lowest = jnp.finfo(tree_dtype(trainable, "lowest")).dtype
        highest = jnp.finfo(tree_dtype(trainable, "highest")).dtype
        return ReduceLROnPlateauState(
            scale=jnp.asarray(1.0, dtype=lowest),
            best_value=jnp.asarray(jnp.inf, dtype=highest),
            plateau_count=jnp.asarray(0, jnp.int32),
            cooldown_count=jnp.asarray(0, jnp.int32),
            count=jnp.asarray(0, jnp.int32),
            avg_value=jnp.asarray(0.0, dtype=highest),
        )

    def _evaluate(self, state: ReduceLROnPlateauState) -> ReduceLROnPlateauState:
        average = state.avg_value
        improved = average < (1 - self.rtol) * state.best_value - self.atol
        best_value = jnp.where(improved, average, state.best_value)
        plateau_count = jnp.where(
            improved, 0, safe_increment(state.plateau_count)
        ).astype(jnp.int32)
        in_cooldown = state.cooldown_count > 0
        reduce = jnp.logical_and(~in_cooldown, plateau_count == self.patience)
        scale = jnp.where(
            in_cooldown,
            state.scale,
            jnp.maximum(
                jnp.where(reduce, state.scale * self.factor, state.scale),
                self.min_scale,
            ).astype(state.scale.dtype),
        )
        new_plateau_count = jnp.where(in_cooldown | reduce, 0, plateau_count).astype(
            jnp.int32
        )
        cooldown_count = jnp.where(
            in_cooldown,
            state.cooldown_count - 1,
            jnp.where(reduce, self.cooldown, 0),
        ).astype(jnp.int32)
        return ReduceLROnPlateauState(
            scale=scale,
            best_value=best_value.astype(state.best_value.dtype),
            plateau_count=new_plateau_count,
            cooldown_count=cooldown_count,
            count=jnp.asarray(0, jnp.int32),
            avg_value=jnp.zeros_like(state.avg_value),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ReduceLROnPlateauState,
        params: Params | None = None,
        *,
        value: Real[ArrayLike, ""] | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ReduceLROnPlateauState]:
        if value is None:
            raise ValueError(
                "reduce_on_plateau needs the monitored value: call "
                "`update(updates, state, params, value=loss)`."
            )
        count = safe_increment(state.count)
        dtype = state.avg_value.dtype
        average = (
            state.count * state.avg_value + jnp.asarray(value).astype(dtype)
        ) / count
        state = eqx.tree_at(
            lambda s: (s.avg_value, s.count), state, (average.astype(dtype), count)
        )
        state = jax.lax.cond(
            count == self.accumulation_size, self._evaluate, lambda s: s, state
        )
        scale = state.scale
        return scale_updates(updates, scale), state


@checked
def reduce_on_plateau(
    factor: ScalarLike = 0.1,
    patience: int = 10,
    rtol: ScalarLike = 0.0001,
    atol: ScalarLike = 0.0,
    cooldown: int = 0,
    accumulation_size: int = 1,
    min_scale: ScalarLike = 0.0,
) -> ReduceOnPlateau:
    """Optax spelling of `eqopt.contrib.ReduceOnPlateau`.

    !!! example

        ```python
        opt = eqopt.chain(eqopt.adam(1e-3), eqopt.contrib.reduce_on_plateau(patience=5))
        state = opt.init(model)
        loss = loss_fn(model, x, y)
        updates, state = opt.update(grads, state, model, value=loss)
        ```
    """
    return ReduceOnPlateau(
        factor=factor,
        patience=patience,
        rtol=rtol,
        atol=atol,
        cooldown=cooldown,
        accumulation_size=accumulation_size,
        min_scale=min_scale,
    )
