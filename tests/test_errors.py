"""Bad input gets one clear error that names the offending leaf's path or argument."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import pytest

import eqopt


def make_model():
    return eqx.nn.MLP(3, 2, 4, 1, key=jax.random.key(0))


def grads_of(model):
    return eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(3)) ** 2))(model)


def test_gradient_shape_mismatch_names_path():
    model = make_model()
    opt = eqopt.adam(1e-3) if hasattr(eqopt, "adam") else eqopt.scale_by_adam()
    state = opt.init(model)
    bad = eqx.tree_at(lambda g: g.layers[1].weight, grads_of(model), jnp.ones((3, 3)))
    with pytest.raises(
        ValueError, match=r"\.layers\[1\]\.weight.*shape \(3, 3\).*\(2, 4\)"
    ):
        opt.update(bad, state, model)


def test_gradient_structure_mismatch_names_path():
    params = {"a": jnp.ones(2), "b": jnp.ones(3)}
    opt = eqopt.scale_by_adam()
    state = opt.init(params)
    with pytest.raises(ValueError, match=r"\['c'\]"):
        opt.update(
            {"a": jnp.ones(2), "b": jnp.ones(3), "c": jnp.ones(1)}, state, params
        )
    with pytest.raises(ValueError, match=r"\['b'\]"):
        opt.update({"a": jnp.ones(2)}, state)


def test_gradient_for_non_trainable_leaf_names_path():
    model = make_model()
    grads = eqx.tree_at(
        lambda g: g.activation,
        grads_of(model),
        jnp.ones(()),
        is_leaf=lambda x: x is None,
    )
    with pytest.raises(ValueError, match=r"\.activation.*not trainable"):
        eqopt.apply_updates(model, grads)


def test_complex_update_for_real_param_names_path():
    params = {"w": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"\['w'\].*complex"):
        eqopt.apply_updates(params, {"w": jnp.ones(2, jnp.complex64)})


def test_state_from_another_model_names_path():
    opt = eqopt.scale_by_adam()
    state = opt.init({"a": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"\['b'\]"):
        opt.update({"a": jnp.ones(2), "b": jnp.ones(2)}, state)


def test_errors_at_trace_time_under_jit():
    params = {"a": jnp.ones(2)}
    opt = eqopt.scale_by_adam()
    state = opt.init(params)

    @eqx.filter_jit
    def step(updates, state):
        return opt.update(updates, state)

    with pytest.raises(ValueError, match=r"\['a'\].*shape \(3,\)"):
        step({"a": jnp.ones(3)}, state)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_learning_rate(value):
    with pytest.raises(ValueError, match="learning_rate.*finite"):
        eqopt.scale_by_learning_rate(value)


@pytest.mark.parametrize("b1", [-0.1, 1.0, 1.5])
def test_decay_out_of_range(b1):
    with pytest.raises(ValueError, match="b1"):
        eqopt.scale_by_adam(b1=b1)


def test_mask_that_selects_nothing():
    model = make_model()
    with pytest.raises(ValueError, match="selects no trainable leaf"):
        eqopt.masked(eqopt.scale(2.0), lambda x: x.ndim > 3).init(model)
    with pytest.raises(ValueError, match="selects no trainable leaf"):
        eqopt.add_decayed_weights(0.1, mask=False).init(model)


def test_mask_predicate_returning_a_tree_is_explained():
    params = {"a": jnp.ones(2)}
    with pytest.raises(
        ValueError, match=r"per-leaf predicate.*\['a'\]|\['a'\].*per-leaf predicate"
    ):
        eqopt.masked(eqopt.scale(2.0), lambda p: {"x": True}).init(params)


def test_mask_not_a_prefix():
    params = {"a": jnp.ones(2), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match="not a prefix"):
        eqopt.masked(eqopt.scale(2.0), {"a": True, "c": False}).init(params)


def test_partition_leaf_in_no_group_or_two():
    model = make_model()
    transforms = {"a": eqopt.scale(1.0), "b": eqopt.scale(2.0)}
    with pytest.raises(ValueError, match=r"\.layers\[0\]\.bias.*no group"):
        eqopt.partition(transforms, {"a": lambda x: x.ndim > 1, "b": False}).init(model)
    with pytest.raises(ValueError, match=r"\.layers\[0\]\.weight.*several groups"):
        eqopt.partition(transforms, {"a": True, "b": lambda x: x.ndim > 1}).init(model)


def test_partition_unknown_label_names_path():
    params = {"w": jnp.ones(2), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"\['b'\].*'c'.*no group"):
        eqopt.partition({"a": eqopt.scale(1.0)}, {"w": "a", "b": "c"}).init(params)


def test_wrong_state_type_is_a_type_error():
    params = {"a": jnp.ones(2)}
    with pytest.raises(jaxtyping.TypeCheckError):
        eqopt.scale_by_adam().update(params, eqopt.EmptyState())


def test_state_field_types_are_checked():
    with pytest.raises(jaxtyping.TypeCheckError):
        eqopt.ScaleByAdamState(count=jnp.zeros(()), mu=None, nu=None)  # float count


def test_weight_decay_needs_params():
    params = {"a": jnp.ones(2)}
    opt = eqopt.add_decayed_weights(0.1)
    with pytest.raises(ValueError, match="needs `params`"):
        opt.update(params, opt.init(params))


def test_integer_gradient_is_a_type_error():
    """Updates are checked as a pytree of inexact arrays (with None) at every update."""
    params = {"a": jnp.ones(2)}
    opt = eqopt.scale_by_adam()
    with pytest.raises(jaxtyping.TypeCheckError, match="updates"):
        opt.update({"a": jnp.ones(2, jnp.int32)}, opt.init(params))
    with pytest.raises(jaxtyping.TypeCheckError):
        eqopt.ScaleByAdamState(
            count=jnp.zeros((), jnp.int32), mu={"a": jnp.ones(2, jnp.int32)}, nu=None
        )
