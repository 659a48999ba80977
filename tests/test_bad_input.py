"""Every mistake gets one short error naming the place and the fix.

Each test asserts the exception type, that the message names the argument or
the path, and that it is short: one line, no "Called with parameters" dump.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqopt


def _mlp(width=4, depth=2, seed=0):
    return eqx.nn.MLP(3, 2, width, depth, key=jax.random.key(seed))


def _grads(model):
    return eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(3)) ** 2))(model)


def _assert_short(error: BaseException, *needles: str):
    message = str(error)
    assert "Called with parameters" not in message
    assert len(message.splitlines()) < 20, message
    assert len(message) < 600, message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_state_of_another_optimiser():
    model = _mlp()
    adam = eqopt.scale_by_adam()
    state = eqopt.trace(0.9).init(model)
    with pytest.raises(TypeError) as info:
        adam.update(_grads(model), state, model)
    _assert_short(
        info.value, "`state`", "ScaleByAdamState", "state of `trace`", "`init`"
    )


def test_updates_and_state_swapped():
    model = _mlp()
    opt = eqopt.adam(1e-3)
    state = opt.init(model)
    with pytest.raises(TypeError) as info:
        opt.update(state, _grads(model), model)
    _assert_short(info.value, "`updates`")


def test_model_given_as_gradients():
    model = _mlp()
    opt = eqopt.adam(1e-3)
    with pytest.raises(TypeError) as info:
        opt.update(model, opt.init(model), model)
    _assert_short(info.value, "`updates`", ".activation", "eqx.filter_grad")


def test_gradients_of_a_wider_mlp():
    model = _mlp(width=4)
    opt = eqopt.adam(1e-3)
    with pytest.raises(ValueError) as info:
        opt.update(_grads(_mlp(width=5)), opt.init(model), model)
    _assert_short(info.value, "width_size=5", "width_size=4")


def test_gradients_of_a_deeper_mlp():
    model = _mlp(depth=2)
    opt = eqopt.adam(1e-3)
    with pytest.raises(ValueError) as info:
        opt.update(_grads(_mlp(depth=3)), opt.init(model), model)
    _assert_short(info.value, "depth=3", "depth=2")


def test_renamed_dict_key():
    params = {"w": jnp.ones(3), "b": jnp.ones(2)}
    grads = {"w": jnp.ones(3), "x": jnp.ones(2)}
    opt = eqopt.adam(1e-3)
    with pytest.raises(ValueError) as info:
        opt.update(grads, opt.init(params), params)
    _assert_short(info.value, "['b']", "nothing")


def test_apply_updates_shape_mismatch_names_leaf():
    params = {"w": jnp.ones(3), "b": jnp.ones(2)}
    with pytest.raises(ValueError) as info:
        eqopt.apply_updates(params, {"w": jnp.ones(3), "b": jnp.ones(4)})
    _assert_short(info.value, "['b']", "shape")


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda: eqopt.adam(1e-3, b1="0.9"), "b1"),
        (lambda: eqopt.adam(1e-3, b1=None), "b1"),
        (lambda: eqopt.adam(1e-3, b1=jnp.array([0.9, 0.8])), "b1"),
        (lambda: eqopt.scale_by_adam(eps=jnp.array([1e-8, 1e-7])), "eps"),
        (lambda: eqopt.clip_by_global_norm("1.0"), "max_norm"),
    ],
    ids=["string", "none", "vector", "vector-eps", "string-norm"],
)
def test_hyperparameter_of_the_wrong_kind(build, name):
    with pytest.raises(TypeError) as info:
        build()
    _assert_short(info.value, f"`{name}`")


def test_hyperparameter_out_of_range():
    with pytest.raises(ValueError) as info:
        eqopt.adam(1e-3, b1=1.5)
    _assert_short(info.value, "`b1`")
    with pytest.raises(ValueError) as info:
        eqopt.sgd(float("nan"))
    _assert_short(info.value, "learning_rate", "finite")


def test_float0_gradients_are_no_update():
    params = {"w": jnp.ones(3), "steps": jnp.arange(2)}
    grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2), allow_int=True)(params)
    assert grads["steps"].dtype == jax.dtypes.float0
    opt = eqopt.adam(1e-2)
    state = opt.init(params)
    updates, state = eqx.filter_jit(opt.update)(grads, state, params)
    assert updates["steps"] is None
    new = eqopt.apply_updates(params, updates)
    np.testing.assert_array_equal(new["steps"], params["steps"])
    assert not np.allclose(new["w"], params["w"])
    # apply_updates takes float0 leaves directly too.
    np.testing.assert_array_equal(eqopt.apply_updates(params, grads)["steps"], [0, 1])


def test_packed_gradient_for_unpacked_model():
    model = _mlp()
    packed = eqopt.pack(model)
    grads = eqx.filter_grad(lambda p: jnp.sum(p.unpack()(jnp.ones(3)) ** 2))(packed)
    with pytest.raises(ValueError) as info:
        eqopt.apply_updates(model, grads)
    _assert_short(info.value, "packed")
