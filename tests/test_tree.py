"""Tests of `eqopt.tree`'s arithmetic, creation and casting (`eqopt/tree/_math.py`,
`_creation.py`, `_casting.py`, and the moment helpers it re-exports): parity with
`optax.tree`, whole models, `None` leaves, empty trees and errors that name paths.
The state functions are tested in test_tree_state.py."""

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import compare_trees, filtered, make_mlp, tree_allclose

import eqopt
import eqopt.tree

PUBLIC_NAMES = [
    "add", "add_scale", "sub", "mul", "div", "scale", "vdot", "sum", "max", "min",
    "norm", "size", "dtype", "batch_shape", "conj", "real", "cast", "cast_like",
    "clip", "where", "zeros_like", "ones_like", "full_like", "random_like",
    "split_key_like", "unwrap_random_key_data", "allclose", "bias_correction",
    "update_moment", "update_moment_per_elem_norm", "update_infinity_moment", "get",
    "get_all_with_path", "set", "map_params",
]  # fmt: skip

# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------

SHAPES = {"a": (3,), "b": {"c": (2, 3), "d": ()}, "e": [(4,)]}


@functools.cache
def make_tree(seed: int, dtype: Any = jnp.float32, positive: bool = False) -> Any:
    """A nested dict/list pytree of fixed random arrays."""
    shapes, treedef = jax.tree.flatten(SHAPES, is_leaf=lambda s: isinstance(s, tuple))
    keys = jax.random.split(jax.random.key(seed), len(shapes))
    leaves = []
    for key, shape in zip(keys, shapes, strict=True):
        if jnp.issubdtype(dtype, jnp.complexfloating):
            re, im = jax.random.normal(key, (2, *shape))
            leaf = (re + 1j * im).astype(dtype)
        else:
            leaf = jax.random.normal(key, shape).astype(dtype)
        leaves.append(jnp.abs(leaf) + 0.5 if positive else leaf)
    return jax.tree.unflatten(treedef, leaves)


x = lambda: make_tree(0)
y = lambda: make_tree(1)
z = lambda: make_tree(2)
pos = lambda: make_tree(3, positive=True)
cx = lambda: make_tree(4, jnp.complex64)
cy = lambda: make_tree(5, jnp.complex64)
mixed = lambda: {"h": jnp.ones(2, jnp.float16), "f": jnp.ones(3), "i": jnp.arange(2)}
key = lambda: jax.random.PRNGKey(7)
new_key = lambda: jax.random.key(7)
scalar = lambda: jnp.asarray(0.3)


@dataclasses.dataclass(frozen=True)
class Case:
    #: Test id.
    id: str
    #: The function's name in both `eqopt.tree` and `optax.tree`.
    name: str
    #: Builds the positional arguments.
    args: Callable[[], tuple]
    kwargs: dict = dataclasses.field(default_factory=dict)
    #: Whether the result keeps the structure of the first tree (so a model works).
    treewise: bool = False


