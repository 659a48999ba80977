"""Properties of every registry entry on randomly generated Equinox models.

Models are nested Modules, lists and dicts with float32 and bfloat16 arrays,
integer arrays, functions, ints, strings and `None`; gradients are `None` at
the non-trainable leaves and at randomly frozen trainable ones. For every
registry entry that builds without seeing the model: `init`, `update` and
`apply_updates` never change a non-trainable leaf, updates have the params'
structure with `None` where there is no gradient and arrays of the params'
shapes elsewhere, the new params keep their dtypes, and the state survives
serialisation.
"""

import io
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st
from registry import ALL_CASES

import eqopt

# Cases that build without the params and need no extra arguments.
CASES = [
    case
    for case in ALL_CASES
    if "p" not in case.make.__code__.co_varnames[: case.make.__code__.co_argcount]
    and case.extra_args is None
    # With bfloat16 params, inject_hyperparams stores b2=0.999 in bfloat16, where it
    # rounds to 1 (Optax gives NaN; eqopt refuses b2=1): see its hyperparam_dtype case.
    and case.name != "inject_hyperparams-scale_by_adam"
    # One set of dimension numbers for every matrix: a random 3-D leaf does not
    # fit it, which is refused with one error naming the leaf
    # (test_contrib_galore, test_bad_input).
    and case.name != "contrib.scale_by_galore-dimension-numbers-rms"
]


class Block(eqx.Module):
    weight: Any
    extra: Any
    activation: Any = jax.nn.gelu
    label: str = "block"


_SHAPES = st.sampled_from([(), (3,), (2, 3), (4, 1), (2, 2, 2)])


@st.composite
def leaves(draw):
    kind = draw(
        st.sampled_from(["f32", "f32", "bf16", "int", "fn", "int_py", "str", "none"])
    )
    seed = draw(st.integers(0, 2**16))
    shape = draw(_SHAPES)
    if kind == "f32":
        return jax.random.normal(jax.random.key(seed), shape)
    if kind == "bf16":
        return jax.random.normal(jax.random.key(seed), shape).astype(jnp.bfloat16)
    if kind == "int":
        return jnp.arange(int(np.prod(shape)), dtype=jnp.int32).reshape(shape)
    if kind == "fn":
        return jnp.tanh
    if kind == "int_py":
        return seed
    if kind == "str":
        return f"name{seed}"
    return None


def trees(depth=2):
    if depth == 0:
        return leaves()
    child = trees(depth - 1)
    return st.one_of(
        leaves(),
        st.dictionaries(st.sampled_from("abcde"), child, min_size=1, max_size=3),
        st.lists(child, min_size=1, max_size=3),
        st.builds(Block, weight=child, extra=child),
    )


def _has_trainable(tree):
    return any(eqx.is_inexact_array(x) for x in jax.tree.leaves(tree))


@st.composite
def models_and_grads(draw):
    model = draw(trees().filter(_has_trainable))
    frozen_seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(frozen_seed)

    def gradient(leaf):
        if not eqx.is_inexact_array(leaf) or rng.random() < 0.2:
            return None  # not trainable, or frozen
        return (jnp.ones_like(leaf) * rng.normal()).astype(leaf.dtype)

    grads = jax.tree.map(gradient, model)
    return model, grads


def _snapshot(model):
    # Non-trainable leaves, compared by identity or value.
    return [
        x
        for x in jax.tree.leaves(model, is_leaf=lambda y: y is None)
        if not eqx.is_inexact_array(x)
    ]


def _same(a, b):
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if eqx.is_array(x):
            if not (eqx.is_array(y) and x.dtype == y.dtype and np.array_equal(x, y)):
                return False
        elif x is not y and x != y:
            return False
    return True


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case_index=st.integers(0, len(CASES) - 1), data=models_and_grads())
def test_registry_properties_on_random_models(case_index, data):
    case = CASES[case_index]
    model, grads = data
    if not any(
        g is not None for g in jax.tree.leaves(grads, is_leaf=lambda x: x is None)
    ):
        grads = jax.tree.map(
            lambda x: jnp.ones_like(x) if eqx.is_inexact_array(x) else None, model
        )
    tx = case.make()
    before = _snapshot(model)
    with warnings.catch_warnings():
        # A mask that selects no leaf of this random model is allowed, with a warning.
        warnings.filterwarnings("ignore", "The .* selects no trainable leaf")
        state = tx.init(model)
    updates, state = tx.update(grads, state, model)
    assert _same(_snapshot(model), before), case.name
    # Updates: the params' structure, None where there is no gradient.
    flat_updates, update_def = jax.tree.flatten(updates, is_leaf=lambda x: x is None)
    flat_params, param_def = jax.tree.flatten(model, is_leaf=lambda x: x is None)
    flat_grads = jax.tree.flatten(grads, is_leaf=lambda x: x is None)[0]
    assert update_def == param_def, case.name
    for update, param, grad in zip(flat_updates, flat_params, flat_grads, strict=True):
        if grad is None:
            assert update is None, case.name
        else:
            assert update is not None and update.shape == param.shape, case.name
    new_model = eqopt.apply_updates(model, updates)
    assert _same(_snapshot(new_model), before), case.name
    assert jax.tree.map(
        lambda x: x.dtype if eqx.is_array(x) else None,
        eqx.filter(new_model, eqx.is_array),
    ) == jax.tree.map(
        lambda x: x.dtype if eqx.is_array(x) else None, eqx.filter(model, eqx.is_array)
    ), case.name
    # The state round-trips through Equinox serialisation.
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, state)
    buffer.seek(0)
    # Zeros laid out as each leaf is (`jnp.zeros_like` of an array in host memory
    # fails outside `jit` in JAX 0.10: "Memory kind mismatch").
    like = jax.tree.map(
        lambda x: (
            jax.device_put(jnp.zeros(x.shape, x.dtype), x.sharding)
            if eqx.is_array(x)
            else x
        ),
        state,
    )
    restored = eqx.tree_deserialise_leaves(buffer, like)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        if eqx.is_array(a):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
