"""Per-leaf ("block") scaling and clipping: by the parameter's norm or RMS, AGC, normalisation.

A block is one leaf of the model: a weight matrix, a bias vector, a kernel.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .. import _sharding
from .._base import (
    AbstractGradientTransformation,
    EmptyState,
    Params,
    Updates,
    is_none,
    path_str,
)
from .._entry import init_entry, update_entry
from .._hyper import Scalar, as_scalar, check_hyperparameter
from .._layer_axes import layer_leaves
from .._leafwise import leafwise, require_params
from .._numerics import abs_squared, tree_l2_norm
from .._typecheck import checked

# ---------------------------------------------------------------------------
# Per-leaf helpers (unchecked: they run once per leaf at trace time)
# ---------------------------------------------------------------------------


@no_type_check
def floored_norm(x, floor):
    """$\\max(\\|x\\|_2, m)$ over the whole leaf, with a zero (not NaN) gradient below $m$."""
    squared = jnp.sum(abs_squared(x))
    small = squared <= floor**2
    # Where the norm is floored, take the root of a positive dummy: the
    # derivative of sqrt at zero is infinite and would poison the gradient.
    root = jnp.sqrt(jnp.where(small, jnp.ones_like(squared), squared))
    return jnp.where(small, floor, root).astype(squared.dtype)


@no_type_check
def floored_rms(x, floor):
    """$\\max(\\mathrm{RMS}(x), m)$ over the whole leaf, with a zero gradient below $m$."""
    mean_square = jnp.mean(abs_squared(x))
    small = mean_square <= floor**2
    root = jnp.sqrt(jnp.where(small, jnp.ones_like(mean_square), mean_square))
    return jnp.where(small, floor, root).astype(mean_square.dtype)


# ---------------------------------------------------------------------------
# Scaling by the parameter block
# ---------------------------------------------------------------------------


class _AbstractScaleByParamBlock(AbstractGradientTransformation):
    """Multiplies each leaf's update by a floored measure of that leaf of the params."""

    min_scale: eqx.AbstractVar[Float[Array, ""]]
    # The measure, `(leaf, floor) -> scalar`, and the Optax name for errors.
    _measure: ClassVar[Callable[[Any, Any], Any]]
    _name: ClassVar[str]

    @property
    def elementwise(self) -> bool:
        return False

    def __check_init__(self):
        check_hyperparameter("min_scale", self.min_scale, low=0.0)

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
        require_params(params, self._name)
        min_scale, measure = self.min_scale, type(self)._measure

        @no_type_check
        def step(u, p):
            return (u * measure(p, min_scale)).astype(u.dtype)

        return leafwise(step, updates, params), state


@checked
class ScaleByParamBlockNorm(_AbstractScaleByParamBlock):
    r"""Multiplies each leaf's update by the L2 norm of that leaf of the parameters.

    $$ u_\ell \mapsto u_\ell \cdot \max(\|\theta_\ell\|_2,\ m) $$

    The norm is over the whole leaf (all its elements). This makes a step size
    relative to the size of each parameter block; the floor $m$ lets
    zero-initialised parameters move.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `min_scale`: the floor $m \ge 0$ of the norm.

    **References:** Shazeer & Stern, *Adafactor: Adaptive Learning Rates with
    Sublinear Memory Cost*, ICML 2018 (relative step sizes, §8).
    """

    min_scale: Scalar = eqx.field(default=1e-3, converter=as_scalar)

    _measure: ClassVar[Callable[[Any, Any], Any]] = staticmethod(floored_norm)
    _name: ClassVar[str] = "scale_by_param_block_norm"


@checked
def scale_by_param_block_norm(min_scale: Any = 1e-3) -> ScaleByParamBlockNorm:
    """Optax spelling of `eqopt.ScaleByParamBlockNorm`."""
    return ScaleByParamBlockNorm(min_scale=min_scale)


