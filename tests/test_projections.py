"""Tests of `eqopt.projections`: parity with `optax.projections` (values and
gradients), the constraints themselves, whole models, `None` leaves and errors."""

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from helpers import filtered, make_mlp, tree_allclose

import eqopt
import eqopt.projections
import eqopt.tree

PUBLIC_NAMES = [
    "projection_non_negative", "projection_box", "projection_hypercube",
    "projection_simplex", "projection_l1_sphere", "projection_l1_ball",
    "projection_l2_sphere", "projection_l2_ball", "projection_linf_ball",
    "projection_hyperplane", "projection_halfspace", "projection_vector",
]  # fmt: skip

# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


@functools.cache
def vector(seed: int, n: int = 7, scale: float = 1.0) -> jax.Array:
    return scale * jax.random.normal(jax.random.key(seed), (n,))


@functools.cache
def tree(seed: int, scale: float = 1.0) -> dict:
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {
        "w": scale * jax.random.normal(k1, (3, 2)),
        "b": scale * jax.random.normal(k2, (4,)),
    }


def as_dict(t: Any) -> dict:
    """The array leaves of a pytree as a dict, in leaf order: a tree Optax handles."""
    return {f"{i:03d}": leaf for i, leaf in enumerate(jax.tree.leaves(filtered(t)))}


@dataclasses.dataclass(frozen=True)
class Case:
    #: Test id.
    id: str
    #: The function's name in both `eqopt.projections` and `optax.projections`.
    name: str
    #: Builds the point to project (an array or a pytree of arrays).
    x: Callable[[], Any]
    #: Builds the other positional arguments.
    args: Callable[[], tuple] = lambda: ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    #: Whether to compare Jacobians (where the projection is differentiable at `x`).
    grad: bool = True


CASES = [
    Case("non_negative", "projection_non_negative", lambda: vector(0)),
    Case("non_negative-tree", "projection_non_negative", lambda: tree(0)),
    Case("box", "projection_box", lambda: vector(0), lambda: (-0.5, 0.4)),
    Case(
        "box-arrays",
        "projection_box",
        lambda: vector(0),
        lambda: (-(vector(1) ** 2), vector(2) ** 2),
    ),
    Case(
        "box-tree-bounds",
        "projection_box",
        lambda: tree(0),
        lambda: ({"w": -0.5, "b": jnp.zeros(4)}, {"w": 0.3, "b": jnp.ones(4)}),
    ),
    Case("hypercube", "projection_hypercube", lambda: vector(0)),
    Case("hypercube-scale", "projection_hypercube", lambda: vector(0), lambda: (0.5,)),
    Case("linf_ball", "projection_linf_ball", lambda: vector(0)),
    Case(
        "linf_ball-tree", "projection_linf_ball", lambda: tree(0), kwargs={"scale": 0.5}
    ),
    Case("simplex", "projection_simplex", lambda: vector(0)),
    Case("simplex-scale", "projection_simplex", lambda: vector(1), lambda: (2.5,)),
    Case("simplex-small", "projection_simplex", lambda: vector(2, scale=0.01)),
    Case("simplex-tree", "projection_simplex", lambda: tree(0), kwargs={"scale": 0.7}),
    Case("l1_sphere", "projection_l1_sphere", lambda: vector(0)),
    Case(
        "l1_sphere-inside",
        "projection_l1_sphere",
        lambda: vector(1, scale=0.01),
        lambda: (2.0,),
    ),
    Case("l1_sphere-tree", "projection_l1_sphere", lambda: tree(1)),
    Case("l1_ball", "projection_l1_ball", lambda: vector(0)),
    Case("l1_ball-inside", "projection_l1_ball", lambda: vector(1, scale=0.01)),
    Case("l1_ball-tree", "projection_l1_ball", lambda: tree(2), kwargs={"scale": 0.5}),
    Case("l2_sphere", "projection_l2_sphere", lambda: vector(0)),
    Case("l2_sphere-tree", "projection_l2_sphere", lambda: tree(0), lambda: (3.0,)),
    Case("l2_ball", "projection_l2_ball", lambda: vector(0)),
    Case("l2_ball-inside", "projection_l2_ball", lambda: vector(1, scale=0.01)),
    Case("l2_ball-zero", "projection_l2_ball", lambda: jnp.zeros(5)),
    Case("l2_ball-tree", "projection_l2_ball", lambda: tree(0), kwargs={"scale": 0.5}),
    Case(
        "hyperplane",
        "projection_hyperplane",
        lambda: vector(0),
        lambda: (vector(1), 0.3),
    ),
    Case(
        "hyperplane-tree",
        "projection_hyperplane",
        lambda: tree(0),
        lambda: (tree(1), -1.0),
    ),
    Case(
        "halfspace-active",
        "projection_halfspace",
        lambda: vector(0),
        lambda: (vector(0), 0.3),
    ),
    Case(
        "halfspace-inactive",
        "projection_halfspace",
        lambda: vector(0),
        lambda: (vector(1), 100.0),
    ),
    Case(
        "halfspace-tree",
        "projection_halfspace",
        lambda: tree(0),
        lambda: (tree(0), 1.0),
    ),
    Case("vector", "projection_vector", lambda: vector(0), lambda: (vector(1),)),
    Case("vector-tree", "projection_vector", lambda: tree(0), lambda: (tree(1),)),
]


