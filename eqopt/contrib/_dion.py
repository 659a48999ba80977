"""Dion: low-rank orthonormalised updates by one power iteration, with error feedback."""

from typing import Any, Literal, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from .._alias import adamw
from .._base import AbstractGradientTransformation, Params, Updates
from .._combine import Chain, Partition
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
from .._leafwise import per_slice
from .._leaves import InputError, is_none, is_trainable
from .._linalg import qr
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._sharding import gathered
from .._structure import structure_mismatch_message
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._transform.sign import lion
from .._typecheck import checked
from ._dimension_numbers import (
    fans,
    matrix_view,
)
from ._muon import (
    _is_matrix,
    _matrices_and_the_rest,
    matrix_dimension_numbers,
)


@checked
class DionState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByDion`.

    `mu` is the momentum $M$ (shaped like the params) and `right_factor` the
    right factor $Q$ of the low-rank approximation, `(n_in, r)` per layer (with
    the stack axes of a stacked layer in front); both are `None` at leaves
    that Dion does not update.
    """

    count: Int[Array, ""]
    mu: Updates
    right_factor: Updates


@no_type_check
def _rank(shape, dims, rank, rank_fraction) -> tuple[int, int, int]:
    """`(n_in, n_out, r)` of one layer's leaf."""
    fan_in, fan_out = fans(shape, dims)
    smallest = min(fan_in, fan_out)
    r = rank if rank is not None else max(1, int(rank_fraction * smallest))
    return fan_in, fan_out, min(r, smallest)


@no_type_check
def _dion_step(g, mu, q, dims, *, momentum, eps):
    """One Dion step on one layer: `(update, new mu, new right factor)`."""
    g, shard_like_g = gathered(g)
    mu, shard_like_mu = gathered(mu)
    q, shard_like_q = gathered(q)
    to_matrix, from_matrix = matrix_view(g.shape, dims)
    dtype = jnp.promote_types(mu.dtype, jnp.float32)
    # The paper's B is (n_out, n_in); the view is (1, n_in, n_out).
    b = to_matrix(mu.astype(dtype) + g.astype(dtype))[0].T
    right = q.astype(dtype)
    # A zero B (no gradient yet) would zero the factor for good: keep the factor,
    # and step by zero.
    nonzero = jnp.any(b != 0)
    p = qr(b @ right)[0] * nonzero
    r = b.conj().T @ p
    new_b = b - (1 - momentum) * (p @ r.conj().T)
    new_right = r / (jnp.linalg.norm(r, axis=0, keepdims=True) + eps)
    new_right = jnp.where(nonzero, new_right, right)
    fan_out, fan_in = b.shape
    update = (fan_out / fan_in) ** 0.5 * (p @ new_right.conj().T)
    return (
        shard_like_g(from_matrix(update.T[None]).astype(g.dtype)),
        shard_like_mu(from_matrix(new_b.T[None]).astype(mu.dtype)),
        shard_like_q(new_right.astype(q.dtype)),
    )


@checked
class ScaleByDion(AbstractGradientTransformation):
    r"""Dion's low-rank orthonormal update of each matrix, by one power iteration with error feedback.

    For each selected matrix, viewed as $(n_{\text{out}}, n_{\text{in}})$, with
    momentum $M$ and right factor $Q \in \mathbb{R}^{n_{\text{in}} \times r}$:

    $$
    \begin{aligned}
    B_t &= M_{t-1} + G_t \\
    P_t &= \operatorname{orth}(B_t Q_{t-1}) \quad\text{(the } Q \text{ of a QR decomposition)} \\
    R_t &= B_t^\top P_t \\
    M_t &= B_t - (1 - \mu)\, P_t R_t^\top \quad\text{(error feedback)} \\
    Q_t &= R_t \,/\, (\lVert R_t \rVert_{\text{columns}} + \epsilon) \\
    u_t &= \sqrt{n_{\text{out}} / n_{\text{in}}}\; P_t Q_t^\top
    \end{aligned}
    $$

    $P_t Q_t^\top$ approximates the orthogonal factor $U V^\top$ of $B_t$'s
    best rank-$r$ part (one step of power iteration, warm-started from the
    last step's $Q$), and what the update leaves out of $B_t$ stays in the
    momentum. With $r = \min(n_{\text{in}}, n_{\text{out}})$ it approaches Muon's
    update. The rank is `rank`, or `rank_fraction` of the smaller side.
    $Q_0$ is drawn from a normal distribution, from `seed` (each leaf, and
    each layer of a stack, its own draw), so `init` is deterministic. If
    $B_t$ is zero, the update is zero and $Q$ is kept.

    Which axes are $n_{\text{in}}$ and $n_{\text{out}}$ is read from the
    Equinox layer a leaf belongs to (an `eqx.nn.Linear` weight is
    `(out, in)`), else Optax's convention `(in, out)`; see "Orientation" in
    `eqopt.contrib.ScaleByMuon`. Leaves not selected pass through and keep no
    state.

    **Sharded state.** Under ZeRO-1 (`eqopt.zero_plan`) the momentum and the
    right factor are split over the data axis like any state; on explicit mesh
    axes each layer's matrices are gathered for the power iteration and the
    results put back in their shardings, so a step computes what it computes
    unsharded.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers. Each slice has its own
    momentum and low-rank factors.

    **Arguments:**

    - `rank`: $r$, an int (capped at the smaller side), or `None` to use
      `rank_fraction`.
    - `rank_fraction`: $r$ as a fraction of $\min(n_{\text{in}}, n_{\text{out}})$
      (rounded down, at least 1).
    - `mu`: $\mu$, the error-feedback (momentum) factor.
    - `eps`: $\epsilon$ in the column normalisation.
    - `seed`: the seed of $Q_0$ (static).
    - `weight_dimension_numbers`: which leaves are matrices (default: every
      trainable leaf), as for `eqopt.contrib.ScaleByMuon`; every axis must be
      an input or an output axis.

    **References:** Ahn, Xu, Abreu & Langford, *Dion: Distributed
    Orthonormalized Updates*, arXiv:2504.05295, 2025.
    """

    rank: int | None = eqx.field(default=None, static=True)
    rank_fraction: float = eqx.field(default=1.0, static=True)
    mu: Scalar = eqx.field(default=0.95, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    seed: int = eqx.field(default=0, static=True)
    weight_dimension_numbers: Any = None

    def __check_init__(self):
        check_decays(self, "mu")
        check_hyperparameter("eps", self.eps, low=0.0)
        if self.rank is not None and (
            isinstance(self.rank, bool)
            or not isinstance(self.rank, int)
            or self.rank < 1
        ):
            raise ValueError(
                f"ScaleByDion: `rank` must be a positive int, got {self.rank!r}."
            )
        if not 0 < self.rank_fraction <= 1:
            raise ValueError(
                f"ScaleByDion: `rank_fraction` must be in (0, 1], got {self.rank_fraction!r}."
            )

    @property
    def elementwise(self) -> bool:
        return False

    def _dimension_numbers(self, tree: Any) -> Any:
        return matrix_dimension_numbers(
            self.weight_dimension_numbers, tree, "Dion", batch_axes=False
        )

    @init_entry
    def init(self, params: Params) -> DionState:
        dims = self._dimension_numbers(params)
        leaves, treedef = jax.tree.flatten(params, is_leaf=is_none)
        dim_leaves = treedef.flatten_up_to(dims)
        stacks = stack_axes(params)
        base = jax.random.key(self.seed)
        mu, right = [], []
        for index, (p, d, stack) in enumerate(
            zip(leaves, dim_leaves, stacks, strict=True)
        ):
            if not is_trainable(p) or d is None:
                mu.append(None)
                right.append(None)
                continue
            fan_in, _, r = _rank(p.shape[stack:], d, self.rank, self.rank_fraction)
            shape = (*p.shape[:stack], fan_in, r)
            key = jax.random.fold_in(base, index)
            mu.append(jnp.zeros_like(p))
            right.append(jax.random.normal(key, shape, jnp.float32).astype(p.dtype))
        return DionState(
            count=jnp.zeros([], jnp.int32),
            mu=jax.tree.unflatten(treedef, mu),
            right_factor=jax.tree.unflatten(treedef, right),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: DionState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, DionState]:
        leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
        if jax.tree.structure(state.mu, is_leaf=is_none) != treedef:
            raise InputError(
                structure_mismatch_message(updates, state.mu, "updates", "state")
            )
        dims = treedef.flatten_up_to(
            self._dimension_numbers(updates if params is None else params)
        )
        mu = treedef.flatten_up_to(state.mu)
        right = treedef.flatten_up_to(state.right_factor)
        stacks = stack_axes(updates)
        out, new_mu, new_right = [], [], []
        for g, m, q, d, stack in zip(leaves, mu, right, dims, stacks, strict=True):
            if g is None or d is None or m is None:
                out.append(g)
                new_mu.append(m)
                new_right.append(q)
                continue
            step = per_slice(
                lambda g, m, q, d: _dion_step(
                    g, m, q, d, momentum=self.mu, eps=self.eps
                ),
                stack,
            )
            u, m, q = step(g, m, q, d)
            out.append(u)
            new_mu.append(m)
            new_right.append(q)
        return jax.tree.unflatten(treedef, out), DionState(
            count=safe_int32_increment(state.count),
            mu=jax.tree.unflatten(treedef, new_mu),
            right_factor=jax.tree.unflatten(treedef, new_right),
        )


@checked
def scale_by_dion(
    rank: int | None = None,
    rank_fraction: float = 1.0,
    mu: ScalarLike = 0.95,
    eps: ScalarLike = 1e-8,
    seed: int = 0,
    *,
    weight_dimension_numbers: Any = None,
) -> ScaleByDion:
    """Functional spelling of `eqopt.contrib.ScaleByDion`."""
    return ScaleByDion(
        rank=rank,
        rank_fraction=rank_fraction,
        mu=mu,
        eps=eps,
        seed=seed,
        weight_dimension_numbers=weight_dimension_numbers,
    )


@checked
def dion(
    learning_rate: ScalarOrSchedule,
    rank: int | None = None,
    rank_fraction: float = 1.0,
    mu: ScalarLike = 0.95,
    weight_decay: ScalarOrSchedule = 0.01,
    weight_decay_mask: FilterSpec | None = None,
    eps: ScalarLike = 1e-8,
    seed: int = 0,
    *,
    scalar_optimizer: Literal["adamw", "lion"] = "adamw",
    scalar_learning_rate: ScalarOrSchedule | None = None,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.95,
    scalar_weight_decay: ScalarOrSchedule = 0.0,
    dion_weight_dimension_numbers: Any = None,
) -> Partition:
    r"""Dion for the matrices, AdamW (or Lion) for every other leaf.

    The selected matrices are updated by

    $$ u_t = -\eta_t \big( \sqrt{n_{\text{out}} / n_{\text{in}}}\; P_t Q_t^\top + \lambda\, W_{t-1} \big) $$

    with $P_t Q_t^\top$ the low-rank orthonormal update of
    `eqopt.contrib.ScaleByDion`; every other leaf (biases, norms, scalars,
    and what you leave out) is trained by `eqopt.adamw` or `eqopt.lion`
    with `b1`, `b2`, as the paper does.

    The result is an `eqopt.Partition` with groups `"dion"` (the chain
    `scale_by_dion`, `add_decayed_weights`, `scale_by_learning_rate`) and
    `"adam"` (the other leaves' optimiser, whichever it is).

    !!! example

        ```python
        model = eqx.nn.MLP(8, 2, width_size=16, depth=2, key=jax.random.key(0))
        opt = eqopt.contrib.dion(0.01, rank_fraction=0.5)
        state = opt.init(model)
        ```

    **Arguments:**

    - `learning_rate`: $\eta$ for the Dion group, a number or a schedule.
    - `rank`, `rank_fraction`, `mu`, `eps`, `seed`: as for
      `eqopt.contrib.ScaleByDion` (`eps` is AdamW's too, as in the authors'
      code).
    - `weight_decay`: $\lambda$ for the Dion group (multiplied by the learning
      rate); `weight_decay_mask`: a filter spec of the Dion leaves to decay.
    - `scalar_optimizer`: `"adamw"` or `"lion"`, for the other leaves.
    - `scalar_learning_rate`: its learning rate (default: `learning_rate`).
    - `b1`, `b2`: its decay rates (AdamW's $\beta_1, \beta_2$, or Lion's).
    - `scalar_weight_decay`: its decoupled weight decay.
    - `dion_weight_dimension_numbers`: which leaves get Dion (default: every
      2-D leaf, one layer's slice for a stack), as
      `muon_weight_dimension_numbers` of `eqopt.contrib.muon`.

    **Returns:** an `eqopt.Partition`.

    **References:** Ahn, Xu, Abreu & Langford, *Dion: Distributed
    Orthonormalized Updates*, arXiv:2504.05295, 2025.
    """
    if scalar_optimizer not in ("adamw", "lion"):
        raise ValueError(
            f"dion: `scalar_optimizer` must be 'adamw' or 'lion', got {scalar_optimizer!r}."
        )
    if scalar_learning_rate is None:
        scalar_learning_rate = learning_rate
    spec = (
        _is_matrix
        if dion_weight_dimension_numbers is None
        else dion_weight_dimension_numbers
    )
    dion_part = Chain(
        ScaleByDion(
            rank=rank,
            rank_fraction=rank_fraction,
            mu=mu,
            eps=eps,
            seed=seed,
            weight_dimension_numbers=spec,
        ),
        AddDecayedWeights(weight_decay, weight_decay_mask),
        ScaleByLearningRate(learning_rate),
    )
    if scalar_optimizer == "lion":
        rest = lion(
            scalar_learning_rate, b1=b1, b2=b2, weight_decay=scalar_weight_decay
        )
    else:
        rest = adamw(
            scalar_learning_rate,
            b1=b1,
            b2=b2,
            eps=eps,
            weight_decay=scalar_weight_decay,
        )
    return _matrices_and_the_rest("dion", dion_part, rest, spec)
