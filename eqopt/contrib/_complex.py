"""Treating complex parameters as pairs of real ones."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Inexact, PyTree

from .._base import (
    AbstractGradientTransformation,
    AbstractWrapper,
    Params,
    Updates,
    is_none,
)
from .._entry import init_entry, update_entry
from .._interop import as_transform
from .._optax_tuple import OptaxTuple
from .._typecheck import checked


class _RealAndImaginary(eqx.Module):
    """A complex array as two real arrays (a pytree node with two leaves)."""

    real: Inexact[Array, "..."]
    imaginary: Inexact[Array, "..."]


def _is_pair(x: Any) -> bool:
    return isinstance(x, _RealAndImaginary)


def _split(tree: Any) -> Any:
    def split(x):
        if eqx.is_array(x) and jnp.iscomplexobj(x):
            return _RealAndImaginary(jnp.real(x), jnp.imag(x))
        return x

    return jax.tree.map(split, tree, is_leaf=is_none)


def _merge(tree: Any) -> Any:
    def merge(x):
        if _is_pair(x):
            return jax.lax.complex(x.real, x.imaginary)
        return x

    return jax.tree.map(merge, tree, is_leaf=lambda x: x is None or _is_pair(x))


@checked
class SplitRealAndImaginaryState(eqx.Module, OptaxTuple):
    """The state of `eqopt.contrib.SplitRealAndImaginary`: the inner state.

    The inner state was built for the split params: each complex leaf appears
    in it as a pair of real arrays, `.real` and `.imaginary`.
    """

    inner_state: PyTree[Any]


@checked
class SplitRealAndImaginary(AbstractWrapper):
    r"""Runs `inner` on the real and imaginary parts of complex leaves as separate reals.

    Each complex leaf $z = x + i y$ is given to `inner` as two real leaves $x$
    and $y$, and its update is reassembled:

    $$ u(z) = \operatorname{inner}(x) + i\, \operatorname{inner}(y) $$

    Real leaves pass to `inner` unchanged. This makes an optimiser that is
    not written for complex numbers (one that uses $g^2$ rather than
    $|g|^2$, or a per-leaf norm) treat $\mathbb{C}$ as $\mathbb{R}^2$.

    **Kind of its parts**: element-wise, global or per layer as what it wraps is.

    **Arguments:**

    - `inner`: the transform for the real parameters.
    """

    inner: AbstractGradientTransformation = eqx.field(converter=as_transform)

    @init_entry
    def init(self, params: Params) -> SplitRealAndImaginaryState:
        return SplitRealAndImaginaryState(self.inner.init(_split(params)))

    @update_entry
    def update(
        self,
        updates: Updates,
        state: SplitRealAndImaginaryState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, SplitRealAndImaginaryState]:
        inner_updates, inner_state = self.inner.update(
            _split(updates),
            state.inner_state,
            None if params is None else _split(params),
            **extra_args,
        )
        return _merge(inner_updates), SplitRealAndImaginaryState(inner_state)


@checked
def split_real_and_imaginary(inner: Any) -> SplitRealAndImaginary:
    """Optax spelling of `eqopt.contrib.SplitRealAndImaginary`."""
    return SplitRealAndImaginary(inner)
