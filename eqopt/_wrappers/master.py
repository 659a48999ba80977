"""Low-precision parameters: float32 master weights and stochastic rounding."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Inexact, Int, Key, UInt32

from .._base import AbstractGradientTransformation, AbstractWrapper, Params, Updates
from .._entry import init_entry, update_entry
from .._interop import as_transform
from .._leafwise import require_params
from .._leaves import is_none
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._transform.noise import KeyLike, _key_data_and_impl
from .._typecheck import checked


@no_type_check
def _is_low_precision(x: Any) -> bool:
    return (
        eqx.is_array(x)
        and jnp.issubdtype(x.dtype, jnp.floating)
        and jnp.finfo(x.dtype).bits < 32
    )


@checked
def stochastic_round(
    x: Float[Array, "*shape"], dtype: Any, key: Key[Array, ""]
) -> Inexact[Array, "*shape"]:
    r"""Rounds `x` to a lower-precision float dtype, up or down at random, without bias.

    With $\lfloor x \rfloor$ and $\lceil x \rceil$ the two neighbours of $x$ in
    `dtype`,

    $$
    \operatorname{SR}(x) = \begin{cases}
    \lceil x \rceil & \text{with probability } \dfrac{x - \lfloor x \rfloor}{\lceil x \rceil - \lfloor x \rfloor} \\
    \lfloor x \rfloor & \text{otherwise,}
    \end{cases}
    \qquad \mathbb E[\operatorname{SR}(x)] = x.
    $$

    Round-to-nearest loses every update smaller than half a unit in the last
    place: adding $10^{-3}$ a thousand times to a `bfloat16` $1$ leaves it at
    $1$, where stochastic rounding reaches $2$ on average. Values already
    representable, infinities and NaNs are returned as round-to-nearest gives
    them. Deterministic for a given key; works under `jit` and `vmap`.

    **Arguments:**

    - `x`: the values (float32, or any dtype wider than `dtype`).
    - `dtype`: the target dtype, e.g. `jnp.bfloat16` or `jnp.float16`.
    - `key`: a PRNG key (`jax.random.key`).

    **Returns:** an array of `dtype` shaped like `x`.

    **References:** Gupta, Agrawal, Gopalakrishnan & Narayanan, *Deep Learning
    with Limited Numerical Precision*, ICML 2015; Zamirai, Zhang, Aberger &
    De Sa, *Revisiting BFloat16 Training*, arXiv:2010.06192, 2020.
    """
    x = jnp.asarray(x)
    wide = jnp.promote_types(x.dtype, jnp.float32)
    x = x.astype(wide)
    nearest = x.astype(dtype)
    nearest_wide = nearest.astype(wide)
    # The other neighbour of x: one step from the nearest value towards x.
    toward = jnp.where(nearest_wide > x, -jnp.inf, jnp.inf).astype(dtype)
    other = jnp.nextafter(nearest, toward)
    gap = other.astype(wide) - nearest_wide
    probability = jnp.where(gap != 0, (x - nearest_wide) / gap, 0.0)
    draw = jax.random.uniform(key, x.shape, wide)
    return jnp.where(draw < probability, other, nearest)


def _wrap_key(data: Array, impl: str | None) -> Key[Array, ""]:
    if impl is None:
        return jax.random.wrap_key_data(data)
    return jax.random.wrap_key_data(data, impl=impl)


@no_type_check
def _map_leaves(fn, updates, *trees):
    """Maps `fn(u, *others)` over the leaves of `updates` (`None` counted), the
    other trees being cut at its leaves; returns a list of results and the treedef."""
    leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    others = [treedef.flatten_up_to(tree) for tree in trees]
    return [fn(*args) for args in zip(leaves, *others, strict=True)], treedef


@checked
class StochasticRoundingState(eqx.Module, OptaxTuple):
    """The state of `eqopt.StochasticRounding`: the step count and the raw data of the next key."""

    count: Int[Array, ""]
    rng_key: UInt32[Array, " key_data"]


@checked
class StochasticRounding(AbstractGradientTransformation):
    r"""Makes `apply_updates` round low-precision parameters stochastically.

    Put it last in a chain. For every `bfloat16` or `float16` parameter it
    returns the float32 update that takes $\theta$ to
    $\operatorname{SR}(\theta + u)$ (see `eqopt.stochastic_round`), so
    `eqopt.apply_updates` lands exactly on the stochastically rounded value:

    $$
    u'_t = \operatorname{SR}_{\xi_t}(\theta_{t-1} + u_t) - \theta_{t-1}
    $$

    Updates of float32 (and wider) parameters pass through. The state's key is
    split at every step (one key per leaf), so a run is deterministic for a
    given key; it works under `jit` and `vmap` (vmap over keys for independent
    runs).

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `key`: a key from `jax.random.key`, a raw key, or an integer seed.

    !!! example

        ```python
        model = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if eqx.is_inexact_array(x) else x, model)
        opt = eqopt.chain(eqopt.adam(1e-3, mu_dtype=jnp.float32, nu_dtype=jnp.float32),
                          eqopt.stochastic_rounding(jax.random.key(0)))
        state = opt.init(model)
        ```

    **References:** Gupta et al., *Deep Learning with Limited Numerical
    Precision*, ICML 2015; Zamirai et al., *Revisiting BFloat16 Training*, 2020.
    """

    key: UInt32[Array | np.ndarray, " key_data"]
    key_impl: str | None = eqx.field(static=True)

    def __init__(self, key: KeyLike = 0):
        self.key, self.key_impl = _key_data_and_impl(key)

    @property
    def elementwise(self) -> bool:
        return False

    @init_entry
    def init(self, params: Params) -> StochasticRoundingState:
        # A copy of the key: a step that donates the optimiser and the state
        # cannot take one buffer twice.
        return StochasticRoundingState(
            count=jnp.zeros([], jnp.int32), rng_key=jnp.array(self.key, copy=True)
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: StochasticRoundingState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, StochasticRoundingState]:
        require_params(params, "stochastic_rounding")
        next_key, step_key = jax.random.split(_wrap_key(state.rng_key, self.key_impl))

        leaf_keys = iter(jax.random.split(step_key, len(jax.tree.leaves(updates))))

        @no_type_check
        def round_leaf(u, p):
            if u is None:
                return None
            leaf_key = next(leaf_keys)
            if not _is_low_precision(p):
                return u
            target = p.astype(jnp.float32) + u.astype(jnp.float32)
            rounded = stochastic_round(target, p.dtype, leaf_key)
            # Exact in float32: `apply_updates` adds it in float32 and lands on `rounded`.
            return rounded.astype(jnp.float32) - p.astype(jnp.float32)

        out, treedef = _map_leaves(round_leaf, updates, params)
        new_updates = jax.tree.unflatten(treedef, out)
        return new_updates, StochasticRoundingState(
            count=safe_int32_increment(state.count),
            rng_key=jax.random.key_data(next_key),
        )


@checked
def stochastic_rounding(key: KeyLike = 0) -> StochasticRounding:
    """Stochastic rounding of low-precision parameters: see `eqopt.StochasticRounding`."""
    return StochasticRounding(key)


@checked
class MasterWeightsState(eqx.Module, OptaxTuple):
    """The state of `eqopt.MasterWeights`.

    - `master`: the float32 copy of every low-precision parameter (`None` where
      a parameter is float32 or wider, or not trained).
    - `inner_state`: the inner optimiser's state, for the master weights.
    """

    master: Any
    inner_state: Any


@checked
class MasterWeights(AbstractWrapper):
    r"""Trains float32 master copies of low-precision parameters.

    The state keeps $\theta^{32}$, a float32 copy of each `bfloat16` or
    `float16` parameter. The inner optimiser sees float32 gradients and the
    master weights, and its update is applied to them; the returned update
    moves the low-precision parameter to the rounded master copy, so
    `eqopt.apply_updates` keeps working:

    $$
    \theta^{32}_t = \theta^{32}_{t-1} + \operatorname{inner}(g_t), \qquad
    u'_t = \operatorname{round}(\theta^{32}_t) - \theta_{t-1}
    $$

    Small steps accumulate in the master copy instead of being rounded away.
    Read the master weights as `state.master` (model-shaped). Parameters that
    are float32 already have no copy and get the inner update directly.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `inner`: the optimiser to run in float32 (an eqopt transform or an
      Optax-style pair).

    !!! example

        ```python
        to_bf16 = lambda x: x.astype(jnp.bfloat16) if eqx.is_inexact_array(x) else x
        bf16_model, bf16_grads = jax.tree.map(to_bf16, (model, grads))
        opt = eqopt.master_weights(eqopt.adamw(1e-3))
        state = opt.init(bf16_model)
        updates, state = opt.update(bf16_grads, state, bf16_model)
        bf16_model = eqopt.apply_updates(bf16_model, updates)
        state.master      # float32 weights
        ```

    **References:** Micikevicius et al., *Mixed Precision Training*, ICLR 2018.
    """

    inner: AbstractGradientTransformation

    def __init__(self, inner: Any):
        self.inner = as_transform(inner)

    def _full(self, params: Params, master: Any) -> Any:
        return jax.tree.map(
            lambda m, p: p if m is None else m, master, params, is_leaf=is_none
        )

    @init_entry
    def init(self, params: Params) -> MasterWeightsState:
        master = jax.tree.map(
            lambda p: p.astype(jnp.float32) if _is_low_precision(p) else None, params
        )
        return MasterWeightsState(
            master=master, inner_state=self.inner.init(self._full(params, master))
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: MasterWeightsState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, MasterWeightsState]:
        require_params(params, "master_weights")
        full = self._full(params, state.master)

        @no_type_check
        def widen(g, p):
            return (
                g.astype(jnp.float32) if _is_low_precision(p) and g is not None else g
            )

        widened, treedef = _map_leaves(widen, updates, params)
        inner_updates, inner_state = self.inner.update(
            jax.tree.unflatten(treedef, widened), state.inner_state, full, **extra_args
        )

        @no_type_check
        def step(u, m, p):
            if m is None or u is None:
                return m, u
            new_master = m + u.astype(jnp.float32)
            # Exact in float32, so `apply_updates` lands on the rounded master.
            out = new_master.astype(p.dtype).astype(jnp.float32) - p.astype(jnp.float32)
            return new_master, out

        pairs, treedef = _map_leaves(step, inner_updates, state.master, params)
        master = jax.tree.unflatten(treedef, [m for m, _ in pairs])
        new_updates = jax.tree.unflatten(treedef, [u for _, u in pairs])
        return new_updates, MasterWeightsState(master=master, inner_state=inner_state)


@checked
def master_weights(inner: Any) -> MasterWeights:
    """Float32 master weights for low-precision params: see `eqopt.MasterWeights`."""
    return MasterWeights(inner)
