"""Smoothing a function by random perturbations of its input (Berthet et al., 2020)."""

import abc
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, PyTree

from .._hyper import Scalar, as_scalar, weakly_typed
from .._typecheck import checked


class AbstractNoiseDistribution(eqx.Module):
    """A noise distribution $\\mu$ for `eqopt.perturbations.make_perturbed_fun`:
    it can be sampled and has a log-density known up to a constant.

    Any object with these two methods can be used as noise; subclassing this
    class is optional.
    """

    @abc.abstractmethod
    def sample(
        self,
        key: PRNGKeyArray,
        sample_shape: Sequence[int] = (),
        dtype: DTypeLike = float,
    ) -> Float[Array, "..."]:
        """Draws independent samples.

        **Arguments:**

        - `key`: a JAX random key.
        - `sample_shape`: the shape of the returned array.
        - `dtype`: its floating dtype.

        **Returns:** an array of shape `sample_shape` and dtype `dtype`.
        """

    @abc.abstractmethod
    def log_prob(self, inputs: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        """The elementwise log-density of `inputs`, up to an additive constant.

        **Arguments:**

        - `inputs`: an array of points.

        **Returns:** $\\log \\mu(z)$ for each entry $z$ of `inputs`, up to a constant.
        """


@checked
class Normal(AbstractNoiseDistribution):
    r"""The standard normal distribution.

    $$ \log \mu(z) = -\tfrac12 z^2 + \text{const} $$

    Samples match `jax.random.normal` (and Optax's `Normal`) for the same key.

    **References:** Q. Berthet et al., *Learning with Differentiable Perturbed
    Optimizers*, NeurIPS 2020.
    """

    def sample(
        self,
        key: PRNGKeyArray,
        sample_shape: Sequence[int] = (),
        dtype: DTypeLike = float,
    ) -> Float[Array, "..."]:
        return jax.random.normal(key, tuple(sample_shape), dtype)

    def log_prob(self, inputs: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        return -0.5 * jnp.square(inputs)


@checked
class Gumbel(AbstractNoiseDistribution):
    r"""The standard Gumbel distribution.

    $$ \log \mu(z) = -z - e^{-z} $$

    Perturbing scores with Gumbel noise makes the argmax a sample from the
    softmax of the scores (the Gumbel-max trick), so a perturbed argmax is a
    Monte Carlo softmax. Samples match `jax.random.gumbel` (and Optax's
    `Gumbel`) for the same key.

    **References:** E. J. Gumbel, *Statistical theory of extreme values and some
    practical applications*, 1954; Q. Berthet et al., *Learning with
    Differentiable Perturbed Optimizers*, NeurIPS 2020.
    """

    def sample(
        self,
        key: PRNGKeyArray,
        sample_shape: Sequence[int] = (),
        dtype: DTypeLike = float,
    ) -> Float[Array, "..."]:
        return jax.random.gumbel(key, tuple(sample_shape), dtype)

    def log_prob(self, inputs: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        return -inputs - jnp.exp(-inputs)


def _magic_box(x: Array) -> Array:
    # Equal to one, with the derivatives of exp(x) (Foerster et al., 2018).
    return jnp.exp(x - jax.lax.stop_gradient(x))


@checked
class PerturbedFunction(eqx.Module):
    r"""A Monte Carlo estimate of a function smoothed by random perturbations of its input.

    Calling it as `perturbed(key, x)` estimates

    $$ f_\sigma(x) = \mathbb{E}_{z \sim \mu}\, f(x + \sigma z) $$

    with `num_samples` samples. Its derivatives, of any order, taken with JAX's
    autodiff, are unbiased estimates of the derivatives of $f_\sigma$ that use
    only values of $f$, so $f$ may be piecewise constant (an argmax, a sort, a
    solver). Built by `eqopt.perturbations.make_perturbed_fun`.

    `sigma` is an array leaf, so it can be changed without recompiling, vmapped
    over, or differentiated.

    **Arguments:**

    - `fun`: the function $f$, from a pytree to a pytree of arrays.
    - `num_samples`: the number of perturbations $N$ (static).
    - `sigma`: the scale $\sigma$ of the perturbations.
    - `noise`: the noise distribution $\mu$, with `sample` and `log_prob`.
    - `use_baseline`: whether to use $f(x)$ as a control variate (static).

    **References:** Q. Berthet et al., *Learning with Differentiable Perturbed
    Optimizers*, NeurIPS 2020.
    """

    fun: Callable[[Any], Any]
    num_samples: int = eqx.field(static=True)
    sigma: Scalar = eqx.field(converter=as_scalar)
    noise: Any
    use_baseline: bool = eqx.field(static=True)

    # Identity, not value, as for transforms: `jax.jit(perturbed)` (Optax's
    # idiom) hashes the function, and `sigma` is an array.
    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __check_init__(self):
        if self.num_samples < 1:
            raise ValueError(f"`num_samples` must be positive, got {self.num_samples}.")
        if not (hasattr(self.noise, "sample") and hasattr(self.noise, "log_prob")):
            raise TypeError(
                "`noise` must have `sample(key, sample_shape, dtype)` and "
                f"`log_prob(inputs)` methods, got {type(self.noise).__name__}."
            )

    def __call__(self, key: PRNGKeyArray, inputs: PyTree[Any]) -> PyTree[Any]:
        """Estimates $f_\\sigma$ at `inputs`.

        **Arguments:**

        - `key`: the random key; the same key gives the same perturbations.
        - `inputs`: the point $x$, any pytree. Only its inexact-array leaves are
          perturbed; other leaves are passed to $f$ unchanged.

        **Returns:** the estimate, shaped like the output of $f$.
        """
        dynamic, static = eqx.partition(inputs, eqx.is_inexact_array)
        leaves, treedef = jax.tree.flatten(dynamic)
        if not leaves:
            raise ValueError("`inputs` has no inexact-array leaves to perturb.")
        sigma = weakly_typed(self.sigma)
        baseline = None
        if self.use_baseline:
            baseline = self.fun(eqx.combine(jax.lax.stop_gradient(dynamic), static))

        def one_sample(sample_key):
            leaf_keys = jax.random.split(sample_key, len(leaves))
            noise = [
                self.noise.sample(k, x.shape, x.dtype)
                for k, x in zip(leaf_keys, leaves, strict=True)
            ]
            perturbed = jax.lax.stop_gradient(
                [x + sigma * z for x, z in zip(leaves, noise, strict=True)]
            )
            # The noise recovered from the (constant) perturbed point depends on x
            # and sigma, which is what carries the score-function derivative.
            recovered = [
                (y - x) / sigma for x, y in zip(leaves, perturbed, strict=True)
            ]
            log_prob = jnp.asarray(
                sum(jnp.sum(self.noise.log_prob(z)) for z in recovered)
            )
            box = _magic_box(log_prob)
            output = self.fun(
                eqx.combine(jax.tree.unflatten(treedef, perturbed), static)
            )
            if self.use_baseline:
                return jax.tree.map(
                    lambda y, b: box * y + (1 - box) * b if eqx.is_array(y) else y,
                    output,
                    baseline,
                )
            return jax.tree.map(lambda y: box * y if eqx.is_array(y) else y, output)

        keys = jax.random.split(key, self.num_samples)
        outputs = eqx.filter_vmap(one_sample)(keys)
        return jax.tree.map(
            lambda y: jnp.mean(y, axis=0) if eqx.is_array(y) else y, outputs
        )


@checked
def make_perturbed_fun(
    fun: Callable[[Any], Any],
    num_samples: int = 1000,
    sigma: Float[ArrayLike, ""] = 0.1,
    noise: Any = Gumbel(),
    use_baseline: bool = True,
) -> PerturbedFunction:
    r"""Makes a differentiable, stochastic approximation of `fun` by perturbing its input.

    The returned function, called as `perturbed(key, x)`, is a Monte Carlo
    estimate of

    $$ f_\sigma(x) = \mathbb{E}_{z \sim \mu}\, f(x + \sigma z)
       \approx \frac1N \sum_{n=1}^N f(x + \sigma z_n). $$

    It is written with the "magic box" of Foerster et al. (2018) around the
    log-density of the recovered noise $z_n = (y_n - x)/\sigma$, so that
    differentiating it any number of times gives unbiased score-function
    estimates of the derivatives of $f_\sigma$, for example

    $$ \nabla_x f_\sigma(x) \approx -\frac{1}{N\sigma}\sum_{n=1}^N
       \big(f(x + \sigma z_n) - b\big)\, \nabla_z \log\mu(z_n), $$

    using only values of $f$. With `use_baseline`, $b = f(x)$ reduces the
    variance without changing the expectation; otherwise $b = 0$.

    Given the same key, the perturbations are the ones Optax draws: the key is
    split into `num_samples` keys, and each of those into one key per perturbed
    leaf.

    **Arguments:**

    - `fun`: the function $f$, from a pytree to a pytree of arrays. It need not be
      differentiable.
    - `num_samples`: the number of perturbations $N$.
    - `sigma`: the scale $\sigma$ of the perturbations.
    - `noise`: the noise distribution $\mu$, an object with
      `sample(key, sample_shape, dtype)` and `log_prob(inputs)`, such as
      `eqopt.perturbations.Gumbel` (the default) or
      `eqopt.perturbations.Normal`.
    - `use_baseline`: whether to use $f(x)$ as a control variate.

    **Returns:** a `eqopt.perturbations.PerturbedFunction`, called as
    `perturbed(key, x)`.

    **References:** Q. Berthet, M. Blondel, O. Teboul, M. Cuturi, J.-P. Vert and
    F. Bach, *Learning with Differentiable Perturbed Optimizers*, NeurIPS 2020;
    J. Foerster et al., *DiCE: The Infinitely Differentiable Monte Carlo
    Estimator*, ICML 2018.

    !!! example

        ```python
        f = lambda x: jax.nn.one_hot(jnp.argmax(x), x.shape[0])
        soft_argmax = eqopt.perturbations.make_perturbed_fun(f, num_samples=500)
        key, scores = jax.random.key(0), jnp.array([1.0, 2.0, 0.5])
        jacobian = jax.jacobian(soft_argmax, argnums=1)(key, scores)
        ```
    """
    return PerturbedFunction(fun, num_samples, sigma, noise, use_baseline)
