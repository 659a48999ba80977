"""Annealed Gaussian gradient noise."""

from typing import Any, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Int, Integer, Key, UInt32

from .._base import AbstractGradientTransformation, Params, Updates, is_none
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_hyperparameter,
)
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._typecheck import checked
from .basic import ScaleByLearningRate

#: A PRNG key: a typed key (`jax.random.key`), a raw `uint32` key
#: (`jax.random.PRNGKey`), or an integer seed.
KeyLike: TypeAlias = (
    int | Integer[ArrayLike, ""] | Key[Array, ""] | UInt32[Array, " key_data"]
)


def _key_data_and_impl(key: Any) -> tuple[Array | np.ndarray, str | None]:
    """Splits a key into its raw `uint32` data and the name of its PRNG implementation.

    Accepts an integer seed, a typed key (`jax.random.key`) or a raw key
    (`jax.random.PRNGKey`, read with the default implementation).
    """
    if isinstance(key, (bool, np.bool_)):
        raise TypeError("`key` must be a PRNG key or an integer seed, got a bool.")
    if isinstance(key, (int, np.integer)):
        key = jax.random.key(int(key))
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(
                f"`key` must be a single PRNG key, got an array of shape {key.shape}."
            )
        return jax.random.key_data(key), str(jax.random.key_impl(key))
    if eqx.is_array(key) and key.dtype == jnp.uint32 and key.ndim == 1:
        return key, None
    if eqx.is_array(key) and key.ndim == 0 and jnp.issubdtype(key.dtype, jnp.integer):
        # A JAX seed may be traced (an integer injected by `inject_hyperparams`).
        seed = jax.random.key(key) if isinstance(key, jax.Array) else int(key)
        return _key_data_and_impl(seed)
    raise TypeError(
        "`key` must be a PRNG key (`jax.random.key(seed)`), a raw `uint32` key or an "
        f"integer seed, got {type(key).__name__}."
    )


@checked
class AddNoiseState(eqx.Module, OptaxTuple):
    """The state of `eqopt.AddNoise`: the step count and the raw data of the next key."""

    count: Int[Array, ""]
    rng_key: UInt32[Array, " key_data"]


@checked
class AddNoise(AbstractGradientTransformation):
    r"""Adds annealed Gaussian noise to the updates.

    $$ u_t = g_t + \sigma_t\, \xi_t, \qquad \xi_t \sim \mathcal N(0, I), \qquad
       \sigma_t^2 = \frac{\eta}{t^{\gamma}} $$

    with $t = 1, 2, \dots$ the step. Each step splits the state's key in two, keeps
    one half for the next step and splits the other into one key per (non-`None`)
    update leaf, in the order of `jax.tree.leaves`; each leaf's noise is drawn
    in that leaf's dtype (complex noise has unit total variance). Given the same
    key and the same tree of updates, the noise is bit-for-bit Optax's.

    The state stores the key as raw `uint32` data (`jax.random.key_data`), so it
    serialises with `eqx.tree_serialise_leaves`; the implementation of a typed
    key is remembered as a static field.

    Not elementwise in eqopt's sense: the noise drawn depends on how the
    parameters are split into leaves (its distribution does not).

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `eta`: $\eta \ge 0$, the variance of the noise at the first step.
    - `gamma`: $\gamma \ge 0$, the annealing exponent (0.55 in the paper).
    - `key`: a key from `jax.random.key`, a raw key from `jax.random.PRNGKey`,
      or an integer seed. Default: seed 0, as in Optax; pass your own key.

    **References:** Neelakantan et al., *Adding Gradient Noise Improves Learning
    for Very Deep Networks*, arXiv:1511.06807, 2015.
    """

    eta: Scalar = eqx.field(converter=as_scalar)
    gamma: Scalar = eqx.field(converter=as_scalar)
    key: UInt32[Array | np.ndarray, " key_data"]
    key_impl: str | None = eqx.field(static=True)

    @property
    def elementwise(self) -> bool:
        return False

    def __init__(self, eta: ScalarLike, gamma: ScalarLike, key: KeyLike = 0):
        self.eta = as_scalar(eta)
        self.gamma = as_scalar(gamma)
        self.key, self.key_impl = _key_data_and_impl(key)

    def __check_init__(self):
        check_hyperparameter("eta", self.eta, low=0.0)
        check_hyperparameter("gamma", self.gamma, low=0.0)

    def _wrap(self, data: Array) -> Key[Array, ""]:
        if self.key_impl is None:
            return jax.random.wrap_key_data(data)
        return jax.random.wrap_key_data(data, impl=self.key_impl)

    @init_entry
    def init(self, params: Params) -> AddNoiseState:
        return AddNoiseState(
            count=jnp.zeros([], jnp.int32), rng_key=jnp.array(self.key)
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: AddNoiseState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, AddNoiseState]:
        count = safe_int32_increment(state.count)
        deviation = jnp.sqrt(self.eta / count**self.gamma)
        next_key, sample_key = jax.random.split(self._wrap(state.rng_key))
        leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
        live = [g for g in leaves if g is not None]
        keys = iter(jax.random.split(sample_key, len(live)))

        def noisy(g):
            if g is None:
                return None
            noise = jax.random.normal(next(keys), g.shape, g.dtype)
            return g + (deviation * noise).astype(g.dtype)

        new_updates = jax.tree.unflatten(treedef, [noisy(g) for g in leaves])
        state = AddNoiseState(count=count, rng_key=jax.random.key_data(next_key))
        return new_updates, state


