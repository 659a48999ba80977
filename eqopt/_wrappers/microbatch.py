"""Evaluating a function over a batch in sequential micro-batches: `microbatch`."""

import dataclasses
import enum
import functools
from collections.abc import Callable, Sequence
from typing import Any, no_type_check

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Int

from .._typecheck import checked


class AccumulationType(enum.Enum):
    """How `eqopt.microbatch` combines the results of the micro-batches.

    - `MEAN`: the sum divided by the number of micro-batches.
    - `SUM`: the sum.
    - `RUNNING_MEAN`: the mean, kept as a running mean (more accurate in low
      precision, one division per micro-batch).
    - `CONCAT`: the results concatenated along their leading axis, in the
      order of the original batch.
    """

    MEAN = 1
    SUM = 2
    RUNNING_MEAN = 3
    CONCAT = 4


@dataclasses.dataclass(frozen=True)
class Accumulator:
    """A custom way of combining micro-batch results in `eqopt.microbatch`.

    The micro-batched function computes

    ```python
    carry = init(jax.eval_shape(fun, first_microbatch))
    for i in range(n):
        carry = update(carry, fun(microbatch_i), i)
    return finalize(carry)
    ```

    **Arguments:**

    - `init`: maps the shape and dtype (a `jax.ShapeDtypeStruct`) of one
      micro-batch's result to the initial carry.
    - `update`: `(carry, value, index) -> carry`.
    - `finalize`: maps the last carry to the result.
    - `aggregate`: combines a stack of per-micro-batch results (leading axis)
      in one go; used by vectorised evaluation.
    """

    init: Callable[[Any], Any]
    update: Callable[[Any, Any, Any], Any]
    finalize: Callable[[Any], Any]
    aggregate: Callable[[Any], Any]


@no_type_check
def _builtin(kind: AccumulationType, num_microbatches: int) -> Accumulator:
    if kind is AccumulationType.SUM or kind is AccumulationType.MEAN:
        divisor = num_microbatches if kind is AccumulationType.MEAN else 1
        return Accumulator(
            init=lambda s: jnp.zeros(s.shape, s.dtype),
            update=lambda carry, value, index: carry + value,
            finalize=lambda carry: carry / divisor if divisor != 1 else carry,
            aggregate=lambda values: (
                jnp.sum(values, axis=0) / divisor
                if divisor != 1
                else jnp.sum(values, axis=0)
            ),
        )
    if kind is AccumulationType.RUNNING_MEAN:
        return Accumulator(
            init=lambda s: jnp.zeros(s.shape, s.dtype),
            update=lambda carry, value, index: (
                carry + ((value - carry) / (index + 1)).astype(carry.dtype)
            ),
            finalize=lambda carry: carry,
            aggregate=lambda values: jnp.mean(values, axis=0),
        )
    if kind is AccumulationType.CONCAT:

        def finalize(carry):
            # carry[j] holds micro-batch j, made of the rows j, j + n, j + 2n...
            return jnp.swapaxes(carry, 0, 1).reshape(-1, *carry.shape[2:])

        return Accumulator(
            init=lambda s: jnp.zeros((num_microbatches, *s.shape), s.dtype),
            update=lambda carry, value, index: carry.at[index].set(value),
            finalize=finalize,
            aggregate=finalize,
        )
    raise TypeError(f"microbatch: unknown accumulation type {kind!r}.")


@no_type_check
def _is_accumulator(x) -> bool:
    return isinstance(x, (AccumulationType, Accumulator))


@no_type_check
def _resolve(accumulator, output_shape, num_microbatches):
    """One Accumulator per output leaf, from a prefix tree of accumulators."""
    if _is_accumulator(accumulator):
        spec_leaves, spec_def = [accumulator], jax.tree.structure(0)
    else:
        spec_leaves, spec_def = jax.tree.flatten(accumulator, is_leaf=_is_accumulator)
    for spec in spec_leaves:
        if not _is_accumulator(spec):
            raise TypeError(
                "microbatch: `accumulator` must be an AccumulationType, an "
                "Accumulator, or a prefix tree of them matching the output of `fun`, "
                f"got a {type(spec).__name__} in it."
            )
    try:
        subtrees = spec_def.flatten_up_to(output_shape)
    except (ValueError, TypeError) as error:
        raise ValueError(
            "microbatch: `accumulator` is not a prefix of the structure of `fun`'s "
            f"output: {error}"
        ) from None
    per_leaf = []
    for spec, subtree in zip(spec_leaves, subtrees, strict=True):
        if isinstance(spec, AccumulationType):
            spec = _builtin(spec, num_microbatches)
        per_leaf += [spec] * len(jax.tree.leaves(subtree))
    return per_leaf


def _as_tuple(value: Any) -> tuple:
    if isinstance(value, (str, int)):
        return (value,)
    return tuple(value)


