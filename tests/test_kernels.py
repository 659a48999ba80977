"""Every leaf of one shape compiles to one kernel, as in Optax.

eqopt's hyperparameters are inputs of the program, so each leaf's kernel reads
them as parameters; XLA shares a compiled kernel between leaves only when the
parameters come in the same order, which depends on how the per-leaf
arithmetic is written (see `docs/development.md`). A model of many leaves of a
few shapes must compile no more distinct kernels than Optax compiles for it.
`benchmarks/kernel_count.py` reports the same counts on the benchmark's trees.
"""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest

import eqopt

SHAPES = [(8, 4), (4,), (2, 3, 4), (5,), (3, 5), (6, 2)]
PARAMS = {f"w{i}": jnp.full(SHAPES[i % 6], 0.5 + i) for i in range(18)}
GRADS = jax.tree.map(lambda x: 0.1 * x, PARAMS)


def _distinct_kernels(step, *args) -> int:
    text = jax.jit(step).lower(*args).compile().as_text()
    bodies = re.findall(r"^%fused_computation[.\d]* \((.*?)^}", text, re.S | re.M)
    # Two kernels are one program when they differ only in names.
    strip = lambda b: re.sub(r"%[\w.\-]+|param_[\d.]+|metadata=\{[^}]*\}", "", b)  # noqa: E731
    return len({strip(b) for b in bodies})


CASES = {
    "adam": lambda m: m.adam(1e-3),
    "adamw": lambda m: m.adamw(1e-3, weight_decay=1e-4),
    "sgd-momentum": lambda m: m.sgd(1e-3, momentum=0.9),
    "rmsprop": lambda m: m.rmsprop(1e-3),
    "lion": lambda m: m.lion(1e-3, weight_decay=1e-4),
    "clip-adamw": lambda m: m.chain(
        m.clip_by_global_norm(1.0), m.adamw(1e-3, weight_decay=1e-4)
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_no_more_distinct_kernels_than_optax(name):
    reference = CASES[name](optax)
    reference_state = reference.init(PARAMS)

    def optax_step(params, state, grads):
        updates, state = reference.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    opt = CASES[name](eqopt)
    state = opt.init(PARAMS)
    arrays, static = eqx.partition(opt, eqx.is_array)

    # The hyperparameters are arguments, as `eqx.filter_jit` passes them.
    def eqopt_step(arrays, params, state, grads):
        opt = eqx.combine(arrays, static)
        updates, state = opt.update(grads, state, params)
        return eqopt.apply_updates(params, updates), state

    expected = _distinct_kernels(optax_step, PARAMS, reference_state, GRADS)
    got = _distinct_kernels(eqopt_step, arrays, PARAMS, state, GRADS)
    # Zero means XLA's text no longer names its fusions the way `_distinct_kernels`
    # reads them (then `got <= expected + 2` would pass whatever eqopt compiles).
    assert expected > 0 and got > 0, (
        f"counted {got} eqopt and {expected} Optax kernels: the compiled HLO text "
        "names no `%fused_computation`; update `_distinct_kernels`"
    )
    # Two spare: eqopt may compile one or two scalar kernels of its own (the
    # step count's increment) or give the very first leaf a kernel of its own.
    # Kernels that differ by leaf shape would add one per shape (six here).
    assert got <= expected + 2, (got, expected)
