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


# ---------------------------------------------------------------------------
# Wrappers and combinators check their inputs before mapping over them
# ---------------------------------------------------------------------------


def _adam():
    return eqopt.adam(1e-3)


def _is_matrix(x):
    return x.ndim > 1


def _groups():
    return {"matrices": _adam(), "vectors": eqopt.sgd(1e-2)}


_GROUP_SPECS = {"matrices": _is_matrix, "vectors": lambda x: x.ndim <= 1}

#: Every wrapper or combinator that hands `updates` (with a second tree: the
#: params, a mask, labels) to an inner transform. Each `update` checks its
#: inputs before mapping over them.
WRAPPERS = {
    "chain": lambda: eqopt.chain(eqopt.scale_by_adam(), eqopt.scale(-1e-3)),
    "named_chain": lambda: eqopt.named_chain(
        ("adam", eqopt.scale_by_adam()), ("lr", eqopt.scale(-1e-3))
    ),
    "masked": lambda: eqopt.masked(_adam(), _is_matrix),
    "freeze": lambda: eqopt.freeze(_is_matrix),
    "selective_transform": lambda: eqopt.selective_transform(
        _adam(), freeze_mask=lambda x: x.ndim <= 1
    ),
    "partition": lambda: eqopt.partition(_groups(), _GROUP_SPECS),
    "partition-label-fn": lambda: eqopt.partition(
        _groups(), lambda x: "matrices" if x.ndim > 1 else "vectors"
    ),
    "multi_transform": lambda: eqopt.multi_transform(_groups(), _GROUP_SPECS),
    "conditionally_transform": lambda: eqopt.conditionally_transform(
        _adam(), lambda step: step < 5
    ),
    "conditionally_mask": lambda: eqopt.conditionally_mask(
        _adam(), lambda step: step < 5
    ),
    "MultiSteps": lambda: eqopt.MultiSteps(_adam(), 2),
    "apply_every": lambda: eqopt.apply_every(2),
    "flatten": lambda: eqopt.flatten(_adam()),
    "apply_if_finite": lambda: eqopt.apply_if_finite(_adam(), 3),
    "inject_hyperparams": lambda: eqopt.inject_hyperparams(eqopt.adam)(
        learning_rate=1e-3
    ),
    "monitor": lambda: eqopt.monitor({"norm": eqopt.tree.norm}),
    "snapshot": lambda: eqopt.snapshot("norm", eqopt.tree.norm),
    "bucketed": lambda: eqopt.bucketed(_adam()),
    "contrib.mechanize": lambda: eqopt.contrib.mechanize(_adam()),
    "contrib.schedule_free": lambda: eqopt.contrib.schedule_free(_adam(), 1e-3),
    "contrib.sam": lambda: eqopt.contrib.sam(eqopt.sgd(1e-2), eqopt.sgd(1e-2)),
    "contrib.split_real_and_imaginary": lambda: eqopt.contrib.split_real_and_imaginary(
        _adam()
    ),
    "contrib.muon": lambda: eqopt.contrib.muon(1e-3),
    "contrib.galore": lambda: eqopt.contrib.galore(1e-3, rank=2),
}

#: Those whose state does not depend on the params, or that need the params:
#: without params there is nothing to check the updates against.
_NOTHING_TO_CHECK_WITHOUT_PARAMS = {
    "freeze",
    "monitor",
    "snapshot",
    "contrib.mechanize",
    "contrib.schedule_free",
    "contrib.sam",
    # The inner state is of one flat vector: the error names its length only.
    "flatten",
}


@pytest.mark.parametrize("name", list(WRAPPERS))
def test_wrapper_gradients_of_a_wider_mlp(name):
    tx = WRAPPERS[name]()
    model = _mlp(width=4)
    with pytest.raises(ValueError) as info:
        tx.update(_grads(_mlp(width=5)), tx.init(model), model)
    _assert_short(info.value, "`updates`", "`params`", "width_size=5", "width_size=4")


@pytest.mark.parametrize("name", list(WRAPPERS))
def test_wrapper_gradients_with_an_extra_key(name):
    tx = WRAPPERS[name]()
    params = {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}
    grads = {"w": jnp.ones((4, 3)), "b": jnp.ones(3), "x": jnp.ones(2)}
    with pytest.raises(ValueError) as info:
        tx.update(grads, tx.init(params), params)
    _assert_short(info.value, "`updates`", "`params`", "['x']", "nothing")


@pytest.mark.parametrize(
    "name", [name for name in WRAPPERS if name not in _NOTHING_TO_CHECK_WITHOUT_PARAMS]
)
def test_wrapper_gradients_of_a_wider_mlp_without_params(name):
    tx = WRAPPERS[name]()
    with pytest.raises(ValueError) as info:
        tx.update(_grads(_mlp(width=5)), tx.init(_mlp(width=4)))
    _assert_short(info.value, "`updates`", "`state`", "width_size=5", "width_size=4")


@pytest.mark.parametrize("name", list(WRAPPERS))
def test_wrapper_state_of_another_optimiser(name):
    tx = WRAPPERS[name]()
    params = {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}
    state = eqopt.lion(1e-3).init(params)
    with pytest.raises((TypeError, ValueError)) as info:
        tx.update(params, state, params)
    _assert_short(info.value, "`state`", "`init`")