def ours(case: Case) -> Callable[..., Any]:
    fn, args = getattr(eqopt.projections, case.name), case.args()
    return lambda x: fn(x, *args, **case.kwargs)


def theirs(case: Case) -> Callable[..., Any]:
    fn, args = getattr(optax.projections, case.name), case.args()
    return lambda x: fn(x, *args, **case.kwargs)


# ---------------------------------------------------------------------------
# Namespace and signatures
# ---------------------------------------------------------------------------


def test_public_names():
    for name in PUBLIC_NAMES:
        fn = getattr(eqopt.projections, name)
        assert fn.__doc__ and "**Arguments:**" in fn.__doc__, name
    for name in ["projection_simplex", "projection_l1_ball", "projection_l1_sphere"]:
        assert "**References:**" in getattr(eqopt.projections, name).__doc__


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_signature_matches_optax(name):
    ours_params = inspect.signature(getattr(eqopt.projections, name)).parameters
    theirs_params = inspect.signature(getattr(optax.projections, name)).parameters
    assert list(ours_params) == list(theirs_params)
    for param_name, param in theirs_params.items():
        assert ours_params[param_name].kind == param.kind
        assert ours_params[param_name].default == param.default


# ---------------------------------------------------------------------------
# Parity: values and gradients
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_parity_values(case):
    x = case.x()
    assert tree_allclose(ours(case)(x), theirs(case)(x), rtol=1e-5, atol=1e-6)


GRAD_CASES = [
    c
    for c in CASES
    if c.grad and not c.id.startswith(("box", "hypercube", "non_negative", "linf"))
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.id for c in GRAD_CASES])
def test_parity_gradients(case):
    x = case.x()
    weights = jax.tree.map(
        lambda t: jnp.cos(jnp.arange(t.size, dtype=t.dtype).reshape(t.shape)), x
    )

    def objective(project):
        return lambda point: optax.tree.vdot(weights, project(point))

    ours_grad = jax.jit(jax.grad(objective(ours(case))))(x)
    theirs_grad = jax.jit(jax.grad(objective(theirs(case))))(x)
    assert tree_allclose(ours_grad, theirs_grad, rtol=1e-4, atol=1e-5)


