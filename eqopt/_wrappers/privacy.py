"""Differentially private SGD: per-example clipping, noisy aggregation and `dpsgd`."""

import warnings
from typing import Any, ClassVar, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Int, PRNGKeyArray, PyTree, Real, UInt32

from .._base import (
    AbstractGradientTransformation,
    Params,
    Updates,
    is_none,
    is_trainable,
    path_str,
)
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_hyperparameter,
)
from .._numerics import abs_squared
from .._optax_tuple import OptaxTuple
from .._transform.basic import Identity, ScaleByLearningRate
from .._transform.momentum import Trace
from .._typecheck import checked


def _present(grads: Any) -> list[Array]:
    return [g for g in jax.tree.leaves(grads) if g is not None]


@no_type_check
def _squared_norms(leaf):
    """Per-example squared norms of a batched leaf: one value per row of axis 0."""
    return jnp.sum(abs_squared(leaf).reshape(leaf.shape[0], -1), axis=1)


@no_type_check
def _clip_and_sum(leaf, scale):
    """`sum_b scale_b * leaf_b`, in the leaf's dtype (an integer leaf's in the
    scale's: a clipped integer gradient is not a whole number)."""
    dtype = leaf.dtype if jnp.issubdtype(leaf.dtype, jnp.inexact) else scale.dtype
    scale = scale.reshape((-1,) + (1,) * (leaf.ndim - 1)).astype(dtype)
    return jnp.sum(leaf * scale, axis=0)


def _check_batched(grads: Any, what: str) -> int:
    leaves = jax.tree_util.tree_flatten_with_path(grads)[0]
    batch_sizes = set()
    for path, leaf in leaves:
        if leaf is None:
            continue
        if not eqx.is_array(leaf) or leaf.ndim == 0:
            raise ValueError(
                f"{what}: the per-example gradient at {path_str(path)} has no batch "
                "axis. Pass per-example gradients with the batch on axis 0, e.g. "
                "`jax.vmap(eqx.filter_grad(loss), in_axes=(None, 0, 0))(model, x, y)`."
            )
        batch_sizes.add(leaf.shape[0])
    if len(batch_sizes) > 1:
        raise ValueError(
            f"{what}: the per-example gradients have different batch sizes "
            f"{sorted(batch_sizes)} on axis 0."
        )
    return batch_sizes.pop() if batch_sizes else 0


@checked
def per_example_global_norm_clip(
    grads: PyTree[Any], l2_norm_clip: Real[ArrayLike, ""]
) -> tuple[PyTree[Any], Int[Array, ""]]:
    r"""Clips each example's gradient to a global norm, then sums over the batch.

    With $g^{(b)}$ the gradient of example $b$ (all leaves together) and $C$ =
    `l2_norm_clip`:

    $$
    \sum_b g^{(b)} \min\!\Big(1, \frac{C}{\|g^{(b)}\|_2}\Big)
    $$

    **Arguments:**

    - `grads`: per-example gradients, any pytree (a whole model from
      `jax.vmap(eqx.filter_grad(...))` is fine) whose arrays have the batch on
      axis 0; `None` leaves stay `None`.
    - `l2_norm_clip`: $C$.

    **Returns:** `(summed, num_clipped)`: the sum of the clipped per-example
    gradients (shaped like `grads` without the batch axis) and the number of
    examples whose norm exceeded $C$.

    **References:** Abadi et al., *Deep Learning with Differential Privacy*,
    CCS 2016.
    """
    _check_batched(grads, "per_example_global_norm_clip")
    leaves = _present(grads)
    if not leaves:
        return grads, jnp.zeros([], jnp.int32)
    norms = jnp.sqrt(sum(_squared_norms(leaf) for leaf in leaves))
    clipped = norms > l2_norm_clip
    scale = jnp.where(clipped, l2_norm_clip / jnp.where(clipped, norms, 1), 1)
    summed = jax.tree.map(
        lambda g: None if g is None else _clip_and_sum(g, scale),
        grads,
        is_leaf=is_none,
    )
    return summed, jnp.sum(clipped, dtype=jnp.int32)


