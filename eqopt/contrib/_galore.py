"""GaLore: gradient low-rank projection."""

import dataclasses
from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from .. import _sharding
from .._base import (
    AbstractGradientTransformation,
    OptState,
    Params,
    Updates,
    is_none,
    is_trainable,
)
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._filters import FilterSpec
from .._hyper import Scalar, ScalarLike, ScalarOrSchedule, as_scalar
from .._interop import as_transform
from .._layer_axes import stack_axes
from .._leafwise import per_slice
from .._linalg import thin_svd
from .._numerics import safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._structure import structure_mismatch_message
from .._transform.adam import ScaleByAdam
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._dimension_numbers import (
    _AbstractDimensionNumbers,
    fans,
    layer_oriented,
    matrix_view,
    resolve_dimension_numbers,
)


@dataclasses.dataclass(frozen=True)
class GaLoreDimensionNumbers(_AbstractDimensionNumbers):
    """Which axes of a parameter GaLore treats as the rows and columns of a matrix.

    The reduction axes become the rows and the output axes the columns; unlike
    `eqopt.contrib.MuonDimensionNumbers`, every axis must be one or the
    other (GaLore has no batch axes). The default is a plain matrix.

    A frozen dataclass (Optax's is a NamedTuple): a single pytree leaf, so it
    can sit in a filter spec next to bools and predicates.

    **Arguments:**

    - `reduction_axis`: an axis or a sequence of axes.
    - `output_axis`: an axis or a sequence of axes.
    """