@checked
class ScaleByParamBlockRms(_AbstractScaleByParamBlock):
    r"""Multiplies each leaf's update by the root mean square of that leaf of the parameters.

    $$ u_\ell \mapsto u_\ell \cdot \max\big(\mathrm{RMS}(\theta_\ell),\ m\big), \qquad
       \mathrm{RMS}(x) = \sqrt{\tfrac{1}{n}\textstyle\sum_i |x_i|^2} $$

    This is Adafactor's relative step size (`multiply_by_parameter_scale`):
    the step of each block is proportional to the scale of its parameters.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `min_scale`: the floor $m \ge 0$ of the RMS ($\epsilon_2$ in the paper).

    **References:** Shazeer & Stern, *Adafactor: Adaptive Learning Rates with
    Sublinear Memory Cost*, ICML 2018, §8.
    """

    min_scale: Scalar = eqx.field(default=1e-3, converter=as_scalar)

    _measure: ClassVar[Callable[[Any, Any], Any]] = staticmethod(floored_rms)
    _name: ClassVar[str] = "scale_by_param_block_rms"


@checked
def scale_by_param_block_rms(min_scale: Any = 1e-3) -> ScaleByParamBlockRms:
    """Optax spelling of `eqopt.ScaleByParamBlockRms`."""
    return ScaleByParamBlockRms(min_scale=min_scale)


# ---------------------------------------------------------------------------
# Clipping per block
# ---------------------------------------------------------------------------


