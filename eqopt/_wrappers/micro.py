"""Vectorised maps and per-example gradients in micro-batches: `micro_vmap`, `micro_grad`."""

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, PyTree

from .._typecheck import checked
from .microbatch import AccumulationType, _is_accumulator, _resolve, microbatch


class _IndividualOutputs(NamedTuple):
    """The per-example outputs of `micro_grad`, each with the batch axis in front."""

    values: Any
    metrics: Any
    aux: Any


@checked
def reshape_batch_axis(tree: PyTree, microbatch_size: int, axis: int = 0) -> PyTree:
    r"""Splits the batch axis of every leaf into (micro-batches, rows per micro-batch).

    A batch of $B = n m$ rows becomes $n$ micro-batches of $m$ rows, the axis
    of length $B$ replaced by two axes $(n, m)$ in its place. Micro-batch $j$
    holds the rows $j, j + n, j + 2n, \dots$ (the strided split of
    `eqopt.microbatch`): row $b$ goes to $(b \bmod n,\ \lfloor b / n \rfloor)$.
    A batch sharded along its axis keeps that sharding in the new $m$ axis.

    **Arguments:**

    - `tree`: a pytree of arrays, each with a batch axis.
    - `microbatch_size`: $m$, the rows per micro-batch; it must divide the
      batch size.
    - `axis`: the batch axis.

    **Returns:** the pytree with each batch axis split in two.
    """

    def split(path, x):
        x = jnp.asarray(x)
        size = x.shape[axis]
        if microbatch_size < 1 or size % microbatch_size:
            raise ValueError(
                f"reshape_batch_axis: the batch size {size} of the leaf at "
                f"{jax.tree_util.keystr(path)} is not divisible by "
                f"`microbatch_size={microbatch_size}`."
            )
        moved = jnp.moveaxis(x, axis, -1)
        n = size // microbatch_size
        # Row b = j + n k goes to (j, k): a column-major reshape of the axis.
        split = moved.reshape(*moved.shape[:-1], microbatch_size, n)
        split = jnp.swapaxes(split, -1, -2)
        return jnp.moveaxis(split, (-2, -1), (axis % x.ndim, axis % x.ndim + 1))

    return jax.tree_util.tree_map_with_path(split, tree)


@no_type_check
def _reduce_stack(accumulator, output):
    """Combines the rows of one micro-batch's stacked outputs, per accumulator.

    `CONCAT` keeps the rows (the loop over micro-batches concatenates them in
    order); the others reduce the stack as they reduce micro-batches.
    """
    leaves, treedef = jax.tree.flatten(output)
    rows = leaves[0].shape[0] if leaves else 1
    per_leaf = _resolve(accumulator, output, rows)
    kinds = _resolve_kinds(accumulator, output)
    reduced = [
        leaf if kind is AccumulationType.CONCAT else acc.aggregate(leaf)
        for leaf, acc, kind in zip(leaves, per_leaf, kinds, strict=True)
    ]
    return jax.tree.unflatten(treedef, reduced)


@no_type_check
def _resolve_kinds(accumulator, output):
    """The accumulator given for each leaf of `output` (a prefix tree resolved)."""
    if _is_accumulator(accumulator):
        return [accumulator] * len(jax.tree.leaves(output))
    spec_leaves, spec_def = jax.tree.flatten(accumulator, is_leaf=_is_accumulator)
    subtrees = spec_def.flatten_up_to(output)
    kinds = []
    for spec, subtree in zip(spec_leaves, subtrees, strict=True):
        kinds += [spec] * len(jax.tree.leaves(subtree))
    return kinds