CASES = [
    Case("add", "add", lambda: (x(), y()), treewise=True),
    Case("add-3", "add", lambda: (x(), y(), z()), treewise=True),
    Case("add_scale", "add_scale", lambda: (x(), 0.3, y()), treewise=True),
    Case("add_scale-array", "add_scale", lambda: (x(), scalar(), y()), treewise=True),
    Case("sub", "sub", lambda: (x(), y()), treewise=True),
    Case("mul", "mul", lambda: (x(), y()), treewise=True),
    Case("div", "div", lambda: (x(), pos()), treewise=True),
    Case("scale", "scale", lambda: (0.3, x())),
    Case("scale-array", "scale", lambda: (scalar(), x())),
    Case("vdot", "vdot", lambda: (x(), y()), treewise=True),
    Case("vdot-complex", "vdot", lambda: (cx(), cy())),
    Case("sum", "sum", lambda: (x(),)),
    Case("sum-associative", "sum", lambda: (x(),), {"associative_reduction": True}),
    Case("max", "max", lambda: (x(),)),
    Case("min", "min", lambda: (x(),)),
    Case("norm", "norm", lambda: (x(),)),
    Case("norm-2-squared", "norm", lambda: (x(),), {"ord": 2, "squared": True}),
    Case("norm-1", "norm", lambda: (x(),), {"ord": 1}),
    Case("norm-1-squared", "norm", lambda: (x(),), {"ord": 1, "squared": True}),
    Case("norm-inf", "norm", lambda: (x(),), {"ord": jnp.inf}),
    Case("norm-inf-str", "norm", lambda: (x(),), {"ord": "inf", "squared": True}),
    Case("norm-complex", "norm", lambda: (cx(),)),
    Case("norm-complex-1", "norm", lambda: (cx(),), {"ord": 1}),
    Case("size", "size", lambda: (x(),)),
    Case("dtype", "dtype", lambda: (x(),)),
    Case("dtype-promote", "dtype", lambda: (mixed(), "promote")),
    Case("dtype-highest", "dtype", lambda: (mixed(), "highest")),
    Case(
        "dtype-lowest", "dtype", lambda: (mixed(),), {"mixed_dtype_handler": "lowest"}
    ),
    Case("batch_shape", "batch_shape", lambda: (x(), (2, 3))),
    Case("conj", "conj", lambda: (cx(),)),
    Case("real", "real", lambda: (cx(),)),
    Case("cast", "cast", lambda: (x(), jnp.bfloat16)),
    Case("cast-none", "cast", lambda: (x(), None)),
    Case(
        "cast_like",
        "cast_like",
        lambda: (x(), make_tree(1, jnp.bfloat16)),
        treewise=True,
    ),
    Case("clip", "clip", lambda: (x(), -0.5, 0.5)),
    Case("clip-min", "clip", lambda: (x(),), {"min_value": 0.0}),
    Case("clip-max", "clip", lambda: (x(),), {"max_value": jnp.asarray(0.1)}),
    Case("where-true", "where", lambda: (True, x(), y())),
    Case("where-false", "where", lambda: (jnp.asarray(False), x(), y())),
    Case("zeros_like", "zeros_like", lambda: (x(),)),
    Case("zeros_like-dtype", "zeros_like", lambda: (x(), jnp.int32)),
    Case("ones_like", "ones_like", lambda: (x(),)),
    Case("full_like", "full_like", lambda: (x(), 2.5)),
    Case("full_like-dtype", "full_like", lambda: (x(), 2, jnp.bfloat16)),
    Case("random_like", "random_like", lambda: (key(), x())),
    Case(
        "random_like-new-key",
        "random_like",
        lambda: (new_key(), make_tree(0, jnp.bfloat16)),
    ),
    Case(
        "random_like-dtype", "random_like", lambda: (key(), x()), {"dtype": jnp.float16}
    ),
    Case(
        "random_like-rademacher",
        "random_like",
        lambda: (key(), x()),
        {"sampler": jax.random.rademacher, "dtype": jnp.int32},
    ),
    Case("split_key_like", "split_key_like", lambda: (key(), x())),
    Case(
        "unwrap_random_key_data",
        "unwrap_random_key_data",
        lambda: ({"k": jax.random.key(0), "raw": key(), "x": jnp.ones(2)},),
    ),
    Case(
        "allclose-true",
        "allclose",
        lambda: (x(), jax.tree.map(lambda t: t + 1e-7, x())),
    ),
    Case("allclose-false", "allclose", lambda: (x(), y())),
    Case("allclose-tol", "allclose", lambda: (x(), y()), {"atol": 10.0}),
    Case("bias_correction", "bias_correction", lambda: (x(), 0.9, 3)),
    Case("update_moment", "update_moment", lambda: (x(), y(), 0.9, 2)),
    Case(
        "update_moment_per_elem_norm",
        "update_moment_per_elem_norm",
        lambda: (cx(), pos(), 0.9, 2),
    ),
    Case(
        "update_infinity_moment",
        "update_infinity_moment",
        lambda: (x(), pos(), 0.9, 1e-8),
    ),
]


