"""NorMuon: Muon with a neuron-wise second moment of the orthogonalised update."""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
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
from .._layer_axes import stack_axes
from .._leafwise import leafwise, map_layers, per_slice
from .._numerics import abs_squared, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._dimension_numbers import (
    fans,
    matrix_view,
)
from ._muon import (
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


def _is_matrix(x: Any) -> bool:
    return x.ndim == 2


@checked
class NorMuonState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByNorMuon`.

    - `count`: the number of steps taken.
    - `mu`: the momentum, shaped like the params (`None` where not a matrix).
    - `nu`: the second moment of each neuron's orthogonalised update, of shape
      `(batch, neurons)` for each matrix leaf (batch 1 without batch axes).
    """

    count: Int[Array, ""]
    mu: Updates
    nu: Updates


@checked
class ScaleByNorMuon(AbstractGradientTransformation):
    r"""Orthogonalises the momentum (Muon), then normalises each neuron by its second moment.

    For each selected matrix $G_t \in \mathbb{R}^{n \times m}$ whose $m$
    columns (the output axes of `weight_dimension_numbers`) are the neurons:

    $$
    \begin{aligned}
    M_t &= \beta_1 M_{t-1} + (1 - \beta_1)\, G_t
      \qquad\text{(Nesterov: use } \beta_1 M_t + (1 - \beta_1) G_t\text{)} \\
    O_t &= \operatorname{NS}(M_t) \\
    v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, \operatorname{mean}_{\text{rows}}(O_t \odot O_t)
      \in \mathbb{R}^m \\
    \hat O_t &= O_t \oslash \big(\sqrt{v_t} + \epsilon\big) \\
    u_t &= \rho\, \sqrt{n m}\; \hat O_t / (\|\hat O_t\|_F + \epsilon)
    \end{aligned}
    $$

    $\operatorname{NS}$ is Muon's Newton–Schulz orthogonalisation
    (`eqopt.contrib.ScaleByMuon`, same coefficients and preconditioning).
    Orthogonalising equalises the singular values but leaves some neurons with
    much larger updates than others; the per-neuron second moment (one value
    per neuron, as Adam-mini's blocks) evens them out, and the last line gives
    the update the root mean square $\rho = 0.2$ of AdamW's, as Algorithm 1 of
    the paper does. The authors' code (and `pytorch-optimizer`'s default)
    instead keep the Frobenius norm of $O_t$ and then apply Muon's width
    factor (their `update *= max(1, rows / cols) ** 0.5`, rows being the
    neurons of a PyTorch `(out, in)` weight): `consistent_rms=None` does that,

    $$ u_t = \sqrt{\max(1, m / n)}\; \|O_t\|_F\, \hat O_t / (\|\hat O_t\|_F + \epsilon). $$

    Neither bias-corrects $M$ or $v$; nor does eqopt.

    **Which axis is a neuron.** The neurons are the output axes. As for
    Muon (see "Orientation" in `eqopt.contrib.ScaleByMuon`), a weight of
    a known Equinox layer is read as the layer uses it: the neurons of an
    `eqx.nn.Linear` weight `(out, in)` are its rows, as in the authors'
    PyTorch code. Any other leaf keeps Optax's convention, a Flax `(in, out)`
    kernel whose neurons are its columns; explicit dimension numbers (e.g.
    `MuonDimensionNumbers(reduction_axis=1, output_axis=0)` for PyTorch-laid
    bare arrays) always win.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `ns_coeffs`, `ns_steps`, `preconditioning`, `orthogonalization`: as
      for `eqopt.contrib.ScaleByMuon` (`"polar_express"`, `"gram"` included).
    - `beta`: $\beta_1$, the momentum decay.
    - `b2`: $\beta_2$, the decay of the neuron-wise second moment.
    - `eps`: $\epsilon$.
    - `mu_dtype`: dtype to store the momentum in (default: the params').
    - `nesterov`: Nesterov momentum (the authors' code) or plain momentum (the
      paper's Algorithm 1, default).
    - `consistent_rms`: $\rho$, or `None` for the authors' code: keep
      $\|O_t\|_F$ and apply the width factor $\sqrt{\max(1, m / n)}$.
    - `weight_dimension_numbers`: as for `eqopt.contrib.ScaleByMuon`
      (`None`: every leaf is a matrix, oriented by its layer as above).

    **References:** Li, Liu, Liang, Chen & Zhao, *NorMuon: Making Muon more
    efficient and scalable*, arXiv:2510.05491, 2025.
    """

    ns_coeffs: Float[Array | np.ndarray, "3"] | Float[Array | np.ndarray, "steps 3"] = (
        eqx.field(default=_DEFAULT_NS_COEFFS, converter=_as_coefficients)
    )
    ns_steps: int = eqx.field(default=5, static=True)
    beta: Scalar = eqx.field(default=0.95, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.95, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    mu_dtype: DTypeLike | None = eqx.field(default=None, static=True)
    nesterov: bool = eqx.field(default=False, static=True)
    preconditioning: Preconditioning = eqx.field(default="frobenius", static=True)
    consistent_rms: Scalar | None = eqx.field(default=0.2, converter=as_optional_scalar)
    weight_dimension_numbers: Any = None
    orthogonalization: Orthogonalization = eqx.field(
        default="newton_schulz", static=True
    )

    def __check_init__(self):
        check_decays(self, "beta", "b2")
        check_orthogonalizer(
            "ScaleByNorMuon",
            self.orthogonalization,
            self.preconditioning,
            self.ns_steps,
        )
        check_hyperparameter("eps", self.eps, low=0.0)

    @property
    def elementwise(self) -> bool:
        return False

    def _dimension_numbers(self, tree: Any) -> Any:
        return matrix_dimension_numbers(self.weight_dimension_numbers, tree, "NorMuon")

    @init_entry
    def init(self, params: Params) -> NorMuonState:
        dims = self._dimension_numbers(params)

        @no_type_check
        def momentum(p, d):
            if d is None:
                return None
            return jnp.zeros_like(p, dtype=self.mu_dtype or p.dtype)

        @no_type_check
        def neurons(p, d):
            if d is None:
                return None
            fan_in, fan_out = fans(p.shape, d)
            batch = p.size // (fan_in * fan_out)
            return jnp.zeros((batch, fan_out), jnp.finfo(p.dtype).dtype)

        is_none = lambda x: x is None  # noqa: E731
        mu = jax.tree.map(momentum, params, dims, is_leaf=is_none)
        # One row of neurons per layer: stacked on a stacked leaf's stack axes.
        nu = map_layers(neurons, params, dims)
        return NorMuonState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: NorMuonState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, NorMuonState]:
        dims = self._dimension_numbers(updates if params is None else params)
        beta, eps = self.beta, self.eps
        one_minus_beta = 1 - beta

        @no_type_check
        def step(g, mu, d):
            if d is None:
                return g, mu
            mu_next = beta * mu + one_minus_beta * g
            direction = (
                beta * mu_next + one_minus_beta * g if self.nesterov else mu_next
            )
            o = orthogonalize(
                direction.astype(g.dtype),
                d,
                self.ns_coeffs,
                self.ns_steps,
                self.preconditioning,
                eps,
                self.orthogonalization,
            )
            return o, mu_next.astype(mu.dtype)

        orthogonal, mu = leafwise(step, updates, state.mu, dims, n_out=2)
        flat_nu, _ = jax.tree.flatten(state.nu, is_leaf=lambda x: x is None)
        flat_o, o_def = jax.tree.flatten(orthogonal, is_leaf=lambda x: x is None)
        flat_d = o_def.flatten_up_to(
            jax.tree.map(_Boxed, dims, is_leaf=lambda x: x is None)
        )
        outs, nus = [], []
        for o, nu, d, stack in zip(
            flat_o, flat_nu, flat_d, stack_axes(orthogonal), strict=True
        ):
            if o is None or d.value is None:
                outs.append(o)
                nus.append(nu)
                continue
            # Per layer: each slice of a stacked leaf is normalised alone.
            o, nu = per_slice(self._normalise, stack)(o, nu, d.value)
            outs.append(o)
            nus.append(nu)
        updates = o_def.unflatten(outs)
        nu = o_def.unflatten(nus)
        count = safe_int32_increment(state.count)
        return updates, NorMuonState(count=count, mu=mu, nu=nu)

    @no_type_check
    def _normalise(self, o, nu, d):
        # NorMuon's second step on one layer's orthogonalised update `o`.
        b2, eps, rms = self.b2, self.eps, self.consistent_rms
        one_minus_b2 = 1 - b2
        to_matrix, from_matrix = matrix_view(o.shape, d)
        matrix = to_matrix(o)  # (batch, in, neurons)
        nu = b2 * nu + one_minus_b2 * jnp.mean(abs_squared(matrix), axis=1)
        normalised = matrix / (eps + jnp.sqrt(nu))[:, None, :].astype(o.dtype)
        norms = jnp.sqrt(jnp.sum(abs_squared(normalised), axis=(1, 2)))
        if rms is None:
            # The authors' code: the norm of O, times Muon's width factor
            # sqrt(max(1, neurons / inputs)).
            fan_in, fan_out = matrix.shape[1], matrix.shape[2]
            target = jnp.sqrt(jnp.sum(abs_squared(matrix), axis=(1, 2)))
            target = target * max(1.0, fan_out / fan_in) ** 0.5
        else:
            target = rms * jnp.sqrt(matrix.shape[1] * matrix.shape[2])
        factor = (target / (eps + norms))[:, None, None].astype(o.dtype)
        return from_matrix(factor * normalised).astype(o.dtype), nu


class _Boxed(eqx.Module):
    """One resolved dimension-numbers value (or `None`) as a single pytree node."""

    value: Any = eqx.field(static=True)


@checked
def scale_by_normuon(
    ns_coeffs: Coefficients = _DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: ScalarLike = 0.95,
    b2: ScalarLike = 0.95,
    eps: ScalarLike = 1e-8,
    mu_dtype: DTypeLike | None = None,
    *,
    nesterov: bool = False,
    preconditioning: Preconditioning = "frobenius",
    consistent_rms: ScalarLike | None = 0.2,
    weight_dimension_numbers: Any = None,
    orthogonalization: Orthogonalization = "newton_schulz",
) -> ScaleByNorMuon:
    """Lowercase spelling of `eqopt.contrib.ScaleByNorMuon`."""
    return ScaleByNorMuon(
        ns_coeffs=ns_coeffs,
        ns_steps=ns_steps,
        beta=beta,
        b2=b2,
        eps=eps,
        mu_dtype=mu_dtype,
        nesterov=nesterov,
        preconditioning=preconditioning,
        consistent_rms=consistent_rms,
        weight_dimension_numbers=weight_dimension_numbers,
        orthogonalization=orthogonalization,
    )


@checked
def normuon(
    learning_rate: ScalarOrSchedule,
    ns_coeffs: Coefficients = _DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: ScalarLike = 0.95,
    b2: ScalarLike = 0.95,
    eps: ScalarLike = 1e-8,
    weight_decay: ScalarOrSchedule = 0.0,
    weight_decay_mask: FilterSpec | None = None,
    mu_dtype: DTypeLike | None = None,
    *,
    nesterov: bool = False,
    preconditioning: Preconditioning = "frobenius",
    consistent_rms: ScalarLike | None = 0.2,
    adam_b1: ScalarLike = 0.9,
    adam_b2: ScalarLike = 0.999,
    adam_eps_root: ScalarLike = 0.0,
    adam_weight_decay: ScalarOrSchedule = 0.0,
    adam_learning_rate: ScalarOrSchedule | None = None,
    normuon_weight_dimension_numbers: Any = None,
    orthogonalization: Orthogonalization = "newton_schulz",
) -> Partition:
    r"""NorMuon for the matrices, AdamW for every other leaf.

    $$ W_{t+1} = W_t - \eta_t \big(u_t + \lambda\, W_t\big) $$

    with $u_t$ from `eqopt.contrib.ScaleByNorMuon` (whose RMS of 0.2 makes
    AdamW's learning rates a good start). As `eqopt.contrib.muon`, the
    result is a `eqopt.Partition` with groups `"normuon"` and `"adam"`.

    !!! example

        ```python
        opt = eqopt.contrib.normuon(1e-2, weight_decay=0.01, adam_learning_rate=3e-3)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        state.inner_states["normuon"][0].nu.layers[1].weight.shape  # (1, 16)
        ```

    **Arguments:**

    - `learning_rate`: $\eta$ for the NorMuon group, a number or a schedule.
    - `ns_coeffs`, `ns_steps`, `beta`, `b2`, `eps`, `mu_dtype`, `nesterov`,
      `preconditioning`, `consistent_rms`, `orthogonalization`: as for
      `eqopt.contrib.ScaleByNorMuon`.
    - `weight_decay`, `weight_decay_mask`: $\lambda$ and the filter spec of
      the NorMuon leaves to decay.
    - `adam_*`: AdamW's hyperparameters for the other leaves
      (`adam_learning_rate` defaults to `learning_rate`).
    - `normuon_weight_dimension_numbers`: which leaves get NorMuon and their
      neuron axes, a filter spec as Muon's; default: every 2-D leaf, oriented
      by its Equinox layer (an `eqx.nn.Linear` weight's neurons are its
      rows) or else by Optax's convention (a bare matrix's neurons are its
      columns).

    **Returns:** an `eqopt.Partition`.

    **References:** Li et al., *NorMuon: Making Muon more efficient and
    scalable*, arXiv:2510.05491, 2025.
    """
    if adam_learning_rate is None:
        adam_learning_rate = learning_rate
    spec = (
        _is_matrix
        if normuon_weight_dimension_numbers is None
        else normuon_weight_dimension_numbers
    )
    matrices = Chain(
        ScaleByNorMuon(
            ns_coeffs=ns_coeffs,
            ns_steps=ns_steps,
            beta=beta,
            b2=b2,
            eps=eps,
            mu_dtype=mu_dtype,
            nesterov=nesterov,
            preconditioning=preconditioning,
            consistent_rms=consistent_rms,
            weight_dimension_numbers=spec,
            orthogonalization=orthogonalization,
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
    return _matrices_and_the_rest("normuon", matrices, others, spec)
