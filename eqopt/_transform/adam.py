"""Adaptive moment estimation: Adam, AMSGrad and AdaMax."""

from typing import Any, no_type_check

import equinox as eqx
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Int

from .._base import AbstractGradientTransformation, Params, Updates
from .._entry import init_entry, update_entry
from .._hyper import Scalar, ScalarLike, as_scalar, check_decays, check_hyperparameter
from .._leafwise import full_like_trainable_real, leafwise, zeros_like_trainable
from .._numerics import abs_squared, debias, safe_int32_increment, unfused
from .._optax_tuple import OptaxTuple
from .._quantize import (
    MomentDType,
    any_quantized,
    cast_moment,
    is_quantized_format,
    moment_like,
    quantized_on_buffers,
)
from .._typecheck import checked

Moments = Updates


_cast = cast_moment


def _per_dtype(scalars: list) -> Any:
    """`scalars` cast to a dtype, once per dtype (`debias` casts per leaf)."""
    cast: dict = {}

    def in_dtype(dtype):
        if dtype not in cast:
            cast[dtype] = [x.astype(dtype) for x in scalars]
        return cast[dtype]

    return in_dtype


def _second_moment_zeros(params, dtype):
    # |g|^2 is real, so the second moment is stored in the real dtype (float32
    # for complex64 params), unless a dtype (or a quantised format) is asked for.
    if dtype is None:
        return full_like_trainable_real(params, 0.0)
    if is_quantized_format(dtype):
        return moment_like(params, dtype, second=True)
    return zeros_like_trainable(params, dtype)


def _check_adam_hyperparameters(module: "ScaleByAdam | ScaleByAmsgrad") -> None:
    check_decays(module, "b1", "b2")
    check_hyperparameter("eps", module.eps, low=0.0)
    check_hyperparameter("eps_root", module.eps_root, low=0.0)


