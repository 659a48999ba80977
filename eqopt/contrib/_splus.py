"""SPlus: Shampoo's eigenbasis with an instant sign normalisation (Frans et al., 2025)."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._base import AbstractGradientTransformation, EmptyState, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._filters import FilterSpec
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_decays,
    check_hyperparameter,
)
from .._layer_axes import stack_axes
from .._leafwise import leafwise, map_layers, per_slice, zeros_like_trainable
from .._leaves import is_none, is_trainable
from .._linalg import eigh
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._sharding import gathered, whole
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._reductions import refuse_complex


def _is_whitened(shape: tuple[int, ...], max_dim: int) -> bool:
    return len(shape) == 2 and max(shape) <= max_dim


@checked
class ScaleBySPlusState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleBySPlus`.

    - `count`: the number of steps taken.
    - `mu`: the momentum $M$, shaped like the params.
    - `sides`: for each matrix, the pair $(L, R)$ of gradient covariances
      ($n \\times n$ and $m \\times m$, stacked on a stacked leaf's stack
      axes); `None` for other leaves.
    - `bases`: the pair of eigenbases $(Q_L, Q_R)$ in use, shaped as `sides`.
    """

    count: Int[Array, ""]
    mu: Updates
    sides: Any
    bases: Any


@checked
class ScaleBySPlus(AbstractGradientTransformation):
    r"""Whitens the momentum of each matrix in Shampoo's eigenbasis by its sign (SPlus).

    For each matrix $G_t \in \mathbb{R}^{n \times m}$:

    $$
    \begin{aligned}
    M_t &= \beta_1 M_{t-1} + (1 - \beta_1)\, G_t \\
    u_t &= Q_L\, \operatorname{sign}\!\big(Q_L^\top M_t\, Q_R\big)\, Q_R^\top \\
    L_t &= \beta_2 L_{t-1} + (1 - \beta_2)\, G_t G_t^\top, \qquad
    R_t = \beta_2 R_{t-1} + (1 - \beta_2)\, G_t^\top G_t
    \end{aligned}
    $$

    with $Q_L, Q_R$ the eigenvectors of $L$ and $R$, recomputed after the
    first step and every `inverse_every` steps (identity before the first).
    The eigenbasis comes from history and changes seldom; the normalisation
    (the sign, Adam's update without its second moment) is instant, so a
    stale basis cannot blow up the step as a stale inverse root does in
    Shampoo. Any other leaf (vectors, scalars, matrices with a side longer
    than `max_dim`) gets $u_t = \operatorname{sign}(M_t)$. The update is
    invariant to the signs and order of the eigenvectors, so orientation does
    not matter. The shape-aware scale of the step is
    `eqopt.contrib.ScaleBySPlusShape`; `eqopt.contrib.splus` chains both.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers. Each slice has its
    own covariances and bases. Real parameters only (a complex leaf is an error naming it).

    **Arguments:**

    - `b1`: $\beta_1$, the momentum's decay.
    - `b2`: $\beta_2$, the covariances' decay.
    - `eps`: added to the diagonal of $L$, $R$ before the eigendecomposition.
    - `inverse_every`: steps between eigendecompositions (static).
    - `max_dim`: a matrix with a side longer than this is not whitened.

    **References:** Frans, Levine & Abbeel, *A Stable Whitening Optimizer for
    Efficient Neural Network Training*, arXiv:2506.07254, 2025.
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-30, converter=as_scalar)
    inverse_every: int = eqx.field(default=100, static=True)
    max_dim: int = eqx.field(default=10000, static=True)

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("eps", self.eps, low=0.0)
        for name in ("inverse_every", "max_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"ScaleBySPlus: `{name}` must be a positive int, got {value!r}."
                )

    @property
    def elementwise(self) -> bool:
        return False

    @init_entry
    def init(self, params: Params) -> ScaleBySPlusState:
        refuse_complex(params, "splus")

        @no_type_check
        def side(p, make):
            if not _is_whitened(p.shape, self.max_dim):
                return None
            dtype = jnp.promote_types(p.dtype, jnp.float32)
            return tuple(make(d, dtype) for d in p.shape)

        zeros = lambda d, t: jnp.zeros((d, d), t)  # noqa: E731
        eye = lambda d, t: jnp.eye(d, dtype=t)  # noqa: E731
        return ScaleBySPlusState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params),
            sides=map_layers(lambda p: side(p, zeros), params),
            bases=map_layers(lambda p: side(p, eye), params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleBySPlusState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleBySPlusState]:
        b1, b2, eps = self.b1, self.b2, self.eps
        one_minus_b1, one_minus_b2 = 1 - b1, 1 - b2
        count = safe_int32_increment(state.count)
        # After the first step, and every `inverse_every` steps.
        refresh = (count == 1) | (count % self.inverse_every == 0)

        @no_type_check
        def eigenbasis(side):
            shifted = side + eps * jnp.eye(side.shape[0], dtype=side.dtype)
            return eigh(shifted)[1].astype(side.dtype)

        @no_type_check
        def step(g, mu, sides, bases):
            mu = b1 * mu + one_minus_b1 * g
            if sides is None:
                return jnp.sign(mu).astype(g.dtype), mu, sides, bases
            # On explicit mesh axes (and under ZeRO-1) the matrices and their
            # factors are whole for the rotations; results keep their layouts.
            g, shard_like_g = gathered(g)
            x, shard_like_mu = gathered(mu)
            layouts = [gathered(f)[1] for f in (*sides, *bases)]
            sides, bases = whole(sides), whole(bases)
            left, right = bases
            x = x.astype(left.dtype)
            direction = left @ jnp.sign(left.T @ x @ right) @ right.T
            g32 = g.astype(left.dtype)
            new_sides = (
                b2 * sides[0] + one_minus_b2 * (g32 @ g32.T),
                b2 * sides[1] + one_minus_b2 * (g32.T @ g32),
            )
            new_bases = jax.lax.cond(
                refresh,
                lambda s: tuple(eigenbasis(x) for x in s),
                lambda _: bases,
                new_sides,
            )
            new_sides = tuple(f(y) for f, y in zip(layouts[:2], new_sides, strict=True))
            new_bases = tuple(f(y) for f, y in zip(layouts[2:], new_bases, strict=True))
            return (
                shard_like_g(direction.astype(g.dtype)),
                shard_like_mu(mu),
                new_sides,
                new_bases,
            )

        leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
        rest = [
            treedef.flatten_up_to(tree) for tree in (state.mu, state.sides, state.bases)
        ]
        out = []
        for g, mu, sides, bases, stack in zip(
            leaves, *rest, stack_axes(updates), strict=True
        ):
            if g is None:
                out.append((None, mu, sides, bases))
            else:
                # Per layer: each slice of a stacked leaf has its own L, R, Q.
                out.append(per_slice(step, stack)(g, mu, sides, bases))
        new_updates, mu, sides, bases = (
            jax.tree.unflatten(treedef, [o[i] for o in out]) for i in range(4)
        )
        return new_updates, ScaleBySPlusState(
            count=count, mu=mu, sides=sides, bases=bases
        )


@checked
class ScaleBySPlusShape(AbstractGradientTransformation):
    r"""Scales each matrix's update by $2 / (n + m)$, every other leaf's by a constant.

    $$ u \mapsto \frac{2}{n + m}\, u \quad (u \in \mathbb{R}^{n \times m}), \qquad
       u \mapsto c\, u \quad\text{otherwise} $$

    SPlus's shape-aware scaling: a sign update of an $n \times m$ matrix has
    spectral norm about $\sqrt{nm}$, and $2 / (n + m)$ keeps the learning
    rate that suits one width right for another. Leaves that
    `eqopt.contrib.ScaleBySPlus` does not whiten (vectors, scalars, a matrix
    with a side longer than `max_dim`) take $c$ (`nonstandard_constant`).

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers. The factor is read
    from one slice.

    **Arguments:**

    - `nonstandard_constant`: $c$.
    - `max_dim`: as `eqopt.contrib.ScaleBySPlus`.

    **References:** Frans, Levine & Abbeel, *A Stable Whitening Optimizer for
    Efficient Neural Network Training*, arXiv:2506.07254, 2025.
    """

    nonstandard_constant: Scalar = eqx.field(default=1e-3, converter=as_scalar)
    max_dim: int = eqx.field(default=10000, static=True)

    @property
    def elementwise(self) -> bool:
        return False

    @init_entry
    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    @update_entry
    def update(
        self,
        updates: Updates,
        state: EmptyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmptyState]:
        constant = self.nonstandard_constant

        @no_type_check
        def scale(u):
            if _is_whitened(u.shape, self.max_dim):
                return (2.0 / sum(u.shape)) * u
            return (constant * u).astype(u.dtype)

        return leafwise(scale, updates), state


@checked
class IterateAverageState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.IterateAverage`: the step count, the (not
    bias-corrected) average of the parameters, and the total weight
    $1 - \rho^t$ of the iterates in it (what to divide the average by)."""

    count: Int[Array, ""]
    average: Updates
    weight: Float[Array, ""]


