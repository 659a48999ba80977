"""Optimisers: named chains of the building blocks, spelled as in Optax.

Each optimiser is an `eqopt.Chain` whose parts sit in the same positions as
in Optax's chain (so `state[0]` is the same part), named after their classes
(`state.scale_by_adam.mu`). Every part is a Module whose hyperparameters are
array leaves, so `print(eqopt.adamw(1e-3))` shows the whole optimiser and
`eqx.tree_at(lambda o: o.scale_by_learning_rate.learning_rate, opt,
eqopt.as_scalar(3e-4))` changes the learning rate without recompiling (convert
the number: `tree_at` does not run the field's converter, and `filter_jit`
treats a Python float as static).
"""

import functools

from jax.typing import DTypeLike

from ._combine import Chain
from ._filters import FilterSpec
from ._hyper import ScalarLike, ScalarOrSchedule
from ._quantize import MomentDType
from ._transform.adam import ScaleByAdam, ScaleByAdamax, ScaleByAmsgrad
from ._transform.basic import Identity, ScaleByLearningRate
from ._transform.decay import AddDecayedWeights
from ._transform.momentum import Trace
from ._transform.rms import ScaleByRms, ScaleByRss, ScaleByStddev
from ._transform.trust_ratio import ScaleByTrustRatio
from ._typecheck import checked
from ._wrappers.masked import Masked


def _momentum(
    momentum: ScalarLike | None,
    nesterov: bool,
    accumulator_dtype: DTypeLike | None = None,
) -> Identity | Trace:
    # Optax keeps an identity in the chain when there is no momentum, so a
    # state's parts have the same positions in both libraries.
    if momentum is None:
        return Identity()
    return Trace(decay=momentum, nesterov=nesterov, accumulator_dtype=accumulator_dtype)


@checked
def sgd(
    learning_rate: ScalarOrSchedule,
    momentum: ScalarLike | None = None,
    nesterov: bool = False,
    accumulator_dtype: DTypeLike | None = None,
) -> Chain:
    r"""Stochastic gradient descent, optionally with (Nesterov) momentum.

    $$
    m_t = g_t + \mu\, m_{t-1}, \qquad
    u_t = -\eta_t \begin{cases} g_t + \mu\, m_t & \text{Nesterov} \\ m_t & \text{heavy ball} \end{cases}
    $$

    Without momentum, $u_t = -\eta_t g_t$. The chain is
    `identity | trace`, then `scale_by_learning_rate`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `momentum`: $\mu$, or `None` for plain SGD.
    - `nesterov`: use Nesterov's look-ahead momentum.
    - `accumulator_dtype`: dtype to store the momentum in (default: the params').

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        opt = eqopt.sgd(learning_rate=1e-2, momentum=0.9, nesterov=True)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
        state.trace.trace            # the momentum buffer, shaped like the model
        ```

    **References:** Robbins & Monro, *A Stochastic Approximation Method*, 1951;
    Sutskever, Martens, Dahl & Hinton, *On the importance of initialization and
    momentum in deep learning*, ICML 2013.
    """
    return Chain(
        _momentum(momentum, nesterov, accumulator_dtype=accumulator_dtype),
        ScaleByLearningRate(learning_rate=learning_rate),
    )


@checked
def adam(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    mu_dtype: MomentDType = None,
    *,
    nesterov: bool = False,
    nu_dtype: MomentDType = None,
) -> Chain:
    r"""Adam: steps by bias-corrected first and second moment estimates.

    $$
    \begin{aligned}
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, |g_t|^2 \\
    u_t &= -\eta_t\, \frac{m_t / (1 - \beta_1^t)}{\sqrt{v_t / (1 - \beta_2^t) + \epsilon_{\text{root}}} + \epsilon}
    \end{aligned}
    $$

    The chain is `eqopt.ScaleByAdam`, then `eqopt.ScaleByLearningRate`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `b1`, `b2`: the decay rates $\beta_1, \beta_2 \in [0, 1)$.
    - `eps`: added to the denominator outside the square root.
    - `eps_root`: added inside the square root.
    - `mu_dtype`, `nu_dtype`: dtype to store the first and second moment in
      (default: the params'), or a `eqopt.Quantized` format: 8-bit or 4-bit
      codes with a scale per block (see the Memory page).
      Optax has no `nu_dtype`.
    - `nesterov`: use Dozat's Nesterov momentum (this is `eqopt.nadam`).

    **Returns:** an `eqopt.Chain`.

    **References:** Kingma & Ba, *Adam: A Method for Stochastic Optimization*,
    ICLR 2015.
    """
    return Chain(
        ScaleByAdam(
            b1=b1,
            b2=b2,
            eps=eps,
            eps_root=eps_root,
            mu_dtype=mu_dtype,
            nu_dtype=nu_dtype,
            nesterov=nesterov,
        ),
        ScaleByLearningRate(learning_rate=learning_rate),
    )