def test_clipping_gradients():
    # Coordinatewise projections: gradient one inside the set, zero outside.
    x = vector(0)
    for name, args in [
        ("projection_non_negative", ()),
        ("projection_box", (-0.5, 0.4)),
        ("projection_linf_ball", (0.5,)),
    ]:
        ours_fn = getattr(eqopt.projections, name)
        theirs_fn = getattr(optax.projections, name)
        ours_jac = jax.jit(jax.jacobian(lambda p, f=ours_fn, a=args: f(p, *a)))(x)
        theirs_jac = jax.jit(jax.jacobian(lambda p, f=theirs_fn, a=args: f(p, *a)))(x)
        assert tree_allclose(ours_jac, theirs_jac), name


def test_jit():
    x = vector(0)
    for name in ["projection_simplex", "projection_l1_ball", "projection_l2_ball"]:
        jitted = jax.jit(getattr(eqopt.projections, name))(x, 0.5)
        assert tree_allclose(jitted, getattr(optax.projections, name)(x, 0.5))


# ---------------------------------------------------------------------------
# The constraints hold
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_constraints(seed):
    x = vector(seed, n=11, scale=2.0)
    p = eqopt.projections.projection_simplex(x, 1.5)
    assert jnp.all(p >= 0) and jnp.allclose(jnp.sum(p), 1.5)
    p = eqopt.projections.projection_l1_sphere(x, 1.5)
    assert jnp.allclose(jnp.sum(jnp.abs(p)), 1.5)
    p = eqopt.projections.projection_l1_ball(x, 1.5)
    assert jnp.sum(jnp.abs(p)) <= 1.5 + 1e-5
    p = eqopt.projections.projection_l2_sphere(x, 1.5)
    assert jnp.allclose(jnp.linalg.norm(p), 1.5)
    p = eqopt.projections.projection_l2_ball(x, 1.5)
    assert jnp.linalg.norm(p) <= 1.5 + 1e-5
    a = vector(seed + 10, n=11)
    p = eqopt.projections.projection_hyperplane(x, a, 0.7)
    assert jnp.allclose(jnp.vdot(a, p), 0.7, atol=1e-5)
    p = eqopt.projections.projection_halfspace(x, a, -0.7)
    assert jnp.vdot(a, p) <= -0.7 + 1e-5
    # Projecting a point of the set leaves it where it is.
    inside = jnp.full(4, 0.25)
    assert jnp.allclose(eqopt.projections.projection_simplex(inside), inside)
    # The projection is at least as near as any other point of the set.
    p = eqopt.projections.projection_simplex(x)
    other = eqopt.projections.projection_simplex(x + vector(seed + 20, n=11))
    assert jnp.linalg.norm(x - p) <= jnp.linalg.norm(x - other) + 1e-6


def test_simplex_tree_is_one_vector():
    p = eqopt.projections.projection_simplex(tree(0), 0.7)
    assert jnp.allclose(eqopt.tree.sum(p), 0.7)


def test_l2_ball_gradient_finite_at_zero():
    jac = jax.jit(jax.jacobian(eqopt.projections.projection_l2_ball))(jnp.zeros(3))
    assert jnp.allclose(jac, jnp.eye(3))
    jac = jax.jit(jax.jacobian(eqopt.projections.projection_l1_ball))(jnp.zeros(3))
    assert jnp.allclose(jac, jnp.eye(3))


def test_simplex_with_ties_and_zero_scale():
    assert jnp.allclose(eqopt.projections.projection_simplex(jnp.ones(4)), 0.25)
    assert jnp.allclose(eqopt.projections.projection_simplex(vector(0), 0.0), 0.0)


# ---------------------------------------------------------------------------
# Whole models, None leaves, dtypes
# ---------------------------------------------------------------------------

MODEL_CASES = [
    c for c in CASES
    if (c.id.endswith("-tree") or "-" not in c.id) and not c.id.startswith(("box", "hypercube"))
]  # fmt: skip


