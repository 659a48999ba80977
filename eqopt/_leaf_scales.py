"""Per-leaf constant factors: the multipliers of parameter groups.

`eqopt.param_groups` gives each trainable leaf a learning-rate and a
weight-decay multiplier. They are not a chain per group: the optimiser stays
one optimiser with one state, and its `eqopt.ScaleByLearningRate` and
`eqopt.AddDecayedWeights` steps multiply their rate by each leaf's factor
(`scales`, a static field those two steps hold for the call). The factors are
Python floats, so XLA sees constants: a leaf's step costs what it costs
without groups.

A `LeafScales` is keyed by the model's structure (its treedef with `None`
counted as a leaf) and applies to any tree with that structure, or to a
`eqopt.Packed` of it (a packed model, or the buffers `eqopt.bucketed`
makes), where the factors become one constant per buffer, or a constant array
over the buffer's segments where they differ.
"""

from typing import Any, no_type_check

import jax
import jax.numpy as jnp
import numpy as np

from ._fused._pack import Packed, _Layout, _Static
from ._leaves import InputError, is_none


class LeafScales(_Static):
    """One factor per leaf position of a model (`None` at untrained leaves).

    Interned (`LeafScales.make(treedef, factors)`): equal factors are one object,
    hashed by identity, so a static field holding one costs `jit` nothing.
    """

    __slots__ = ("_buffers",)

    @property
    def treedef(self) -> Any:
        return self._key[0]

    @property
    def factors(self) -> tuple[float | None, ...]:
        return self._key[1]

    @no_type_check
    def per_buffer(self, layout: _Layout) -> tuple[Any, ...]:
        """Per buffer of a packed tree: a float, or a float32 array over its segments."""
        cache = getattr(self, "_buffers", None)
        if cache is None:
            cache = self._buffers = {}
        found = cache.get(layout)
        if found is None:
            parts: list[list[tuple[float, int]]] = [[] for _ in layout.buffers]
            for slot in layout.slots:
                factor = self.factors[slot.leaf_index]
                size = int(np.prod(slot.shape, dtype=np.int64))
                parts[slot.buffer].append((1.0 if factor is None else factor, size))
            found = []
            for segments in parts:
                values = {factor for factor, _ in segments}
                if len(values) == 1:
                    found.append(values.pop())
                else:
                    found.append(
                        np.concatenate(
                            [
                                np.full(size, factor, np.float32)
                                for factor, size in segments
                            ]
                        )
                    )
            found = cache[layout] = tuple(found)
        return found

    def check(self, tree: Any, what: str) -> None:
        treedef = (
            tree.structure.treedef
            if isinstance(tree, Packed)
            else jax.tree.structure(tree, is_leaf=is_none)
        )
        if treedef != self.treedef:
            raise InputError(
                f"The parameter groups' multipliers were resolved for another model than "
                f"the {what} this step received: build the optimiser's state with `init` "
                "on the model you train (the multipliers follow the params' structure "
                "through chains, partitions, `pack` and `bucketed`, not through "
                "transforms that reshape the tree, such as `flatten`)."
            )


def _times(factor: Any, multiplier: Any, dtype: Any, cast: bool) -> Any:
    # A weakly typed factor times a float stays weak and takes the leaf's dtype
    # in the product with the leaf, as `factor * g` does without groups; times a
    # (float32) array of a packed buffer's segments it is cast to that dtype, to
    # the same effect. `cast` casts in every case (a strongly typed rate).
    scaled = factor * multiplier
    if cast or (isinstance(multiplier, np.ndarray) and factor.weak_type):
        return scaled.astype(dtype)
    return scaled


@no_type_check
def scale_leaves(updates: Any, factor: Any, scales: LeafScales, cast: bool) -> Any:
    """Each leaf `g` times `factor * m`, `m` its multiplier (`cast`: to `g`'s dtype first)."""
    factor = jnp.asarray(factor)
    cast = cast or not factor.weak_type
    scales.check(updates, "updates")
    if isinstance(updates, Packed):
        buffers = tuple(
            None if g is None else _times(factor, m, g.dtype, cast) * g
            for g, m in zip(
                updates.buffers, scales.per_buffer(updates.layout), strict=True
            )
        )
        return Packed(buffers=buffers, rest=updates.rest, layout=updates.layout)
    leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    products: dict[tuple[float, Any], Any] = {}
    out = []
    for g, m in zip(leaves, scales.factors, strict=True):
        if g is None or m is None:
            out.append(g)
            continue
        key = (m, g.dtype)
        if key not in products:
            products[key] = _times(factor, m, g.dtype, cast)
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

    def rate(m, dtype):
        return weight_decay if m is None else _times(weight_decay, m, dtype, False)

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
            decayed = g + rate(m, p.dtype) * p
            buffers.append(decayed if mask is True else jnp.where(mask, decayed, g))
        return Packed(buffers=tuple(buffers), rest=updates.rest, layout=updates.layout)
    g_leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
    p_leaves = treedef.flatten_up_to(params)
    flags = treedef.flatten_up_to(selected)
    factors = (None,) * len(g_leaves) if scales is None else scales.factors
    out = []
    for g, p, m, flag in zip(g_leaves, p_leaves, factors, flags, strict=True):
        if g is None or p is None or not flag or (scales is not None and m is None):
            out.append(g)
        else:
            out.append(rate(m, p.dtype) * p + g)
    return jax.tree.unflatten(treedef, out)