@checked
def nadam(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    mu_dtype: MomentDType = None,
    *,
    nesterov: bool = True,
    nu_dtype: MomentDType = None,
) -> Chain:
    r"""NAdam: Adam with Nesterov momentum.

    $$
    u_t = -\eta_t\, \frac{\beta_1 m_t / (1 - \beta_1^{t+1}) + (1 - \beta_1)\, g_t / (1 - \beta_1^t)}
                       {\sqrt{\hat v_t + \epsilon_{\text{root}}} + \epsilon}
    $$

    with $m_t$, $\hat v_t$ as in `eqopt.adam`. This is `adam(...,
    nesterov=True)`.

    **Arguments:** as `eqopt.adam`.

    **Returns:** an `eqopt.Chain`.

    **References:** Dozat, *Incorporating Nesterov Momentum into Adam*, ICLR
    2016 workshop.
    """
    return adam(
        learning_rate=learning_rate,
        b1=b1,
        b2=b2,
        eps=eps,
        eps_root=eps_root,
        mu_dtype=mu_dtype,
        nu_dtype=nu_dtype,
        nesterov=nesterov,
    )


@checked
def adamw(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    mu_dtype: MomentDType = None,
    weight_decay: ScalarOrSchedule = 1e-4,
    mask: FilterSpec | None = None,
    *,
    nesterov: bool = False,
    nu_dtype: MomentDType = None,
    cautious_weight_decay: bool = False,
) -> Chain:
    r"""AdamW: Adam with weight decay decoupled from the adaptive scaling.

    $$
    u_t = -\eta_t \left( \frac{\hat m_t}{\sqrt{\hat v_t + \epsilon_{\text{root}}} + \epsilon}
                         + \lambda\, \theta_{t-1} \right)
    $$

    with $\hat m_t, \hat v_t$ Adam's bias-corrected moments. The chain is
    `eqopt.ScaleByAdam`, `eqopt.AddDecayedWeights`,
    `eqopt.ScaleByLearningRate`; `update` needs `params`.

    `mask` selects the parameters to decay with an Equinox filter spec: a bool,
    a per-leaf predicate such as `lambda x: x.ndim > 1` (decay matrices, not
    biases), or a prefix pytree of these (for example built with `eqx.tree_at`
    on the model). A full boolean pytree, Optax's kind of mask, is one such spec.
    Unlike Optax, a callable is always a per-leaf predicate, never a function of
    the whole params.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `b1`, `b2`, `eps`, `eps_root`, `mu_dtype`, `nu_dtype`: as `eqopt.adam`.
    - `weight_decay`: $\lambda$, a number or a schedule.
    - `mask`: the filter spec of the leaves to decay (default: all).
    - `nesterov`: use Nesterov momentum (this is `eqopt.nadamw`).
    - `cautious_weight_decay`: as `cautious` of `eqopt.AddDecayedWeights`.

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        opt = eqopt.adamw(
            learning_rate=eqopt.warmup_cosine_decay_schedule(0.0, 1e-3, 100, 10_000),
            weight_decay=1e-4,
            mask=lambda x: x.ndim > 1,        # decay the weight matrices only
        )
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)   # params: for the decay
        model = eqopt.apply_updates(model, updates)
        state.scale_by_adam.mu       # the first moment; `nu` is the second
        ```

    **References:** Loshchilov & Hutter, *Decoupled Weight Decay
    Regularization*, ICLR 2019.
    """
    return Chain(
        ScaleByAdam(
            b1=b1,
            b2=b2,
            eps=eps,
            eps_root=eps_root,
            mu_dtype=mu_dtype,
            nu_dtype=nu_dtype,
            nesterov=nesterov,
        ),
        AddDecayedWeights(
            weight_decay=weight_decay, mask=mask, cautious=cautious_weight_decay
        ),
        ScaleByLearningRate(learning_rate=learning_rate),
    )