@checked
class GaLoreState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByGaLore`.

    `projector` holds, for each projected leaf, the orthonormal basis $P$ of its
    current subspace (`None` at leaves that are not projected);
    `base_optimizer_state` is the inner optimiser's state, whose moments have
    the low-rank shapes at projected leaves.
    """

    count: Int[Array, ""]
    base_optimizer_state: OptState
    projector: Updates


@no_type_check
def _low_rank_shapes(shape, dims, rank):
    """`(m, n, r, left)`: the matrix view's size, the rank and the side projected."""
    m, n = fans(shape, dims)
    return m, n, min(rank, m, n), m >= n


@no_type_check
def _as_matrix(x, dims):
    return matrix_view(x.shape, dims)[0](x)[0]


@no_type_check
def _from_matrix(x, shape, dims):
    return matrix_view(shape, dims)[1](x[None])


@no_type_check
def _map_pairs(fn, tree, *others):
    """Maps `fn` (returning a pair) over the leaves of `tree` (`None` included) and
    the matching subtrees of `others`; returns the two output trees."""
    leaves, treedef = jax.tree.flatten(tree, is_leaf=is_none)
    other_leaves = [treedef.flatten_up_to(other) for other in others]
    # Per layer: `fn` sees one slice of a stacked leaf (one projector per layer).
    outs = [
        per_slice(fn, stack if is_trainable(args[0]) else 0)(*args)
        for stack, *args in zip(stack_axes(tree), leaves, *other_leaves, strict=True)
    ]
    return tuple(
        jax.tree.unflatten(treedef, [out[i] for out in outs]) for i in range(2)
    )


@checked
class ScaleByGaLore(AbstractGradientTransformation):
    r"""Runs an optimiser on low-rank projections of the gradient matrices (GaLore).

    For a gradient matrix $G_t \in \mathbb{R}^{m \times n}$ with $m \ge n$ (the
    other case is the transpose), every `update_proj_gap` steps the projector
    is refreshed from the top-$r$ left singular vectors of the current
    gradient; in between it is kept:

    $$
    \begin{aligned}
    P_t &= U_{[:, :r]} \text{ where } G_t = U S V^H \quad (t \equiv 0 \bmod T),
      \qquad P_t = P_{t-1} \text{ otherwise} \\
    R_t &= P_t^H G_t \in \mathbb{R}^{r \times n}, \qquad
    N_t = \rho_t(R_t) \\
    u_t &= \alpha\, P_t N_t
    \end{aligned}
    $$

    where $\rho$ is the base optimiser (Adam by default) whose moments live in
    the $r \times n$ space, so optimiser memory shrinks from $mn$ to $rn$.
    Leaves that are not projected (by default, those that are not 2-D) are
    passed to the base optimiser at full size. The singular value
    decomposition runs in float32 (complex64 for complex gradients). On
    gradients sharded over explicit mesh axes, the matrix is gathered for the
    decomposition, the projector and the low-rank moments are replicated, and
    the update comes back sharded like the gradient.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `rank`: $r$, static (capped at $\min(m, n)$).
    - `update_proj_gap`: $T$, how often to recompute the projector (static).
    - `scale`: $\alpha$, applied to the projected-back updates.
    - `base_optimizer`: the optimiser run in the low-rank space (default:
      `eqopt.scale_by_adam`).
    - `weight_dimension_numbers`: which leaves are projected and how they are
      viewed as matrices: `None` (every 2-D leaf), one
      `eqopt.contrib.GaLoreDimensionNumbers` (every leaf of rank >= 2),
      or a filter spec whose leaves may be dimension numbers (a per-leaf
      predicate, a prefix pytree from `eqx.tree_at`, or Optax's tree with
      `None` for leaves not projected). Unlike Optax, a callable is applied to
      each leaf, never to the whole params. Where the spec says `True`, a
      weight of a known Equinox layer is viewed as the layer uses it (an
      `eqx.nn.Linear` weight `(out, in)` has its input on axis 1, a
      convolution's `(out, in, *kernel)` is the matrix `(in * kernel, out)`),
      any other leaf by Optax's convention (axis 0 is the input); see
      "Orientation" in `eqopt.contrib.ScaleByMuon`. The side projected is
      the longer one either way, so this changes only square matrices (which
      side) and the layout of the low-rank state.

    **References:** Zhao et al., *GaLore: Memory-Efficient LLM Training by
    Gradient Low-Rank Projection*, ICML 2024.
    """

    rank: int = eqx.field(default=128, static=True)
    update_proj_gap: int = eqx.field(default=200, static=True)
    scale: Scalar = eqx.field(default=1.0, converter=as_scalar)
    base_optimizer: AbstractGradientTransformation = eqx.field(
        default_factory=ScaleByAdam, converter=as_transform
    )
    weight_dimension_numbers: Any = None

    def __check_init__(self):
        if not isinstance(self.rank, int) or isinstance(self.rank, bool):
            raise TypeError(f"ScaleByGaLore: `rank` must be an int, got {self.rank!r}.")
        if self.rank <= 0:
            raise ValueError(
                f"ScaleByGaLore: `rank` must be positive, got {self.rank}."
            )
        if not isinstance(self.update_proj_gap, int) or self.update_proj_gap <= 0:
            raise ValueError(
                "ScaleByGaLore: `update_proj_gap` must be a positive int, got "
                f"{self.update_proj_gap!r}."
            )

    @property
    def elementwise(self) -> bool:
        return False

    def _dimension_numbers(self, tree: Any) -> Any:
        spec = self.weight_dimension_numbers
        if spec is None:
            spec = _is_matrix
        elif isinstance(spec, GaLoreDimensionNumbers):
            spec = _AtLeastMatrix(spec)
        return resolve_dimension_numbers(
            spec,
            tree,
            GaLoreDimensionNumbers,
            owner="GaLore",
            batch_axes=False,
            default=layer_oriented(tree, GaLoreDimensionNumbers),
        )

    @init_entry
    def init(self, params: Params) -> GaLoreState:
        dims = self._dimension_numbers(params)

        def shapes(p, d):
            if not is_trainable(p):
                return None, None
            if d is None:
                return None, jnp.zeros_like(p)
            m, n, r, left = _low_rank_shapes(p.shape, d, self.rank)
            projector = jnp.zeros((m, r) if left else (n, r), p.dtype)
            proxy = jnp.zeros((r, n) if left else (m, r), p.dtype)
            return projector, proxy

        projector, proxies = _map_pairs(shapes, params, dims)
        return GaLoreState(
            count=jnp.zeros([], jnp.int32),
            base_optimizer_state=self.base_optimizer.init(proxies),
            projector=projector,
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: GaLoreState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, GaLoreState]:
        if jax.tree.structure(updates, is_leaf=is_none) != jax.tree.structure(
            state.projector, is_leaf=is_none
        ):
            raise ValueError(
                structure_mismatch_message(updates, state.projector, "updates", "state")
            )
        dims = self._dimension_numbers(updates if params is None else params)
        refresh = state.count % self.update_proj_gap == 0

        @no_type_check
        def project(g, projector, d):
            if g is None or d is None:
                return g, projector
            matrix = _as_matrix(g, d)
            m, n, r, left = _low_rank_shapes(g.shape, d, self.rank)
            svd_dtype = jnp.promote_types(g.dtype, jnp.float32)

            def fresh():
                # The decomposition is global: an explicitly sharded gradient is
                # gathered for it, and the projector is replicated.
                full = _sharding.gathered(matrix)[0].astype(svd_dtype)
                u, _, vh = thin_svd(full)
                basis = u[:, :r] if left else vh[:r, :].conj().T
                # Laid out as the state keeps it (split under ZeRO-1).
                return _sharding.like(basis.astype(g.dtype), projector)

            projector = jax.lax.cond(refresh, fresh, lambda: projector)
            if left:
                low_rank = _sharding.replicated_matmul(projector.conj().T, matrix)
            else:
                low_rank = _sharding.replicated_matmul(matrix, projector)
            return low_rank, projector

        low_rank, projector = _map_pairs(project, updates, state.projector, dims)
        low_rank_updates, base_state = self.base_optimizer.update(
            low_rank, state.base_optimizer_state, None, **extra_args
        )

        @no_type_check
        def project_back(u, projector, g, d):
            if u is None or d is None:
                return u
            left = _low_rank_shapes(g.shape, d, self.rank)[3]
            matrix = projector @ u if left else u @ projector.conj().T
            full = (self.scale * _from_matrix(matrix, g.shape, d)).astype(g.dtype)
            return _sharding.like(full, g)

        flat_updates, treedef = jax.tree.flatten(updates, is_leaf=is_none)
        full = treedef.unflatten(
            [
                per_slice(project_back, stack if u is not None else 0)(u, p, g, d)
                for u, p, g, d, stack in zip(
                    treedef.flatten_up_to(low_rank_updates),
                    treedef.flatten_up_to(projector),
                    flat_updates,
                    treedef.flatten_up_to(dims),
                    stack_axes(updates),
                    strict=True,
                )
            ]
        )
        return full, GaLoreState(
            count=safe_int32_increment(state.count),
            base_optimizer_state=base_state,
            projector=projector,
        )


@dataclasses.dataclass(frozen=True)
class _AtLeastMatrix:
    """Per-leaf: the given dimension numbers for leaves of rank >= 2, else `None`."""

    dimension_numbers: GaLoreDimensionNumbers

    def __call__(self, leaf):
        return self.dimension_numbers if leaf.ndim >= 2 else None


def _is_matrix(x: Any) -> bool:
    return x.ndim == 2


@checked
def scale_by_galore(
    rank: int = 128,
    update_proj_gap: int = 200,
    scale: ScalarLike = 1.0,
    base_optimizer: Any = None,
    weight_dimension_numbers: Any = None,
) -> ScaleByGaLore:
    """Optax spelling of `eqopt.contrib.ScaleByGaLore`.

    `base_optimizer=None` means `eqopt.scale_by_adam``()`.
    """
    return ScaleByGaLore(
        rank=rank,
        update_proj_gap=update_proj_gap,
        scale=scale,
        base_optimizer=ScaleByAdam() if base_optimizer is None else base_optimizer,
        weight_dimension_numbers=weight_dimension_numbers,
    )


@checked
def galore(
    learning_rate: ScalarOrSchedule,
    rank: int = 128,
    update_proj_gap: int = 200,
    scale: ScalarLike = 1.0,
    base_optimizer: Any = None,
    weight_decay: ScalarOrSchedule = 0.0,
    mask: FilterSpec | None = None,
    weight_dimension_numbers: Any = None,
) -> Chain:
    r"""GaLore: an optimiser on low-rank gradient projections, with weight decay.

    $$
    u_t = -\eta_t \big( \alpha\, P_t\, \rho_t(P_t^H G_t) + \lambda\, W_{t-1} \big)
    $$

    for projected matrices (see `eqopt.contrib.ScaleByGaLore`); other leaves
    get the base optimiser's update at full size. The chain is
    `scale_by_galore`, `add_decayed_weights`, `scale_by_learning_rate`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - `rank`, `update_proj_gap`, `scale`, `base_optimizer`,
      `weight_dimension_numbers`: as for `eqopt.contrib.ScaleByGaLore`.
    - `weight_decay`: $\lambda$.
    - `mask`: a filter spec of the leaves to decay.

    **Returns:** an `eqopt.Chain`.

    **References:** Zhao et al., *GaLore: Memory-Efficient LLM Training by
    Gradient Low-Rank Projection*, ICML 2024.
    """
    return Chain(
        scale_by_galore(
            rank=rank,
            update_proj_gap=update_proj_gap,
            scale=scale,
            base_optimizer=base_optimizer,
            weight_dimension_numbers=weight_dimension_numbers,
        ),
        AddDecayedWeights(weight_decay, mask),
        ScaleByLearningRate(learning_rate),
        names=("scale_by_galore", "add_decayed_weights", "scale_by_learning_rate"),
    )