@checked
def microbatch(
    fun: Callable[..., Any],
    argnums: int | Sequence[int],
    microbatch_size: int | None,
    accumulator: Any = AccumulationType.SUM,
    *,
    argnames: str | Sequence[str] = (),
    in_axes: int | Sequence[int] = 0,
    num_real_microbatches: int | Int[Array, ""] | None = None,
) -> Callable[..., Any]:
    r"""Evaluates `fun` on a batch in sequential micro-batches, and combines the results.

    With the batch split into $n$ micro-batches $b_1, \dots, b_n$ of
    `microbatch_size` rows,

    $$ \texttt{microbatch}(f)(b) = \bigoplus_{j=1}^{n} f(b_j) $$

    where $\oplus$ is the accumulator: a sum, a mean, or a concatenation. The
    loop is a `lax.fori_loop`, so only one micro-batch's intermediates are
    alive at a time: this trades time for memory when $f$ on the whole batch
    does not fit, for example `eqx.filter_grad(loss)` on a large batch
    (accumulate with `MEAN` to get the gradient of the mean loss).

    Micro-batch $j$ holds the rows $j, j + n, j + 2n, \dots$ of the batch (a
    strided split, as Optax's), and `CONCAT` puts the rows back in their
    original order.

    **Arguments:**

    - `fun`: the function.
    - `argnums`: the positions of the arguments that have a batch axis.
    - `microbatch_size`: rows per micro-batch; it must divide the batch size.
      `None` evaluates `fun` on the whole batch at once.
    - `accumulator`: how to combine the results: an
      `eqopt.microbatching.AccumulationType`, an
      `eqopt.microbatching.Accumulator`, or a prefix tree of them matching
      `fun`'s output (`SUM` by default).
    - `argnames`: the names of keyword arguments that have a batch axis.
    - `in_axes`: the batch axis of each batched argument (`argnums` first, then
      `argnames`), or one axis for all. Batched arguments may be pytrees.
    - `num_real_microbatches`: evaluate only the first this many micro-batches
      (a traced value is fine: a variable batch size without recompiling).
      `MEAN` still divides by the total number; `CONCAT` leaves zeros.

    **Returns:** a function with the same arguments as `fun`.

    !!! example

        ```python
        grad_fn = eqopt.microbatch(
            eqx.filter_grad(loss_fn), argnums=(1, 2), microbatch_size=32,
            accumulator=eqopt.microbatching.AccumulationType.MEAN,
        )
        x, y = jnp.ones((256, 2)), jnp.zeros((256, 1))
        grads = grad_fn(model, x, y)   # eight micro-batches of 32 rows
        ```
    """
    if microbatch_size is None:
        return fun
    if (
        isinstance(microbatch_size, bool)
        or not isinstance(microbatch_size, int)
        or microbatch_size < 1
    ):
        raise ValueError(
            "microbatch: `microbatch_size` must be a positive int or None, got "
            f"{microbatch_size!r}."
        )
    argnums = _as_tuple(argnums)
    argnames = _as_tuple(argnames)
    axes = (
        (in_axes,) * (len(argnums) + len(argnames))
        if isinstance(in_axes, int)
        else tuple(in_axes)
    )
    if len(axes) != len(argnums) + len(argnames):
        raise ValueError(
            f"microbatch: `in_axes` has {len(axes)} entries but there are "
            f"{len(argnums) + len(argnames)} batched arguments (argnums + argnames)."
        )

    @functools.wraps(fun)
    def microbatched(*args, **kwargs):
        args = list(args)
        batched = [(args, i) for i in argnums] + [(kwargs, name) for name in argnames]
        sizes = set()
        for (container, key), axis in zip(batched, axes, strict=True):
            for leaf in jax.tree.leaves(container[key]):
                sizes.add(jnp.shape(leaf)[axis])
        if len(sizes) > 1:
            raise ValueError(
                f"microbatch: the batched arguments have different batch sizes {sorted(sizes)}."
            )
        if not sizes:
            return fun(*args, **kwargs)
        (batch_size,) = sizes
        if batch_size % microbatch_size:
            raise ValueError(
                f"microbatch: the batch size {batch_size} is not divisible by "
                f"`microbatch_size={microbatch_size}`."
            )
        num_microbatches = batch_size // microbatch_size

        def split(x, axis):
            # (..., B, ...) -> (n, ..., microbatch_size, ...), micro-batch j first.
            x = jnp.moveaxis(x, axis, 0)
            x = x.reshape(microbatch_size, num_microbatches, *x.shape[1:])
            return jnp.moveaxis(jnp.swapaxes(x, 0, 1), 1, axis + 1)

        stacks = [
            jax.tree.map(lambda x, a=axis: split(x, a), container[key])
            for (container, key), axis in zip(batched, axes, strict=True)
        ]

        def call(index):
            for (container, key), stack in zip(batched, stacks, strict=True):
                container[key] = jax.tree.map(lambda s: s[index], stack)
            return fun(*args, **kwargs)

        output_shape = jax.eval_shape(call, 0)
        output_leaves, output_def = jax.tree.flatten(output_shape)
        accumulators = _resolve(accumulator, output_shape, num_microbatches)

        def body(index, carry):
            values = jax.tree.leaves(call(index))
            return [
                acc.update(c, v, index)
                for acc, c, v in zip(accumulators, carry, values, strict=True)
            ]

        init = [acc.init(s) for acc, s in zip(accumulators, output_leaves, strict=True)]
        upper = (
            num_microbatches if num_real_microbatches is None else num_real_microbatches
        )
        carry = lax.fori_loop(0, upper, body, init)
        return jax.tree.unflatten(
            output_def,
            [acc.finalize(c) for acc, c in zip(accumulators, carry, strict=True)],
        )

    return microbatched