@checked
class ClipByBlockRms(AbstractGradientTransformation):
    r"""Scales each leaf's update down so that its root mean square is at most `threshold`.

    $$ u_\ell \mapsto \frac{u_\ell}{\max\big(1,\ \mathrm{RMS}(u_\ell) / d\big)} $$

    This is Adafactor's update clipping: a leaf whose update is small is left
    alone, a large one is rescaled to RMS $d$.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `threshold`: $d > 0$, the largest RMS allowed for each leaf.

    **References:** Shazeer & Stern, *Adafactor: Adaptive Learning Rates with
    Sublinear Memory Cost*, ICML 2018, §6.
    """

    threshold: Scalar = eqx.field(converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return False

    def __check_init__(self):
        check_hyperparameter("threshold", self.threshold, low=0.0, low_inclusive=False)

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
        threshold = self.threshold

        @no_type_check
        def step(u):
            rms = jnp.sqrt(jnp.mean(abs_squared(u)))
            return (u / jnp.maximum(1.0, rms / threshold)).astype(u.dtype)

        return leafwise(step, updates), state


@checked
def clip_by_block_rms(threshold: Any) -> ClipByBlockRms:
    """Optax spelling of `eqopt.ClipByBlockRms`."""
    return ClipByBlockRms(threshold=threshold)


@no_type_check
def _unit_axes(x, axis, layer_inputs=None):
    """The axes reduced to get one norm per unit, or "no rule" (see AdaptiveGradClip).

    `layer_inputs` are the input axes of the Equinox layer the leaf is a weight
    of (`None` for any other leaf)."""
    if axis is not None:
        return axis
    if layer_inputs is not None:  # one unit per output neuron or channel
        return layer_inputs
    if jnp.squeeze(x).ndim <= 1:  # scalars and vectors (even as 1 x n): one unit
        return None
    if x.ndim in (2, 3):  # linear layers (in, out) or multi-head (in, heads, out)
        return (0,)
    if x.ndim == 4:  # 2-D convolution kernels (h, w, in, out)
        return (0, 1, 2)
    if x.ndim == 5:  # 3-D convolution kernels (d, h, w, in, out)
        return (0, 1, 2, 3)
    return "no rule"


@dataclasses.dataclass(frozen=True)
class _LayerInputs:
    """A pytree leaf holding the input axes of a weight's Equinox layer (or `None`)."""

    axes: tuple[int, ...] | None


def _layer_inputs(updates: Any) -> Any:
    """A tree shaped like `updates`: the input axes of each leaf's Equinox layer."""
    described = layer_leaves(updates)
    flat, treedef = jax.tree_util.tree_flatten_with_path(updates, is_leaf=is_none)
    out = []
    for path, u in flat:
        leaf = described.get(path)
        if u is None:
            out.append(None)
        elif leaf is not None and leaf.is_matrix:
            out.append(_LayerInputs(leaf.input_axes))
        else:
            out.append(_LayerInputs(None))
    return jax.tree.unflatten(treedef, out)


def _check_unit_axes(u: Any, axis: Any, layer_inputs: Any, path: Any) -> None:
    if _unit_axes(u, axis, layer_inputs) == "no rule":
        raise ValueError(
            f"adaptive_grad_clip: the update at {path_str(path)} has shape "
            f"{tuple(u.shape)}; without `axis` only leaves of up to 5 dimensions "
            "(or weights of a known Equinox layer) have a rule for their units. "
            "Pass `axis=` (the axes of one unit's norm), or leave this leaf out "
            "with `eqopt.masked`."
        )
    axes = (axis,) if isinstance(axis, int) else (axis or ())
    if any(not -u.ndim <= a < u.ndim for a in axes):
        raise ValueError(
            f"adaptive_grad_clip: `axis={axis}` does not exist for the update at "
            f"{path_str(path)}, of shape {tuple(u.shape)}. Clip leaves of other "
            "ranks with another `adaptive_grad_clip` under `eqopt.partition`, or "
            "leave them out with `eqopt.masked`."
        )


@no_type_check
def _unitwise_norm(x, axes):
    squared = jnp.sum(abs_squared(x), axis=axes, keepdims=True)
    return jnp.broadcast_to(jnp.sqrt(squared), x.shape)


def _as_axes(
    axis: int | tuple[int, ...] | list[int] | None,
) -> int | tuple[int, ...] | None:
    # A static field must be hashable: a list of axes becomes a tuple.
    return tuple(axis) if isinstance(axis, list) else axis


@checked
class AdaptiveGradClip(AbstractGradientTransformation):
    r"""Adaptive gradient clipping (AGC): clips each unit's update relative to its weights' norm.

    $$
    u_i \mapsto \begin{cases}
      u_i & \text{if } \|u_i\| < \lambda \max(\|\theta_i\|, \epsilon) \\
      \lambda \max(\|\theta_i\|, \epsilon)\, \dfrac{u_i}{\max(\|u_i\|, 10^{-6})} & \text{otherwise}
    \end{cases}
    $$

    where $i$ runs over units and the norms are Frobenius norms over a unit's
    elements. As in the paper, a unit is one output neuron (or channel) of a
    layer: the norm is over the axes the layer contracts with its input.

    **Units with `axis=None`.** A weight of a known Equinox layer is read as
    the layer uses it (as Muon's orientation is): an `eqx.nn.Linear` weight
    `(out, in)`, so also in an `eqx.nn.MLP` and in the projections of an
    `eqx.nn.MultiheadAttention`, has one unit per row (the norm is over axis
    1); an `eqx.nn.Conv*` or `eqx.nn.ConvTranspose*` weight `(out, in,
    *kernel)` one per output channel (the norm is over axes 1 onwards, for any
    number of spatial axes); `eqx.nn.GRUCell` and `eqx.nn.LSTMCell` weights
    one per gate unit; an `eqx.nn.Embedding` weight `(tokens, features)` one
    per feature (the norm is over the tokens). Every other leaf (a bare
    array, a bias, a normalisation's scale, a custom module's field) follows
    the layouts of Optax and Haiku/Flax (input axes first, output axis last):
    a scalar or a vector (also shaped `1 x n`) is one unit; a 2-D or 3-D leaf
    has one unit per index of its trailing axes (the norm is over axis 0); a
    4-D (5-D) kernel has one unit per output channel (the norm is over axes
    0-2, 0-3). Other ranks need `axis`. An explicit `axis` applies to every
    leaf, Equinox layer or not.

    This differs from Optax on purpose on an Equinox model: Optax reads every
    matrix as a Flax `(in, out)` kernel, so on an `eqx.nn.Linear` it takes the
    norm over the outputs and clips per input. On bare arrays (the dicts of
    params that Optax code passes) the numbers are Optax's.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `clipping`: $\lambda > 0$, the largest ratio of update norm to weight norm.
    - `eps`: $\epsilon$, so that zero-initialised weights can still move.
    - `axis`: the axis or axes of the per-unit norm, for every leaf; `None` for
      the units above.

    **References:** Brock, De, Smith & Simonyan, *High-Performance Large-Scale
    Image Recognition Without Normalization*, ICML 2021.
    """

    clipping: Scalar = eqx.field(converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-3, converter=as_scalar)
    axis: int | tuple[int, ...] | None = eqx.field(
        default=None, static=True, converter=_as_axes
    )

    @property
    def elementwise(self) -> bool:
        return False

    def __check_init__(self):
        check_hyperparameter("clipping", self.clipping, low=0.0)
        check_hyperparameter("eps", self.eps, low=0.0)

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
        require_params(params, "adaptive_grad_clip")
        clipping, eps = self.clipping, self.eps
        # Gradients are Modules of the model's types: they name the layers.
        layer_inputs = _layer_inputs(updates)
        flat = jax.tree_util.tree_flatten_with_path(updates, is_leaf=is_none)[0]
        inputs_flat = jax.tree.leaves(layer_inputs, is_leaf=is_none)
        for (path, u), inputs in zip(flat, inputs_flat, strict=True):
            if u is not None:
                _check_unit_axes(u, self.axis, inputs.axes, path)

        @no_type_check
        def step(u, p, inputs):
            axes = _unit_axes(u, self.axis, inputs.axes)
            u_norm = _unitwise_norm(u, axes)
            max_norm = clipping * jnp.maximum(_unitwise_norm(p, axes), eps)
            clipped = u * (max_norm / jnp.maximum(u_norm, 1e-6))
            return _sharding.where(u_norm < max_norm, u, clipped).astype(u.dtype)

        return leafwise(step, updates, params, layer_inputs), state


@checked
def adaptive_grad_clip(
    clipping: Any, eps: Any = 1e-3, axis: int | tuple[int, ...] | None = None
) -> AdaptiveGradClip:
    """Optax spelling of `eqopt.AdaptiveGradClip`."""
    return AdaptiveGradClip(clipping=clipping, eps=eps, axis=axis)


# ---------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------


@checked
class NormalizeByUpdateNorm(AbstractGradientTransformation):
    r"""Divides the updates by their global L2 norm: normalised gradient descent.

    $$ u \mapsto \frac{s\, u}{\|u\| + \epsilon}, \qquad
       \|u\| = \sqrt{\textstyle\sum_\ell \|u_\ell\|_2^2} $$

    The norm is over all leaves together, so the result does not depend on how
    the parameters are split into leaves (the transform is elementwise in
    eqopt's sense). Use a negative `scale_factor` to descend without a
    learning rate.

    **Global**: one norm over all the leaves, a stacked layer's slices included.

    **Arguments:**

    - `scale_factor`: $s$, the length of the resulting step.
    - `eps`: $\epsilon \ge 0$, keeping a zero update finite.

    **References:** Hazan, Levy & Shalev-Shwartz, *Beyond Convexity: Stochastic
    Quasi-Convex Optimization*, NeurIPS 2015.
    """

    scale_factor: Scalar = eqx.field(default=1.0, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-6, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_hyperparameter("eps", self.eps, low=0.0)

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
        factor = self.scale_factor / (tree_l2_norm(updates) + self.eps)

        @no_type_check
        def step(u):
            return (u * factor).astype(u.dtype)

        return leafwise(step, updates), state


@checked
def normalize_by_update_norm(
    scale_factor: Any = 1.0, eps: Any = 1e-6
) -> NormalizeByUpdateNorm:
    """Optax spelling of `eqopt.NormalizeByUpdateNorm`."""
    return NormalizeByUpdateNorm(scale_factor=scale_factor, eps=eps)
