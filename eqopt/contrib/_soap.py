"""SOAP: Adam in the eigenbasis of Shampoo's preconditioner."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from .._base import AbstractGradientTransformation, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._filters import FilterSpec
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_optional_scalar,
    as_scalar,
    check_decays,
    check_hyperparameter,
)
from .._leafwise import map_layers
from .._linalg import eigh, qr
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._sharding import gathered, whole
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._kronecker import apply_per_axis, gram, map_leaves, map_params, merge_small_dims

#: Per leaf, one square matrix per (merged) axis, `None` for an axis left alone.
# `None` (an empty subtree) where unused; a stacked layer has its stack axes first.
Factors = PyTree[Float[Array, "... _ _"]]


@checked
class ScaleBySoapState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleBySoap`.

    `mu` is kept in the parameters' own basis, `nu` in the rotated one (both
    shaped like the params); per leaf, `statistics` and `eigenbases` are tuples
    with one `(d, d)` matrix per (merged) axis and `None` where an axis is not
    preconditioned.
    """

    count: Int[Array, ""]
    mu: Updates
    nu: Updates
    statistics: Factors
    eigenbases: Factors


@no_type_check
def _eigenbasis(statistic):
    """The eigenvectors of a symmetric matrix, by decreasing eigenvalue."""
    _, vectors = eigh(statistic)
    return vectors[:, ::-1]


