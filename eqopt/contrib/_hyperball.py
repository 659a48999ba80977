"""Hyperball: each matrix kept at its initial Frobenius norm (MuonH, AdamH)."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Int

from .._alias import adamw
from .._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    Params,
    Updates,
)
from .._combine import Partition
from .._entry import init_entry, update_entry
from .._filters import FilterSpec, select_trainable
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    Schedule,
    as_scalar,
    as_scalar_or_schedule,
    check_hyperparameter,
)
from .._layer_axes import stack_axes
from .._leafwise import map_layers, per_slice, require_params
from .._leaves import is_none
from .._numerics import abs_squared, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._transform.adam import ScaleByAdam
from .._typecheck import checked
from ._muon import ScaleByMuon, _is_matrix, _matrices_and_the_rest
from ._newton_schulz import _DEFAULT_NS_COEFFS, Coefficients


def _is_matrix_or_more(x: Any) -> bool:
    return x.ndim >= 2


@no_type_check
def _norm(x):
    # In float32 at least: the radius of a bfloat16 matrix is kept to float32.
    dtype = jnp.promote_types(jnp.finfo(x.dtype).dtype, jnp.float32)
    return jnp.sqrt(jnp.sum(abs_squared(x).astype(dtype)))


@checked
class HyperballState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.Hyperball`.

    - `count`: the number of steps taken (for a scheduled learning rate).
    - `radius`: the Frobenius norm $R$ of each selected leaf at `init`, one per
      slice of a stacked leaf (`None` where a leaf is not on a sphere).
    - `inner_state`: the wrapped transform's state.
    """

    count: Int[Array, ""]
    radius: Updates
    inner_state: Any


