"""Shampoo: blocked Kronecker-factored preconditioning with grafting."""

import dataclasses
import functools
import math
from typing import Any, Literal, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from .._base import AbstractGradientTransformation, Params, Updates, is_none
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_decays,
    check_hyperparameter,
)
from .._layer_axes import stack_axes
from .._leafwise import map_layers
from .._leaves import InputError, path_str
from .._linalg import eigh, matrix_inverse_pth_root
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._sharding import gathered, like, whole
from .._transform.basic import ScaleByLearningRate
from .._typecheck import checked
from ._kronecker import apply_per_axis, gram, group_leaves, map_params, merge_small_dims

Grafting = Literal["sgd", "adagrad", "adam"]
RootMethod = Literal["eigh", "newton"]
_GRAFTINGS = ("sgd", "adagrad", "adam")
_ROOT_METHODS = ("eigh", "newton")
#: Per leaf, one stack of `(blocks, b, b)` matrices per (merged) axis; `()` for a
#: leaf that is not preconditioned.
BlockFactors = PyTree[Float[Array, "... _ _ _"]]  # stacked layers: stack axes first


@checked
class ScaleByShampooState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByShampoo`.

    `graft_nu` (the grafting method's second moment, `None` for SGD grafting),
    `graft_momentum` and `momentum` are shaped like the params. Per leaf,
    `statistics` and `preconditioners` are tuples with one array per (merged)
    axis, shaped `(blocks, b, b)`: block `k`'s factor for that axis is
    `[k]`. Being arrays of their own with a leading block axis, they can be
    sharded over the blocks like any other state buffer.
    """

    count: Int[Array, ""]
    graft_nu: Updates | None
    graft_momentum: Updates
    momentum: Updates
    statistics: BlockFactors
    preconditioners: BlockFactors


@dataclasses.dataclass(frozen=True)
class _Layout:
    """How a leaf is cut into blocks: its merged shape, the block shape and grid."""

    shape: tuple[int, ...]
    block: tuple[int, ...]
    grid: tuple[int, ...]

    @no_type_check
    def to_blocks(self, x):
        """`(blocks, *block)`: the merged `x`, zero-padded to whole blocks."""
        padded = tuple(n * b for n, b in zip(self.grid, self.block, strict=True))
        x = jnp.pad(
            x.reshape(self.shape),
            [(0, p - s) for p, s in zip(padded, self.shape, strict=True)],
        )
        split = [
            size for pair in zip(self.grid, self.block, strict=True) for size in pair
        ]
        x = x.reshape(split)
        rank = len(self.shape)
        x = x.transpose([2 * i for i in range(rank)] + [2 * i + 1 for i in range(rank)])
        return x.reshape((math.prod(self.grid), *self.block))

    @no_type_check
    def from_blocks(self, blocks, original_shape):
        rank = len(self.shape)
        x = blocks.reshape((*self.grid, *self.block))
        order = [j for i in range(rank) for j in (i, rank + i)]
        x = x.transpose(order).reshape(
            [n * b for n, b in zip(self.grid, self.block, strict=True)]
        )
        x = x[tuple(slice(0, s) for s in self.shape)]
        return x.reshape(original_shape)


@checked
class ScaleByShampoo(AbstractGradientTransformation):
    r"""Preconditions each block of a tensor by inverse roots of its Kronecker factors (Shampoo).

    Each leaf is reshaped (small neighbouring axes merged) and cut into blocks
    of at most `block_size` per axis. For a block $G_t$ of $k$ axes, axis $i$
    keeps the statistic $S^{(i)}_t = \beta_2 S^{(i)}_{t-1} + (1 - \beta_2)\,
    G_{t,(i)} G_{t,(i)}^\top$ (the Gram matrix of its slices along that axis;
    $\beta_2 = 1$ sums them, as the original Shampoo), starting from
    $\epsilon_m I$. Every `preconditioning_compute_steps` steps (a `lax.cond`
    on the step count) the preconditioners become
    $P^{(i)} = (S^{(i)} + \epsilon\, \lambda_{\max} I)^{-1/p}$, $p = 2k$, by an
    eigendecomposition or a coupled Newton iteration (a root whose error
    exceeds `inverse_failure_threshold` keeps the previous one). Then

    $$
    \begin{aligned}
    \tilde G_t &= G_t \times_1 P^{(1)} \cdots \times_k P^{(k)}, \qquad
    D_t = \frac{\|A_t\|_F}{\|\tilde G_t\|_F}\, \tilde G_t \\
    M_t &= \beta_1 M_{t-1} + (D_t + \lambda W), \qquad
    u_t = (D_t + \lambda W) + \beta_1 M_t \;\text{(Nesterov; else } u_t = M_t)
    \end{aligned}
    $$

    where $A_t$ is the grafting direction (layer-wise, over the whole leaf):
    $G_t$ itself (`"sgd"`), Adagrad's $G_t / (\sqrt{\sum G^2} + \epsilon_d)$
    or Adam's (RMSProp's) $G_t / (\sqrt{v_t} + \epsilon_d)$ with
    $v_t = \beta_2 v_{t-1} + (1 - \beta_2) G_t^2$ (with the momentum above,
    Adam grafting is Adam without bias correction). Before
    `start_preconditioning_step` steps the grafting direction itself is used,
    with a momentum of its own. Scalars and leaves with an axis longer than
    `max_preconditioned_dim` use the grafting direction only.

    Preconditioned blocks are padded to the block size with zeros: the padded
    rows of a factor hold only $\epsilon_m \beta_2^t$ and, the factor being
    block diagonal, the root of the real part is unchanged.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `block_size`: the largest block along any axis (static).
    - `b1`: $\beta_1$, the momentum.
    - `b2`: $\beta_2$, the statistics' (and Adam grafting's) decay.
    - `diagonal_epsilon`: $\epsilon_d$ of the grafting direction.
    - `matrix_epsilon`: $\epsilon_m$ and $\epsilon$: the initial statistics and
      the damping relative to the largest eigenvalue.
    - `weight_decay`: $\lambda$, added before the momentum (needs `params`).
    - `start_preconditioning_step`: the first step that uses Shampoo's
      direction (static).
    - `preconditioning_compute_steps`: steps between root computations (static).
    - `grafting`: `"sgd"`, `"adagrad"` or `"adam"` (static).
    - `nesterov`: Nesterov momentum (static).
    - `moving_average_for_momentum`: weight the new direction by $1 - \beta_1$.
    - `exponent_override`: use this $p$ instead of $2k$ (static; 0: $2k$).
    - `root_method`: `"eigh"` (exact) or `"newton"` (coupled Newton
      iteration, matrix products only) (static).
    - `inverse_failure_threshold`: the largest accepted error of a root.
    - `merge_small_dims_block_size`: merge neighbouring axes whose product is
      at most this (static; `None`: keep the shape).
    - `max_preconditioned_dim`: leaves with a longer axis are not preconditioned (static).

    **References:** Gupta, Koren & Singer, *Shampoo: Preconditioned Stochastic
    Tensor Optimization*, ICML 2018; Anil, Gupta, Koren, Regan & Singer,
    *Scalable Second Order Optimization for Deep Learning*, arXiv:2002.09018, 2020.
    """

    block_size: int = eqx.field(default=128, static=True)
    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    diagonal_epsilon: Scalar = eqx.field(default=1e-10, converter=as_scalar)
    matrix_epsilon: Scalar = eqx.field(default=1e-6, converter=as_scalar)
    weight_decay: Scalar = eqx.field(default=0.0, converter=as_scalar)
    start_preconditioning_step: int = eqx.field(default=5, static=True)
    preconditioning_compute_steps: int = eqx.field(default=1, static=True)
    grafting: Grafting = eqx.field(default="sgd", static=True)
    nesterov: bool = eqx.field(default=True, static=True)
    moving_average_for_momentum: bool = eqx.field(default=False, static=True)
    exponent_override: int = eqx.field(default=0, static=True)
    root_method: RootMethod = eqx.field(default="eigh", static=True)
    inverse_failure_threshold: Scalar = eqx.field(default=0.1, converter=as_scalar)
    merge_small_dims_block_size: int | None = eqx.field(default=4096, static=True)
    max_preconditioned_dim: int = eqx.field(default=4096, static=True)

    def __check_init__(self):
        check_decays(self, "b1")
        check_decays(self, "b2", high_inclusive=True)
        for name in ("diagonal_epsilon", "matrix_epsilon", "weight_decay"):
            check_hyperparameter(name, getattr(self, name), low=0.0)
        if self.grafting not in _GRAFTINGS:
            raise ValueError(
                f"ScaleByShampoo: `grafting` must be one of {_GRAFTINGS}, "
                f"got {self.grafting!r}."
            )
        if self.root_method not in _ROOT_METHODS:
            raise ValueError(
                f"ScaleByShampoo: `root_method` must be one of {_ROOT_METHODS}, "
                f"got {self.root_method!r}."
            )
        for name in ("block_size", "preconditioning_compute_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"ScaleByShampoo: `{name}` must be a positive int, got {value!r}."
                )

    @property
    def elementwise(self) -> bool:
        return False

    def _layout(self, shape: tuple[int, ...]) -> _Layout | None:
        """The blocks of a leaf, or `None` if it is not preconditioned."""
        if not shape or max(shape) > self.max_preconditioned_dim:
            return None
        if self.merge_small_dims_block_size is not None:
            shape = merge_small_dims(shape, self.merge_small_dims_block_size)
        block = tuple(min(size, self.block_size) for size in shape)
        grid = tuple(-(-size // b) for size, b in zip(shape, block, strict=True))
        return _Layout(shape, block, grid)

    @init_entry
    def init(self, params: Params) -> ScaleByShampooState:
        def factors(p, eye):
            layout = self._layout(p.shape)
            if layout is None:
                return ()
            dtype = jnp.promote_types(p.dtype, jnp.float32)
            count = math.prod(layout.grid)
            return tuple(
                jnp.broadcast_to(eye(b, dtype), (count, b, b)) for b in layout.block
            )

        graft_nu = None
        if self.grafting != "sgd":
            graft_nu = map_params(jnp.zeros_like, params)
        return ScaleByShampooState(
            count=jnp.zeros([], jnp.int32),
            graft_nu=graft_nu,
            graft_momentum=map_params(jnp.zeros_like, params),
            momentum=map_params(jnp.zeros_like, params),
            statistics=map_layers(
                lambda p: factors(
                    p, lambda b, d: self.matrix_epsilon * jnp.eye(b, dtype=d)
                ),
                params,
            ),
            preconditioners=map_layers(
                lambda p: factors(p, lambda b, d: jnp.eye(b, dtype=d)), params
            ),
        )

    @no_type_check
    def _root(self, statistic, exponent):
        """$(S + \\epsilon \\lambda_{\\max} I)^{-1/p}$ and its error."""
        if self.root_method == "newton":
            return matrix_inverse_pth_root(
                statistic, exponent, ridge_epsilon=self.matrix_epsilon
            )
        # The eigenvalues of S + r I are those of S plus r: one decomposition.
        values, vectors = eigh(statistic)
        ridge = self.matrix_epsilon * jnp.maximum(values[-1], 1e-16)
        inverse = jnp.maximum(values + ridge, ridge) ** (-1.0 / exponent)
        root = (vectors * inverse[None, :]) @ vectors.T
        return root, jnp.where(jnp.all(jnp.isfinite(root)), 0.0, jnp.inf)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByShampooState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByShampooState]:
        b1, b2 = self.b1, self.b2
        count = state.count
        compute = count % self.preconditioning_compute_steps == 0
        run_shampoo = count >= self.start_preconditioning_step
        new_weight = jnp.where(b2 == 1, 1.0, 1 - b2)
        momentum_weight = 1 - b1 if self.moving_average_for_momentum else 1.0
        uses_decay = params is not None
        graft_nu_tree = state.graft_nu
        if graft_nu_tree is None:
            graft_nu_tree = jax.tree.map(lambda _: None, state.momentum)
        param_tree = (
            params if uses_decay else jax.tree.map(lambda _: None, state.momentum)
        )

        leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
        columns = [
            treedef.flatten_up_to(tree)
            for tree in (
                graft_nu_tree,
                state.graft_momentum,
                state.momentum,
                state.statistics,
                state.preconditioners,
                param_tree,
            )
        ]
        # The statistics and preconditioners are whole matrices to every step:
        # under ZeRO-1 (split over the data axis) they are gathered first.
        for column in (3, 4):
            columns[column] = [whole(factors) for factors in columns[column]]
        active = [i for i, u in enumerate(leaves) if u is not None]
        rows = [(leaves[i], *(column[i] for column in columns)) for i in active]
        # Same-shaped leaves are stacked once and each phase runs once per
        # group, vmapped; the roots of all statistics of one size run as one
        # batch under one `cond`.
        # A stacked leaf (`eqx.filter_vmap` of a layer) is its layers: a group
        # whose rows are its slices.
        stacks = _stack_axes_of(updates, active)
        groups = group_leaves(rows, stacks)
        stacks = [group.stack(rows) for group in groups]

        @no_type_check
        def statistics_step(g, graft_nu, statistics):
            g, shard_like_g = gathered(g)
            wide = jnp.promote_types(g.dtype, jnp.float32)
            gw = g.astype(wide)
            if self.grafting == "sgd":
                graft = gw
            else:
                nu = gathered(graft_nu)[0].astype(wide)
                if self.grafting == "adagrad":
                    nu = nu + jnp.square(gw)
                else:
                    nu = b2 * nu + new_weight * jnp.square(gw)
                graft = gw / (self.diagonal_epsilon + jnp.sqrt(nu))
                graft_nu = shard_like_g(nu.astype(graft_nu.dtype))
            layout = self._layout(g.shape)
            if layout is None:
                return graft, graft_nu, None, statistics
            blocks = layout.to_blocks(gw)
            statistics = tuple(
                b2 * s + new_weight * jax.vmap(lambda x, a=axis: gram(x, a))(blocks)
                for axis, s in enumerate(statistics)
            )
            return graft, graft_nu, blocks, statistics

        firsts = [
            group.map(statistics_step, stack[0], stack[1], stack[4])
            for group, stack in zip(groups, stacks, strict=True)
        ]
        statistics = [first[3] for first in firsts]

        @no_type_check
        def roots(old):
            # Every statistic, as a batch of (b, b) matrices, bucketed by size,
            # dtype and root; one vmapped root per bucket.
            buckets: dict[Any, list] = {}
            for position, (group, stack) in enumerate(zip(groups, stacks, strict=True)):
                layout = self._layout(
                    stack[0].shape[1:] if group.batched else stack[0].shape
                )
                if layout is None:
                    continue
                exponent = self.exponent_override or 2 * len(layout.shape)
                for axis, s in enumerate(statistics[position]):
                    # A sharded leaf's statistics keep their sharding: no mixing.
                    alone = None if group.batched else position
                    key = (s.shape[-1], s.dtype, exponent, alone)
                    buckets.setdefault(key, []).append((position, axis, s))
            new = [list(factors) for factors in old]
            for (_, _, exponent, _), entries in buckets.items():
                matrices = [s.reshape(-1, *s.shape[-2:]) for _, _, s in entries]
                sizes = [m.shape[0] for m in matrices]
                stacked = (
                    jnp.concatenate(matrices) if len(matrices) > 1 else matrices[0]
                )
                root_of = functools.partial(self._root, exponent=exponent)
                # Its eigh calls LAPACK one slice at a time on the CPU (_linalg).
                root, error = jax.vmap(root_of)(stacked)
                failed = ~(error < self.inverse_failure_threshold)
                offset = 0
                for (position, axis, s), size in zip(entries, sizes, strict=True):
                    previous = old[position][axis]
                    part = slice(offset, offset + size)
                    new[position][axis] = jnp.where(
                        failed[part].reshape(*s.shape[:-2], 1, 1),
                        previous,
                        root[part].reshape(s.shape).astype(previous.dtype),
                    )
                    offset += size
            return [tuple(factors) for factors in new]

        preconditioners = jax.lax.cond(
            compute, roots, lambda old: old, [stack[5] for stack in stacks]
        )

        @no_type_check
        def direction_step(
            g, graft, blocks, preconditioners, graft_momentum, momentum, p
        ):
            wide = graft.dtype
            if blocks is None:
                preconditioned = graft
            else:
                layout = self._layout(g.shape)
                preconditioned = jax.vmap(apply_per_axis)(blocks, preconditioners)
                preconditioned = layout.from_blocks(preconditioned, g.shape)
            multiplier = jnp.linalg.norm(graft) / (
                jnp.linalg.norm(preconditioned) + 1e-25
            )
            direction = multiplier * preconditioned
            if uses_decay:
                decay = self.weight_decay * gathered(p)[0].astype(wide)
                direction, graft = direction + decay, graft + decay
            new_momentum = (
                b1 * gathered(momentum)[0].astype(wide) + momentum_weight * direction
            )
            new_graft_momentum = (
                b1 * gathered(graft_momentum)[0].astype(wide) + momentum_weight * graft
            )
            current = jnp.where(run_shampoo, new_momentum, new_graft_momentum)
            if self.nesterov:
                current = (
                    momentum_weight * jnp.where(run_shampoo, direction, graft)
                    + b1 * current
                )
            return (
                like(current.astype(g.dtype), g),
                like(new_graft_momentum.astype(graft_momentum.dtype), g),
                like(new_momentum.astype(momentum.dtype), g),
            )

        outs: list[Any] = [None] * len(rows)
        for group, stack, first, stats, factors in zip(
            groups, stacks, firsts, statistics, preconditioners, strict=True
        ):
            graft, graft_nu, blocks, _ = first
            update, graft_momentum, momentum = group.map(
                direction_step,
                stack[0],
                graft,
                blocks,
                factors,
                stack[2],
                stack[3],
                stack[6],
            )
            group.unstack(
                (update, graft_nu, graft_momentum, momentum, stats, factors), outs
            )
        results = [list(leaves), *(list(column) for column in columns[:5])]
        for position, i in enumerate(active):
            for column, value in zip(results, outs[position], strict=True):
                column[i] = value
        updates, graft_nu, graft_momentum, momentum, statistics, preconditioners = (
            jax.tree.unflatten(treedef, column) for column in results
        )
        return updates, ScaleByShampooState(
            count=safe_int32_increment(count),
            graft_nu=None if state.graft_nu is None else graft_nu,
            graft_momentum=graft_momentum,
            momentum=momentum,
            statistics=statistics,
            preconditioners=preconditioners,
        )


def _stack_axes_of(updates: Any, active: list[int]) -> list[int]:
    """The stack axes of the leaves at `active`; one at most (else an error)."""
    stacks = stack_axes(updates)
    paths = None
    for index in active:
        if stacks[index] > 1:
            if paths is None:
                paths = jax.tree_util.tree_flatten_with_path(updates, is_leaf=is_none)[
                    0
                ]
            raise InputError(
                f"Shampoo: the leaf at {path_str(paths[index][0])} has "
                f"{stacks[index]} stack axes; Shampoo runs on one stack axis. Stack "
                "the layers once (`eqx.filter_vmap` of the layer), or merge the "
                "stack axes."
            )
    return [stacks[index] for index in active]


@checked
def scale_by_shampoo(
    block_size: int = 128,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    diagonal_epsilon: ScalarLike = 1e-10,
    matrix_epsilon: ScalarLike = 1e-6,
    weight_decay: ScalarLike = 0.0,
    start_preconditioning_step: int = 5,
    preconditioning_compute_steps: int = 1,
    grafting: Grafting = "sgd",
    *,
    nesterov: bool = True,
    moving_average_for_momentum: bool = False,
    exponent_override: int = 0,
    root_method: RootMethod = "eigh",
    inverse_failure_threshold: ScalarLike = 0.1,
    merge_small_dims_block_size: int | None = 4096,
    max_preconditioned_dim: int = 4096,
) -> ScaleByShampoo:
    """Builds `eqopt.contrib.ScaleByShampoo` (Gupta et al., 2018; Anil et al., 2020)."""
    return ScaleByShampoo(
        block_size=block_size,
        b1=b1,
        b2=b2,
        diagonal_epsilon=diagonal_epsilon,
        matrix_epsilon=matrix_epsilon,
        weight_decay=weight_decay,
        start_preconditioning_step=start_preconditioning_step,
        preconditioning_compute_steps=preconditioning_compute_steps,
        grafting=grafting,
        nesterov=nesterov,
        moving_average_for_momentum=moving_average_for_momentum,
        exponent_override=exponent_override,
        root_method=root_method,
        inverse_failure_threshold=inverse_failure_threshold,
        merge_small_dims_block_size=merge_small_dims_block_size,
        max_preconditioned_dim=max_preconditioned_dim,
    )


@checked
def shampoo(
    learning_rate: ScalarOrSchedule,
    block_size: int = 128,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    diagonal_epsilon: ScalarLike = 1e-10,
    matrix_epsilon: ScalarLike = 1e-6,
    weight_decay: ScalarLike = 0.0,
    start_preconditioning_step: int = 5,
    preconditioning_compute_steps: int = 1,
    grafting: Grafting = "sgd",
    *,
    nesterov: bool = True,
    moving_average_for_momentum: bool = False,
    exponent_override: int = 0,
    root_method: RootMethod = "eigh",
    inverse_failure_threshold: ScalarLike = 0.1,
    merge_small_dims_block_size: int | None = 4096,
    max_preconditioned_dim: int = 4096,
) -> Chain:
    r"""Shampoo with grafting: $w_t = w_{t-1} - \eta_t u_t$.

    $u_t$ is the direction of `eqopt.contrib.ScaleByShampoo` (blocked
    Kronecker factors, inverse $2k$-th roots, grafted onto SGD, Adagrad or
    Adam); the defaults are those of Anil et al.'s distributed Shampoo.

    !!! example

        ```python
        model = eqx.nn.MLP(8, 2, 64, 2, key=jax.random.key(0))
        opt = eqopt.contrib.shampoo(
            1e-3, block_size=32, grafting="adam", merge_small_dims_block_size=None
        )
        state = opt.init(model)
        # The 64x64 hidden weight: 2x2 blocks of 32, one 32x32 factor per axis.
        print(state[0].statistics.layers[1].weight[0].shape)  # (4, 32, 32)
        ```

    **Arguments:** `learning_rate` ($\eta$, a number or a schedule); the
    others as for `eqopt.contrib.ScaleByShampoo`.

    **Returns:** an `eqopt.Chain` of `scale_by_shampoo` and
    `scale_by_learning_rate`.

    **References:** Gupta, Koren & Singer, *Shampoo: Preconditioned Stochastic
    Tensor Optimization*, ICML 2018; Anil et al., *Scalable Second Order
    Optimization for Deep Learning*, arXiv:2002.09018, 2020.
    """
    return Chain(
        scale_by_shampoo(
            block_size=block_size,
            b1=b1,
            b2=b2,
            diagonal_epsilon=diagonal_epsilon,
            matrix_epsilon=matrix_epsilon,
            weight_decay=weight_decay,
            start_preconditioning_step=start_preconditioning_step,
            preconditioning_compute_steps=preconditioning_compute_steps,
            grafting=grafting,
            nesterov=nesterov,
            moving_average_for_momentum=moving_average_for_momentum,
            exponent_override=exponent_override,
            root_method=root_method,
            inverse_failure_threshold=inverse_failure_threshold,
            merge_small_dims_block_size=merge_small_dims_block_size,
            max_preconditioned_dim=max_preconditioned_dim,
        ),
        ScaleByLearningRate(learning_rate),
    )