def test_partition_state_made_with_other_labels():
    params = {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}
    old = eqopt.partition({"m": _adam(), "v": eqopt.sgd(1e-2)}, {"w": "m", "b": "v"})
    new = eqopt.partition(_groups(), {"w": "matrices", "b": "vectors"})
    with pytest.raises(ValueError) as info:
        new.update(params, old.init(params), params)
    _assert_short(info.value, "`state`", "['m', 'v']", "['matrices', 'vectors']")


def test_chain_state_of_another_length():
    params = {"w": jnp.ones((4, 3))}
    with pytest.raises(ValueError) as info:
        eqopt.adamw(1e-3).update(params, eqopt.adam(1e-3).init(params), params)
    _assert_short(info.value, "`state`", "3 parts", "has 2", "`init`")


def test_lookahead_is_checked_against_the_fast_weights():
    opt = eqopt.lookahead(_adam(), sync_period=2, slow_step_size=0.5)
    params = eqopt.LookaheadParams.init_synced(_mlp(width=4))
    with pytest.raises(ValueError) as info:
        opt.update(_grads(_mlp(width=5)), opt.init(params), params)
    _assert_short(info.value, "`updates`", "width_size=5", "width_size=4")


def test_a_model_as_updates_is_still_a_type_error():
    # The structure check leaves a tree that is not gradients to the type check.
    model = _mlp()
    opt = eqopt.masked(_adam(), _is_matrix)
    with pytest.raises(TypeError) as info:
        opt.update(opt.init(model), opt.init(model), model)
    _assert_short(info.value, "`updates`")


# ---------------------------------------------------------------------------
# Callables written for Optax's whole-params call
# ---------------------------------------------------------------------------

_PARAMS = {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}


def _label_tree(params):
    # Optax's spelling: a function of the whole params returning a label tree.
    return {k: "matrices" if v.ndim > 1 else "vectors" for k, v in params.items()}


@pytest.mark.parametrize("factory", [eqopt.partition, eqopt.multi_transform])
@pytest.mark.parametrize(
    "label_fn",
    [
        lambda params: {"w": "matrices", "b": "vectors"},
        _label_tree,
    ],
    ids=["returns-a-tree", "calls-items"],
)
def test_whole_params_label_function(factory, label_fn):
    with pytest.raises(ValueError) as info:
        factory(_groups(), label_fn).init(_PARAMS)
    _assert_short(
        info.value,
        "['b']",
        "per-leaf label function",
        "`eqx.filter`",
        "`partition(transforms, label_fn(params))`",
    )
    # The fix the message shows works.
    state = factory(_groups(), _label_tree(_PARAMS)).init(_PARAMS)
    assert set(state.inner_states) == {"matrices", "vectors"}


def test_label_function_giving_an_unknown_label():
    with pytest.raises(ValueError) as info:
        eqopt.partition(_groups(), lambda x: "biases").init(_PARAMS)
    _assert_short(info.value, "'biases'", "no group", "label_fn(params)")


def test_whole_params_mask_says_it_the_same_way():
    with pytest.raises(ValueError) as info:
        eqopt.masked(_adam(), lambda params: {"w": True, "b": False}).init(_PARAMS)
    _assert_short(
        info.value,
        "['b']",
        "per-leaf predicate",
        "`eqx.filter`",
        "`masked(inner, mask_fn(params))`",
    )
    # A function calling `.items()` on what it is given fails on a leaf: said the same way.
    with pytest.raises(ValueError) as info:
        eqopt.masked(
            _adam(), lambda params: {k: v.ndim > 1 for k, v in params.items()}
        ).init(_PARAMS)
    _assert_short(info.value, "['b']", "AttributeError", "per-leaf predicate")


# ---------------------------------------------------------------------------
# Gradients of another model: the field that differs, and the fix
# ---------------------------------------------------------------------------


def test_gradients_of_another_model_name_the_static_field_and_the_fix():
    model = _mlp(depth=2)
    opt = eqopt.adam(1e-3)
    with pytest.raises(ValueError) as info:
        opt.update(_grads(_mlp(depth=3)), opt.init(model), model)
    _assert_short(
        info.value,
        "`updates` has `MLP(depth=3, ...)` where `params` has `MLP(depth=2, ...)`",
        "static field, not a leaf",
        "gradients of another model",
        "`eqx.filter_grad` of the same model",
    )
    assert "<root>" not in str(info.value)
    # The fix the message gives works.
    opt.update(_grads(model), opt.init(model), model)


def test_a_nested_module_built_otherwise_is_named_by_its_path():
    def params(out_features):
        return {
            "head": eqx.nn.Linear(3, out_features, key=jax.random.key(0)),
            "scale": jnp.ones(3),
        }

    model = params(2)
    opt = eqopt.sgd(0.1)
    with pytest.raises(ValueError) as info:
        opt.update(params(4), opt.init(model), model)
    _assert_short(
        info.value,
        "at ['head'], `updates` has `Linear(out_features=4, ...)`",
        "`Linear(out_features=2, ...)`",
        "eqx.filter_grad",
    )


def test_state_of_another_model_says_to_init_on_this_one():
    model = _mlp(depth=2)
    opt = eqopt.scale_by_adam()
    with pytest.raises(ValueError) as info:
        opt.update(_grads(model), opt.init(_mlp(depth=3)))
    _assert_short(info.value, "`state`", "depth", "`init` the optimiser on the model")
