"""Adam-mini: one second moment per block of parameters."""

import dataclasses
from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Int

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
from .._filters import FilterSpec
from .._hyper import Scalar, ScalarLike, ScalarOrSchedule, as_scalar, check_decays
from .._layer_axes import layer_leaves, one_layer, stack_axes
from .._leafwise import map_layers, per_slice, zeros_like_trainable
from .._numerics import abs_squared, debias, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._sharding import gathered
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._dimension_numbers import resolve_dimension_numbers


@dataclasses.dataclass(frozen=True)
class AdamMiniBlocks:
    r"""How Adam-mini cuts one parameter into blocks that share a second moment.

    - `AdamMiniBlocks()`: the whole leaf is one block (norm gains, biases).
    - `AdamMiniBlocks(axis=0)`: one block per index along `axis`, i.e. per
      output neuron of an Equinox `Linear` weight `(out, in)` (the paper's rule
      for values, attention outputs and MLPs) and per token of an `Embedding`
      weight `(vocab, dim)` (its rule for embeddings and the output layer).
    - `AdamMiniBlocks(axis=0, heads=h)`: the indices along `axis` are cut into
      `h` contiguous groups, one block each: the paper's rule for query and key
      projections, one block per attention head.

    In a `blocks` filter spec, `True` means `AdamMiniBlocks()`, and `False` (or
    `None`) means no sharing: Adam's one value per coordinate.
    `AdamMiniBlocks.default_tree(model)` gives the default blocks of
    a whole model, to edit with `eqx.tree_at`.

    A frozen dataclass: a single pytree leaf, so it can sit in a filter spec.

    **Arguments:**

    - `axis`: the axis whose indices get a block each, or `None`.
    - `heads`: with `axis`, the number of contiguous groups to cut it into.
    """

    axis: int | None = None
    heads: int | None = None

    def __post_init__(self):
        for name in ("axis", "heads"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool)
            ):
                raise TypeError(
                    f"AdamMiniBlocks: `{name}` must be an int or None, got {value!r}."
                )
        if self.heads is not None and (self.axis is None or self.heads < 1):
            raise ValueError(
                "AdamMiniBlocks: `heads` must be a positive int and needs an `axis`."
            )

    @staticmethod
    def default(leaf: Any) -> "AdamMiniBlocks":
        """The paper's rule by rank, for a leaf of no known layer: per index of
        axis 0 for rank 2 and more, else one block."""
        return AdamMiniBlocks(axis=0) if leaf.ndim >= 2 else AdamMiniBlocks()

    @staticmethod
    def default_tree(params: Any) -> Any:
        """The default blocks of every leaf of `params` (see
        `eqopt.contrib.ScaleByAdamMini`), as a filter spec shaped like it.

        **Arguments:**

        - `params`: a model (or its gradients), Equinox layers included.

        **Returns:** a pytree shaped like `params` with an `AdamMiniBlocks` or
        `False` (Adam's per-coordinate second moment) at each trainable leaf
        and `None` elsewhere.
        """
        described = layer_leaves(params)

        def rule(path: Any, leaf: Any) -> Any:
            if not is_trainable(leaf):
                return None
            # The authors route every parameter whose name contains "bias" to Adam.
            if "bias" in path_str(path).lower():
                return False
            layer = described.get(path)
            if layer is None or layer.layer is None:
                # Blocks of one layer: a stacked leaf's slice.
                stack = 0 if layer is None else layer.stack_axes
                return AdamMiniBlocks.default(one_layer(leaf, stack))
            if layer.heads is not None:  # queries and keys: one block per head
                return AdamMiniBlocks(axis=layer.output_axes[0], heads=layer.heads)
            if layer.layer is eqx.nn.Embedding and layer.is_matrix:
                return AdamMiniBlocks(axis=layer.input_axes[0])  # per token
            if layer.is_matrix:
                return AdamMiniBlocks(axis=layer.output_axes[0])  # per neuron
            return AdamMiniBlocks()  # normalisation scales: one block per leaf

        return jax.tree_util.tree_map_with_path(rule, params, is_leaf=is_none)

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the second moment of a leaf of `shape`."""
        if self.axis is None:
            return ()
        return (shape[self.axis] if self.heads is None else self.heads,)


def _check_blocks(shape: tuple[int, ...], blocks: AdamMiniBlocks, path: str) -> None:
    if blocks.axis is None:
        return
    if not -len(shape) <= blocks.axis < len(shape):
        raise ValueError(
            f"Adam-mini: {blocks} names axis {blocks.axis}, but the leaf at {path} "
            f"has shape {shape}."
        )
    if blocks.heads is not None and shape[blocks.axis] % blocks.heads:
        raise ValueError(
            f"Adam-mini: the leaf at {path} has {shape[blocks.axis]} entries on axis "
            f"{blocks.axis}, which {blocks.heads} heads do not divide."
        )


@no_type_check
def _block_mean(squares, blocks):
    """The mean of `squares` over each block: shape `blocks.shape(squares.shape)`."""
    if blocks.axis is None:
        return jnp.mean(squares)
    # A block's mean needs its whole block: on explicit axes, a leaf split over
    # the block axis is gathered first (the means are a few scalars).
    moved = jnp.moveaxis(gathered(squares)[0], blocks.axis, 0)
    count = moved.shape[0] if blocks.heads is None else blocks.heads
    return jnp.mean(moved.reshape(count, -1), axis=1)


@no_type_check
def _broadcast(block_values, blocks, shape):
    """Block values spread back over a leaf of `shape`."""
    if blocks.axis is None:
        return block_values
    axis = blocks.axis % len(shape)
    if blocks.heads is not None:
        block_values = jnp.repeat(block_values, shape[axis] // blocks.heads)
    return block_values.reshape(
        tuple(n if i == axis else 1 for i, n in enumerate(shape))
    )


@checked
class ScaleByAdamMiniState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByAdamMini`.

    - `count`: the number of steps taken.
    - `mu`: Adam's first moment, shaped like the params.
    - `nu`: one second moment per block: a scalar for a whole-leaf block, a
      vector of one value per neuron, token or head, or a full array where a
      leaf is not blocked.
    """

    count: Int[Array, ""]
    mu: Updates
    nu: Updates