@checked
def nadamw(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    mu_dtype: MomentDType = None,
    weight_decay: ScalarOrSchedule = 1e-4,
    mask: FilterSpec | None = None,
    *,
    nesterov: bool = True,
    nu_dtype: MomentDType = None,
) -> Chain:
    r"""NAdamW: NAdam with decoupled weight decay.

    $$
    u_t = -\eta_t \left( \frac{\beta_1 m_t / (1 - \beta_1^{t+1}) + (1 - \beta_1)\, g_t / (1 - \beta_1^t)}
                              {\sqrt{\hat v_t + \epsilon_{\text{root}}} + \epsilon}
                         + \lambda\, \theta_{t-1} \right)
    $$

    This is `adamw(..., nesterov=True)`; `mask` is a filter spec as in
    `eqopt.adamw`.

    **Arguments:** as `eqopt.adamw`.

    **Returns:** an `eqopt.Chain`.

    **References:** Dozat, *Incorporating Nesterov Momentum into Adam*, ICLR
    2016 workshop; Loshchilov & Hutter, *Decoupled Weight Decay
    Regularization*, ICLR 2019.
    """
    return adamw(
        learning_rate=learning_rate,
        b1=b1,
        b2=b2,
        eps=eps,
        eps_root=eps_root,
        mu_dtype=mu_dtype,
        weight_decay=weight_decay,
        mask=mask,
        nesterov=nesterov,
        nu_dtype=nu_dtype,
    )


@checked
def amsgrad(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    eps_root: ScalarLike = 0.0,
    mu_dtype: DTypeLike | None = None,
    bias_correction_mu: bool = True,
    bias_correction_nu: bool = True,
) -> Chain:
    r"""AMSGrad: Adam whose second moment never decreases.

    $$
    \hat v^{\max}_t = \max(\hat v^{\max}_{t-1}, \hat v_t), \qquad
    u_t = -\eta_t\, \frac{\hat m_t}{\sqrt{\hat v^{\max}_t + \epsilon_{\text{root}}} + \epsilon}
    $$

    The chain is `eqopt.ScaleByAmsgrad`, then `eqopt.ScaleByLearningRate`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `b1`, `b2`, `eps`, `eps_root`, `mu_dtype`: as `eqopt.adam`.
    - `bias_correction_mu`, `bias_correction_nu`: divide $m_t$, $v_t$ by
      $1 - \beta^t$ (default); `False` for both is the paper's algorithm.

    **Returns:** an `eqopt.Chain`.

    **References:** Reddi, Kale & Kumar, *On the Convergence of Adam and Beyond*,
    ICLR 2018.
    """
    return Chain(
        ScaleByAmsgrad(
            b1=b1,
            b2=b2,
            eps=eps,
            eps_root=eps_root,
            mu_dtype=mu_dtype,
            bias_correction_mu=bias_correction_mu,
            bias_correction_nu=bias_correction_nu,
        ),
        ScaleByLearningRate(learning_rate=learning_rate),
    )


@checked
def adamax(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
) -> Chain:
    r"""AdaMax: Adam with the infinity norm in place of the second moment.

    $$
    m_t = \beta_1 m_{t-1} + (1 - \beta_1) g_t, \qquad
    s_t = \max(\beta_2 s_{t-1}, |g_t| + \epsilon), \qquad
    u_t = -\eta_t\, \frac{m_t}{(1 - \beta_1^t)\, s_t}
    $$

    The chain is `eqopt.ScaleByAdamax`, then `eqopt.ScaleByLearningRate`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `b1`, `b2`: the decay rates.
    - `eps`: added to $|g|$.

    **Returns:** an `eqopt.Chain`.

    **References:** Kingma & Ba, *Adam: A Method for Stochastic Optimization*,
    ICLR 2015, §7.1.
    """
    return Chain(
        ScaleByAdamax(b1=b1, b2=b2, eps=eps),
        ScaleByLearningRate(learning_rate=learning_rate),
    )