# ---------------------------------------------------------------------------
# Namespace and signatures
# ---------------------------------------------------------------------------


def test_public_names():
    for name in PUBLIC_NAMES:
        assert hasattr(eqopt.tree, name), name
        assert getattr(eqopt.tree, name).__doc__, name


def test_moment_helpers_are_shared():
    for name in [
        "bias_correction",
        "update_moment",
        "update_moment_per_elem_norm",
        "update_infinity_moment",
    ]:
        assert getattr(eqopt.tree, name).__module__ == "eqopt._numerics"


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_signature_matches_optax(name):
    ours = inspect.signature(getattr(eqopt.tree, name)).parameters
    theirs = inspect.signature(getattr(optax.tree, name)).parameters
    assert list(ours) == list(theirs)
    for param_name, param in theirs.items():
        assert ours[param_name].kind == param.kind, param_name
        if name == "get" and param_name == "default":
            continue  # intentional: no default means "raise if missing"
        if param.default is not inspect.Parameter.empty:
            assert ours[param_name].default == param.default, param_name


# ---------------------------------------------------------------------------
# Parity on pytrees of arrays
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_parity(case):
    ours = getattr(eqopt.tree, case.name)(*case.args(), **case.kwargs)
    theirs = getattr(optax.tree, case.name)(*case.args(), **case.kwargs)
    assert compare_trees(ours, theirs), (ours, theirs)


@pytest.mark.parametrize(
    "name", ["add", "sum", "norm", "vdot", "max", "clip", "random_like"]
)
def test_under_jit(name):
    case = next(c for c in CASES if c.name == name)
    args = case.args()
    ours = jax.jit(lambda *a: getattr(eqopt.tree, name)(*a))(*args)
    assert compare_trees(ours, getattr(optax.tree, name)(*args))


def test_add_keeps_dtype_promotion():
    bf16 = make_tree(0, jnp.bfloat16)
    for ours, theirs in [
        (eqopt.tree.scale(0.5, bf16), optax.tree.scale(0.5, bf16)),
        (eqopt.tree.add_scale(bf16, 0.5, bf16), optax.tree.add_scale(bf16, 0.5, bf16)),
    ]:
        assert compare_trees(ours, theirs)


# ---------------------------------------------------------------------------
# Whole models and None leaves
# ---------------------------------------------------------------------------


def _model_args(
    case: Case, model: eqx.Module, other: eqx.Module
) -> tuple[tuple, tuple]:
    """The case's arguments with every pytree replaced by a model (ours) or its arrays (Optax's)."""
    ours, theirs = [], []
    models = iter([model, other, make_mlp(2, width_size=8, depth=2)])
    for arg in case.args():
        if isinstance(arg, dict):
            m = next(models)
            ours.append(m)
            theirs.append(filtered(m))
        else:
            ours.append(arg)
            theirs.append(arg)
    return tuple(ours), tuple(theirs)


MODEL_CASES = [
    c for c in CASES
    if not c.id.startswith(("vdot-complex", "norm-complex", "conj", "real", "dtype-", "unwrap", "update_", "bias_", "div", "random_like"))
    and c.name != "allclose"
]  # fmt: skip


@pytest.mark.parametrize("case", MODEL_CASES, ids=[c.id for c in MODEL_CASES])
def test_whole_model(case):
    model, other = (
        make_mlp(0, width_size=8, depth=2),
        make_mlp(1, width_size=8, depth=2),
    )
    ours_args, theirs_args = _model_args(case, model, other)
    ours = getattr(eqopt.tree, case.name)(*ours_args, **case.kwargs)
    theirs = getattr(optax.tree, case.name)(*theirs_args, **case.kwargs)
    if isinstance(ours, eqx.nn.MLP):
        # Non-array leaves pass through untouched...
        assert ours.activation is model.activation
        assert ours.final_activation is model.final_activation
        assert ours.width_size == model.width_size
        # ...and the arrays are computed as Optax computes them on the arrays alone.
        assert compare_trees(filtered(ours), theirs)
    else:
        assert compare_trees(ours, theirs)


