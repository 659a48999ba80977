"""Scion: steps along the linear minimisation oracle of a norm chosen per layer."""

import dataclasses
from collections.abc import Callable
from typing import Any, TypeGuard, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

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
from .._filters import map_prefix
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_hyperparameter,
)
from .._layer_axes import layer_leaves, one_layer, stack_axes_by_path
from .._leafwise import leafwise
from .._numerics import abs_squared, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._quantize import MomentDType, cast_moment, moment_like
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._dimension_numbers import fans, layer_oriented, matrix_view
from ._muon import MuonDimensionNumbers
from ._newton_schulz import (
    _DEFAULT_NS_COEFFS,
    _ORTHOGONALIZATIONS,
    Coefficients,
    Orthogonalization,
    _as_coefficients,
    orthogonalize,
)

_KINDS = ("spectral", "col", "row", "sign", "rms")
_MATRIX_KINDS = ("spectral", "col", "row")


@dataclasses.dataclass(frozen=True)
class ScionNorm:
    r"""The norm (and its ball's radius) that `eqopt.contrib.ScaleByScion` uses for a leaf.

    For a matrix viewed as $A \in \mathbb{R}^{d_{\text{in}} \times d_{\text{out}}}$
    (rows: inputs; see `eqopt.contrib.MuonDimensionNumbers`), the direction
    $s$ of largest decrease in the ball of radius $\rho$ (the update is
    $\rho\, s$) is, by `kind`:

    | kind | norm | $s$ |
    |---|---|---|
    | `"spectral"` | $\sqrt{d_{\text{in}}/d_{\text{out}}}\,\lVert A\rVert_{2}$ | $\sqrt{d_{\text{out}}/d_{\text{in}}}\; U V^H$ (Newton–Schulz) |
    | `"col"` | max over inputs of an input's output vector's RMS | each input's vector $a_{i,:}$ to RMS one: $\sqrt{d_{\text{out}}}\, a_{i,:} / \lVert a_{i,:}\rVert$ |
    | `"row"` | max over outputs of $\sqrt{d_{\text{in}}}\,\lVert a_{:,j}\rVert$ | $a_{:,j} / (\sqrt{d_{\text{in}}}\, \lVert a_{:,j}\rVert)$ |
    | `"sign"` | $d_{\text{in}} \lVert A\rVert_\infty$ ($\lVert a\rVert_\infty$ for a vector) | $\operatorname{sign}(A) / d_{\text{in}}$ ($\operatorname{sign}(a)$) |
    | `"rms"` | the RMS norm | $a / \operatorname{RMS}(a)$ |

    (Pethick et al.'s ColNorm of an embedding normalises each token's vector,
    their RowNorm each output neuron's.)

    **Arguments:**

    - `kind`: one of the above.
    - `radius`: $\rho > 0$.
    - `dimension_numbers`: how to view the leaf as a matrix (default: as its
      Equinox layer uses it, else Optax's `(in, out)`).
    """

    kind: str = "spectral"
    radius: float = 1.0
    dimension_numbers: MuonDimensionNumbers | None = None

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(
                f"ScionNorm: `kind` must be one of {_KINDS}, got {self.kind!r}."
            )
        if not self.radius > 0:
            raise ValueError(
                f"ScionNorm: `radius` must be positive, got {self.radius!r}."
            )


@dataclasses.dataclass(frozen=True)
class _Resolved:
    kind: str
    radius: float
    dims: Any


def _is_rule(x: Any) -> TypeGuard[Callable[..., Any]]:
    """A per-leaf callable; not a callable Equinox layer of a prefix pytree."""
    return callable(x) and not isinstance(x, eqx.Module)


def _is_choice(x: Any) -> bool:
    return x is None or isinstance(x, (str, ScionNorm)) or _is_rule(x)