@checked
def adamaxw(
    learning_rate: ScalarOrSchedule,
    b1: ScalarLike = 0.9,
    b2: ScalarLike = 0.999,
    eps: ScalarLike = 1e-8,
    weight_decay: ScalarOrSchedule = 1e-4,
    mask: FilterSpec | None = None,
) -> Chain:
    r"""AdaMaxW: AdaMax with decoupled weight decay.

    $$ u_t = -\eta_t \left( \frac{m_t}{(1 - \beta_1^t)\, s_t} + \lambda\, \theta_{t-1} \right) $$

    with $m_t$, $s_t$ as in `eqopt.adamax`. `mask` is an Equinox filter spec
    as in `eqopt.adamw` (a callable is a per-leaf predicate).

    **Arguments:**

    - `learning_rate`, `b1`, `b2`, `eps`: as `eqopt.adamax`.
    - `weight_decay`: $\lambda$, a number or a schedule.
    - `mask`: the filter spec of the leaves to decay (default: all).

    **Returns:** an `eqopt.Chain`.

    **References:** Kingma & Ba, ICLR 2015, §7.1; Loshchilov & Hutter,
    *Decoupled Weight Decay Regularization*, ICLR 2019.
    """
    return Chain(
        ScaleByAdamax(b1=b1, b2=b2, eps=eps),
        AddDecayedWeights(weight_decay=weight_decay, mask=mask),
        ScaleByLearningRate(learning_rate=learning_rate),
    )


@checked
def rmsprop(
    learning_rate: ScalarOrSchedule,
    decay: ScalarLike = 0.9,
    eps: ScalarLike = 1e-8,
    initial_scale: ScalarLike = 0.0,
    eps_in_sqrt: bool = True,
    centered: bool = False,
    momentum: ScalarLike | None = None,
    nesterov: bool = False,
    bias_correction: bool = False,
    *,
    nu_dtype: MomentDType = None,
) -> Chain:
    r"""RMSProp: divides the step by a running root mean square of the gradients.

    $$
    v_t = \rho\, v_{t-1} + (1 - \rho)\, |g_t|^2, \qquad
    u_t = -\eta_t\, \frac{g_t}{\sqrt{v_t + \epsilon}}
    $$

    `centered=True` divides by a running standard deviation instead,
    $\sqrt{v_t - |m_t|^2 + \epsilon}$ with $m_t$ the running mean (Graves, 2013).
    With `momentum`, the scaled step then goes through (Nesterov) momentum, as in
    `eqopt.sgd`. `eps_in_sqrt=False` puts $\epsilon$ outside the root, as
    PyTorch does. The chain is `eqopt.ScaleByRms` (or
    `eqopt.ScaleByStddev`), `eqopt.ScaleByLearningRate`, then
    `eqopt.Trace` or `eqopt.Identity`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `decay`: $\rho$.
    - `eps`: $\epsilon$.
    - `initial_scale`: the initial value of $v$.
    - `eps_in_sqrt`: add $\epsilon$ inside the square root.
    - `centered`: divide by the standard deviation, not the root mean square.
    - `momentum`: momentum decay, or `None`.
    - `nesterov`: Nesterov momentum.
    - `bias_correction`: divide the moments by $1 - \rho^t$.
    - `nu_dtype`: dtype or `eqopt.Quantized` format to store $v$ in
      (uncentred only; Optax has no such option).

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        opt = eqopt.rmsprop(learning_rate=1e-3, decay=0.9, centered=True, momentum=0.9)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
        ```

    **References:** Tieleman & Hinton, *Lecture 6.5 — RMSProp*, COURSERA:
    Neural Networks for Machine Learning, 2012; Graves, *Generating Sequences
    With Recurrent Neural Networks*, 2013 (centred).
    """
    if centered and nu_dtype is not None:
        raise ValueError("rmsprop: `nu_dtype` is for the uncentred RMSProp only.")
    make = (
        ScaleByStddev if centered else functools.partial(ScaleByRms, nu_dtype=nu_dtype)
    )
    scaling = make(
        decay=decay,
        eps=eps,
        initial_scale=initial_scale,
        eps_in_sqrt=eps_in_sqrt,
        bias_correction=bias_correction,
    )
    return Chain(
        scaling,
        ScaleByLearningRate(learning_rate=learning_rate),
        _momentum(momentum, nesterov),
    )