def _grads(model):
    """Gradients as `eqx.filter_grad` gives them: `None` at every non-array leaf."""
    return eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(2)) ** 2))(model)


def test_none_leaves_are_absent():
    model = make_mlp(0, width_size=8, depth=2)
    grads = _grads(model)
    assert grads.activation is None
    # Reductions ignore them.
    assert jnp.allclose(eqopt.tree.norm(grads), optax.tree.norm(grads))
    assert (
        eqopt.tree.size(grads)
        == eqopt.tree.size(model)
        == optax.tree.size(filtered(model))
    )
    # Maps keep them.
    assert eqopt.tree.scale(2.0, grads).activation is None
    assert eqopt.tree.zeros_like(grads).activation is None
    assert eqopt.tree.add(grads, grads).activation is None
    # A hand-written SGD step keeps the model's non-array leaves.
    stepped = eqopt.tree.add_scale(model, -0.1, grads)
    assert stepped.activation is model.activation
    expected = optax.tree.add_scale(filtered(model), -0.1, grads)
    assert tree_allclose(filtered(stepped), expected)


def test_none_in_second_tree_keeps_first():
    tree_x = {"a": jnp.ones(2), "b": jnp.ones(3)}
    tree_y = {"a": jnp.ones(2), "b": None}
    out = eqopt.tree.add(tree_x, tree_y)
    assert tree_allclose(out, {"a": 2 * jnp.ones(2), "b": jnp.ones(3)})
    assert eqopt.tree.vdot(tree_x, tree_y) == 2.0
    out = eqopt.tree.add(tree_y, tree_x)
    assert out["b"] is None


def test_non_array_leaves_are_ignored_by_reductions():
    tree = {
        "w": jnp.array([1.0, -3.0]),
        "p": 0.5,
        "n": 7,
        "f": jax.nn.relu,
        "s": "name",
    }
    assert eqopt.tree.sum(tree) == -2.0
    assert eqopt.tree.max(tree) == 1.0
    assert eqopt.tree.min(tree) == -3.0
    assert eqopt.tree.size(tree) == 2
    assert eqopt.tree.dtype(tree) == jnp.float32
    out = eqopt.tree.scale(2.0, tree)
    assert (
        out["p"] == 0.5
        and out["n"] == 7
        and out["f"] is jax.nn.relu
        and out["s"] == "name"
    )
    assert tree_allclose(
        eqopt.tree.split_key_like(jax.random.PRNGKey(0), tree)["w"],
        jax.random.split(jax.random.PRNGKey(0), 1)[0],
    )


def test_random_like_on_model_matches_optax_on_arrays():
    model = make_mlp(0, width_size=8, depth=2)
    ours = eqopt.tree.random_like(jax.random.PRNGKey(3), model)
    theirs = optax.tree.random_like(jax.random.PRNGKey(3), filtered(model))
    assert ours.activation is model.activation
    assert tree_allclose(filtered(ours), theirs)


def test_allclose_on_models():
    model = make_mlp(0, width_size=8, depth=2)
    assert eqopt.tree.allclose(model, model)
    assert not eqopt.tree.allclose(model, make_mlp(1, width_size=8, depth=2))
    assert not eqopt.tree.allclose(
        model, eqx.tree_at(lambda m: m.activation, model, jnp.tanh)
    )


# ---------------------------------------------------------------------------
# Empty trees: the identity of each reduction, as in Optax
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [("sum", 0), ("max", -jnp.inf), ("min", jnp.inf), ("norm", 0.0), ("size", 0)],
)
def test_empty_reductions(name, expected):
    ours = getattr(eqopt.tree, name)({})
    assert ours == expected == getattr(optax.tree, name)({})


def test_empty_other():
    assert eqopt.tree.vdot({}, {}) == 0
    assert eqopt.tree.norm({}, ord=jnp.inf) == 0  # Optax gives -inf here.
    assert eqopt.tree.norm({}, ord=1) == 0
    assert eqopt.tree.dtype({}) == optax.tree.dtype({})
    assert eqopt.tree.allclose({}, {})
    assert eqopt.tree.split_key_like(jax.random.PRNGKey(0), {}) == {}
    assert eqopt.tree.sum({"f": jax.nn.relu}) == 0
    # Empty arrays have no maximum to contribute.
    assert eqopt.tree.max({"a": jnp.zeros((0,)), "b": jnp.ones(2)}) == 1.0