@checked
class ScaleByAdamMini(AbstractGradientTransformation):
    r"""Rescales updates by Adam's moments, with one second moment per parameter block.

    For each block $b$ of coordinates (see `blocks`):

    $$
    \begin{aligned}
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t \\
    v_{b,t} &= \beta_2 v_{b,t-1} + (1 - \beta_2)\, \operatorname{mean}_{i \in b} |g_{t,i}|^2 \\
    u_{t,i} &= \frac{m_{t,i} / (1 - \beta_1^t)}{\sqrt{v_{b,t} / (1 - \beta_2^t)} + \epsilon}
      \qquad (i \in b)
    \end{aligned}
    $$

    A block shares one learning rate, so the second moment shrinks from one
    value per coordinate to one per neuron, head or leaf: about half of Adam's
    state. The paper's partition for Transformers is by output neuron for
    values, attention outputs and MLPs, by head for queries and keys, by token
    for embeddings and the output layer, and one block per leaf for the rest.
    Here it is an Equinox filter spec whose leaves are
    `eqopt.contrib.AdamMiniBlocks`. The default follows the authors' code,
    reading each leaf's layer from the model:

    - every leaf whose path contains `"bias"` (the bias of a `Linear`, a
      convolution or a `LayerNorm`, a dict entry `"bias"`...) gets Adam's
      per-coordinate second moment, as the authors route every parameter
      whose name contains "bias";
    - the query and key projections of an `eqx.nn.MultiheadAttention`: one
      block per head;
    - the weight of a `Linear` (also in an `MLP`, and the other projections
      of a `MultiheadAttention`), a convolution, a `GRUCell` or `LSTMCell`:
      one block per output neuron (axis 0 of Equinox's `(out, in)`);
    - an `Embedding` weight `(num_embeddings, dim)`: one block per token;
    - a normalisation's scale (`LayerNorm`, `RMSNorm`, `GroupNorm`,
      `BatchNorm` weight): one block, as the authors' "other blocks";
    - any other leaf: one block per index of axis 0 at rank 2 and more, else
      one block (`AdamMiniBlocks.default`).

    To change it, edit the tree of
    `AdamMiniBlocks.default_tree(model)` with `eqx.tree_at` (see
    `eqopt.contrib.adam_mini`).

    `pytorch-optimizer`'s AdamMini (the authors' first release) uses one
    block per leaf for values, outputs and MLPs and Adam's per-coordinate
    second moment for embeddings: the spec `True` and `False` give that.

    Not elementwise: a block's mean depends on the whole leaf.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `b1`, `b2`: the decay rates $\beta_1, \beta_2 \in [0, 1)$.
    - `eps`: $\epsilon$, added to the denominator.
    - `mu_dtype`: dtype to store $m$ in (default: the params').
    - `blocks`: the filter spec of blocks, or `None` for the default above. A
      callable is applied to each leaf and returns `AdamMiniBlocks`, a bool or
      `None`.

    **References:** Zhang, Chen, Li, Ding, Wu, Kingma, Ye, Luo & Sun,
    *Adam-mini: Use Fewer Learning Rates To Gain More*, arXiv:2406.16793,
    ICLR 2025.
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    mu_dtype: DTypeLike | None = eqx.field(default=None, static=True)
    blocks: Any = None

    def __check_init__(self):
        check_decays(self, "b1", "b2")

    @property
    def elementwise(self) -> bool:
        return False

    def _blocks(self, tree: Any) -> Any:
        return resolve_dimension_numbers(
            AdamMiniBlocks.default_tree(tree) if self.blocks is None else self.blocks,
            tree,
            AdamMiniBlocks,
            owner="Adam-mini",
            batch_axes=True,
            check=_check_blocks,
        )

    @init_entry
    def init(self, params: Params) -> ScaleByAdamMiniState:
        blocks = self._blocks(params)

        @no_type_check
        def zeros(p, b):
            if not is_trainable(p):
                return None
            real = jnp.finfo(p.dtype).dtype
            if b is None:
                return jnp.zeros_like(p, dtype=real)
            return jnp.zeros(b.shape(p.shape), real)

        # One second moment per block of each layer (stacked on a stack's axes).
        nu = map_layers(zeros, params, blocks)
        return ScaleByAdamMiniState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params, self.mu_dtype),
            nu=nu,
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByAdamMiniState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByAdamMiniState]:
        blocks = self._blocks(updates if params is None else params)
        b1, b2, eps = self.b1, self.b2, self.eps
        count = safe_int32_increment(state.count)
        one_minus_b1, one_minus_b2 = 1 - b1, 1 - b2
        correction1, correction2 = 1 - b1**count, 1 - b2**count

        @no_type_check
        def step(g, mu, nu, b):
            mu_next = b1 * mu + one_minus_b1 * g
            squares = abs_squared(g)
            mean = squares if b is None else _block_mean(squares, b)
            nu = b2 * nu + one_minus_b2 * mean.astype(nu.dtype)
            denominator = eps + jnp.sqrt(debias(nu, correction2))
            if b is not None:
                denominator = _broadcast(denominator, b, g.shape)
            update = debias(mu_next, correction1) / denominator.astype(g.dtype)
            return update.astype(g.dtype), mu_next.astype(mu.dtype), nu

        # The blocked second moments are not shaped like the updates, so this
        # maps by position rather than through `leafwise` (which checks shapes).
        updates, mu, nu = _blockwise(step, updates, state.mu, state.nu, blocks)
        return updates, ScaleByAdamMiniState(count=count, mu=mu, nu=nu)


@no_type_check
def _blockwise(step, updates, mu, nu, blocks):
    """Maps `step(g, mu, nu, blocks)` over the leaves where `g` is an array."""
    is_leaf = lambda x: x is None  # noqa: E731
    g_leaves, treedef = jax.tree.flatten(updates, is_leaf=is_leaf)
    mu_leaves = treedef.flatten_up_to(mu)
    nu_leaves = treedef.flatten_up_to(nu)
    block_leaves = treedef.flatten_up_to(
        jax.tree.map(lambda b: _Leaf(b), blocks, is_leaf=is_leaf)
    )
    stacks = stack_axes(updates)
    outs = [
        (None, m, v) if g is None else per_slice(step, k)(g, m, v, b.value)
        for g, m, v, b, k in zip(
            g_leaves, mu_leaves, nu_leaves, block_leaves, stacks, strict=True
        )
    ]
    return tuple(treedef.unflatten([o[i] for o in outs]) for i in range(3))


@dataclasses.dataclass(frozen=True)
class _Leaf:
    """Holds a resolved block (or `None`) as one pytree leaf."""

    value: Any


@checked
def scale_by_adam_mini(
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    mu_dtype: DTypeLike | None = None,
    *,
    blocks: Any = None,
) -> ScaleByAdamMini:
    """Lowercase spelling of `eqopt.contrib.ScaleByAdamMini`."""
    return ScaleByAdamMini(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype, blocks=blocks)


@checked
def adam_mini(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    mu_dtype: DTypeLike | None = None,
    weight_decay: ScalarOrSchedule = 1e-4,
    mask: FilterSpec | None = None,
    *,
    blocks: Any = None,
) -> Chain:
    r"""Adam-mini with decoupled weight decay (AdamW's arguments, plus `blocks`).

    $$ x_{t+1} = x_t - \eta_t \big(u_t + \lambda\, x_t\big) $$

    with $u_t$ from `eqopt.contrib.ScaleByAdamMini`.

    **Weight decay differs from the authors'.** The default `weight_decay` is
    `1e-4` (AdamW's default in Optax and eqopt), applied to every
    leaf `mask` selects (all by default). The authors' `Adam_mini` defaults to
    `weight_decay=0` and, when it is set, exempts every parameter whose name
    contains "norm", "ln" or "bias". For their behaviour pass
    `weight_decay=0.0`, or a `mask` such as `lambda x: x.ndim >= 2`.

    !!! example

        The default partition already gives the query and key projections of
        an `eqx.nn.MultiheadAttention` one block per head. Elsewhere, edit the
        default tree (here a hidden layer of 16 neurons as 4 heads):

        ```python
        blocks = eqopt.contrib.AdamMiniBlocks.default_tree(model)
        blocks = eqx.tree_at(
            lambda b: b.layers[1].weight,
            blocks,
            eqopt.contrib.AdamMiniBlocks(axis=0, heads=4),
        )
        opt = eqopt.contrib.adam_mini(1e-3, blocks=blocks)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        state[0].nu.layers[1].weight.shape   # (4,): one value per head
        ```

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - `b1`, `b2`, `eps`, `mu_dtype`, `blocks`: as for
      `eqopt.contrib.ScaleByAdamMini`.
    - `weight_decay`: $\lambda$ (decoupled, multiplied by the learning rate).
    - `mask`: a filter spec of the leaves to decay.

    **Returns:** an `eqopt.Chain`.

    **References:** Zhang et al., *Adam-mini: Use Fewer Learning Rates To Gain
    More*, arXiv:2406.16793, 2024.
    """
    return Chain(
        ScaleByAdamMini(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype, blocks=blocks),
        AddDecayedWeights(weight_decay, mask),
        ScaleByLearningRate(learning_rate),
    )
