"""The diagonal Gaussian that the Monte Carlo gradient estimators are written for."""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._typecheck import checked
from ..losses._utils import ShapeMismatchError


@checked
class MultiNormalDiagFromLogScale(eqx.Module):
    r"""A Gaussian with diagonal covariance, parametrised by its mean and log standard deviation.

    $$ x \sim \mathcal N\big(\mu,\ \operatorname{diag}(\sigma^2)\big), \qquad
       \sigma = e^{s} $$

    The entries are independent; the event shape is the broadcast shape of `loc`
    and `log_scale`, and `log_prob` sums over it.

    **Arguments:**

    - `loc`: the mean $\mu$.
    - `log_scale`: the log standard deviation $s$, broadcastable against `loc`.

    Both are stored as JAX arrays (NumPy arrays and Python floats are converted).
    """

    loc: Float[Array, "..."] = eqx.field(converter=jnp.asarray)
    log_scale: Float[Array, "..."] = eqx.field(converter=jnp.asarray)

    def __check_init__(self):
        # Checked here, not by the annotations: shapes that do not broadcast
        # are a bad value (`ValueError`), as in Optax, and a `TypeError`.
        try:
            jnp.broadcast_shapes(self.loc.shape, self.log_scale.shape)
        except ValueError:
            raise ShapeMismatchError(
                "Incompatible shapes for broadcasting: `loc` has shape "
                f"{self.loc.shape} and `log_scale` {self.log_scale.shape}."
            ) from None

    @property
    def param_shape(self) -> tuple[int, ...]:
        """The event shape: the broadcast shape of `loc` and `log_scale`."""
        return jnp.broadcast_shapes(self.loc.shape, self.log_scale.shape)

    @property
    def scale(self) -> Float[Array, "*shape"]:
        """The standard deviation $\\sigma = e^s$, broadcast to the event shape."""
        return jnp.broadcast_to(jnp.exp(self.log_scale), self.param_shape)

    @property
    def params(self) -> list[Float[Array, "..."]]:
        """The parameters `[loc, log_scale]`, in the order `multi_normal` takes them."""
        return [self.loc, self.log_scale]

    def sample(
        self,
        shape: Sequence[int],
        key: PRNGKeyArray | None = None,
        *,
        seed: PRNGKeyArray | None = None,
    ) -> Float[Array, "..."]:
        """Draws samples $x = \\mu + \\sigma\\,\\varepsilon$, $\\varepsilon \\sim \\mathcal N(0, I)$,
        differentiable with respect to the parameters (reparameterisation).

        **Arguments:**

        - `shape`: the sample shape, prepended to the event shape.
        - `key`: a JAX random key (Optax's name for it).
        - `seed`: the same, under the name the Monte Carlo estimators of older
          Optax releases pass it by; give one of the two.

        **Returns:** an array of shape `tuple(shape) + param_shape`.
        """
        if (key is None) == (seed is None):
            raise TypeError(
                "MultiNormalDiagFromLogScale.sample: give the random key once, as "
                "`key` (or `seed`)."
            )
        key = seed if key is None else key
        full_shape = tuple(shape) + self.param_shape
        dtype = jnp.result_type(self.loc, self.log_scale)
        assert key is not None  # one of the two was given, checked above
        noise = jax.random.normal(key, full_shape, dtype)
        return noise * jnp.broadcast_to(self.scale, full_shape) + jnp.broadcast_to(
            self.loc, full_shape
        )

    def log_prob(self, x: Float[Array, "..."]) -> Float[Array, "..."]:
        """The log-density of `x`, summed over the event axes.

        **Arguments:**

        - `x`: an array whose trailing axes are the event shape.

        **Returns:** an array of the leading (sample) shape of `x`.
        """
        num_event_axes = len(self.param_shape)
        if x.shape[x.ndim - num_event_axes :] != self.param_shape:
            raise ValueError(
                f"`x` of shape {x.shape} does not end with the event shape "
                f"{self.param_shape}."
            )
        loc = jnp.broadcast_to(self.loc, x.shape)
        scale = jnp.broadcast_to(self.scale, x.shape)
        log_density = jax.scipy.stats.norm.logpdf(x, loc, scale)
        return jnp.sum(log_density, axis=tuple(range(x.ndim - num_event_axes, x.ndim)))


@checked
def multi_normal(
    loc: Float[ArrayLike, "..."], log_scale: Float[ArrayLike, "..."]
) -> MultiNormalDiagFromLogScale:
    r"""Builds a diagonal Gaussian from its mean and log standard deviation.

    $$ \mathcal N\big(\text{loc},\ \operatorname{diag}(e^{2\,\text{log\_scale}})\big) $$

    This is the `dist_builder` the estimators in `eqopt.monte_carlo` expect:
    they call `multi_normal(*params)` with `params = [loc, log_scale]`.

    **Arguments:**

    - `loc`: the mean.
    - `log_scale`: the log standard deviation.

    **Returns:** a `eqopt.monte_carlo.MultiNormalDiagFromLogScale`.

    **References:** S. Mohamed, M. Rosca, M. Figurnov and A. Mnih, *Monte Carlo
    Gradient Estimation in Machine Learning*, JMLR 21(132), 2020.
    """
    return MultiNormalDiagFromLogScale(loc, log_scale)