@checked
class Hyperball(AbstractWrapper):
    r"""Keeps each selected matrix on the sphere of its initial Frobenius norm.

    With $u_t$ the inner transform's update (a direction before the learning
    rate: Muon's orthogonalised momentum, Adam's $\hat m / (\sqrt{\hat v} +
    \epsilon)$) and $R = \|W_0\|_F$ recorded at `init`:

    $$
    W_t = R\, \operatorname{normalize}\!\big(W_{t-1} - \eta_t R\,
          \operatorname{normalize}(u_t)\big),
    \qquad \operatorname{normalize}(x) = x / \max(\|x\|_F, \epsilon)
    $$

    The norm of each matrix stays $R$ instead of being set by a balance of
    weight decay and learning rate, and $\eta_t$ is (about) the angle each
    step turns the matrix by, whatever the scale of $u_t$. Every leaf the
    mask does not select (biases, norms' scales) takes the ordinary step
    $-\eta_t u_t$. The returned update is $W_t - W_{t-1}$.

    Weight decay put inside `inner` (`eqopt.AddDecayedWeights` after the
    direction) enters $u_t$ before the normalisation, as heavyball's
    `HyperBallAdamW` does; on the sphere it only tilts the direction.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers. $R$ and both
    normalisations are per slice (one radius per layer); the mask's predicate
    sees one slice.

    **Arguments:**

    - `inner`: the transform giving $u_t$ (no learning rate in it).
    - `learning_rate`: $\eta$, a number or a schedule.
    - `mask`: a filter spec of the leaves kept on their sphere (default: every
      leaf with two or more axes per layer, i.e. matrices and convolution
      kernels).
    - `norm_eps`: $\epsilon$, the floor of the norms.

    **References:** Wen, Dang, Lyu, Ma & Liang, *Fantastic Pretraining
    Optimizers and Where to Find Them II: Hyperball Optimization*,
    arXiv:2606.16899 (MuonH, AdamH).
    """

    inner: AbstractGradientTransformation
    learning_rate: Scalar | Schedule = eqx.field(converter=as_scalar_or_schedule)
    mask: FilterSpec | None = None
    norm_eps: Scalar = eqx.field(default=1e-12, converter=as_scalar)

    def __check_init__(self):
        check_hyperparameter("norm_eps", self.norm_eps, low=0.0)

    @property
    def elementwise(self) -> bool:
        return False

    @property
    def runs_on_buffers(self) -> bool:
        return False

    def _selected(self, params: Any) -> Any:
        spec = _is_matrix_or_more if self.mask is None else self.mask
        return select_trainable(spec, params, what="hyperball mask")

    @init_entry
    def init(self, params: Params) -> HyperballState:
        @no_type_check
        def radius(p, selected):
            return _norm(p) if selected else None

        return HyperballState(
            count=jnp.zeros([], jnp.int32),
            radius=map_layers(radius, params, self._selected(params)),
            inner_state=self.inner.init(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: HyperballState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, HyperballState]:
        require_params(params, "hyperball")
        inner, inner_state = self.inner.update(
            updates, state.inner_state, params, **extra_args
        )
        lr = self.learning_rate
        if callable(lr):
            lr = jnp.asarray(lr(state.count))
        eps = self.norm_eps

        @no_type_check
        def step(u, p, r):
            if r is None:
                return (-lr * u).astype(u.dtype)
            dtype = jnp.promote_types(p.dtype, r.dtype)  # complex stays complex
            w = p.astype(dtype)
            direction = u.astype(dtype) / jnp.maximum(_norm(u), eps)
            moved = w - (lr * r) * direction
            new = (r / jnp.maximum(_norm(moved), eps)) * moved
            return (new - w).astype(u.dtype)

        leaves, treedef = jax.tree.flatten(inner, is_leaf=is_none)
        ps = treedef.flatten_up_to(params)
        radii = treedef.flatten_up_to(state.radius)
        # Per layer: each slice of a stacked leaf has its radius and its norms.
        out = [
            None if u is None else per_slice(step, stack)(u, p, r)
            for u, p, r, stack in zip(leaves, ps, radii, stack_axes(inner), strict=True)
        ]
        out = jax.tree.unflatten(treedef, out)
        return out, HyperballState(
            count=safe_int32_increment(state.count),
            radius=state.radius,
            inner_state=inner_state,
        )


@checked
def hyperball(
    inner: AbstractGradientTransformation,
    learning_rate: ScalarOrSchedule,
    mask: FilterSpec | None = None,
    norm_eps: ScalarLike = 1e-12,
) -> Hyperball:
    """Lowercase spelling of `eqopt.contrib.Hyperball`."""
    return Hyperball(
        inner=inner, learning_rate=learning_rate, mask=mask, norm_eps=norm_eps
    )


@checked
def adamh(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    mask: FilterSpec | None = None,
    mu_dtype: DTypeLike | None = None,
) -> Hyperball:
    r"""AdamH: Adam's direction, every matrix kept at its initial norm.

    `eqopt.contrib.Hyperball` around `eqopt.ScaleByAdam`: the selected
    matrices move on their sphere by $\eta$, the other leaves by Adam's step
    $-\eta\, \hat m / (\sqrt{\hat v} + \epsilon)$ with the same $\eta$.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule.
    - `b1`, `b2`, `eps`, `mu_dtype`: as `eqopt.ScaleByAdam`.
    - `mask`: the leaves kept on their sphere (default: two or more axes).

    **Returns:** an `eqopt.contrib.Hyperball`.

    **References:** Wen et al., *Fantastic Pretraining Optimizers and Where to
    Find Them II: Hyperball Optimization*, arXiv:2606.16899.
    """
    adam = ScaleByAdam(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype)
    return Hyperball(inner=adam, learning_rate=learning_rate, mask=mask)


@checked
def muonh(
    learning_rate: ScalarOrSchedule,
    ns_coeffs: Coefficients = _DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: ScalarLike = 0.95,
    eps: ScalarLike = 1e-8,
    mu_dtype: DTypeLike | None = None,
    *,
    nesterov: bool = True,
    adam_b1: ScalarLike = 0.9,
    adam_b2: ScalarLike = 0.999,
    adam_weight_decay: ScalarOrSchedule = 0.0,
    adam_learning_rate: ScalarOrSchedule | None = None,
    muon_weight_dimension_numbers: Any = None,
) -> Partition:
    r"""MuonH: Muon's orthogonalised momentum, every matrix kept at its initial norm.

    The matrices (chosen as by `eqopt.contrib.muon`) are updated by
    `eqopt.contrib.Hyperball` around `eqopt.contrib.ScaleByMuon`; every other
    leaf by `eqopt.adamw`. Muon's shape factor and weight decay have no
    place here: the step is normalised and the norm is fixed. The result is
    an `eqopt.Partition` with groups `"muonh"` and `"adam"`.

    !!! example

        ```python
        opt = eqopt.contrib.muonh(0.02, adam_learning_rate=3e-3)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        ```

    **Arguments:**

    - `learning_rate`: $\eta$ of the matrices (about the angle of a step).
    - `ns_coeffs`, `ns_steps`, `beta`, `eps`, `mu_dtype`, `nesterov`: as
      `eqopt.contrib.ScaleByMuon`.
    - `adam_b1`, `adam_b2`, `adam_weight_decay`: AdamW's for the other leaves.
    - `adam_learning_rate`: AdamW's learning rate (default: `learning_rate`).
    - `muon_weight_dimension_numbers`: the matrices, as `eqopt.contrib.muon`.

    **Returns:** an `eqopt.Partition`.

    **References:** Wen et al., *Fantastic Pretraining Optimizers and Where to
    Find Them II: Hyperball Optimization*, arXiv:2606.16899; Jordan et al., *Muon: An
    optimizer for hidden layers in neural networks*, 2024.
    """
    if adam_learning_rate is None:
        adam_learning_rate = learning_rate
    spec = (
        _is_matrix
        if muon_weight_dimension_numbers is None
        else muon_weight_dimension_numbers
    )
    direction = ScaleByMuon(
        ns_coeffs=ns_coeffs,
        ns_steps=ns_steps,
        beta=beta,
        eps=eps,
        mu_dtype=mu_dtype,
        nesterov=nesterov,
        weight_dimension_numbers=spec,
    )
    # Every leaf of the group is a Muon matrix: all go on their sphere.
    matrices = Hyperball(inner=direction, learning_rate=learning_rate, mask=True)
    rest = adamw(
        learning_rate=adam_learning_rate,
        b1=adam_b1,
        b2=adam_b2,
        eps=eps,
        mu_dtype=mu_dtype,
        weight_decay=adam_weight_decay,
    )
    return _matrices_and_the_rest("muonh", matrices, rest, spec)
