"""AdaMuon: Muon's orthogonalised momentum with an element-wise second moment."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._alias import adamw
from .._base import AbstractGradientTransformation, Params, Updates
from .._combine import Chain, Partition
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
from .._leafwise import leafwise
from .._numerics import abs_squared, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._quantize import MomentDType, cast_moment, moment_like
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._dimension_numbers import matrix_view
from ._muon import (
    _is_matrix,
    _matrices_and_the_rest,
    matrix_dimension_numbers,
)
from ._newton_schulz import (
    _DEFAULT_NS_COEFFS,
    Coefficients,
    Orthogonalization,
    Preconditioning,
    _as_coefficients,
    check_orthogonalizer,
    orthogonalize,
)


@checked
class AdaMuonState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByAdaMuon`: the step count, the momentum
    `mu` and the element-wise second moment `nu` of the orthogonalised momentum
    (both `None` at leaves that are not matrices)."""

    count: Int[Array, ""]
    mu: Updates
    nu: Updates


@checked
class ScaleByAdaMuon(AbstractGradientTransformation):
    r"""Orthogonalises the momentum (Muon), normalises it element-wise by its second moment, rescales to an RMS.

    For each selected matrix $G_t \in \mathbb{R}^{n \times m}$:

    $$
    \begin{aligned}
    M_t &= \beta_1 M_{t-1} + (1 - \beta_1)\, G_t
      \qquad\text{(Nesterov: use } \beta_1 M_t + (1 - \beta_1) G_t\text{)} \\
    O_t &= \operatorname{NS}(M_t)
      \qquad\text{(with } \texttt{sign\_momentum}\text{: } \operatorname{NS}(\operatorname{sign} M_t)\text{)} \\
    V_t &= \beta_2 V_{t-1} + (1 - \beta_2)\, O_t \odot O_t \\
    \hat O_t &= O_t \oslash \big(\sqrt{V_t / (1 - \beta_2^t)} + \epsilon\big) \\
    u_t &= \rho \sqrt{n m}\; \hat O_t / (\|\hat O_t\|_F + \epsilon)
    \end{aligned}
    $$

    $\operatorname{NS}$ is Muon's orthogonalisation (`eqopt.contrib.ScaleByMuon`,
    same coefficients, preconditioning and `orthogonalization`). The second
    moment adapts each element of the orthogonalised direction, and the last
    line makes the update's root mean square $\rho = 0.2$, AdamW's, so that
    AdamW's learning rates carry over (the paper's RMS-aligned rescaling).
    With `consistent_rms=None` the update is instead
    $\sqrt{\max(1, m/n)}\,\sqrt{\min(n, m)}\, \hat O_t / (\|\hat O_t\|_F +
    \epsilon)$: the norm of an orthogonal matrix times Muon's width factor
    (`pytorch-optimizer`'s `use_adjusted_lr=False`).

    **Where the paper leaves choices open** this follows `pytorch-optimizer`'s
    `AdaMuon` (4.1): the momentum is an exponential average without Nesterov,
    $V$ is bias-corrected (which only moves $\epsilon$: the rescaling cancels
    it), $\beta_1 = 0.9$, $\beta_2 = 0.95$, $\epsilon = 10^{-10}$, and no sign
    is taken before orthogonalising (the first version of the paper; the
    second adds $\operatorname{sign}(M_t)$: `sign_momentum=True`).

    The norm and sizes are those of one matrix: a leaf with batch axes (see
    `eqopt.contrib.MuonDimensionNumbers`) is rescaled matrix by matrix.
    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `ns_coeffs`, `ns_steps`, `preconditioning`, `orthogonalization`: as for
      `eqopt.contrib.ScaleByMuon`.
    - `beta`: $\beta_1$, the momentum decay.
    - `b2`: $\beta_2$, the decay of the second moment.
    - `eps`: $\epsilon$.
    - `mu_dtype`: dtype (or `eqopt.Quantized` format) of the two moments.
    - `nesterov`: Nesterov momentum (default: plain).
    - `sign_momentum`: orthogonalise $\operatorname{sign}(M_t)$ (the paper's
      second version).
    - `consistent_rms`: $\rho$, or `None` for Muon's width factor as above.
    - `weight_dimension_numbers`: as for `eqopt.contrib.ScaleByMuon`.

    **References:** Si, Zhang & Shen, *AdaMuon: Adaptive Muon Optimizer*,
    arXiv:2507.11005, 2025.
    """

    ns_coeffs: Float[Array | np.ndarray, "3"] | Float[Array | np.ndarray, "steps 3"] = (
        eqx.field(default=_DEFAULT_NS_COEFFS, converter=_as_coefficients)
    )
    ns_steps: int = eqx.field(default=5, static=True)
    beta: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.95, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-10, converter=as_scalar)
    mu_dtype: MomentDType = eqx.field(default=None, static=True)
    nesterov: bool = eqx.field(default=False, static=True)
    sign_momentum: bool = eqx.field(default=False, static=True)
    preconditioning: Preconditioning = eqx.field(default="frobenius", static=True)
    orthogonalization: Orthogonalization = eqx.field(
        default="newton_schulz", static=True
    )
    consistent_rms: Scalar | None = eqx.field(default=0.2, converter=as_optional_scalar)
    weight_dimension_numbers: Any = None

    def __check_init__(self):
        check_decays(self, "beta", "b2")
        check_hyperparameter("eps", self.eps, low=0.0)
        check_orthogonalizer(
            "ScaleByAdaMuon",
            self.orthogonalization,
            self.preconditioning,
            self.ns_steps,
        )

    @property
    def elementwise(self) -> bool:
        return False

    def _dimension_numbers(self, tree: Any) -> Any:
        return matrix_dimension_numbers(self.weight_dimension_numbers, tree, "AdaMuon")

    @init_entry
    def init(self, params: Params) -> AdaMuonState:
        dims = self._dimension_numbers(params)

        def zeros(p, d):
            return None if d is None else moment_like(p, self.mu_dtype or p.dtype)

        is_none = lambda x: x is None  # noqa: E731
        mu = jax.tree.map(zeros, params, dims, is_leaf=is_none)
        nu = jax.tree.map(zeros, params, dims, is_leaf=is_none)
        return AdaMuonState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: AdaMuonState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, AdaMuonState]:
        dims = self._dimension_numbers(updates if params is None else params)
        beta, b2, eps = self.beta, self.b2, self.eps
        count = safe_int32_increment(state.count)
        correction = 1 - b2**count

        @no_type_check
        def step(g, mu, nu, d):
            if d is None:
                return g, mu, nu
            mu_dtype, nu_dtype = mu.dtype, nu.dtype
            mu = beta * mu + (1 - beta) * g
            direction = beta * mu + (1 - beta) * g if self.nesterov else mu
            if self.sign_momentum:
                direction = jnp.sign(direction)
            o = orthogonalize(
                direction.astype(g.dtype),
                d,
                self.ns_coeffs,
                self.ns_steps,
                self.preconditioning,
                eps,
                self.orthogonalization,
            )
            nu = b2 * nu + (1 - b2) * abs_squared(o)
            o = o / (jnp.sqrt(nu / correction) + eps).astype(o.dtype)
            update = self._rescale(o, d)
            mu_out = cast_moment(mu, self.mu_dtype or mu_dtype)
            nu_out = cast_moment(nu, self.mu_dtype or nu_dtype)
            return update.astype(g.dtype), mu_out, nu_out

        updates, mu, nu = leafwise(step, updates, state.mu, state.nu, dims, n_out=3)
        return updates, AdaMuonState(count=count, mu=mu, nu=nu)

    @no_type_check
    def _rescale(self, o, d):
        # The RMS-aligned rescaling, matrix by matrix of the (batch, in, out) view.
        to_matrix, from_matrix = matrix_view(o.shape, d)
        matrix = to_matrix(o)
        fan_in, fan_out = matrix.shape[1], matrix.shape[2]
        norms = jnp.sqrt(jnp.sum(abs_squared(matrix), axis=(1, 2)))
        if self.consistent_rms is None:
            target = max(1.0, fan_out / fan_in) ** 0.5 * min(fan_in, fan_out) ** 0.5
        else:
            target = self.consistent_rms * (fan_in * fan_out) ** 0.5
        factor = (target / (norms + self.eps))[:, None, None].astype(o.dtype)
        return from_matrix(factor * matrix)


