"""PSGD Kron: a Kronecker-factored preconditioner fitted on random probes."""

from collections.abc import Sequence
from typing import Any, Literal, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int, PyTree, Real, UInt32

from .._base import AbstractGradientTransformation, Params, Updates, is_none
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._filters import FilterSpec
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_optional_scalar_or_schedule,
    as_scalar,
    check_decays,
    check_hyperparameter,
)
from .._leafwise import map_layers
from .._linalg import solve_upper_right
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._sharding import gathered, whole
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ..schedules._base import AbstractSchedule
from ._kronecker import map_leaves, map_params

MemorySaveMode = Literal["one_diag", "all_diag"] | None
_MODES = (None, "one_diag", "all_diag")
#: Per leaf, one factor per axis: an upper-triangular `(d, d)` matrix or the
#: diagonal `(d,)` of a diagonal one (a scalar leaf has one scalar factor).
KronFactors = PyTree[Float[Array, "..."]]
# Li's damping of the probed gradient: the square root of float32's epsilon.
_DAMPING = float(np.sqrt(np.finfo(np.float32).eps))
_TINY = float(np.finfo(np.float32).tiny)


@checked
class KronUpdateProbabilitySchedule(AbstractSchedule):
    r"""How often PSGD Kron refits its preconditioner: flat, then exponentially annealed.

    $$ p(t) = \min\big(p_{\max},\, \max(p_{\max} e^{-\delta (t - t_0)},\, p_{\min})\big) $$

    With the defaults the preconditioner is refitted at every step for 500
    steps, then less often, down to about one step in 33 after 4000 steps.

    **Arguments:** `max_prob` ($p_{\max}$), `min_prob` ($p_{\min}$), `decay`
    ($\delta$), `flat_start` ($t_0$).

    **References:** Li, *Preconditioned Stochastic Gradient Descent*, IEEE
    TNNLS 29(5), 2018; the schedule of Evan Walters' `psgd_jax`.
    """

    max_prob: Scalar = eqx.field(default=1.0, converter=as_scalar)
    min_prob: Scalar = eqx.field(default=0.03, converter=as_scalar)
    decay: Scalar = eqx.field(default=0.001, converter=as_scalar)
    flat_start: Scalar = eqx.field(default=500.0, converter=as_scalar)

    @checked
    def __call__(self, count: Real[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        annealed = self.max_prob * jnp.exp(-self.decay * (count - self.flat_start))
        return jnp.minimum(jnp.maximum(annealed, self.min_prob), self.max_prob)


@checked
def precond_update_prob_schedule(
    max_prob: ScalarLike = 1.0,
    min_prob: ScalarLike = 0.03,
    decay: ScalarLike = 0.001,
    flat_start: ScalarLike = 500,
) -> KronUpdateProbabilitySchedule:
    """Builds `eqopt.contrib.KronUpdateProbabilitySchedule`."""
    return KronUpdateProbabilitySchedule(
        max_prob=max_prob, min_prob=min_prob, decay=decay, flat_start=flat_start
    )


@checked
class ScaleByKronState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByKron`.

    `key` (raw `uint32` key data, so the state serialises) draws the probes
    (see `eqopt.contrib.kron_probes`); `update_counter` counts the steps
    since the last refit; `mu` (shaped like the params) is the momentum;
    per leaf, `preconditioner` is a tuple of the factors $Q_i$ (a matrix, or
    the diagonal of a diagonal one).
    """

    count: Int[Array, ""]
    key: UInt32[Array, " key_data"]
    update_counter: Int[Array, ""]
    mu: Updates
    preconditioner: KronFactors


@no_type_check
def _along(x, factor, axis, transpose=False):
    """$Q$ applied to axis `axis` of `x` ($Q^\\top$ with `transpose`); a vector is a diagonal."""
    if factor.ndim < 2:
        shape = [1] * x.ndim
        if x.ndim:
            shape[axis] = -1
        return x * factor.reshape(shape)
    matrix = factor if transpose else factor.T
    return jnp.moveaxis(jnp.tensordot(x, matrix, axes=([axis], [0])), -1, axis)


@no_type_check
def _gram(x, axis, diagonal):
    """Per axis: $\\sum_{\\text{other axes}} x x^\\top$ (its diagonal for a diagonal factor)."""
    if diagonal:
        others = tuple(i for i in range(x.ndim) if i != axis)
        return jnp.sum(x * x, axis=others)
    others = [i for i in range(x.ndim) if i != axis]
    return jnp.tensordot(x, x, axes=(others, others))


@no_type_check
def _norm_lower_bound(matrix):
    """A lower bound of the spectral norm of a symmetric matrix: $\\|A x\\| / \\|x\\|$
    for $x = A r$, $r$ its row of largest norm (within a factor of about $\\sqrt 2$)."""
    largest = jnp.max(jnp.abs(matrix))

    def bound(matrix):
        scaled = matrix / largest
        row = scaled[jnp.argmax(jnp.sum(scaled * scaled, axis=1))]
        x = scaled @ row
        return largest * jnp.linalg.norm(scaled.T @ (x / jnp.linalg.norm(x)))

    return jax.lax.cond(largest > 0, bound, lambda _: largest, matrix)


@no_type_check
def _refit(factors, g, probe, learning_rate):
    """One step of Li's fit of $P = Q^\\top Q$ to the pair (probe $v$, gradient $g$).

    With $A = Q g$ and $B = Q^{-\\top} v$ (per axis), each factor moves down
    the gradient of $\\mathbb{E}[h^\\top P h + v^\\top P^{-1} v]$ on its Lie group,
    with a step normalised by a bound of the curvature:
    $Q_i \\leftarrow Q_i - \\mu\\, \\frac{\\operatorname{triu}(A_{(i)} A_{(i)}^\\top - B_{(i)} B_{(i)}^\\top)}
    {\\|A_{(i)} A_{(i)}^\\top + B_{(i)} B_{(i)}^\\top\\|} Q_i$.
    """
    damped = g + (_DAMPING * jnp.mean(jnp.abs(g))).astype(g.dtype) * probe
    a, b = damped, probe
    for axis, q in enumerate(factors):
        axis = min(axis, g.ndim - 1)
        a = _along(a, q, axis)
        if q.ndim < 2:
            b = b / q.reshape([-1 if i == axis else 1 for i in range(b.ndim)])
        else:  # B = V Q^{-1} along this axis: a triangular solve, not an inverse
            moved = jnp.moveaxis(b, axis, -1)
            solved = solve_upper_right(q, moved.reshape(-1, q.shape[0]))
            b = jnp.moveaxis(solved.reshape(moved.shape), -1, axis)
    new = []
    for axis, q in enumerate(factors):
        diagonal = q.ndim < 2
        if g.ndim == 0:
            first, second = a * a, b * b
        else:
            first, second = _gram(a, axis, diagonal), _gram(b, axis, diagonal)
        step = learning_rate * (first - second)
        if diagonal:
            new.append(q - step * q / (_TINY + jnp.max(jnp.abs(first + second))))
        else:
            step = jnp.triu(step) / (_TINY + _norm_lower_bound(first + second))
            new.append(q - step @ q)
    return tuple(new)


@no_type_check
def _balance(factors):
    """Rescales the factors to equal largest entries, keeping their Kronecker product."""
    if len(factors) < 2:
        return factors
    norms = jnp.stack([jnp.max(jnp.abs(q)) for q in factors]).astype(jnp.float32)
    mean = jnp.prod(norms) ** (1 / len(factors))
    return tuple(
        q * (mean / n).astype(q.dtype) for q, n in zip(factors, norms, strict=True)
    )


@no_type_check
def _precondition(factors, g):
    """$P g = (Q^\\top Q) g$, one axis at a time."""
    for axis, q in enumerate(factors):
        axis = min(axis, g.ndim - 1)
        g = _along(_along(g, q, axis), q, axis, transpose=True)
    return g


def kron_probes(
    key: UInt32[Array, " key_data"], updates: Updates
) -> tuple[Any, Any, Any]:
    r"""Draws the random numbers of one `eqopt.contrib.ScaleByKron` step.

    `ScaleByKron.update` calls this on `state.key` and uses nothing else
    random: the probes $v_t \sim \mathcal N(0, I)$ of the preconditioner's
    refit, one per leaf of `updates`, and the uniform draw that decides
    whether the factors are rebalanced this step (below 0.01). Calling it on
    the same key gives the same numbers, so another implementation of PSGD
    Kron can be fed the probes eqopt uses and compared step by step (as
    `tests/test_contrib_kron.py` does with `psgd_jax`).

    **Arguments:**

    - `key`: the raw key data held in `ScaleByKronState.key`.
    - `updates`: the updates of the step (only their structure, shapes and
      dtypes are read).

    **Returns:** `(next_key, probes, balance_draw)`: the key data for the next
    step, a pytree shaped like `updates` of standard Gaussian probes (`None`
    where `updates` is `None`), and a scalar uniform in $[0, 1)$.

    !!! example

        ```python
        tx = eqopt.contrib.scale_by_kron()
        state = tx.init(model)
        key, probes, balance_draw = eqopt.contrib.kron_probes(state.key, grads)
        probes.layers[0].weight.shape   # (16, 2), as the gradient
        ```
    """
    key, probe_key, balance_key = jax.random.split(jax.random.wrap_key_data(key), 3)
    leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    keys = jax.random.split(probe_key, max(len(leaves), 1))
    probes = [
        None if u is None else jax.random.normal(k, u.shape, u.dtype)
        for k, u in zip(keys, leaves, strict=False)
    ]
    probes = jax.tree.unflatten(treedef, probes)
    return jax.random.key_data(key), probes, jax.random.uniform(balance_key)


@checked
class ScaleByKron(AbstractGradientTransformation):
    r"""Preconditions the momentum by a Kronecker-factored $P = Q^\top Q$ fitted on random probes (PSGD Kron).

    Each leaf of $k$ axes has one factor $Q_i$ per axis, upper triangular (or
    diagonal, to save memory: see below), so $P = \bigotimes_i Q_i^\top Q_i$.
    With momentum $m_t = \beta_1 m_{t-1} + (1 - \beta_1) g_t$ and
    $\hat m_t = m_t / (1 - \beta_1^t)$:

    $$
    \begin{aligned}
    h_t &= \hat m_t + \sqrt{\epsilon_{32}}\,\overline{|\hat m_t|}\; v_t, \quad v_t \sim \mathcal N(0, I)
      \qquad A = Q h_t, \quad B = Q^{-\top} v_t \\
    Q_i &\leftarrow Q_i - \mu\, \frac{\operatorname{triu}\big(A_{(i)} A_{(i)}^\top - B_{(i)} B_{(i)}^\top\big)}
      {\big\| A_{(i)} A_{(i)}^\top + B_{(i)} B_{(i)}^\top \big\|}\, Q_i \\
    u_t &= \frac{P \hat m_t}{\max\big(1, \operatorname{rms}(P \hat m_t) / 1.1\big)}
    \end{aligned}
    $$

    The refit (Li's criterion $\mathbb E[h^\top P h + v^\top P^{-1} v]$,
    minimised on the group of triangular matrices; the norm is a cheap lower
    bound of the spectral norm, the largest entry for a diagonal factor) runs
    under a `lax.cond`, on a fraction $p_t$ of the steps
    (`preconditioner_update_probability`, by default
    `eqopt.contrib.KronUpdateProbabilitySchedule`). Like `psgd_jax` and
    heavyball, the fraction is kept by a counter (a refit when
    $1 / p_t$ steps have passed) rather than Li's coin flip, so runs are
    reproducible and never go long without a refit. With probability 0.01 a
    refit first rescales the factors to equal largest entries (their
    product, hence $P$, is unchanged). The update is clipped to an RMS of 1.1.

    An axis gets a diagonal factor when its size is 1 or above
    `max_size_triangular`, when the leaf has fewer than `min_ndim_triangular`
    axes (so vectors get diagonal factors by default), or by
    `memory_save_mode`: `"one_diag"` makes the largest axis of each leaf
    diagonal, `"all_diag"` every axis. A scalar has one scalar factor.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `b1`: the momentum $\beta_1$ (0: precondition the gradient itself).
    - `preconditioner_update_probability`: $p_t$, a number or a schedule of
      the step (default: `eqopt.contrib.precond_update_prob_schedule``()`).
    - `max_size_triangular`, `min_ndim_triangular`, `memory_save_mode`: which
      factors are diagonal, as above (static).
    - `momentum_into_precond_update`: fit $P$ on $\hat m_t$ (default) or on $g_t$ (static).
    - `preconditioner_lr`: $\mu$, the refit's step.
    - `preconditioner_init_scale`: $P_0 = s^2 I$ ($Q_i = s^{1/k} I$).
    - `seed`: the seed of the probes' key (static).

    **References:** Li, *Preconditioned Stochastic Gradient Descent*, IEEE
    TNNLS 29(5), 2018; Li, *Black Box Lie Group Preconditioners for SGD*,
    arXiv:2211.04422, 2022 (the Kronecker-product preconditioner).
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    preconditioner_update_probability: Any = eqx.field(
        default=None, converter=as_optional_scalar_or_schedule
    )
    max_size_triangular: int = eqx.field(default=8192, static=True)
    min_ndim_triangular: int = eqx.field(default=2, static=True)
    memory_save_mode: MemorySaveMode = eqx.field(default=None, static=True)
    momentum_into_precond_update: bool = eqx.field(default=True, static=True)
    preconditioner_lr: Scalar = eqx.field(default=0.1, converter=as_scalar)
    preconditioner_init_scale: Scalar = eqx.field(default=1.0, converter=as_scalar)
    seed: int = eqx.field(default=0, static=True)

    def __check_init__(self):
        check_decays(self, "b1")
        check_hyperparameter("preconditioner_lr", self.preconditioner_lr, low=0.0)
        if self.memory_save_mode not in _MODES:
            raise ValueError(
                f"ScaleByKron: `memory_save_mode` must be one of {_MODES}, "
                f"got {self.memory_save_mode!r}."
            )

    @property
    def elementwise(self) -> bool:
        return False

    def _diagonal(self, shape: Sequence[int]) -> list[bool]:
        """Which axes of a leaf of this shape get a diagonal factor."""
        diagonal = [
            size == 1
            or size > self.max_size_triangular
            or len(shape) < self.min_ndim_triangular
            for size in shape
        ]
        if self.memory_save_mode == "all_diag":
            diagonal = [True] * len(shape)
        elif self.memory_save_mode == "one_diag" and shape:
            # The largest axis (the last of equal ones).
            largest = max(range(len(shape)), key=lambda i: (shape[i], i))
            diagonal[largest] = True
        return diagonal

    @init_entry
    def init(self, params: Params) -> ScaleByKronState:
        def factors(p):
            if jnp.iscomplexobj(p):
                raise TypeError(
                    "Kron supports real parameters only, got a complex one."
                )
            dtype = jnp.promote_types(p.dtype, jnp.float32)
            if p.ndim == 0:
                return (self.preconditioner_init_scale * jnp.ones((), dtype),)
            scale = self.preconditioner_init_scale ** (1 / p.ndim)
            return tuple(
                scale
                * (jnp.ones(size, dtype) if diagonal else jnp.eye(size, dtype=dtype))
                for size, diagonal in zip(p.shape, self._diagonal(p.shape), strict=True)
            )

        return ScaleByKronState(
            count=jnp.zeros([], jnp.int32),
            key=jax.random.key_data(jax.random.key(self.seed)),
            update_counter=jnp.zeros([], jnp.int32),
            mu=map_params(jnp.zeros_like, params),
            preconditioner=map_layers(factors, params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByKronState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByKronState]:
        count = safe_int32_increment(state.count)
        probability: Any = self.preconditioner_update_probability
        if probability is None:
            probability = KronUpdateProbabilitySchedule()
        if callable(probability):
            probability = probability(count)
        counter = safe_int32_increment(state.update_counter)
        refit = counter >= 1 / probability
        counter = jnp.where(refit, 0, counter)
        key, probes, balance_draw = kron_probes(state.key, updates)
        balance = balance_draw < 0.01
        b1 = self.b1
        correction = 1 - b1**count

        @no_type_check
        def step(g, mu, factors, probe):
            g, shard_like_g = gathered(g)
            # Whole factors (split over the data axis under ZeRO-1).
            factors = whole(factors)
            wide = factors[0].dtype
            gw = g.astype(wide)
            # With b1 = 0 this is g itself (the correction is 1).
            mu = b1 * gathered(mu)[0] + (1 - b1) * g
            momentum = mu.astype(wide) / correction
            mu = shard_like_g(mu.astype(g.dtype))
            fit_on = momentum if self.momentum_into_precond_update else gw

            def refitted(factors):
                factors = jax.lax.cond(balance, _balance, lambda f: f, factors)
                new = _refit(
                    factors,
                    fit_on,
                    gathered(probe)[0].astype(wide),
                    self.preconditioner_lr,
                )
                return tuple(
                    q.astype(old.dtype) for q, old in zip(new, factors, strict=True)
                )

            factors = jax.lax.cond(refit, refitted, lambda f: f, factors)
            direction = _precondition(factors, momentum)
            rms = jnp.sqrt(jnp.mean(jnp.square(direction)))
            direction = direction / jnp.maximum(1.0, rms / 1.1)
            return shard_like_g(direction.astype(g.dtype)), mu, factors

        updates, mu, factors = map_leaves(
            step, updates, state.mu, state.preconditioner, probes, n_out=3
        )
        return updates, ScaleByKronState(
            count=count,
            key=key,
            update_counter=counter,
            mu=mu,
            preconditioner=factors,
        )


@checked
def scale_by_kron(
    b1: ScalarLike = 0.9,
    preconditioner_update_probability: ScalarOrSchedule | None = None,
    max_size_triangular: int = 8192,
    min_ndim_triangular: int = 2,
    memory_save_mode: MemorySaveMode = None,
    momentum_into_precond_update: bool = True,
    preconditioner_lr: ScalarLike = 0.1,
    preconditioner_init_scale: ScalarLike = 1.0,
    *,
    seed: int = 0,
) -> ScaleByKron:
    """Builds `eqopt.contrib.ScaleByKron` (Li, 2018)."""
    return ScaleByKron(
        b1=b1,
        preconditioner_update_probability=preconditioner_update_probability,
        max_size_triangular=max_size_triangular,
        min_ndim_triangular=min_ndim_triangular,
        memory_save_mode=memory_save_mode,
        momentum_into_precond_update=momentum_into_precond_update,
        preconditioner_lr=preconditioner_lr,
        preconditioner_init_scale=preconditioner_init_scale,
        seed=seed,
    )


@checked
def kron(
    learning_rate: ScalarOrSchedule = 1e-3,
    b1: ScalarLike = 0.9,
    weight_decay: ScalarOrSchedule = 0.0,
    weight_decay_mask: FilterSpec | None = None,
    preconditioner_update_probability: ScalarOrSchedule | None = None,
    max_size_triangular: int = 8192,
    min_ndim_triangular: int = 2,
    memory_save_mode: MemorySaveMode = None,
    momentum_into_precond_update: bool = True,
    preconditioner_lr: ScalarLike = 0.1,
    preconditioner_init_scale: ScalarLike = 1.0,
    *,
    seed: int = 0,
) -> Chain:
    r"""PSGD Kron with decoupled weight decay: $w_t = w_{t-1} - \eta_t (u_t + \lambda w_{t-1})$.

    $u_t$ is the preconditioned momentum of `eqopt.contrib.ScaleByKron`.
    PSGD's update has an RMS of at most 1.1, so its learning rate is about
    Adam's (the default is `psgd_jax`'s, 1e-3).

    !!! example

        ```python
        model = eqx.nn.MLP(4, 2, 16, 2, key=jax.random.key(0))
        # Diagonal factors for the largest axis of each leaf: less memory.
        opt = eqopt.contrib.kron(1e-3, memory_save_mode="one_diag")
        state = opt.init(model)
        print([q.shape for q in state[0].preconditioner.layers[1].weight])
        # [(16, 16), (16,)]
        ```

    **On a real model** give Kron the weight matrices and AdamW the rest:
    biases, normalisation scales and embeddings. A vector gets only a
    diagonal factor (by default), and an embedding's factor over its tokens
    is a triangular `(vocab, vocab)` matrix (up to `max_size_triangular`),
    refitted with triangular solves. Select the weights by layer type and
    combine the two with `eqopt.partition` (a `MultiheadAttention`'s
    projections are `Linear`s; an `eqx.nn.Embedding` is not one, so it goes
    to AdamW). PSGD's update has an RMS of at most 1.1, so AdamW's learning
    rate suits both groups.

    !!! example "Kron with AdamW for biases, norms and embeddings"

        ```python
        is_linear = lambda x: isinstance(x, eqx.nn.Linear)

        def label(node):
            labels = jax.tree.map(lambda _: "adamw", node)
            if is_linear(node):
                labels = eqx.tree_at(lambda layer: layer.weight, labels, "kron")
            return labels

        opt = eqopt.partition(
            {"kron": eqopt.contrib.kron(1e-3),
             "adamw": eqopt.adamw(1e-3, weight_decay=1e-2)},
            jax.tree.map(label, model, is_leaf=is_linear),
        )
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        kron_state = state.inner_states["kron"][0]
        print([q.shape for q in kron_state.preconditioner.layers[1].weight])
        # [(16, 16), (16, 16)]
        ```

    **Compile time.** A jitted Kron step compiles for seconds, not the
    fraction of a second of AdamW: on a 2-core CPU, the first call of an
    `eqx.filter_jit` step on a 3-layer `eqx.nn.MLP` (widths 32, 64, 64, 10)
    took a median of 6.0 s over 5 runs (3.1 to 3.6 s of it XLA compiling,
    the rest under load), where AdamW's took 1.1 s. Each leaf's refit
    (factor products, triangular solves and the norm bound, under
    `lax.cond`) is compiled on its own, so the time grows with the number of
    leaves. A lower `preconditioner_update_probability` does not shorten it
    (the refit is compiled once either way); diagonal factors
    (`memory_save_mode="all_diag"`, no triangular solves) did by about 15%
    and leaving the biases to AdamW as above by about 10%. Compile once:
    jit the whole step and pass the optimiser in as an argument, so that a
    new learning rate does not recompile it.

    **Arguments:** `learning_rate` ($\eta$, a number or a schedule),
    `weight_decay` ($\lambda$), `weight_decay_mask` (a filter spec of the
    leaves to decay); the others as for `eqopt.contrib.ScaleByKron`.

    **Returns:** an `eqopt.Chain` of `scale_by_kron`, `add_decayed_weights`
    and `scale_by_learning_rate`.

    **References:** Li, *Preconditioned Stochastic Gradient Descent*, IEEE
    TNNLS 29(5), 2018; Li, *Black Box Lie Group Preconditioners for SGD*,
    arXiv:2211.04422, 2022.
    """
    return Chain(
        scale_by_kron(
            b1=b1,
            preconditioner_update_probability=preconditioner_update_probability,
            max_size_triangular=max_size_triangular,
            min_ndim_triangular=min_ndim_triangular,
            memory_save_mode=memory_save_mode,
            momentum_into_precond_update=momentum_into_precond_update,
            preconditioner_lr=preconditioner_lr,
            preconditioner_init_scale=preconditioner_init_scale,
            seed=seed,
        ),
        AddDecayedWeights(weight_decay, weight_decay_mask),
        ScaleByLearningRate(learning_rate),
    )