# ---------------------------------------------------------------------------
# Errors name the path of the offending leaf
# ---------------------------------------------------------------------------


def test_structure_error_names_path():
    a = {"a": jnp.ones(2), "b": {"c": jnp.ones(2)}}
    b = {"a": jnp.ones(2), "b": {"d": jnp.ones(2)}}
    with pytest.raises(ValueError, match=r"add: .*\['b'\].*'c'.*'d'"):
        eqopt.tree.add(a, b)
    with pytest.raises(ValueError, match=r"\['b'\]"):
        eqopt.tree.vdot(a, b)
    with pytest.raises(ValueError, match=r"\['b'\]"):
        eqopt.tree.allclose(a, b)
    with pytest.raises(ValueError, match=r"other_trees\[0\].*\['b'\]"):
        eqopt.tree.add(a, a, b)


def test_structure_error_in_models():
    model = make_mlp(0, width_size=8, depth=2)
    deeper = eqx.nn.MLP(2, 2, 8, 3, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"<root>.*static fields"):
        eqopt.tree.sub(model, deeper)
    leaf_for_subtree = eqx.tree_at(lambda m: m.layers[1], model, jnp.zeros(3))
    with pytest.raises(ValueError, match=r"\.layers\[1\]"):
        eqopt.tree.mul(model, leaf_for_subtree)


def test_shape_error_names_path():
    a = {"a": jnp.ones(2), "b": [jnp.ones((2, 3)), jnp.ones(4)]}
    b = {"a": jnp.ones(2), "b": [jnp.ones((2, 3)), jnp.ones(5)]}
    with pytest.raises(ValueError, match=r"\['b'\]\[1\].*\[4\].*\[5\]"):
        eqopt.tree.add(a, b)
    with pytest.raises(ValueError, match=r"\['b'\]\[1\]"):
        eqopt.tree.vdot(a, b)
    with pytest.raises(ValueError, match=r"\['b'\]\[1\]"):
        eqopt.tree.where(True, a, b)


def test_non_array_operand_names_path():
    with pytest.raises(ValueError, match=r"\[.a.\].*got custom_jvp"):
        eqopt.tree.add({"a": jnp.ones(2)}, {"a": jax.nn.relu})


def test_mixed_dtype_error_names_path():
    with pytest.raises(ValueError, match=r"\['f'\].*\['h'\]"):
        eqopt.tree.dtype(mixed())
    with pytest.raises(ValueError, match="bfloat16"):
        eqopt.tree.dtype(
            {"a": jnp.ones(1, jnp.bfloat16), "b": jnp.ones(1, jnp.float16)}, "highest"
        )


def test_bad_arguments():
    with pytest.raises(ValueError, match="Unsupported ord"):
        eqopt.tree.norm(x(), ord="fro")


def test_type_annotations_are_checked():
    # eqopt imports its modules under jaxtyping's import hook
    # (docs/design.md, "Type checking").
    if not hasattr(eqopt.tree.scale, "__wrapped__"):
        pytest.skip("eqopt.tree was imported outside eqopt's import hook")
    with pytest.raises(TypeError):  # `scalar` must be a scalar
        eqopt.tree.scale(jnp.ones(3), x())
    with pytest.raises(ValueError, match="one of 'promote'"):  # an unknown choice
        eqopt.tree.dtype(x(), "largest")  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError):
        eqopt.tree.clip(x(), "low")  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError):
        eqopt.tree.random_like(jnp.ones(3), x())
    # Every legitimate scalar is accepted.
    for value in [2, 2.0, np.float32(2.0), jnp.asarray(2.0), jnp.asarray(2, jnp.int32)]:
        eqopt.tree.scale(value, x())
        eqopt.tree.add_scale(x(), value, y())