@checked
def adagrad(
    learning_rate: ScalarOrSchedule,
    initial_accumulator_value: ScalarLike = 0.1,
    eps: ScalarLike = 1e-7,
) -> Chain:
    r"""Adagrad: divides the step by the root of the sum of all squared gradients so far.

    $$
    s_t = s_{t-1} + |g_t|^2, \qquad u_t = -\eta_t\, \frac{g_t}{\sqrt{s_t + \epsilon}}
    $$

    The effective step only shrinks, so Adagrad suits sparse or convex problems
    better than long non-convex training. The chain is `eqopt.ScaleByRss`,
    then `eqopt.ScaleByLearningRate`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `initial_accumulator_value`: $s_0 \ge 0$.
    - `eps`: $\epsilon$.

    **Returns:** an `eqopt.Chain`.

    !!! example

        ```python
        opt = eqopt.adagrad(learning_rate=1e-1)
        state = opt.init(model)
        updates, state = opt.update(grads, state, model)
        state.scale_by_rss.sum_of_squares   # the accumulated squared gradients
        ```

    **References:** Duchi, Hazan & Singer, *Adaptive Subgradient Methods for
    Online Learning and Stochastic Optimization*, JMLR 12, 2011.
    """
    return Chain(
        ScaleByRss(initial_accumulator_value=initial_accumulator_value, eps=eps),
        ScaleByLearningRate(learning_rate=learning_rate),
    )


@checked
def lars(
    learning_rate: ScalarOrSchedule,
    weight_decay: ScalarOrSchedule = 0.0,
    weight_decay_mask: FilterSpec | None = True,
    trust_coefficient: ScalarLike = 0.001,
    eps: ScalarLike = 0.0,
    trust_ratio_mask: FilterSpec | None = True,
    momentum: ScalarLike = 0.9,
    nesterov: bool = False,
) -> Chain:
    r"""LARS: SGD with momentum on weight-decayed gradients rescaled by a per-layer trust ratio.

    $$
    r_t = g_t + \lambda\, \theta_{t-1}, \qquad
    m_t = \mu\, m_{t-1} - \eta_t\, c\, \frac{\|\theta_{t-1}\|}{\|r_t\| + \epsilon}\, r_t,
    \qquad u_t = m_t
    $$

    per leaf (the ratio is 1 where a norm is zero; with `nesterov`, $u_t = -\eta_t
    c\,(\dots) + \mu\, m_t$). The chain is `eqopt.AddDecayedWeights`,
    `eqopt.Masked` `eqopt.ScaleByTrustRatio`,
    `eqopt.ScaleByLearningRate`, `eqopt.Trace`; `update` needs
    `params`.

    `weight_decay_mask` and `trust_ratio_mask` are Equinox filter specs (a
    bool, a per-leaf predicate such as `lambda x: x.ndim > 1`, or a prefix
    pytree of these; a full boolean pytree still works). Unlike Optax, a
    callable is always a per-leaf predicate, never a function of the whole
    params. The paper excludes biases and normalisation scales from both, for
    example with `lambda x: x.ndim > 1`.

    **Arguments:**

    - `learning_rate`: $\eta$, a number or a schedule of the step count.
    - `weight_decay`: $\lambda$, a number or a schedule.
    - `weight_decay_mask`: the filter spec of the leaves to decay (default: all).
    - `trust_coefficient`: $c$.
    - `eps`: $\epsilon$, added to the norm of $r_t$.
    - `trust_ratio_mask`: the filter spec of the leaves rescaled by the trust
      ratio (default: all; `None` also means all).
    - `momentum`: $\mu$.
    - `nesterov`: use Nesterov momentum.

    **Returns:** an `eqopt.Chain`.

    **References:** You, Gitman & Ginsburg, *Large Batch Training of
    Convolutional Networks*, arXiv:1708.03888, 2017.
    """
    return Chain(
        AddDecayedWeights(weight_decay=weight_decay, mask=weight_decay_mask),
        Masked(
            ScaleByTrustRatio(trust_coefficient=trust_coefficient, eps=eps),
            True if trust_ratio_mask is None else trust_ratio_mask,
        ),
        ScaleByLearningRate(learning_rate),
        Trace(decay=momentum, nesterov=nesterov),
    )