def key_or_seed(key: KeyLike | None, seed: int | None) -> KeyLike:
    """The key given as `key` or as Optax's older `seed` (not both); seed 0 by default."""
    if seed is not None:
        if key is not None:
            raise ValueError("Give only one of `key` and `seed`.")
        return seed
    return 0 if key is None else key


@checked
def add_noise(
    eta: ScalarLike,
    gamma: ScalarLike,
    key: KeyLike | None = None,
    *,
    seed: int | None = None,
) -> AddNoise:
    """Optax spelling of `eqopt.AddNoise`.

    `seed` is Optax's older name for an integer `key`; give one or the other.
    """
    return AddNoise(eta=eta, gamma=gamma, key=key_or_seed(key, seed))


@checked
def noisy_sgd(
    learning_rate: ScalarOrSchedule,
    eta: ScalarLike = 0.01,
    gamma: ScalarLike = 0.55,
    key: KeyLike | None = None,
    *,
    seed: int | None = None,
) -> Chain:
    r"""SGD with annealed Gaussian noise added to the gradients.

    $$ u_t = -\eta_t \left( g_t + \sigma_t\, \xi_t \right), \qquad
       \xi_t \sim \mathcal N(0, I), \qquad \sigma_t^2 = \frac{\eta}{t^{\gamma}} $$

    (here $\eta$ is the argument `eta`, the noise variance, and $\eta_t$ the
    learning rate). The chain is `eqopt.AddNoise`, then
    `eqopt.ScaleByLearningRate`. Given the same key, the noise is Optax's.

    **Arguments:**

    - `learning_rate`: $\eta_t$, a number or a schedule of the step count.
    - `eta`: the noise variance at the first step.
    - `gamma`: the annealing exponent.
    - `key`: a key from `jax.random.key`, a raw key, or an integer seed (default
      seed 0, as in Optax; pass your own).
    - `seed`: Optax's older name for an integer `key`.

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        opt = eqopt.noisy_sgd(learning_rate=1e-2, eta=0.01, key=jax.random.key(0))
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)   # a new key every step
        ```

    **References:** Neelakantan et al., *Adding Gradient Noise Improves
    Learning for Very Deep Networks*, arXiv:1511.06807, 2015.
    """
    return Chain(
        AddNoise(eta=eta, gamma=gamma, key=key_or_seed(key, seed)),
        ScaleByLearningRate(learning_rate=learning_rate),
    )