@checked
class IterateAverage(AbstractGradientTransformation):
    r"""Keeps an exponential moving average of the parameters the updates lead to.

    $$ \bar\theta_t = \rho\, \bar\theta_{t-1} + (1 - \rho)\, (\theta_{t-1} + u_t),
       \qquad \bar\theta_0 = 0 $$

    The updates pass through unchanged; put it last in a chain, where
    $\theta_{t-1} + u_t$ is the next iterate. Evaluate with the
    bias-corrected average $\bar\theta_t / (1 - \rho^t)$
    (`eqopt.contrib.splus_eval_params`): large learning rates leave noise in
    the iterates that the average removes.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `ema_rate`: $\rho$.

    **References:** Frans, Levine & Abbeel, *A Stable Whitening Optimizer for
    Efficient Neural Network Training*, arXiv:2506.07254, 2025 (iterate
    averaging, as in Polyak & Juditsky, 1992).
    """

    ema_rate: Scalar = eqx.field(default=0.999, converter=as_scalar)

    def __check_init__(self):
        check_decays(self, "ema_rate")

    @property
    def elementwise(self) -> bool:
        return True

    @init_entry
    def init(self, params: Params) -> IterateAverageState:
        return IterateAverageState(
            count=jnp.zeros([], jnp.int32),
            average=zeros_like_trainable(params),
            weight=jnp.zeros([], jnp.float32),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: IterateAverageState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, IterateAverageState]:
        if params is None:
            raise ValueError(
                "IterateAverage needs `params`: call `update(updates, state, params)`."
            )
        rate = self.ema_rate
        one_minus_rate = 1 - rate

        @no_type_check
        def average(u, a, p):
            return (rate * a + one_minus_rate * (p + u)).astype(a.dtype)

        new = leafwise(average, updates, state.average, params, elementwise=True)
        # Leaves without an update keep their average.
        new = jax.tree.map(
            lambda n, a: a if n is None else n, new, state.average, is_leaf=is_none
        )
        weight = jnp.asarray(rate * state.weight + one_minus_rate, jnp.float32)
        return updates, IterateAverageState(
            count=safe_int32_increment(state.count), average=new, weight=weight
        )