@checked
class ScionState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByScion`: the step count and the averaged
    gradient `d` (`None` at leaves that are not trained)."""

    count: Int[Array, ""]
    d: Updates


@checked
class ScaleByScion(AbstractGradientTransformation):
    r"""Averages the gradient and returns its linear minimisation oracle under a per-leaf norm (Scion).

    For each leaf, with its norm $\lVert\cdot\rVert$ and radius $\rho$
    (`eqopt.contrib.ScionNorm`):

    $$
    \begin{aligned}
    d_t &= (1 - \alpha)\, d_{t-1} + \alpha\, g_t \\
    u_t &= -\operatorname{lmo}(d_t) = \rho\, \operatorname*{arg\,max}_{\lVert s\rVert \le 1} \langle d_t, s\rangle
    \end{aligned}
    $$

    so that $x_{t+1} = x_t - \gamma u_t$ (unconstrained Scion) or
    $x_{t+1} = (1 - \gamma) x_t - \gamma u_t$ (Scion, a convex combination
    that keeps $x$ in the ball): see `eqopt.contrib.scion`. $\alpha$ is the
    paper's momentum, the weight of the new gradient ($\alpha = 1$: none).

    **The norm of each leaf** is read from the model, as the paper assigns
    them: an `eqx.nn.Embedding` weight gets `"col"` (each token's vector
    normalised), every other matrix (`Linear`, `Conv` weights, bare 2-D
    arrays) `"spectral"`, every vector or scalar (biases, normalisation
    scales) `"sign"`, each with radius 1. `norms` overrides this: a per-leaf
    callable, or a prefix pytree, whose leaves are a kind (`"row"`), a
    `eqopt.contrib.ScionNorm` (kind, radius, dimension numbers), or `None`
    for the default. The output layer's norm is yours to choose (the paper
    uses `"sign"` or `"row"` there with a larger radius), e.g. with
    `eqx.tree_at` on `jax.tree.map(lambda _: None, model)`.

    heavyball's `Scion` is this update with other norms: the spectral norm
    of every matrix, an embedding's `(vocab, dim)` read as `(out, in)`, and
    the RMS norm of every vector (and it re-initialises the parameters on
    its first step). Its bias-corrected average, $d_t / (1 - (1 - \alpha)^t)$,
    gives the same direction: the oracle of a norm ignores a positive factor.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `momentum`: $\alpha \in (0, 1]$.
    - `norms`: the per-leaf norms, as above (`None`: the defaults).
    - `ns_coeffs`, `ns_steps`, `orthogonalization`: the spectral norm's
      orthogonalisation, as for `eqopt.contrib.ScaleByMuon`.
    - `eps`: added to the norms before dividing.
    - `mu_dtype`: dtype (or `eqopt.Quantized` format) of $d$.

    **References:** Pethick, Xie, Erdogan, Antonakopoulos, Silveti-Falls &
    Cevher, *Training Deep Learning Models with Norm-Constrained LMOs*,
    arXiv:2502.07529, 2025.
    """

    momentum: Scalar = eqx.field(default=0.1, converter=as_scalar)
    norms: Any = None
    ns_coeffs: Float[Array | np.ndarray, "3"] | Float[Array | np.ndarray, "steps 3"] = (
        eqx.field(default=_DEFAULT_NS_COEFFS, converter=_as_coefficients)
    )
    ns_steps: int = eqx.field(default=5, static=True)
    orthogonalization: Orthogonalization = eqx.field(
        default="newton_schulz", static=True
    )
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    mu_dtype: MomentDType = eqx.field(default=None, static=True)

    def __check_init__(self):
        check_hyperparameter(
            "momentum",
            self.momentum,
            low=0.0,
            high=1.0,
            low_inclusive=False,
            high_inclusive=True,
        )
        check_hyperparameter("eps", self.eps, low=0.0)
        if self.orthogonalization not in _ORTHOGONALIZATIONS:
            raise ValueError(
                f"ScaleByScion: `orthogonalization` must be one of "
                f"{_ORTHOGONALIZATIONS}, got {self.orthogonalization!r}."
            )

    @property
    def elementwise(self) -> bool:
        return False

    def _resolve(self, tree: Any) -> Any:
        flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_none)
        described = layer_leaves(tree)
        stacks = stack_axes_by_path(tree)
        oriented = layer_oriented(tree, MuonDimensionNumbers)
        spec = self.norms
        if spec is None or isinstance(spec, (str, ScionNorm)) or _is_rule(spec):
            given = [spec] * len(flat)
        else:
            full = map_prefix(
                lambda s, sub, _: jax.tree.map(lambda _: s, sub, is_leaf=is_none),
                spec,
                tree,
                is_leaf=_is_choice,
                what="Scion's `norms`",
            )
            given = jax.tree.leaves(full, is_leaf=_is_choice)
        out = []
        for (path, x), choice in zip(flat, given, strict=True):
            if x is None or not is_trainable(x):
                out.append(None)
                continue
            stack = stacks.get(path, 0)
            if _is_rule(choice):
                choice = choice(one_layer(x, stack))
            ndim = x.ndim - stack
            if choice is None:
                layer = described.get(path)
                if ndim < 2:
                    choice = "sign"
                elif layer is not None and layer.layer is eqx.nn.Embedding:
                    choice = "col"
                else:
                    choice = "spectral"
            norm = ScionNorm(choice) if isinstance(choice, str) else choice
            if not isinstance(norm, ScionNorm):
                raise ValueError(
                    f"Scion: the norm of {path_str(path)} must be a kind, a "
                    f"ScionNorm or None, got {choice!r}."
                )
            if norm.kind in _MATRIX_KINDS and ndim < 2:
                raise ValueError(
                    f"Scion: {path_str(path)} has {ndim} dims; use 'sign' or 'rms' "
                    f"for it, not {norm.kind!r}."
                )
            dims = norm.dimension_numbers or (oriented(path) if ndim >= 2 else None)
            out.append(_Resolved(norm.kind, float(norm.radius), dims))
        return jax.tree.unflatten(treedef, out)

    @init_entry
    def init(self, params: Params) -> ScionState:
        norms = self._resolve(params)

        def zeros(p, r):
            return None if r is None else moment_like(p, self.mu_dtype or p.dtype)

        d = jax.tree.map(zeros, params, norms, is_leaf=is_none)
        return ScionState(count=jnp.zeros([], jnp.int32), d=d)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScionState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScionState]:
        norms = self._resolve(updates if params is None else params)
        alpha = self.momentum

        @no_type_check
        def step(g, d, r):
            if r is None:
                return g, d
            d_dtype = d.dtype
            d = d + alpha * (g - d)
            u = r.radius * self._direction(d.astype(g.dtype), r)
            return u.astype(g.dtype), cast_moment(d, self.mu_dtype or d_dtype)

        updates, d = leafwise(step, updates, state.d, norms, n_out=2)
        return updates, ScionState(count=safe_int32_increment(state.count), d=d)

    @no_type_check
    def _direction(self, d, r):
        eps = self.eps
        if r.kind == "rms":
            return d / (jnp.sqrt(jnp.mean(abs_squared(d))) + eps).astype(d.dtype)
        if r.dims is None:  # a vector or scalar: sign
            return jnp.sign(d)
        fan_in, fan_out = fans(d.shape, r.dims)
        if r.kind == "spectral":
            o = orthogonalize(
                d,
                r.dims,
                self.ns_coeffs,
                self.ns_steps,
                "frobenius",
                eps,
                self.orthogonalization,
            )
            return o * (fan_out / fan_in) ** 0.5
        to_matrix, from_matrix = matrix_view(d.shape, r.dims)
        m = to_matrix(d)  # (batch, in, out)
        if r.kind == "sign":
            return from_matrix(jnp.sign(m) / fan_in)
        if r.kind == "col":
            norm = jnp.sqrt(jnp.sum(abs_squared(m), axis=2, keepdims=True))
            return from_matrix(m / (norm / fan_out**0.5 + eps).astype(m.dtype))
        norm = jnp.sqrt(jnp.sum(abs_squared(m), axis=1, keepdims=True))
        return from_matrix(m / (norm * fan_in**0.5 + eps).astype(m.dtype))


@checked
def scale_by_scion(
    momentum: ScalarLike = 0.1,
    norms: Any = None,
    ns_coeffs: Coefficients = _DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    eps: ScalarLike = 1e-8,
    mu_dtype: MomentDType = None,
    *,
    orthogonalization: Orthogonalization = "newton_schulz",
) -> ScaleByScion:
    """Lowercase spelling of `eqopt.contrib.ScaleByScion`."""
    return ScaleByScion(
        momentum=momentum,
        norms=norms,
        ns_coeffs=ns_coeffs,
        ns_steps=ns_steps,
        orthogonalization=orthogonalization,
        eps=eps,
        mu_dtype=mu_dtype,
    )


@checked
def scion(
    learning_rate: ScalarOrSchedule,
    momentum: ScalarLike = 0.1,
    norms: Any = None,
    *,
    constrained: bool = False,
    weight_decay: ScalarOrSchedule = 0.0,
    ns_coeffs: Coefficients = _DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    eps: ScalarLike = 1e-8,
    mu_dtype: MomentDType = None,
    orthogonalization: Orthogonalization = "newton_schulz",
) -> Chain:
    r"""Scion (constrained) or unconstrained Scion, with a norm per leaf.

    With $u_t$ from `eqopt.contrib.ScaleByScion` and $\gamma_t$ the learning rate:

    $$
    x_{t+1} = \begin{cases}
    x_t - \gamma_t\, (u_t + \lambda\, x_t) & \text{unconstrained (uScion; } \lambda \text{ optional decoupled decay)} \\
    (1 - \gamma_t)\, x_t - \gamma_t\, u_t & \text{constrained (Scion): } x \text{ stays in the ball}
    \end{cases}
    $$

    Every leaf is trained by Scion, with the norm its layer calls for (see
    `eqopt.contrib.ScaleByScion`): no AdamW part.

    **Arguments:**

    - `learning_rate`: $\gamma$, a number or a schedule.
    - `momentum`: $\alpha$, the weight of the new gradient in the average.
    - `norms`: the per-leaf norms (`eqopt.contrib.ScionNorm`).
    - `constrained`: Scion's convex combination (weight decay $\gamma_t$)
      instead of the unconstrained step.
    - `weight_decay`: $\lambda$ of the unconstrained step.
    - `ns_coeffs`, `ns_steps`, `eps`, `mu_dtype`, `orthogonalization`: as for
      `eqopt.contrib.ScaleByScion`.

    **Returns:** an `eqopt.Chain`.

    **References:** Pethick et al., *Training Deep Learning Models with
    Norm-Constrained LMOs*, arXiv:2502.07529, 2025.
    """
    if constrained and not (
        isinstance(weight_decay, (int, float)) and weight_decay == 0
    ):
        raise ValueError("scion: `weight_decay` is for the unconstrained step only.")
    return Chain(
        ScaleByScion(
            momentum=momentum,
            norms=norms,
            ns_coeffs=ns_coeffs,
            ns_steps=ns_steps,
            orthogonalization=orthogonalization,
            eps=eps,
            mu_dtype=mu_dtype,
        ),
        AddDecayedWeights(1.0 if constrained else weight_decay),
        ScaleByLearningRate(learning_rate),
    )
