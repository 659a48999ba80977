"""Per-leaf factors: the multipliers of parameter groups, inputs of the compiled step.

`eqopt.param_groups` gives each trainable leaf a learning-rate and a
weight-decay multiplier. They are not a chain per group: the optimiser stays
one optimiser with one state, and its `eqopt.ScaleByLearningRate` and
`eqopt.AddDecayedWeights` steps multiply their rate by each leaf's factor
(`scales`, a field those two steps hold for the call).

The factors are arrays kept in the groups' state (`eqopt.ParamGroupsState`),
one scalar per distinct multiplier, so they are inputs of the compiled program:
every layer of one shape runs the same kernels whatever its multiplier. (As
Python floats they were constants that XLA folds into each layer's kernels:
one kernel per distinct constant, and a longer first call.) A leaf that stacks
layers on leading axes (`eqx.filter_vmap`) takes a vector of factors, one per
slice, broadcast over the slice's axes.

A `LeafScales` is keyed by the model's structure (its treedef with `None`
counted as a leaf) and applies to any tree with that structure, or to a
`eqopt.Packed` of it (a packed model, or the buffers `eqopt.bucketed`
makes), where the factors become one scalar per buffer, or an array over the
buffer's segments where they differ.
"""

from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ._fused._pack import Packed, _Layout, _Static
from ._leaves import InputError, is_none

#: A leaf's factor: a number, or one number per slice of a stack (nested tuples
#: over nested stack axes, as `numpy.asarray` reads them).
Factor = float | tuple


class ScaleIndex(_Static):
    """Which of the factors each leaf position of a model takes (`None`: none).

    Interned (`ScaleIndex.make(treedef, slots)`): equal indices are one object,
    hashed by identity, so a static field holding one costs `jit` nothing.
    """

    __slots__ = ("_buffers",)

    @property
    def treedef(self) -> Any:
        return self._key[0]

    @property
    def slots(self) -> tuple[int | None, ...]:
        return self._key[1]

    @no_type_check
    def per_buffer(self, layout: _Layout) -> tuple[Any, ...]:
        """Per buffer of a packed tree: the index of its one factor, or its segments
        as `(index or None, size)` pairs in the buffer's order."""
        cache = getattr(self, "_buffers", None)
        if cache is None:
            cache = self._buffers = {}
        found = cache.get(layout)
        if found is None:
            found = []
            for segments in layout.segments(self.slots):
                indices = {index for index, _ in segments}
                if len(indices) == 1 and None not in indices:
                    found.append(indices.pop())
                else:
                    found.append(tuple(segments))
            found = cache[layout] = tuple(found)
        return found


@no_type_check
def _as_value(factor: Factor) -> Array:
    # The default float dtype: float32, or float64 with `jax_enable_x64`, as a
    # Python float would be in the product with a weakly typed rate.
    return jnp.asarray(np.asarray(factor), dtype=jnp.result_type(float))