@checked
class ScaleByAdamState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByAdam`: step count and the two moments."""

    count: Int[Array, ""]
    mu: Moments
    nu: Moments


@checked
class ScaleByAdam(AbstractGradientTransformation):
    r"""Rescales updates by Adam's bias-corrected moment estimates.

    $$
    \begin{aligned}
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t \\
    v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, |g_t|^2 \\
    \hat m_t &= m_t / (1 - \beta_1^t), \qquad \hat v_t = v_t / (1 - \beta_2^t) \\
    u_t &= \hat m_t \,/\, \big(\sqrt{\hat v_t + \epsilon_{\text{root}}} + \epsilon\big)
    \end{aligned}
    $$

    With `nesterov=True` the first moment is replaced by Dozat's look-ahead
    $\beta_1 m_t / (1 - \beta_1^{t+1}) + (1 - \beta_1) g_t / (1 - \beta_1^t)$
    (NAdam). Complex updates use $|g|^2 = g \bar g$, so $v$ is real and is
    stored as a real array (Optax stores it complex with a zero imaginary part;
    the updates are the same).

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `b1`, `b2`: the decay rates $\beta_1, \beta_2 \in [0, 1)$.
    - `eps`: added to the denominator outside the square root.
    - `eps_root`: added inside the square root (useful when differentiating
      through the update).
    - `mu_dtype`: dtype to store the first moment in (default: the params'),
      or a `eqopt.Quantized` format (8-bit or 4-bit codes).
    - `nu_dtype`: dtype or `eqopt.Quantized` format to store the second
      moment in (default: the params'). Optax has no such option.
    - `nesterov`: use Nesterov momentum (NAdam).

    !!! note "Numerics"
        `b1`, `b2` and `eps` are float32 leaves, so $1 - \beta_2$ is rounded in
        float32, where Optax subtracts Python floats in double precision. With
        the default $\beta_2 = 0.999$ this is a relative $10^{-5}$ in $v$
        (about $5 \cdot 10^{-6}$ in the update); for decays exactly representable
        in float32 the results are identical.

    **References:** Kingma & Ba, *Adam: A Method for Stochastic Optimization*,
    ICLR 2015; Dozat, *Incorporating Nesterov Momentum into Adam*, ICLR 2016
    workshop.
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    eps_root: Scalar = eqx.field(default=0.0, converter=as_scalar)
    mu_dtype: MomentDType = eqx.field(default=None, static=True)
    nu_dtype: MomentDType = eqx.field(default=None, static=True)
    nesterov: bool = eqx.field(default=False, static=True)

    @property
    def elementwise(self) -> bool:
        # Quantised moments are block-wise: not the same on a concatenation.
        return not any_quantized(self.mu_dtype, self.nu_dtype)

    @property
    def runs_on_buffers(self) -> bool:
        # A packed buffer's quantised moments are quantised as one array.
        return quantized_on_buffers(self.mu_dtype, self.nu_dtype)

    def __check_init__(self):
        _check_adam_hyperparameters(self)

    @init_entry
    def init(self, params: Params) -> ScaleByAdamState:
        return ScaleByAdamState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params, self.mu_dtype),
            nu=_second_moment_zeros(params, self.nu_dtype),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByAdamState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByAdamState]:
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        # Fields read once, not per leaf (an attribute of a Module is Python code).
        nesterov, mu_dtype_field, nu_dtype_field = (
            self.nesterov,
            self.mu_dtype,
            self.nu_dtype,
        )
        count = safe_int32_increment(state.count)
        mu_quantized = is_quantized_format(mu_dtype_field)
        nu_quantized = is_quantized_format(nu_dtype_field)
        # Scalars computed once per step, not once per leaf.
        one_minus_b1, one_minus_b2 = 1 - b1, 1 - b2
        correction1, correction2 = 1 - b1**count, 1 - b2**count
        corrections = [correction1, correction2]
        if nesterov:
            corrections.append(1 - b1 ** safe_int32_increment(count))
        # The corrections in each leaf dtype, cast once per step (`debias`'s cast).
        in_dtype = _per_dtype(corrections)

        @no_type_check
        def step(g, mu, nu):
            mu_dtype, nu_dtype = mu.dtype, nu.dtype
            # Operands in this order (state term first, `eps +`) make every leaf
            # of one shape compile to the same kernel when the hyperparameters
            # are inputs of the program (benchmarks/kernel_count.py); the other
            # order gave the first leaf of each shape a kernel of its own.
            if mu_quantized:
                # Rounded alike in every program layout (see `unfused`).
                mu = unfused(b1 * mu, count) + unfused(one_minus_b1 * g, count)
            else:
                mu = b1 * mu + one_minus_b1 * g
            if nu_quantized:
                nu = unfused(b2 * nu, count) + unfused(
                    one_minus_b2 * abs_squared(g), count
                )
            else:
                nu = b2 * nu + one_minus_b2 * abs_squared(g)
            if nesterov:
                scaled = one_minus_b1 * g
                mu_hat = b1 * (mu / in_dtype(mu.dtype)[2]) + (
                    scaled / in_dtype(scaled.dtype)[0]
                )
            else:
                mu_hat = mu / in_dtype(mu.dtype)[0]
            nu_hat = nu / in_dtype(nu.dtype)[1]
            update = mu_hat / (eps + jnp.sqrt(eps_root + nu_hat))
            return (
                update,
                _cast(mu, mu_dtype_field or mu_dtype),
                _cast(nu, nu_dtype_field or nu_dtype),
            )

        updates, mu, nu = leafwise(
            step, updates, state.mu, state.nu, n_out=3, elementwise=True, step=count
        )
        return updates, ScaleByAdamState(count=count, mu=mu, nu=nu)


@checked
def scale_by_adam(
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    mu_dtype: MomentDType = None,
    *,
    nesterov: bool = False,
    nu_dtype: MomentDType = None,
) -> ScaleByAdam:
    """Optax spelling of `eqopt.ScaleByAdam` (`nu_dtype` is eqopt's addition)."""
    return ScaleByAdam(
        b1=b1,
        b2=b2,
        eps=eps,
        eps_root=eps_root,
        mu_dtype=mu_dtype,
        nu_dtype=nu_dtype,
        nesterov=nesterov,
    )


@checked
class ScaleByAmsgradState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByAmsgrad`: moments and the running maximum of $\\hat v$."""

    count: Int[Array, ""]
    mu: Moments
    nu: Moments
    nu_max: Moments


@checked
class ScaleByAmsgrad(AbstractGradientTransformation):
    r"""Rescales updates with AMSGrad: Adam with a non-decreasing second moment.

    $$
    \hat v^{\max}_t = \max(\hat v^{\max}_{t-1}, \hat v_t), \qquad
    u_t = \hat m_t / \big(\sqrt{\hat v^{\max}_t + \epsilon_{\text{root}}} + \epsilon\big)
    $$

    with $\hat m_t, \hat v_t$ the bias-corrected moments of Adam.

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:** as `eqopt.ScaleByAdam` (without `nesterov`), and

    - `bias_correction_mu`, `bias_correction_nu`: whether to divide each moment
      by $1 - \beta^t$ (both `True` by default).

    **References:** Reddi, Kale & Kumar, *On the Convergence of Adam and Beyond*,
    ICLR 2018.
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    eps_root: Scalar = eqx.field(default=0.0, converter=as_scalar)
    mu_dtype: DTypeLike | None = eqx.field(default=None, static=True)
    bias_correction_mu: bool = eqx.field(default=True, static=True)
    bias_correction_nu: bool = eqx.field(default=True, static=True)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        _check_adam_hyperparameters(self)

    @init_entry
    def init(self, params: Params) -> ScaleByAmsgradState:
        return ScaleByAmsgradState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params, self.mu_dtype),
            nu=full_like_trainable_real(params, 0.0),
            nu_max=full_like_trainable_real(params, 0.0),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByAmsgradState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByAmsgradState]:
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        count = safe_int32_increment(state.count)

        one_minus_b1, one_minus_b2 = 1 - b1, 1 - b2
        correction1, correction2 = 1 - b1**count, 1 - b2**count

        @no_type_check
        def step(g, mu, nu, nu_max):
            mu_dtype = mu.dtype
            mu = b1 * mu + one_minus_b1 * g
            nu = b2 * nu + one_minus_b2 * abs_squared(g)
            mu_hat = debias(mu, correction1) if self.bias_correction_mu else mu
            nu_hat = debias(nu, correction2) if self.bias_correction_nu else nu
            nu_max = jnp.maximum(nu_max, nu_hat)
            update = mu_hat / (eps + jnp.sqrt(eps_root + nu_max))
            return update, _cast(mu, self.mu_dtype or mu_dtype), nu, nu_max

        updates, mu, nu, nu_max = leafwise(
            step, updates, state.mu, state.nu, state.nu_max, n_out=4
        )
        return updates, ScaleByAmsgradState(count=count, mu=mu, nu=nu, nu_max=nu_max)