@pytest.mark.parametrize("case", MODEL_CASES, ids=[c.id for c in MODEL_CASES])
def test_whole_model(case):
    model, other = make_mlp(0), make_mlp(1)
    args = case.args()
    ours_args = tuple(other if isinstance(a, (dict, jax.Array)) else a for a in args)
    # Optax sees the same arrays as a plain dict.
    theirs_args = tuple(
        as_dict(a) if isinstance(a, eqx.Module) else a for a in ours_args
    )
    result = getattr(eqopt.projections, case.name)(model, *ours_args, **case.kwargs)
    expected = getattr(optax.projections, case.name)(
        as_dict(model), *theirs_args, **case.kwargs
    )
    if case.name == "projection_vector":  # shaped like `a`
        model = other
    assert result.activation is model.activation
    assert result.final_activation is model.final_activation
    assert tree_allclose(as_dict(result), expected, rtol=1e-5, atol=1e-6)


def test_box_on_model():
    model = make_mlp(0)
    projected = eqopt.projections.projection_box(model, -0.1, 0.2)
    assert projected.activation is model.activation
    expected = jax.tree.map(lambda t: jnp.clip(t, -0.1, 0.2), filtered(model))
    assert tree_allclose(filtered(projected), expected)


def test_none_leaves_pass_through():
    grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(2))))(make_mlp(0))
    for name in [
        "projection_simplex",
        "projection_l2_ball",
        "projection_l1_ball",
        "projection_linf_ball",
    ]:
        projected = getattr(eqopt.projections, name)(grads)
        assert projected.activation is None
        expected = getattr(optax.projections, name)(as_dict(grads))
        assert tree_allclose(as_dict(projected), expected, atol=1e-6)


def test_floating_dtypes_are_kept():
    x = {"h": vector(0).astype(jnp.bfloat16), "f": vector(1)}
    for name in [
        "projection_simplex",
        "projection_l1_ball",
        "projection_l2_ball",
        "projection_l2_sphere",
    ]:
        projected = getattr(eqopt.projections, name)(x)
        assert (
            projected["h"].dtype == jnp.bfloat16 and projected["f"].dtype == jnp.float32
        )
    assert (
        eqopt.projections.projection_simplex(jnp.array([1, 2, 3])).dtype == jnp.float32
    )


def test_scalar_bounds_on_trees():
    # Optax fails here (a scalar bound is not a prefix of a dict); eqopt broadcasts it.
    projected = eqopt.projections.projection_hypercube(tree(0))
    expected = jax.tree.map(lambda t: jnp.clip(t, 0, 1), tree(0))
    assert tree_allclose(projected, expected)
    projected = eqopt.projections.projection_hypercube(
        tree(0), {"w": 0.5, "b": jnp.full(4, 2.0)}
    )
    expected = {
        "w": jnp.clip(tree(0)["w"], 0, 0.5),
        "b": jnp.clip(tree(0)["b"], 0, 2.0),
    }
    assert tree_allclose(projected, expected)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def test_mismatched_trees_name_the_path():
    x = tree(0)
    a = {"w": jnp.ones((3, 2)), "b": jnp.ones(5)}
    with pytest.raises(ValueError, match=r"\['b'\]"):
        eqopt.projections.projection_hyperplane(x, a, 1.0)
    with pytest.raises(ValueError, match=r"\['b'\]"):
        eqopt.projections.projection_halfspace(x, a, 1.0)
    with pytest.raises(ValueError, match=r"keys \['b', 'w'\].*keys \['c', 'w'\]"):
        eqopt.projections.projection_vector(
            x, {"w": jnp.ones((3, 2)), "c": jnp.ones(4)}
        )
    with pytest.raises(ValueError, match=r"\['w'\]"):
        eqopt.projections.projection_box(x, {"w": jnp.zeros(7), "b": 0.0}, 1.0)


def test_empty_tree():
    with pytest.raises(ValueError, match="no array leaves"):
        eqopt.projections.projection_simplex({})
    with pytest.raises(ValueError, match="no array leaves"):
        eqopt.projections.projection_l1_sphere({"f": jax.nn.relu})
    assert eqopt.projections.projection_l1_ball({}) == {}
    assert eqopt.projections.projection_l2_ball({}) == {}
    assert eqopt.projections.projection_non_negative({}) == {}