@checked
def per_example_layer_norm_clip(
    grads: PyTree[Any], global_l2_norm_clip: Real[ArrayLike, ""], uniform: bool = True
) -> tuple[PyTree[Any], PyTree[Any]]:
    r"""Clips each example's gradient leaf by leaf (layer by layer), then sums over the batch.

    With $K$ leaves, $D_i$ entries per example in leaf $i$, $D = \sum_i D_i$
    and $C$ = `global_l2_norm_clip`, leaf $i$ is clipped to

    $$
    C_i = \frac{C}{\sqrt K} \ (\texttt{uniform}), \qquad
    C_i = C \sqrt{D_i / D} \ (\text{otherwise}),
    $$

    so that the whole gradient of an example has norm at most $C$. With one
    leaf this is `eqopt.per_example_global_norm_clip`.

    **Arguments:**

    - `grads`: per-example gradients with the batch on axis 0 (any pytree;
      `None` leaves stay `None`).
    - `global_l2_norm_clip`: $C$.
    - `uniform`: split $C$ evenly between leaves, or by their sizes.

    **Returns:** `(summed, num_clipped)`: trees shaped like `grads`, of the
    summed clipped gradients and of the number of examples clipped in each
    leaf.

    **References:** McMahan, Ramage, Talwar & Zhang, *Learning Differentially
    Private Recurrent Language Models*, ICLR 2018.
    """
    _check_batched(grads, "per_example_layer_norm_clip")
    leaves = _present(grads)
    num_leaves = len(leaves)
    total = sum(leaf.size // leaf.shape[0] for leaf in leaves)

    def clip(g):
        if g is None:
            return None
        if uniform:
            bound = global_l2_norm_clip / jnp.sqrt(num_leaves)
        else:
            bound = global_l2_norm_clip * jnp.sqrt((g.size // g.shape[0]) / total)
        norms = jnp.sqrt(_squared_norms(g))
        clipped = norms > bound
        scale = jnp.where(clipped, bound / jnp.where(clipped, norms, 1), 1)
        return _clip_and_sum(g, scale), jnp.sum(clipped, dtype=jnp.int32)

    pairs = [clip(g) for g in jax.tree.leaves(grads, is_leaf=is_none)]
    treedef = jax.tree.structure(grads, is_leaf=is_none)
    summed = jax.tree.unflatten(treedef, [None if p is None else p[0] for p in pairs])
    counts = jax.tree.unflatten(treedef, [None if p is None else p[1] for p in pairs])
    return summed, counts


@checked
class DifferentiallyPrivateAggregateState(eqx.Module, OptaxTuple):
    """The state of `eqopt.DifferentiallyPrivateAggregate`: the PRNG key for the next step.

    - `rng_key`: the key's raw data (`jax.random.key_data`), so that the state
      serialises with `eqx.tree_serialise_leaves` (a typed key does not).
      Optax keeps the typed key; `state.key()` gives it back.
    - `impl`: the name of the key's PRNG implementation.
    """

    rng_key: UInt32[Array, " _"]
    impl: str = eqx.field(static=True, default="threefry2x32")

    def key(self) -> PRNGKeyArray:
        """The typed PRNG key."""
        return jax.random.wrap_key_data(self.rng_key, impl=self.impl)


def _state_of(key: PRNGKeyArray) -> DifferentiallyPrivateAggregateState:
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return DifferentiallyPrivateAggregateState(
            rng_key=jax.random.key_data(key), impl=str(jax.random.key_impl(key))
        )
    # A raw key (`jax.random.PRNGKey`): the default implementation's data.
    # A copy: a step that donates the optimiser and the state cannot take one
    # buffer twice.
    return DifferentiallyPrivateAggregateState(
        rng_key=jnp.array(key, copy=True),
        impl=str(jax.random.key_impl(jax.random.key(0))),
    )


def _as_key(key: Any, seed: Any) -> PRNGKeyArray:
    if key is not None and seed is not None:
        raise ValueError(
            "differentially_private_aggregate: pass `key` only (`seed` is its "
            "deprecated spelling), not both."
        )
    if seed is not None:
        warnings.warn(
            "differentially_private_aggregate: `seed` is deprecated, pass `key`.",
            DeprecationWarning,
            stacklevel=3,
        )
        key = seed
    if key is None:
        raise ValueError(
            "differentially_private_aggregate: a `key` is required (a "
            "`jax.random.key(...)` or an int seed). The noise is what makes the "
            "gradients private, so eqopt does not pick a default seed."
        )
    if isinstance(key, int) or (
        eqx.is_array(key) and key.ndim == 0 and jnp.issubdtype(key.dtype, jnp.integer)
    ):
        return jax.random.key(key)
    return key


@checked
class DifferentiallyPrivateAggregate(AbstractGradientTransformation):
    r"""Aggregates per-example gradients the DP-SGD way: clip each, sum, add Gaussian noise, average.

    With per-example gradients $g^{(1)}, \dots, g^{(B)}$, clip norm $C$ and
    noise multiplier $\sigma$:

    $$
    \tilde g = \frac{1}{B} \Big( \sum_{b=1}^{B} g^{(b)}
    \min\!\Big(1, \frac{C}{\|g^{(b)}\|_2}\Big) + \mathcal N(0, \sigma^2 C^2 I) \Big)
    $$

    The updates it receives have a batch axis 0 (per-example gradients, e.g.
    from `jax.vmap(eqx.filter_grad(loss), in_axes=(None, 0, 0))`); the updates
    it returns do not, so it comes first in a chain. Gradient accumulation
    wrappers (`eqopt.MultiSteps`, `eqopt.apply_every`) do not compose
    with it: the aggregation is the point.

    Each step splits the state's key into one key for the next step and one per
    gradient leaf, in leaf order, as Optax does: the same key gives the same
    noise as Optax on params of the same structure.

    Unlike Optax, a key is required: there is no default seed. The state keeps
    the key's raw data so that it serialises (see
    `eqopt.DifferentiallyPrivateAggregateState`).

    **Global**: one clipping norm per example over all the leaves, a stacked layer's
    slices included.

    **Arguments:**

    - `l2_norm_clip`: $C$, the largest norm of a per-example gradient.
    - `noise_multiplier`: $\sigma$, the noise's standard deviation relative to $C$.
    - `key`: a `jax.random.key(...)`, or an int seed.

    !!! example

        ```python
        # One gradient per example: vmap over the batch, with a batch of one inside.
        def example_loss(model, x, y):
            return loss_fn(model, x[None], y[None])

        per_example_grad = jax.vmap(eqx.filter_grad(example_loss), in_axes=(None, 0, 0))
        per_example = per_example_grad(model, x, y)
        opt = eqopt.chain(
            eqopt.differentially_private_aggregate(
                l2_norm_clip=1.0, noise_multiplier=1.1, key=jax.random.key(0)
            ),
            eqopt.sgd(1e-2),
        )
        state = opt.init(model)
        updates, state = opt.update(per_example, state, model)   # no batch axis
        model = eqopt.apply_updates(model, updates)
        ```

    **References:** Abadi et al., *Deep Learning with Differential Privacy*,
    CCS 2016.
    """

    l2_norm_clip: Scalar = eqx.field(converter=as_scalar)
    noise_multiplier: Scalar = eqx.field(converter=as_scalar)
    key: PRNGKeyArray

    def __check_init__(self):
        super().__check_init__()
        check_hyperparameter("l2_norm_clip", self.l2_norm_clip, low=0.0)
        check_hyperparameter("noise_multiplier", self.noise_multiplier, low=0.0)

    @property
    def elementwise(self) -> bool:
        return False

    #: The updates it takes have a batch axis 0 (a chain it starts checks them here).
    per_example_updates: ClassVar[bool] = True

    @init_entry
    def init(self, params: Params) -> DifferentiallyPrivateAggregateState:
        return _state_of(self.key)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: DifferentiallyPrivateAggregateState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, DifferentiallyPrivateAggregateState]:
        batch_size = _check_batched(updates, "differentially_private_aggregate")
        if params is not None:
            _check_against_params(updates, params)
        leaves = _present(updates)
        keys = jax.random.split(state.key(), len(leaves) + 1)
        summed, _ = per_example_global_norm_clip(updates, self.l2_norm_clip)
        stddev = self.noise_multiplier * self.l2_norm_clip
        noise_keys = iter(keys[1:])

        def noisy_mean(g):
            if g is None:
                return None
            noise = jax.random.normal(next(noise_keys), g.shape, g.dtype)
            return (g + stddev.astype(g.dtype) * noise) / batch_size

        return jax.tree.map(noisy_mean, summed, is_leaf=is_none), _state_of(keys[0])


def _check_against_params(updates: Any, params: Any) -> None:
    flat = jax.tree_util.tree_flatten_with_path(updates, is_leaf=is_none)[0]
    param_leaves = jax.tree.leaves(params, is_leaf=is_none)
    if len(flat) != len(param_leaves):
        raise ValueError(
            "differentially_private_aggregate: the per-example gradients do not have "
            "the structure of the params."
        )
    for (path, g), p in zip(flat, param_leaves, strict=True):
        if g is None:
            continue
        if not is_trainable(p) or tuple(g.shape[1:]) != tuple(p.shape):
            raise ValueError(
                f"differentially_private_aggregate: the per-example gradient at "
                f"{path_str(path)} has shape {tuple(g.shape)}; expected the batch "
                f"axis then the param's shape {tuple(getattr(p, 'shape', ()))}."
            )


@checked
def differentially_private_aggregate(
    l2_norm_clip: ScalarLike,
    noise_multiplier: ScalarLike,
    key: PRNGKeyArray | int | None = None,
    *,
    seed: int | None = None,
) -> DifferentiallyPrivateAggregate:
    """Optax spelling of `eqopt.DifferentiallyPrivateAggregate`.

    `seed` is the deprecated spelling of `key` (a warning says so).
    """
    return DifferentiallyPrivateAggregate(
        l2_norm_clip=l2_norm_clip,
        noise_multiplier=noise_multiplier,
        key=_as_key(key, seed),
    )


@checked
def dpsgd(
    learning_rate: ScalarOrSchedule,
    l2_norm_clip: ScalarLike,
    noise_multiplier: ScalarLike,
    seed: int,
    momentum: ScalarLike | None = None,
    nesterov: bool = False,
) -> Chain:
    r"""Differentially private SGD: DP aggregation of per-example gradients, then SGD.

    $$
    \tilde g_t = \frac{1}{B}\Big(\sum_b \operatorname{clip}_C(g^{(b)}_t) +
    \mathcal N(0, \sigma^2 C^2 I)\Big), \qquad u_t = -\eta_t\, \tilde g_t
    $$

    with optional (Nesterov) momentum on $\tilde g$ as in `eqopt.sgd`. The
    chain is `differentially_private_aggregate`, `identity` or `trace`, then
    `scale_by_learning_rate`, as in Optax. The updates it receives are
    per-example gradients (batch on axis 0).

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - `l2_norm_clip`: $C$, the largest norm of a per-example gradient.
    - `noise_multiplier`: $\sigma$, the noise's standard deviation relative to $C$.
    - `seed`: the seed of the noise's PRNG key (an int, or a key).
    - `momentum`: the momentum, or `None` for none.
    - `nesterov`: use Nesterov momentum.

    **Returns:** an `eqopt.Chain`.

    **References:** Abadi et al., *Deep Learning with Differential Privacy*,
    CCS 2016.
    """
    return Chain(
        DifferentiallyPrivateAggregate(
            l2_norm_clip=l2_norm_clip,
            noise_multiplier=noise_multiplier,
            key=_as_key(seed, None),
        ),
        Identity() if momentum is None else Trace(decay=momentum, nesterov=nesterov),
        ScaleByLearningRate(learning_rate=learning_rate),
    )
