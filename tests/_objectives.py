"""Objectives for the registry cases of line searches and L-BFGS (`value`, `grad`, `value_fn`).

The generic tests give a case's `extra_args(model, grads)` the model and the
gradients of the step. A line search needs an objective whose gradient at the
model is the `grad` it is given; `extra_args_with_gradient` builds one whose
gradient is (a multiple of) those gradients, so that the random gradients of
the parity test and the loss gradients of the other tests are both true
gradients. The objective accepts the eqopt `Model` and Optax's dict params.

It is an `eqx.Module` holding its arrays, so a jitted update sees the same
function structure at every step and compiles once: eqopt's line searches run
their loop under `eqx.filter_jit`, and `jit_update` does the same for Optax's.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from helpers import Model, as_dict

CURVATURE = 10.0


class Objective(eqx.Module):
    r"""$f(p) = \sum \operatorname{Re}(g\,d) + \tfrac{k}{2}|d|^2 + \tfrac14|d|^4$, $d = p - m$.

    Its JAX gradient at the model $m$ is `direction` $g$, and it is strongly
    convex, so a line search has a minimum to bracket along any descent
    direction; `CURVATURE` $k$ makes the first trial step too long, so the
    searches interpolate.
    """

    centre: dict
    direction: dict

    def __call__(self, params):
        arrays = as_dict(params) if isinstance(params, Model) else params
        total = jnp.zeros([], jnp.float32)
        for name, p in arrays.items():
            wide = jnp.promote_types(p.dtype, jnp.float32)
            d = p.astype(wide) - self.centre[name].astype(wide)
            squared = jnp.real(d * jnp.conj(d))
            total = total + jnp.sum(
                jnp.real(self.direction[name].astype(wide) * d)
                + 0.5 * CURVATURE * squared
                + 0.25 * squared**2
            )
        return total


def extra_args_with_gradient(sign: float = 1.0):
    """`Case.extra_args` for an objective whose gradient at the model is `sign * grads`.

    `sign=1` suits an optimiser fed the gradient (L-BFGS); `sign=-1` a bare line
    search fed the gradients as its direction, which is then one of descent.
    """

    def extra_args(model, grads):
        grad = jax.tree.map(
            lambda g: None if g is None else sign * g,
            grads,
            is_leaf=lambda x: x is None,
        )
        value_fn = Objective(as_dict(model), as_dict(grad))
        return {"value": value_fn(model), "grad": grad, "value_fn": value_fn}

    return extra_args


def jit_update(tx):
    """An Optax transform whose `update` is jitted (its `value_fn` being a pytree),

    so the oracle does not recompile its line search loop at every eager step.
    """
    return optax.GradientTransformationExtraArgs(tx.init, jax.jit(tx.update))