@checked
def scale_by_adamuon(
    ns_coeffs: Coefficients = _DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: ScalarLike = 0.9,
    b2: ScalarLike = 0.95,
    eps: ScalarLike = 1e-10,
    mu_dtype: MomentDType = None,
    *,
    nesterov: bool = False,
    sign_momentum: bool = False,
    preconditioning: Preconditioning = "frobenius",
    orthogonalization: Orthogonalization = "newton_schulz",
    consistent_rms: ScalarLike | None = 0.2,
    weight_dimension_numbers: Any = None,
) -> ScaleByAdaMuon:
    """Lowercase spelling of `eqopt.contrib.ScaleByAdaMuon`."""
    return ScaleByAdaMuon(
        ns_coeffs=ns_coeffs,
        ns_steps=ns_steps,
        beta=beta,
        b2=b2,
        eps=eps,
        mu_dtype=mu_dtype,
        nesterov=nesterov,
        sign_momentum=sign_momentum,
        preconditioning=preconditioning,
        orthogonalization=orthogonalization,
        consistent_rms=consistent_rms,
        weight_dimension_numbers=weight_dimension_numbers,
    )


@checked
def adamuon(
    learning_rate: ScalarOrSchedule,
    ns_coeffs: Coefficients = _DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: ScalarLike = 0.9,
    b2: ScalarLike = 0.95,
    eps: ScalarLike = 1e-10,
    weight_decay: ScalarOrSchedule = 0.0,
    weight_decay_mask: FilterSpec | None = None,
    mu_dtype: MomentDType = None,
    *,
    nesterov: bool = False,
    sign_momentum: bool = False,
    preconditioning: Preconditioning = "frobenius",
    orthogonalization: Orthogonalization = "newton_schulz",
    consistent_rms: ScalarLike | None = 0.2,
    adam_b1: ScalarLike = 0.9,
    adam_b2: ScalarLike = 0.999,
    adam_eps_root: ScalarLike = 0.0,
    adam_weight_decay: ScalarOrSchedule = 0.0,
    adam_learning_rate: ScalarOrSchedule | None = None,
    adamuon_weight_dimension_numbers: Any = None,
) -> Partition:
    r"""AdaMuon for the matrices, AdamW for every other leaf.

    $$ W_{t+1} = W_t - \eta_t \big(u_t + \lambda\, W_t\big) $$

    with $u_t$ from `eqopt.contrib.ScaleByAdaMuon` (RMS 0.2, so AdamW's
    learning rates are a good start). The leaves are chosen as in
    `eqopt.contrib.muon`: the result is a `eqopt.Partition` with groups
    `"adamuon"` and `"adam"` (AdamW with the `adam_*` hyperparameters and
    AdaMuon's `eps`, as `pytorch-optimizer`'s AdaMuon).

    **Arguments:**

    - `learning_rate`: $\eta$ for the AdaMuon group, a number or a schedule.
    - `ns_coeffs`, `ns_steps`, `beta`, `b2`, `eps`, `mu_dtype`, `nesterov`,
      `sign_momentum`, `preconditioning`, `orthogonalization`,
      `consistent_rms`: as for `eqopt.contrib.ScaleByAdaMuon`.
    - `weight_decay`, `weight_decay_mask`: $\lambda$ (decoupled, times the
      learning rate) and the filter spec of the AdaMuon leaves to decay.
    - `adam_*`: AdamW's hyperparameters for the other leaves
      (`adam_learning_rate` defaults to `learning_rate`).
    - `adamuon_weight_dimension_numbers`: which leaves get AdaMuon, a filter
      spec as Muon's (default: every 2-D leaf, oriented by its layer).

    **Returns:** an `eqopt.Partition`.

    **References:** Si, Zhang & Shen, *AdaMuon: Adaptive Muon Optimizer*,
    arXiv:2507.11005, 2025.
    """
    if adam_learning_rate is None:
        adam_learning_rate = learning_rate
    spec = (
        _is_matrix
        if adamuon_weight_dimension_numbers is None
        else adamuon_weight_dimension_numbers
    )
    matrices = Chain(
        ScaleByAdaMuon(
            ns_coeffs=ns_coeffs,
            ns_steps=ns_steps,
            beta=beta,
            b2=b2,
            eps=eps,
            mu_dtype=mu_dtype,
            nesterov=nesterov,
            sign_momentum=sign_momentum,
            preconditioning=preconditioning,
            orthogonalization=orthogonalization,
            consistent_rms=consistent_rms,
            weight_dimension_numbers=spec,
        ),
        AddDecayedWeights(weight_decay, weight_decay_mask),
        ScaleByLearningRate(learning_rate),
    )
    others = adamw(
        learning_rate=adam_learning_rate,
        b1=adam_b1,
        b2=adam_b2,
        eps=eps,
        eps_root=adam_eps_root,
        mu_dtype=mu_dtype,
        weight_decay=adam_weight_decay,
    )
    return _matrices_and_the_rest("adamuon", matrices, others, spec)