@checked
def scale_by_amsgrad(
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    mu_dtype: DTypeLike | None = None,
    bias_correction_mu: bool = True,
    bias_correction_nu: bool = True,
) -> ScaleByAmsgrad:
    """Optax spelling of `eqopt.ScaleByAmsgrad`."""
    return ScaleByAmsgrad(
        b1=b1,
        b2=b2,
        eps=eps,
        eps_root=eps_root,
        mu_dtype=mu_dtype,
        bias_correction_mu=bias_correction_mu,
        bias_correction_nu=bias_correction_nu,
    )


@checked
class ScaleByAdamaxState(eqx.Module, OptaxTuple):
    """The state of `eqopt.ScaleByAdamax`: first moment and infinity norm."""

    count: Int[Array, ""]
    mu: Moments
    nu: Moments


@checked
class ScaleByAdamax(AbstractGradientTransformation):
    r"""Rescales updates with AdaMax, Adam's infinity-norm variant.

    $$
    m_t = \beta_1 m_{t-1} + (1 - \beta_1) g_t, \qquad
    u^{\infty}_t = \max(\beta_2 u^{\infty}_{t-1}, |g_t| + \epsilon), \qquad
    u_t = \frac{m_t}{(1 - \beta_1^t)\, u^{\infty}_t}
    $$

    **Element-wise**: each entry's update depends on that entry alone, so a layer
    stacked with `eqx.filter_vmap` is updated as the list of those layers.

    **Arguments:**

    - `b1`, `b2`: the decay rates.
    - `eps`: added to $|g|$, keeping the denominator positive.

    **References:** Kingma & Ba, *Adam: A Method for Stochastic Optimization*,
    ICLR 2015, §7.1.
    """

    b1: Scalar = eqx.field(default=0.9, converter=as_scalar)
    b2: Scalar = eqx.field(default=0.999, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)

    @property
    def elementwise(self) -> bool:
        return True

    def __check_init__(self):
        check_decays(self, "b1", "b2")
        check_hyperparameter("eps", self.eps, low=0.0)

    @init_entry
    def init(self, params: Params) -> ScaleByAdamaxState:
        return ScaleByAdamaxState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_trainable(params),
            nu=zeros_like_trainable(params),
        )

    @update_entry
    def update(
        self,
        updates: Updates,
        state: ScaleByAdamaxState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, ScaleByAdamaxState]:
        b1, b2, eps = self.b1, self.b2, self.eps
        count = safe_int32_increment(state.count)

        one_minus_b1, correction1 = 1 - b1, 1 - b1**count

        @no_type_check
        def step(g, mu, nu):
            mu = b1 * mu + one_minus_b1 * g
            nu = jnp.maximum(eps + jnp.abs(g), b2 * nu)
            return debias(mu, correction1) / nu, mu, nu

        updates, mu, nu = leafwise(step, updates, state.mu, state.nu, n_out=3)
        return updates, ScaleByAdamaxState(count=count, mu=mu, nu=nu)


@checked
def scale_by_adamax(
    b1: ScalarLike = 0.9, b2: ScalarLike = 0.999, eps: ScalarLike = 1e-8
) -> ScaleByAdamax:
    """Optax spelling of `eqopt.ScaleByAdamax`."""
    return ScaleByAdamax(b1=b1, b2=b2, eps=eps)