class LeafScales(eqx.Module):
    """One factor per leaf position of a model (`None` at leaves without one).

    `values` holds each distinct factor once, as an array (a scalar, or the
    factors of a stack's slices); `index` (static) says which one each leaf
    takes. Made by `LeafScales.build`.
    """

    values: tuple[Array, ...]
    index: ScaleIndex = eqx.field(static=True)

    @staticmethod
    def build(treedef: Any, factors: tuple[Factor | None, ...]) -> "LeafScales":
        """The scales of `factors`, one per leaf position of `treedef` (`None`: none)."""
        distinct: dict[Factor, int] = {}
        slots = tuple(
            None if f is None else distinct.setdefault(f, len(distinct))
            for f in factors
        )
        return LeafScales(
            values=tuple(_as_value(f) for f in distinct),
            index=ScaleIndex.make(treedef, slots),
        )

    def check(self, tree: Any, what: str) -> None:
        treedef = (
            tree.structure.treedef
            if isinstance(tree, Packed)
            else jax.tree.structure(tree, is_leaf=is_none)
        )
        if treedef != self.index.treedef:
            raise InputError(
                f"The parameter groups' multipliers were resolved for another model than "
                f"the {what} this step received: build the optimiser's state with `init` "
                "on the model you train (the multipliers follow the params' structure "
                "through chains, partitions, `pack` and `bucketed`, not through "
                "transforms that reshape the tree, such as `flatten`)."
            )

    @no_type_check
    def per_leaf(self) -> list[Array | None]:
        """Per leaf position: its factor (an array), or `None`."""
        return [None if i is None else self.values[i] for i in self.index.slots]

    @no_type_check
    def per_buffer(self, layout: _Layout) -> list[Array]:
        """Per buffer of a packed tree: a scalar, or an array over its elements."""
        out = []
        for plan in self.index.per_buffer(layout):
            if isinstance(plan, int):
                out.append(self.values[plan])
                continue
            pieces = []
            for index, size in plan:
                value = (
                    jnp.ones((), jnp.result_type(float))
                    if index is None
                    else self.values[index].reshape(-1)
                )
                # A stack's slices are contiguous in the buffer: each factor
                # repeats over its slice's elements.
                pieces.append(jnp.repeat(value, size // max(value.size, 1)))
            out.append(jnp.concatenate(pieces))
        return out


def _rate(factor: Any, multiplier: Any, dtype: Any, ndim: int) -> Any:
    # `factor * multiplier` (`factor` alone where `multiplier` is `None`), cast
    # to `dtype` unless it is `None`; a stack's factors broadcast over each
    # slice's axes (`ndim`: the leaf's).
    scaled = factor if multiplier is None else factor * multiplier
    if dtype is not None:
        scaled = scaled.astype(dtype)
    if scaled.ndim:
        scaled = scaled.reshape(scaled.shape + (1,) * (ndim - scaled.ndim))
    return scaled


@no_type_check
def scale_updates(updates: Any, factor: Any, scales: LeafScales | None = None) -> Any:
    r"""Each update `g` times `factor` (times its leaf's multiplier with `scales`).

    $$ g \mapsto \operatorname{cast}_{g}(\alpha\, m)\, g $$

    The one product of every learning rate and step size: the factor (with
    the multiplier, an array of the default float dtype) is cast to the
    update's dtype before the product. A weakly typed factor (a Python number)
    gives the numbers of `factor * g`; a strongly typed one (a schedule's
    value, a rate swept by `jax.vmap`) does not promote a `bfloat16` update to
    `float32`. A complex update takes a real factor as complex. `updates` may
    be a `eqopt.Packed`: with `scales`, each buffer takes one factor, or one
    per segment where they differ (`LeafScales.per_buffer`). A leaf without a
    multiplier in `scales` (one the groups do not train here) is not scaled.

    **Arguments:**

    - `updates`: a tree of updates (`None` where a leaf is not trained).
    - `factor`: a scalar (array or number).
    - `scales`: per-leaf multipliers (`eqopt.param_groups`), or `None`.

    **Returns:** the scaled updates, each in its own dtype.
    """
    if not isinstance(factor, jax.Array):
        factor = jnp.asarray(factor)
    if scales is not None:
        scales.check(updates, "updates")
        if isinstance(updates, Packed):
            multipliers = scales.per_buffer(updates.layout)
            buffers = tuple(
                None if g is None else _rate(factor, m, g.dtype, 1) * g
                for g, m in zip(updates.buffers, multipliers, strict=True)
            )
            return Packed(buffers=buffers, rest=updates.rest, layout=updates.layout)
    leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    indices = (-1,) * len(leaves) if scales is None else scales.index.slots
    products: dict[tuple[int, Any, int], Any] = {}
    out = []
    for g, index in zip(leaves, indices, strict=True):
        if g is None or index is None:
            out.append(g)
            continue
        # The leaf's rank matters only to a stack's factors (one per slice).
        key = (index, g.dtype, 0 if scales is None else g.ndim)
        if key not in products:
            m = None if scales is None else scales.values[index]
            products[key] = _rate(factor, m, g.dtype, g.ndim)
        out.append(products[key] * g)
    return jax.tree.unflatten(treedef, out)


@no_type_check
def decay_leaves(
    updates: Any,
    params: Any,
    weight_decay: Any,
    scales: LeafScales | None,
    selected: Any,
) -> Any:
    """`g + (weight_decay * m) * p` per leaf (`m` its multiplier; without `scales`,
    `g + weight_decay * p`), where `selected` (per leaf, or per buffer of a packed
    tree: `True`, `False` or a boolean array) says to decay."""
    if scales is not None:
        scales.check(params, "params")
    # Not cast: a strongly typed decay (a schedule's value) promotes the update,
    # as it does without groups.
    weight_decay = jnp.asarray(weight_decay)

    def rate(m, p):
        if m is None:
            return weight_decay
        dtype = p.dtype if weight_decay.weak_type else None
        return _rate(weight_decay, m, dtype, p.ndim)

    if isinstance(params, Packed):
        multipliers = (
            (None,) * len(params.buffers)
            if scales is None
            else scales.per_buffer(params.layout)
        )
        buffers = []
        for g, p, m, mask in zip(
            updates.buffers, params.buffers, multipliers, selected, strict=True
        ):
            if g is None or mask is False:
                buffers.append(g)
                continue
            decayed = g + rate(m, p) * p
            buffers.append(decayed if mask is True else jnp.where(mask, decayed, g))
        return Packed(buffers=tuple(buffers), rest=updates.rest, layout=updates.layout)
    g_leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    p_leaves = treedef.flatten_up_to(params)
    flags = treedef.flatten_up_to(selected)
    factors = (None,) * len(g_leaves) if scales is None else scales.per_leaf()
    out = []
    for g, p, m, flag in zip(g_leaves, p_leaves, factors, flags, strict=True):
        if g is None or p is None or not flag or (scales is not None and m is None):
            out.append(g)
        else:
            out.append(rate(m, p) * p + g)
    return jax.tree.unflatten(treedef, out)