@checked
def micro_vmap(
    fun: Callable[..., Any],
    in_axes: int | None | Sequence[int | None] = 0,
    out_axes: Any = 0,
    *,
    microbatch_size: int | None = None,
    vmap_fn: Callable[..., Any] = jax.vmap,
    accumulator: Any = AccumulationType.CONCAT,
    num_real_microbatches: int | Int[Array, ""] | None = None,
) -> Callable[..., Any]:
    r"""`jax.vmap` evaluated in sequential micro-batches, with an optional reduction.

    With the batch split into micro-batches $b_1, \dots, b_n$,

    $$ \texttt{micro\_vmap}(f)(x) = \bigoplus_{j=1}^{n} \operatorname{vmap}(f)(b_j) $$

    where $\oplus$ is the accumulator. By default (`CONCAT`) the result is
    `jax.vmap(fun)(x)`, computed `microbatch_size` rows at a time so that only
    one micro-batch's intermediates are alive; `SUM` and `MEAN` reduce over
    the batch axis instead, without ever holding the per-example outputs.

    **Arguments:**

    - `fun`: the function to map.
    - `in_axes`: the batch axis of each positional argument (`None`: not
      batched), or one axis for all, as in `jax.vmap`. Keyword arguments are
      batched along their leading axis.
    - `out_axes`: must be 0: outputs carry the batch axis in front.
    - `microbatch_size`: rows per micro-batch (dividing the batch size);
      `None` maps the whole batch at once.
    - `vmap_fn`: called as `vmap_fn(fun, in_axes, out_axes)` in place of
      `jax.vmap` (to pass it options).
    - `accumulator`: how to combine the outputs: an
      `eqopt.microbatching.AccumulationType`, an
      `eqopt.microbatching.Accumulator`, or a prefix tree of them matching
      `fun`'s output.
    - `num_real_microbatches`: evaluate only the first this many micro-batches.

    **Returns:** a function with `fun`'s arguments, each batched one with a
    batch axis.

    !!! example

        ```python
        squares = eqopt.microbatching.micro_vmap(lambda x: x**2, microbatch_size=2)
        squares(jnp.arange(8.0))   # [0, 1, 4, ..., 49], two rows at a time
        ```
    """
    if out_axes != 0:
        raise ValueError(
            f"micro_vmap: `out_axes={out_axes!r}` is not supported; outputs carry "
            "the batch axis in front (`out_axes=0`)."
        )

    def vmap_reduce(*args, kwargs):
        axes = (
            (in_axes,) * len(args)
            if isinstance(in_axes, (int, type(None)))
            else tuple(in_axes)
        )
        # Keyword arguments are mapped along their leading axis, as `jax.vmap` does.
        output = vmap_fn(functools.partial(_call_with, fun), (0, *axes), 0)(
            kwargs, *args
        )
        return _reduce_stack(accumulator, output)

    @functools.wraps(fun)
    def mapped(*args, **kwargs):
        axes = (
            (in_axes,) * len(args)
            if isinstance(in_axes, (int, type(None)))
            else tuple(in_axes)
        )
        if len(axes) != len(args):
            raise ValueError(
                f"micro_vmap: `in_axes` has {len(axes)} entries for {len(args)} "
                "positional arguments."
            )
        batched = [i for i, axis in enumerate(axes) if axis is not None]
        batch_axes = [axis for axis in axes if axis is not None]
        run = microbatch(
            _keyword_kwargs(vmap_reduce),
            argnums=tuple(batched),
            microbatch_size=microbatch_size,
            accumulator=accumulator,
            argnames=("kwargs",) if kwargs else (),
            in_axes=(*batch_axes, *((0,) if kwargs else ())),
            num_real_microbatches=num_real_microbatches,
        )
        return run(*args, kwargs=kwargs)

    return mapped


def _call_with(fun: Callable[..., Any], kwargs: dict, *args: Any) -> Any:
    return fun(*args, **kwargs)


def _keyword_kwargs(fun: Callable[..., Any]) -> Callable[..., Any]:
    # `microbatch` passes batched keyword arguments by name: `kwargs=` is one.
    def call(*args, kwargs):
        return fun(*args, kwargs=kwargs)

    return call


