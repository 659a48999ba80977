"""Muon: momentum orthogonalised by Newton–Schulz iterations."""

import dataclasses
from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._alias import adamw
from .._base import AbstractGradientTransformation, EmptyState, Params, Updates
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
from .._numerics import debias, safe_int32_increment
from .._optax_tuple import OptaxTuple
from .._quantize import MomentDType, cast_moment, moment_like
from .._transform.basic import ScaleByLearningRate
from .._transform.decay import AddDecayedWeights
from .._typecheck import checked
from ._dimension_numbers import (
    _AbstractDimensionNumbers,
    fans,
    layer_oriented,
    resolve_dimension_numbers,
    selection_spec,
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


@dataclasses.dataclass(frozen=True)
class MuonDimensionNumbers(_AbstractDimensionNumbers):
    r"""Which axes of a parameter Muon treats as the rows and columns of a matrix.

    A weight used as $x W = y$ has its *reduction* axes (contracted with the
    input) as rows and its *output* axes as columns; the default is a plain
    matrix, rows on axis 0 and columns on axis 1 (Optax's convention, as a Flax
    `(in, out)` kernel). Every other axis is a batch axis: each slice along the
    batch axes is orthogonalised on its own. For a convolution kernel of shape
    `(out, in, kh, kw)`, for example,
    `MuonDimensionNumbers(reduction_axis=(1, 2, 3), output_axis=0)`.

    You rarely need these for an Equinox model: where a spec says `True` (or
    a predicate returns `True`) for a weight of a known Equinox layer, the
    dimension numbers are the layer's own (see "Orientation" in
    `eqopt.contrib.ScaleByMuon`). Dimension numbers you pass always win.

    Unlike Optax's NamedTuple, this is a frozen dataclass: a single pytree
    leaf, so it can sit in a filter spec next to bools and predicates.

    **Arguments:**

    - `reduction_axis`: an axis or a sequence of axes (negative counts from the end).
    - `output_axis`: an axis or a sequence of axes.
    """


@checked
class MuonState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.ScaleByMuon`: the step count and the momentum.

    The momentum is `None` at leaves that Muon does not orthogonalise. (Optax's
    state also holds the Newton–Schulz coefficients; here they are a
    hyperparameter of the transform.)
    """

    count: Int[Array, ""]
    mu: Updates


@checked
class ScaleByMuon(AbstractGradientTransformation):
    r"""Orthogonalises the Nesterov momentum of each matrix (Muon).

    For each selected matrix $G_t$ (see `weight_dimension_numbers`):

    $$
    \begin{aligned}
    M_t &= \beta M_{t-1} + (1 - \beta) G_t \\
    \hat M_t &= \beta\, \frac{M_t}{1 - \beta^{t+1}} + (1 - \beta)\, \frac{G_t}{1 - \beta^t}
      \quad\text{(Nesterov; else } \hat M_t = M_t / (1 - \beta^t)\text{)} \\
    X_0 &= \hat M_t / (\|\hat M_t\|_F + \epsilon), \qquad
    X_{k+1} = a X_k + \big(b\, X_k X_k^H + c\, (X_k X_k^H)^2\big) X_k \\
    u_t &= X_K \;\approx\; U V^H \quad\text{where } \hat M_t = U S V^H
    \end{aligned}
    $$

    The quintic Newton–Schulz iteration drives every singular value towards
    (roughly) one, so the update is the nearest semi-orthogonal matrix to the
    momentum: steepest descent under the spectral norm. With a matrix taller
    than wide the iteration runs on its transpose. With `adaptive=True` the
    result is scaled by the nuclear norm estimate $\langle \hat M_t, u_t\rangle$
    (Bernstein & Newhouse, 2024).

    Leaves that `weight_dimension_numbers` does not select pass through
    unchanged and keep no momentum. Non-matrix leaves usually go to Adam:
    `eqopt.contrib.muon` does that.

    **Orientation.** Which axes are a matrix's input (rows) and output
    (columns) does not change the orthogonalised direction, but it does change
    the shape factor of `eqopt.contrib.ScaleByShape`, NorMuon's neurons
    and GaLore's sides. The model knows its layers: a weight of a known
    Equinox layer is read as the layer uses it, whatever Optax's convention:

    | leaf | reduction (input) axes | output axes |
    |---|---|---|
    | `eqx.nn.Linear.weight` `(out, in)` (also in `MLP`, and the projections of `MultiheadAttention`) | 1 | 0 |
    | `eqx.nn.Conv*.weight`, `eqx.nn.ConvTranspose*.weight` `(out, in, *kernel)` | 1, 2, ... | 0 |
    | `eqx.nn.Embedding.weight` `(num_embeddings, dim)` | 0 | 1 |
    | `eqx.nn.GRUCell`/`LSTMCell` `weight_ih`, `weight_hh` | 1 | 0 |
    | any other leaf (a bare array, a custom module's field) | 0 | 1 (Optax's convention, as a Flax `(in, out)` kernel) |

    The layer is read from `updates` (or `params`), which `eqx.filter_grad`
    returns as Modules of the same types. Dimension numbers given explicitly
    (a `eqopt.contrib.MuonDimensionNumbers` in the spec, or returned by a
    predicate) always win. This differs on purpose from Optax, which applies
    its `(in, out)` convention to an `eqx.nn.Linear` weight and so transposes
    its shape factor.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `ns_coeffs`: the coefficients $(a, b, c)$, or one row of them per
      iteration (shape `(n, 3)`, then `ns_steps` is ignored), or a preset name
      (`"standard"`, `"dion"`, or `"polar_express"`: Amsel et al.'s five
      optimal quintics, see `eqopt.contrib.polar_express_coefficients`
      for other counts).
    - `ns_steps`: the number of iterations $K$ (static).
    - `beta`: the momentum decay $\beta \in [0, 1)$.
    - `eps`: added to the norm before dividing.
    - `mu_dtype`: dtype to store the momentum in (default: the params'), or a
      `eqopt.Quantized` format.
    - `nesterov`: use Nesterov momentum (default) or plain momentum.
    - `adaptive`: scale by the dual norm of the momentum.
    - `preconditioning`: how $X_0$ is scaled before iterating: `"frobenius"`
      (above), `"spectral"` (by the largest singular value: exact, costs an
      SVD), `"aol"` (row rescaling from $|X X^H|$ folded into the first
      iteration, Boissin et al. 2025) or `"schatten"` (by the Schatten-4 norm,
      Grishina et al. 2025).
    - `orthogonalization`: `"newton_schulz"` (above) or `"gram"`: the same
      quintics iterated on the Gram matrix of the short side, with one
      restart (Zhang, Amsel, Chen & Dao, 2026); cheaper for rectangular ones.
    - `weight_dimension_numbers`: which leaves are matrices, and how to view
      them as matrices. `None` (default): every trainable leaf is a matrix,
      oriented as above. Otherwise an Equinox filter spec whose leaves may
      also be `eqopt.contrib.MuonDimensionNumbers`: a predicate such as
      `lambda x: x.ndim == 2`, a prefix pytree built with `eqx.tree_at`, or
      Optax's tree of dimension numbers with `None` for leaves to skip.
      Unlike Optax, a callable is applied to each leaf (it returns a bool,
      dimension numbers or `None`), never to the whole params. `True` means
      the orientation above; explicit dimension numbers are used as given.

    **References:** Jordan et al., *Muon: An optimizer for hidden layers in
    neural networks*, 2024 (kellerjordan.github.io/posts/muon); Bernstein &
    Newhouse, *Old Optimizer, New Norm: An Anthology*, arXiv:2409.20325, 2024;
    Amsel et al., *The Polar Express*, arXiv:2505.16932, 2025.
    """

    ns_coeffs: Float[Array | np.ndarray, "3"] | Float[Array | np.ndarray, "steps 3"] = (
        eqx.field(default=_DEFAULT_NS_COEFFS, converter=_as_coefficients)
    )
    ns_steps: int = eqx.field(default=5, static=True)
    beta: Scalar = eqx.field(default=0.95, converter=as_scalar)
    eps: Scalar = eqx.field(default=1e-8, converter=as_scalar)
    mu_dtype: MomentDType = eqx.field(default=None, static=True)
    nesterov: bool = eqx.field(default=True, static=True)
    adaptive: bool = eqx.field(default=False, static=True)
    preconditioning: Preconditioning = eqx.field(default="frobenius", static=True)
    weight_dimension_numbers: Any = None
    orthogonalization: Orthogonalization = eqx.field(
        default="newton_schulz", static=True
    )

    def __check_init__(self):
        check_decays(self, "beta")
        check_orthogonalizer(
            "ScaleByMuon", self.orthogonalization, self.preconditioning, self.ns_steps
        )
        check_hyperparameter("eps", self.eps, low=0.0)
        shape = self.ns_coeffs.shape
        if not (len(shape) == 1 and shape == (3,) or len(shape) == 2 and shape[1] == 3):
            raise ValueError(
                f"ScaleByMuon: `ns_coeffs` must have shape (3,) or (n, 3), got {shape}."
            )

    @property
    def elementwise(self) -> bool:
        return False

    def _dimension_numbers(self, tree: Any) -> Any:
        return matrix_dimension_numbers(self.weight_dimension_numbers, tree, "Muon")

    @init_entry
    def init(self, params: Params) -> MuonState:
        dims = self._dimension_numbers(params)

        def zeros(p, d):
            if d is None:
                return None
            return moment_like(p, self.mu_dtype or p.dtype)

        mu = jax.tree.map(zeros, params, dims, is_leaf=lambda x: x is None)
        return MuonState(count=jnp.zeros([], jnp.int32), mu=mu)

    @update_entry
    def update(
        self,
        updates: Updates,
        state: MuonState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, MuonState]:
        dims = self._dimension_numbers(updates if params is None else params)
        beta, eps = self.beta, self.eps
        count = safe_int32_increment(state.count)
        one_minus_beta = 1 - beta
        correction = 1 - beta**count
        next_correction = 1 - beta ** safe_int32_increment(count)

        @no_type_check
        def step(g, mu, d):
            if d is None:
                return g, mu
            mu_dtype = mu.dtype
            mu = beta * mu + one_minus_beta * g
            if self.nesterov:
                mu_hat = beta * debias(mu, next_correction) + one_minus_beta * debias(
                    g, correction
                )
            else:
                mu_hat = debias(mu, correction)
            update = orthogonalize(
                mu_hat,
                d,
                self.ns_coeffs,
                self.ns_steps,
                self.preconditioning,
                eps,
                self.orthogonalization,
            )
            if self.adaptive:
                update = jnp.sum(mu_hat.conj() * update) * update
            return update.astype(g.dtype), cast_moment(mu, self.mu_dtype or mu_dtype)

        updates, mu = leafwise(step, updates, state.mu, dims, n_out=2)
        return updates, MuonState(count=count, mu=mu)


@checked
def scale_by_muon(
    ns_coeffs: Coefficients = _DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: ScalarLike = 0.95,
    eps: ScalarLike = 1e-8,
    mu_dtype: MomentDType = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: Preconditioning = "frobenius",
    weight_dimension_numbers: Any = None,
    orthogonalization: Orthogonalization = "newton_schulz",
) -> ScaleByMuon:
    """Optax spelling of `eqopt.contrib.ScaleByMuon`.

    `weight_dimension_numbers` is a filter spec whose leaves may be
    `eqopt.contrib.MuonDimensionNumbers`; a callable is applied per leaf.
    """
    return ScaleByMuon(
        ns_coeffs=ns_coeffs,
        ns_steps=ns_steps,
        beta=beta,
        eps=eps,
        mu_dtype=mu_dtype,
        nesterov=nesterov,
        adaptive=adaptive,
        preconditioning=preconditioning,
        weight_dimension_numbers=weight_dimension_numbers,
        orthogonalization=orthogonalization,
    )


@checked
class ScaleByShape(AbstractGradientTransformation):
    r"""Scales each orthogonalised matrix by a factor of its shape (Muon's second step).

    With $n_{\text{in}}$ and $n_{\text{out}}$ the sizes of a leaf's reduction
    and output axes:

    $$
    u \mapsto \begin{cases}
    \sqrt{\max(1, n_{\text{out}} / n_{\text{in}})}\; u & \text{(default: width transfer)} \\
    \rho \sqrt{\max(n_{\text{in}}, n_{\text{out}})}\; u & \text{(with consistent RMS } \rho\text{)}
    \end{cases}
    $$

    The first keeps the spectral norm per unit of input width (Jordan et al.,
    2024); the second makes the update's root mean square about $\rho$ whatever
    the shape, like AdamW's (Liu et al., 2025, who recommend $\rho = 0.2$).
    Leaves the spec does not select pass through.

    Which axes are $n_{\text{in}}$ and $n_{\text{out}}$ is read from the
    Equinox layer a leaf belongs to (an `eqx.nn.Linear(16, 32)` weight, stored
    `(32, 16)`, gets $\sqrt 2$), else from Optax's convention (axis 0 is the
    input); see "Orientation" in `eqopt.contrib.ScaleByMuon`.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers.

    **Arguments:**

    - `weight_dimension_numbers`: as for `eqopt.contrib.ScaleByMuon`.
    - `consistent_rms`: $\rho$, or `None` for the width-transfer scale.

    **References:** Liu et al., *Muon is Scalable for LLM Training*,
    arXiv:2502.16982, 2025.
    """

    weight_dimension_numbers: Any = None
    consistent_rms: Scalar | None = eqx.field(
        default=None, converter=as_optional_scalar
    )

    @property
    def elementwise(self) -> bool:
        return False

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
        spec = (
            True
            if self.weight_dimension_numbers is None
            else self.weight_dimension_numbers
        )
        tree = updates if params is None else params
        dims = resolve_dimension_numbers(
            spec,
            tree,
            MuonDimensionNumbers,
            owner="Muon",
            batch_axes=True,
            default=layer_oriented(tree, MuonDimensionNumbers),
        )

        @no_type_check
        def step(u, d):
            if d is None:
                return u
            fan_in, fan_out = fans(u.shape, d)
            if self.consistent_rms is None:
                factor = jnp.sqrt(jnp.maximum(1, fan_out / fan_in))
            else:
                factor = jnp.sqrt(jnp.maximum(fan_in, fan_out)) * self.consistent_rms
            return factor * u

        return leafwise(step, updates, dims), state


def matrix_dimension_numbers(
    spec: Any, tree: Any, owner: str, batch_axes: bool = True
) -> Any:
    """The `MuonDimensionNumbers` (or `None`) of each leaf of `tree` for a
    transform of Muon's family: `spec` resolved (`None`: every leaf it takes, as
    its layer orients it, Optax's convention for a bare array)."""
    return resolve_dimension_numbers(
        True if spec is None else spec,
        tree,
        MuonDimensionNumbers,
        owner=owner,
        batch_axes=batch_axes,
        default=layer_oriented(tree, MuonDimensionNumbers),
    )


def _is_matrix(x: Any) -> bool:
    return x.ndim == 2


@checked
def muon(
    learning_rate: ScalarOrSchedule,
    ns_coeffs: Coefficients = _DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: ScalarLike = 0.95,
    eps: ScalarLike = 1e-8,
    weight_decay: ScalarOrSchedule = 0.0,
    weight_decay_mask: FilterSpec | None = None,
    mu_dtype: MomentDType = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: Preconditioning = "frobenius",
    adam_b1: ScalarLike = 0.9,
    adam_b2: ScalarLike = 0.999,
    adam_eps_root: ScalarLike = 0.0,
    adam_weight_decay: ScalarOrSchedule = 0.0,
    adam_learning_rate: ScalarOrSchedule | None = None,
    muon_weight_dimension_numbers: Any = None,
    consistent_rms: ScalarLike | None = None,
    adam_eps: ScalarLike | None = None,
    adam_nesterov: bool | None = None,
    orthogonalization: Orthogonalization = "newton_schulz",
    cautious_weight_decay: bool = False,
) -> Partition:
    r"""Muon for the matrices, AdamW for every other leaf.

    The selected matrices are updated by

    $$
    u_t = -\eta_t \big( s \cdot \operatorname{NS}(\hat M_t) + \lambda\, W_{t-1} \big)
    $$

    with $\operatorname{NS}(\hat M_t)$ the Newton–Schulz orthogonalisation of
    the (Nesterov) momentum (`eqopt.contrib.ScaleByMuon`) and $s$ the shape
    factor of `eqopt.contrib.ScaleByShape`. Every other leaf (biases,
    scalars, embeddings you leave out) is trained by `eqopt.adamw` with
    the `adam_*` hyperparameters and Muon's `mu_dtype`.

    **The Adam part's `eps` and `nesterov`.** As in Optax, they default to
    Muon's: `muon(lr, nesterov=True)` (the default) makes the other leaves'
    optimiser NAdam, and `eps` is shared. The reference implementation
    (Jordan et al.'s `MuonWithAuxAdam`) runs a plain Adam with its own `eps`
    there: pass `adam_nesterov=False` (and `adam_eps=`) for that.

    **Orientation on Equinox models.** The shape factor $s =
    \sqrt{\max(1, n_{\text{out}} / n_{\text{in}})}$ reads which axis is the
    input from the Equinox layer a weight belongs to: an `eqx.nn.Linear`
    weight is `(out, in)`, so `eqx.nn.Linear(16, 32)` gets $\sqrt 2$ and
    `eqx.nn.Linear(32, 8)` gets 1, as in the authors' Muon. Optax reads every
    matrix as a Flax `(in, out)` kernel and gives the transposed factors on
    such a model; a bare array (or a custom module's field) keeps Optax's
    convention here too, and explicit `eqopt.contrib.MuonDimensionNumbers`
    always win. See "Orientation" in `eqopt.contrib.ScaleByMuon`.

    The result is a `eqopt.Partition` with groups `"muon"` (the chain
    `scale_by_muon`, `scale_by_shape`, `add_decayed_weights`,
    `scale_by_learning_rate`) and `"adam"`.

    **Which leaves get Muon** is an Equinox filter spec, given as
    `muon_weight_dimension_numbers`:

    - `None` (default): every 2-D leaf, i.e. the predicate `lambda x: x.ndim == 2`;
    - a per-leaf predicate, e.g. `lambda x: x.ndim == 2 and x.shape[0] > 16`;
    - a prefix pytree of bools built with `eqx.tree_at` on the model, e.g. only
      the hidden layers of an MLP;
    - Optax's tree of `eqopt.contrib.MuonDimensionNumbers` (with `None` for
      Adam leaves), which also says how to view higher-rank leaves as matrices.
      A predicate may return dimension numbers too.

    Unlike Optax, a callable is applied to each leaf, never to the whole params.

    !!! example

        ```python
        hidden = jax.tree.map(lambda _: False, model)
        hidden = eqx.tree_at(
            lambda m: [layer.weight for layer in m.layers[1:-1]],
            hidden,
            replace_fn=lambda _: True,
        )
        opt = eqopt.contrib.muon(0.02, muon_weight_dimension_numbers=hidden,
                                 adam_learning_rate=3e-3)
        ```

    **Arguments:**

    - `learning_rate`: $\eta$ for the Muon group, a number or a schedule.
    - `ns_coeffs`, `ns_steps`, `beta`, `eps`, `mu_dtype`, `nesterov`,
      `adaptive`, `preconditioning`, `orthogonalization`: as for
      `eqopt.contrib.ScaleByMuon`.
    - `weight_decay`: $\lambda$ for the Muon group (multiplied by the learning rate).
    - `weight_decay_mask`: a filter spec of the Muon leaves to decay.
    - `cautious_weight_decay`: decay only the entries whose update agrees
      with them in sign (see `eqopt.AddDecayedWeights`), in both groups.
    - `adam_b1`, `adam_b2`, `adam_eps_root`, `adam_weight_decay`: AdamW's
      hyperparameters for the other leaves.
    - `adam_learning_rate`: AdamW's learning rate (default: `learning_rate`).
    - `muon_weight_dimension_numbers`: the Muon leaves, as above.
    - `consistent_rms`: see `eqopt.contrib.ScaleByShape`.
    - `adam_eps`: AdamW's $\epsilon$ (default: `eps`, as Optax).
    - `adam_nesterov`: whether AdamW uses Nesterov momentum, i.e. NAdam
      (default: `nesterov`, as Optax).

    **Returns:** an `eqopt.Partition`.

    **References:** Jordan et al., *Muon: An optimizer for hidden layers in
    neural networks*, 2024; Bernstein & Newhouse, *Old Optimizer, New Norm: An
    Anthology*, arXiv:2409.20325, 2024; Liu et al., *Muon is Scalable for LLM
    Training*, arXiv:2502.16982, 2025.
    """
    if adam_learning_rate is None:
        adam_learning_rate = learning_rate
    spec = (
        _is_matrix
        if muon_weight_dimension_numbers is None
        else muon_weight_dimension_numbers
    )
    muon_part = Chain(
        ScaleByMuon(
            ns_coeffs=ns_coeffs,
            ns_steps=ns_steps,
            beta=beta,
            eps=eps,
            mu_dtype=mu_dtype,
            nesterov=nesterov,
            adaptive=adaptive,
            preconditioning=preconditioning,
            weight_dimension_numbers=spec,
            orthogonalization=orthogonalization,
        ),
        ScaleByShape(weight_dimension_numbers=spec, consistent_rms=consistent_rms),
        AddDecayedWeights(
            weight_decay, weight_decay_mask, cautious=cautious_weight_decay
        ),
        ScaleByLearningRate(learning_rate),
    )
    adam_part = adamw(
        learning_rate=adam_learning_rate,
        b1=adam_b1,
        b2=adam_b2,
        eps=eps if adam_eps is None else adam_eps,
        eps_root=adam_eps_root,
        mu_dtype=mu_dtype,
        weight_decay=adam_weight_decay,
        nesterov=nesterov if adam_nesterov is None else adam_nesterov,
        cautious_weight_decay=cautious_weight_decay,
    )
    return _matrices_and_the_rest("muon", muon_part, adam_part, spec)


def _matrices_and_the_rest(
    name: str, matrix_part: Any, rest: Any, spec: Any
) -> Partition:
    """The partition of Muon's family: `matrix_part` on the leaves that the
    dimension-numbers `spec` selects (group `name`), `rest` on the others ("adam")."""
    return Partition(
        {name: matrix_part, "adam": rest},
        {
            name: selection_spec(spec, MuonDimensionNumbers),
            "adam": selection_spec(spec, MuonDimensionNumbers, complement=True),
        },
        # A model of matrices alone leaves "adam" empty: not the user's mistake.
        warn_empty=False,
    )
