"""`eqopt.tree_utils`' reductions and `tree_add_scale` against Optax on every dtype.

Optax's own tests of these functions (`tree_utils/_tree_math_test.py`) put
Python numbers in the trees; eqopt leaves those out on purpose (a model's
`Dropout.p` is not data). The same cases with arrays in place of the numbers
(the maximum and minimum of a tree with an empty leaf, norms and inner
products of integer trees, the dtype of `tree_add_scale`) give Optax's values
and dtypes here.
"""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqopt

OURS, THEIRS = eqopt.tree_utils, optax.tree_utils


def _same(ours, theirs):
    ours, theirs = jnp.asarray(ours), jnp.asarray(theirs)
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


@pytest.mark.parametrize("which", ["tree_max", "tree_min"])
@pytest.mark.parametrize("dtype", ["int8", "uint8", "float32", "bfloat16"])
@pytest.mark.parametrize("value", [0, 10000, -10000, float("inf"), -float("inf")])
def test_max_and_min_skip_an_empty_leaf(which, dtype, value):
    tree = [jnp.asarray(value), jnp.zeros(0, dtype)]
    ours, theirs = getattr(OURS, which)(tree), getattr(THEIRS, which)(tree)
    _same(ours, theirs)
    assert ours == value
    empty = [jnp.zeros(0, dtype), jnp.zeros((2, 0), dtype)]
    _same(getattr(OURS, which)(empty), getattr(THEIRS, which)(empty))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "float32", "bfloat16"])
def test_reductions_of_integer_and_low_precision_trees(dtype):
    a = (
        jnp.asarray(1, dtype),
        {"k1": jnp.asarray([2, 3], dtype)},
        jnp.asarray(5, dtype),
    )
    b = (
        jnp.asarray(4, dtype),
        {"k1": jnp.asarray([1, 1], dtype)},
        jnp.asarray(2, dtype),
    )
    for name in ("tree_sum", "tree_max", "tree_min", "tree_size"):
        _same(getattr(OURS, name)(a), getattr(THEIRS, name)(a))
    for ord_ in (None, 1, 2, jnp.inf, "inf"):
        for squared in (False, True):
            _same(
                OURS.tree_norm(a, ord=ord_, squared=squared),
                THEIRS.tree_norm(a, ord=ord_, squared=squared),
            )
    _same(OURS.tree_vdot(a, b), THEIRS.tree_vdot(a, b))


@pytest.mark.parametrize("x_dtype", ["int32", "float32", "bfloat16", "float16"])
@pytest.mark.parametrize("y_dtype", ["int32", "float32", "bfloat16"])
@pytest.mark.parametrize("scalar", [0.1, 2, jnp.asarray(0.1), jnp.asarray(2)])
def test_add_scale_promotes_as_optax(x_dtype, y_dtype, scalar):
    x, y = jnp.asarray([3, 1], x_dtype), jnp.asarray([2, 5], y_dtype)
    _same(OURS.tree_add_scale(x, scalar, y), THEIRS.tree_add_scale(x, scalar, y))
    _same(OURS.tree_scale(scalar, y), THEIRS.tree_scale(scalar, y))


def test_python_numbers_are_data_under_optax_names_only():
    """Optax's trees of Python numbers: data in `tree_utils`, as in Optax;
    left alone by `eqopt.tree` (Equinox's rule, a model's `Dropout.p`)."""
    cases = [
        ("max", ([5.0, jnp.zeros(0, jnp.int8)],), 5.0, -jnp.inf),
        ("sum", ({"p": 0.5, "w": jnp.ones(2)},), 2.5, 2),
        ("add_scale", (3, 0.1, 2), 3.2, 3),
        ("size", ((1.0, {"k": 2.0}),), 2, 0),
    ]
    for name, args, optax_rule, equinox_rule in cases:
        ours = getattr(OURS, f"tree_{name}")(*args)
        assert ours == pytest.approx(getattr(THEIRS, f"tree_{name}")(*args))
        assert ours == pytest.approx(optax_rule)
        assert getattr(eqopt.tree, name)(*args) == equinox_rule