@checked
def micro_grad(
    fun: Callable[..., Any],
    has_aux: bool = False,
    argnums: int | Sequence[int] = 0,
    *,
    batch_argnums: int | Sequence[int] = 1,
    keep_batch_dim: bool = True,
    microbatch_size: int | None = None,
    accumulator: Any = AccumulationType.SUM,
    transform_fn: Callable[[Any], Any] = lambda grads: grads,
    metrics_fn: Callable[[Any], Any] = lambda grads: None,
    num_real_microbatches: int | Int[Array, ""] | None = None,
) -> Callable[..., tuple[Any, Any]]:
    r"""Per-example gradients, transformed and combined over the batch in micro-batches.

    For each example $i$ of the batch, with $g_i = \nabla f(\theta; x_i)$,

    $$ \texttt{micro\_grad}(f)(\theta, x) =
       \Big(\bigoplus_i T(g_i),\ \big(f(\theta; x_i),\ M(g_i),\ \text{aux}_i\big)_i\Big) $$

    where $T$ is `transform_fn` (clipping per example, squaring for second
    moments...), $M$ is `metrics_fn` and $\oplus$ the accumulator (a sum by
    default). The examples are evaluated `microbatch_size` at a time
    (`eqopt.microbatching.micro_vmap`). Gradients are taken with respect to
    the inexact arrays of the arguments in `argnums`, as `eqx.filter_grad`
    takes them, so a whole Equinox model can be differentiated; other leaves
    get `None`. An argument that is itself a Python float is differentiated as
    `jax.grad` differentiates it.

    **Arguments:**

    - `fun`: the function, `fun(params, batch, ...)` by default, returning a
      scalar (and an auxiliary output if `has_aux`).
    - `has_aux`: whether `fun` returns `(value, aux)`.
    - `argnums`: the argument(s) to differentiate.
    - `batch_argnums`: the argument(s) with a batch axis (the leading one).
    - `keep_batch_dim`: whether `fun` sees each example with a batch axis of
      size 1 (`True`) or without one.
    - `microbatch_size`: examples per micro-batch; `None`: all at once.
    - `accumulator`: how to combine the transformed gradients over the batch
      (an `eqopt.microbatching.AccumulationType` or `Accumulator`, or a prefix
      tree of them matching `transform_fn`'s output).
    - `transform_fn`: applied to each example's gradient before combining.
    - `metrics_fn`: applied to each example's gradient; its values are
      returned per example.
    - `num_real_microbatches`: evaluate only the first this many micro-batches.

    **Returns:** a function with `fun`'s arguments returning `(combined, aux)`,
    where `aux` is a named tuple of `values`, `metrics` and `aux` (the
    function's own auxiliary output), each with the batch axis in front.

    **References:** Abadi et al., *Deep Learning with Differential Privacy*,
    CCS 2016 (per-example gradients, clipped, then summed).

    !!! example

        ```python
        def loss(w, x, y):
            return 0.5 * jnp.mean((x @ w - y) ** 2)

        mean_grad, aux = eqopt.microbatching.micro_grad(
            loss, batch_argnums=(1, 2), microbatch_size=2,
            accumulator=eqopt.microbatching.AccumulationType.MEAN,
        )(jnp.zeros(1), jnp.ones((4, 1)), jnp.arange(4.0))
        aux.values   # the loss of each example
        ```
    """
    diff = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    batch = (batch_argnums,) if isinstance(batch_argnums, int) else tuple(batch_argnums)

    def per_example(*args):
        if keep_batch_dim:
            args = tuple(
                jax.tree.map(lambda x: jnp.expand_dims(x, 0), arg)
                if i in batch
                else arg
                for i, arg in enumerate(args)
            )
        # An argument that is itself a Python float is differentiated, as
        # `jax.grad` differentiates it; inside a pytree, only arrays are.
        args = tuple(
            jnp.asarray(arg) if i in diff and isinstance(arg, (float, complex)) else arg
            for i, arg in enumerate(args)
        )
        parts = [eqx.partition(args[i], eqx.is_inexact_array) for i in diff]

        def of_dynamic(*dynamic):
            full = list(args)
            for i, d, (_, static) in zip(diff, dynamic, parts, strict=True):
                full[i] = eqx.combine(d, static)
            return fun(*full)

        value, grads = jax.value_and_grad(
            of_dynamic, argnums=tuple(range(len(diff))), has_aux=has_aux
        )(*[d for d, _ in parts])
        grads = grads[0] if isinstance(argnums, int) else grads
        value, aux = value if has_aux else (value, None)
        return transform_fn(grads), _IndividualOutputs(value, metrics_fn(grads), aux)

    @functools.wraps(fun)
    def gradients(*args):
        in_axes = tuple(0 if i in batch else None for i in range(len(args)))
        return micro_vmap(
            per_example,
            in_axes,
            microbatch_size=microbatch_size,
            accumulator=(accumulator, AccumulationType.CONCAT),
            num_real_microbatches=num_real_microbatches,
        )(*args)

    return gradients