@checked
class ScaleBySoap(AbstractGradientTransformation):
    r"""Runs Adam in the eigenbasis of Shampoo's Kronecker-factored preconditioner (SOAP).

    For a matrix gradient $G_t$ (tensors: one factor per axis) with Shampoo's
    statistics $L_t = \beta_s L_{t-1} + (1 - \beta_s) G_t G_t^\top$,
    $R_t = \beta_s R_{t-1} + (1 - \beta_s) G_t^\top G_t$ and their eigenbases
    $Q_L, Q_R$:

    $$
    \begin{aligned}
    M_t &= \beta_1 M_{t-1} + (1 - \beta_1) G_t, \qquad
    V_t = \beta_2 V_{t-1} + (1 - \beta_2) \big(Q_L^\top G_t Q_R\big)^{2} \\
    u_t &= \frac{\sqrt{1 - \beta_2^t}}{1 - \beta_1^t}\;
      Q_L \left[\frac{Q_L^\top M_t Q_R}{\sqrt{V_t} + \epsilon}\right] Q_R^\top
    \end{aligned}
    $$

    The first step only measures: it sets $L_1, R_1$ and their eigenbases and
    returns a zero update, as the authors' implementation does (so $t$ above
    counts from the second call). After each step the statistics take the new
    gradient; every `precondition_frequency` steps (a `lax.cond` on the step
    count) each eigenbasis is refreshed by one power iteration and a QR
    decomposition, $Q \leftarrow \operatorname{qr}(L Q)$ with columns sorted by
    the estimated eigenvalues $\operatorname{diag}(Q^\top L Q)$, and $V_t$ is
    permuted to follow its columns.

    Axes longer than `max_precondition_dim` keep the identity; vectors are
    plain Adam unless `precondition_1d`; scalars are always plain Adam (with
    SOAP's $\epsilon$ outside the bias correction). With `merge_dims`,
    neighbouring axes whose product stays within `max_precondition_dim` are
    merged first (a `(64, 3, 3, 3)` convolution kernel becomes `(64, 27)`).
    With `one_sided`, only the shortest preconditioned axis of a tensor is
    rotated: the paper's one-sided variant, for layers where one side is too
    large to factor.

    Unlike `pytorch-optimizer`, merging that ends with a single axis keeps it
    (its `merge_small_dims` returns `[1]` for a shape merged into one axis).

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `b1`, `b2`: Adam's decay rates $\beta_1, \beta_2$.
    - `shampoo_beta`: the statistics' decay $\beta_s$ (default: `b2`).
    - `eps`: $\epsilon$.
    - `precondition_frequency`: steps between eigenbasis refreshes (static).
    - `max_precondition_dim`: the longest axis given a factor (static).
    - `merge_dims`: merge small neighbouring axes (static).
    - `precondition_1d`: give vectors a factor too (static).
    - `one_sided`: rotate only the shortest axis of a tensor (static).

    **References:** Vyas et al., *SOAP: Improving and Stabilizing Shampoo using
    Adam*, arXiv:2409.11321, 2024.
    """

    b1: Scalar = eqx.field(default=0.95, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.95, converter=as_scalar)
    shampoo_beta: Scalar | None = eqx.field(default=None, converter=as_optional_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    precondition_frequency: int = eqx.field(default=10, static=True)
    max_precondition_dim: int = eqx.field(default=10000, static=True)
    merge_dims: bool = eqx.field(default=False, static=True)
    precondition_1d: bool = eqx.field(default=False, static=True)
    one_sided: bool = eqx.field(default=False, static=True)

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        if self.shampoo_beta is not None:
            check_decays(self, "shampoo_beta")
        check_hyperparameter("eps", self.eps, low=0.0)
        for name in ("precondition_frequency", "max_precondition_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"ScaleBySoap: `{name}` must be a positive int, got {value!r}."
                )

    @property
    def elementwise(self) -> bool:
        return False

    def _layout(self, shape: tuple[int, ...]) -> tuple[tuple[int, ...], list[bool]]:
        """The (merged) shape a leaf is preconditioned in, and which axes get a factor."""
        if len(shape) == 1:
            return shape, [
                self.precondition_1d and shape[0] <= self.max_precondition_dim
            ]
        if self.merge_dims:
            shape = merge_small_dims(shape, self.max_precondition_dim)
        chosen = [size <= self.max_precondition_dim for size in shape]
        if self.one_sided and any(chosen):
            shortest = min(
                (size, axis) for axis, size in enumerate(shape) if chosen[axis]
            )[1]
            chosen = [axis == shortest for axis in range(len(shape))]
        return shape, chosen

    @init_entry
    def init(self, params: Params) -> ScaleBySoapState:
        def factors(p, value):
            if jnp.iscomplexobj(p):
                raise TypeError(
                    "SOAP supports real parameters only, got a complex one."
                )
            shape, chosen = self._layout(p.shape)
            dtype = jnp.promote_types(p.dtype, jnp.float32)
            return tuple(
                value(size, dtype) if use else None
                for size, use in zip(shape, chosen, strict=True)
            )

        zeros = lambda size, dtype: jnp.zeros((size, size), dtype)
        eye = lambda size, dtype: jnp.eye(size, dtype=dtype)
        return ScaleBySoapState(
            count=jnp.zeros([], jnp.int32),
            mu=map_params(jnp.zeros_like, params),
            nu=map_params(jnp.zeros_like, params),
            statistics=map_layers(lambda p: factors(p, zeros), params),
            eigenbases=map_layers(lambda p: factors(p, eye), params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleBySoapState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleBySoapState]:
        b1, b2, eps = self.b1, self.b2, self.eps
        shampoo_beta = b2 if self.shampoo_beta is None else self.shampoo_beta
        count = state.count
        first = count == 0
        refresh = (count % self.precondition_frequency == 0) & ~first
        # 0: set the eigenbases from the first statistics; 1: refresh; 2: keep.
        branch = jnp.where(first, 0, jnp.where(refresh, 1, 2))
        steps = jnp.maximum(count, 1)
        scale = jnp.sqrt(1 - b2**steps) / (1 - b1**steps)

        @no_type_check
        def step(g, mu, nu, statistics, bases):
            g, shard_like_g = gathered(g)
            mu, nu = gathered(mu)[0], gathered(nu)[0]
            # Whole factors too: under ZeRO-1 they are split over the data axis
            # (and the state's layout is restored by the plan's constraints).
            statistics, bases = whole(statistics), whole(bases)
            shape, _ = self._layout(g.shape)
            wide = jnp.promote_types(g.dtype, jnp.float32)
            merged = g.reshape(shape).astype(wide)
            new_mu = b1 * mu + (1 - b1) * g
            rotated = apply_per_axis(merged, bases)
            new_nu = b2 * nu + (1 - b2) * jnp.square(rotated).reshape(nu.shape)
            rotated_mu = apply_per_axis(new_mu.reshape(shape).astype(wide), bases)
            direction = rotated_mu / (eps + jnp.sqrt(new_nu.reshape(shape)))
            direction = apply_per_axis(direction, bases, transpose=True)
            update = jnp.where(first, 0, scale * direction).reshape(g.shape)
            new_mu = jnp.where(first, mu, new_mu).astype(mu.dtype)
            new_nu = jnp.where(first, nu, new_nu).astype(nu.dtype)
            statistics = tuple(
                None
                if s is None
                else shampoo_beta * s + (1 - shampoo_beta) * gram(merged, axis)
                for axis, s in enumerate(statistics)
            )

            def initial(bases, nu):
                return tuple(
                    None if s is None else _eigenbasis(s) for s in statistics
                ), nu

            def refreshed(bases, nu):
                nu = nu.reshape(shape)
                new_bases = []
                for axis, (s, q) in enumerate(zip(statistics, bases, strict=True)):
                    if s is None:
                        new_bases.append(None)
                        continue
                    product = s @ q
                    order = jnp.argsort(-jnp.sum(q * product, axis=0))
                    nu = jnp.take(nu, order, axis=axis)
                    new_bases.append(qr(product[:, order])[0])
                return tuple(new_bases), nu.reshape(g.shape)

            bases, new_nu = jax.lax.switch(
                branch, [initial, refreshed, lambda b, n: (b, n)], bases, new_nu
            )
            return (
                shard_like_g(update.astype(g.dtype)),
                shard_like_g(new_mu),
                shard_like_g(new_nu),
                statistics,
                bases,
            )

        updates, mu, nu, statistics, bases = map_leaves(
            step,
            updates,
            state.mu,
            state.nu,
            state.statistics,
            state.eigenbases,
            n_out=5,
        )
        return updates, ScaleBySoapState(
            count=safe_int32_increment(count),
            mu=mu,
            nu=nu,
            statistics=statistics,
            eigenbases=bases,
        )


@checked
def scale_by_soap(
    b1: ScalarLike = 0.95,
    b2: ScalarLike = 0.95,
    shampoo_beta: ScalarLike | None = None,
    eps: ScalarLike = 1e-8,
    precondition_frequency: int = 10,
    max_precondition_dim: int = 10000,
    *,
    merge_dims: bool = False,
    precondition_1d: bool = False,
    one_sided: bool = False,
) -> ScaleBySoap:
    """Builds `eqopt.contrib.ScaleBySoap` (Vyas et al., 2024)."""
    return ScaleBySoap(
        b1=b1,
        b2=b2,
        shampoo_beta=shampoo_beta,
        eps=eps,
        precondition_frequency=precondition_frequency,
        max_precondition_dim=max_precondition_dim,
        merge_dims=merge_dims,
        precondition_1d=precondition_1d,
        one_sided=one_sided,
    )


@checked
def soap(
    learning_rate: ScalarOrSchedule = 3e-3,
    b1: ScalarLike = 0.95,
    b2: ScalarLike = 0.95,
    shampoo_beta: ScalarLike | None = None,
    eps: ScalarLike = 1e-8,
    weight_decay: ScalarOrSchedule = 1e-2,
    weight_decay_mask: FilterSpec | None = None,
    precondition_frequency: int = 10,
    max_precondition_dim: int = 10000,
    *,
    merge_dims: bool = False,
    precondition_1d: bool = False,
    one_sided: bool = False,
) -> Chain:
    r"""SOAP with decoupled weight decay: Adam in Shampoo's eigenbasis.

    $$ w_t = w_{t-1} - \eta_t \big(u_t + \lambda\, w_{t-1}\big) $$

    with $u_t$ the direction of `eqopt.contrib.ScaleBySoap`. Defaults are
    the paper's (`b1 = b2 = 0.95`, a refresh every 10 steps).

    !!! example

        ```python
        model = eqx.nn.MLP(4, 2, 16, 2, key=jax.random.key(0))
        opt = eqopt.contrib.soap(3e-3, precondition_frequency=5)
        state = opt.init(model)
        print(state[0].eigenbases.layers[1].weight[0].shape)  # (16, 16)
        ```

    **On a real model** give SOAP the weight matrices and AdamW the rest:
    biases, normalisation scales and embeddings. SOAP's factors are for
    matrices: a vector would only get SOAP's plain Adam (with its
    `b2 = 0.95`), and an embedding's factor over its tokens is a `(vocab,
    vocab)` statistic and eigenbasis (up to `max_precondition_dim`). Select
    the weights by layer type and combine the two with `eqopt.partition`;
    the same `label` works for a transformer (a `MultiheadAttention`'s
    projections are `Linear`s; an `eqx.nn.Embedding` is not one, so it goes
    to AdamW). Add `eqx.nn.Conv` to `is_linear`'s types for convolutions
    (with `merge_dims=True` for their kernels).

    !!! example "SOAP with AdamW for biases, norms and embeddings"

        ```python
        is_linear = lambda x: isinstance(x, eqx.nn.Linear)

        def label(node):
            labels = jax.tree.map(lambda _: "adamw", node)
            if is_linear(node):
                labels = eqx.tree_at(lambda layer: layer.weight, labels, "soap")
            return labels

        opt = eqopt.partition(
            {"soap": eqopt.contrib.soap(3e-3),
             "adamw": eqopt.adamw(3e-3, weight_decay=1e-2)},
            jax.tree.map(label, model, is_leaf=is_linear),
        )
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        soap_state = state.inner_states["soap"][0]
        print(soap_state.eigenbases.layers[1].weight[0].shape)  # (16, 16)
        print(soap_state.eigenbases.layers[1].bias)             # None: AdamW's
        ```

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - `weight_decay`: $\lambda$ (decoupled, scaled by the learning rate).
    - `weight_decay_mask`: a filter spec of the leaves to decay.
    - the others: as for `eqopt.contrib.ScaleBySoap`.

    **Returns:** an `eqopt.Chain` of `scale_by_soap`, `add_decayed_weights`
    and `scale_by_learning_rate`.

    **References:** Vyas et al., *SOAP: Improving and Stabilizing Shampoo using
    Adam*, arXiv:2409.11321, 2024.
    """
    return Chain(
        scale_by_soap(
            b1=b1,
            b2=b2,
            shampoo_beta=shampoo_beta,
            eps=eps,
            precondition_frequency=precondition_frequency,
            max_precondition_dim=max_precondition_dim,
            merge_dims=merge_dims,
            precondition_1d=precondition_1d,
            one_sided=one_sided,
        ),
        AddDecayedWeights(weight_decay, weight_decay_mask),
        ScaleByLearningRate(learning_rate),
    )