@checked
def splus_eval_params(state: Any, params: Params) -> Any:
    r"""The parameters to evaluate SPlus with: the bias-corrected iterate average.

    $\bar\theta_t / (1 - \rho^t)$ from the `eqopt.contrib.IterateAverageState`
    found in `state` (the state of `eqopt.contrib.splus`, or of any chain
    ending with `eqopt.contrib.IterateAverage`), at each trainable leaf of
    `params`; other leaves are taken from `params`. Before the first step it
    gives `params`.

    **Arguments:**

    - `state`: the optimiser's state.
    - `params`: the model (for its structure and non-trainable leaves).

    **Returns:** `params` with the averaged arrays.
    """
    found = [
        x
        for x in jax.tree.leaves(
            state, is_leaf=lambda x: isinstance(x, IterateAverageState)
        )
        if isinstance(x, IterateAverageState)
    ]
    if len(found) != 1:
        raise ValueError(
            f"splus_eval_params: the state holds {len(found)} iterate averages; "
            "pass the state of `eqopt.contrib.splus`."
        )
    (average,) = found
    weight = jnp.where(average.weight > 0, average.weight, 1.0)

    def corrected(p, a):
        if not is_trainable(p) or a is None:
            return p
        return jnp.where(average.weight > 0, a / weight.astype(a.dtype), p)

    return jax.tree.map(corrected, params, average.average, is_leaf=is_none)


@checked
def scale_by_splus(
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-30,
    inverse_every: int = 100,
    max_dim: int = 10000,
) -> ScaleBySPlus:
    """Lowercase spelling of `eqopt.contrib.ScaleBySPlus`."""
    return ScaleBySPlus(
        b1=b1, b2=b2, eps=eps, inverse_every=inverse_every, max_dim=max_dim
    )


@checked
def splus(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    ema_rate: ScalarLike = 0.999,
    eps: ScalarLike = 1e-30,
    inverse_every: int = 100,
    nonstandard_constant: ScalarLike = 1e-3,
    weight_decay: ScalarOrSchedule = 1e-2,
    mask: FilterSpec | None = None,
    max_dim: int = 10000,
) -> Chain:
    r"""SPlus: sign-whitened momentum in Shampoo's eigenbasis, shape-scaled, averaged.

    $$ \theta_t = \theta_{t-1} - \eta_t\, s \big( u_t + \lambda\, \theta_{t-1} \big),
       \qquad s = \tfrac{2}{n + m} \text{ (matrices) or } c $$

    with $u_t$ from `eqopt.contrib.ScaleBySPlus` and $s$ from
    `eqopt.contrib.ScaleBySPlusShape`; `eqopt.contrib.IterateAverage` keeps
    the average to evaluate with (`eqopt.contrib.splus_eval_params`). The
    chain is those with `eqopt.AddDecayedWeights` (before the shape scale, so
    the decay is scaled as the step) and `eqopt.ScaleByLearningRate`.
    pytorch-optimizer applies the same decay after the step (to
    $\theta_{t-1} - \eta_t s u_t$) and averages the iterate before it.

    !!! example

        ```python
        opt = eqopt.contrib.splus(0.1)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
        evaluated = eqopt.contrib.splus_eval_params(state, model)
        ```

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - `b1`, `b2`, `eps`, `inverse_every`, `max_dim`: as
      `eqopt.contrib.ScaleBySPlus`.
    - `ema_rate`: the iterate average's $\rho$.
    - `nonstandard_constant`: $c$, the scale of leaves that are not whitened.
    - `weight_decay`, `mask`: $\lambda$ and the filter spec of leaves to decay.

    **Returns:** an `eqopt.Chain`.

    **References:** Frans, Levine & Abbeel, *A Stable Whitening Optimizer for
    Efficient Neural Network Training*, arXiv:2506.07254, 2025.
    """
    return Chain(
        ScaleBySPlus(
            b1=b1, b2=b2, eps=eps, inverse_every=inverse_every, max_dim=max_dim
        ),
        AddDecayedWeights(weight_decay, mask),
        ScaleBySPlusShape(nonstandard_constant=nonstandard_constant, max_dim=max_dim),
        ScaleByLearningRate(learning_rate),
        IterateAverage(ema_rate=ema_rate),
    )
