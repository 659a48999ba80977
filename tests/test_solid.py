"""Regressions from trying eqopt as a new user would and from Optax's own test suite.

Each test is one trap a user fell into (issue "Solid on day one"): the message a
mistake gets, a recipe that must do what it says, an Optax behaviour that code
relies on.
"""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqopt

# ---------------------------------------------------------------------------
# A misspelt argument names the function and the likely fix
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: eqopt.adam(learnign_rate=1e-3),
            "adam() got an unexpected keyword argument 'learnign_rate'; did you mean "
            "'learning_rate'?",
        ),
        (
            lambda: eqopt.adamw(1e-3, weight_decy=0.1),
            "adamw() got an unexpected keyword argument 'weight_decy'; did you mean "
            "'weight_decay'?",
        ),
        (
            lambda: eqopt.ScaleByAdam(b11=0.9),
            "ScaleByAdam() got an unexpected keyword argument 'b11'; did you mean 'b1'?",
        ),
        (lambda: eqopt.sgd(), "sgd() missing a required argument: 'learning_rate'"),
        (
            lambda: eqopt.losses.l2_loss(jnp.ones(2), jnp.ones(2), jnp.ones(2)),
            "l2_loss() too many positional arguments",
        ),
    ],
)
def test_a_call_that_does_not_bind_names_the_function(call, message):
    with pytest.raises(TypeError) as info:
        call()
    assert str(info.value) == message


def test_an_error_raised_inside_a_function_is_left_alone():
    # Only a call that does not bind is reworded; a TypeError raised in the body
    # (here by the user's predicate) keeps its own message.
    with pytest.raises(ValueError) as info:
        eqopt.masked(eqopt.scale(2.0), lambda x: x.ndim > "a").init(
            {"w": jnp.ones((2, 2))}
        )
    assert "raised an error on the leaf at ['w'] (TypeError: '>'" in str(info.value)
    assert "argument" not in str(info.value)


# ---------------------------------------------------------------------------
# Interop mistakes
# ---------------------------------------------------------------------------


def _mlp():
    return eqx.nn.MLP(3, 2, 4, 2, key=jax.random.key(0))


def _grads(model):
    return eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(3)) ** 2))(model)


def test_an_optax_transform_in_a_chain_runs_on_a_whole_model():
    model = _mlp()
    mixed = eqopt.chain(optax.clip_by_global_norm(1.0), eqopt.adam(1e-2))
    ours = eqopt.chain(eqopt.clip_by_global_norm(1.0), eqopt.adam(1e-2))
    assert isinstance(mixed[0], eqopt.FromOptax)
    state, reference = mixed.init(model), ours.init(model)
    for _ in range(2):
        updates, state = mixed.update(_grads(model), state, model)
        expected, reference = ours.update(_grads(model), reference, model)
    leaves = jax.tree.leaves(eqx.filter(updates, eqx.is_array))
    expected_leaves = jax.tree.leaves(eqx.filter(expected, eqx.is_array))
    for a, b in zip(leaves, expected_leaves, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "build",
    [
        lambda: eqopt.adam(1e-3, mu_dtype="bf16"),
        lambda: eqopt.scale_by_adam(nu_dtype="floaty"),
        lambda: eqopt.contrib.muon(1e-3, mu_dtype="half-precision"),
    ],
)
def test_a_dtype_that_is_not_one_is_refused_when_built(build):
    with pytest.raises(ValueError, match=r"is not a dtype\. Pass a JAX dtype"):
        build()


def test_a_dtype_name_is_accepted():
    state = eqopt.adam(1e-3, mu_dtype="bfloat16").init({"w": jnp.ones(2)})
    assert state[0].mu["w"].dtype == jnp.bfloat16


# ---------------------------------------------------------------------------
# Optax's suite: the remaining real failures
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_radam_keeps_low_precision_dtypes(dtype):
    opt = eqopt.radam(1e-3)
    params = jnp.array([1.0, 2.0], dtype=dtype)
    state = jax.jit(opt.init)(params)
    step = jax.jit(opt.update)
    for _ in range(7):  # past the rectification threshold too
        updates, new_state = step(params, state, params)
        assert updates.dtype == dtype
        same = jax.tree.map(lambda a, b: a.dtype == b.dtype, state, new_state)
        assert all(jax.tree.leaves(same))
        state = new_state


@pytest.mark.parametrize(
    "factory, kwargs",
    [
        (lambda: eqopt.contrib.muon, {"learning_rate": 1e-3}),
        (lambda: eqopt.contrib.muon, {"learning_rate": 1e-3, "ns_steps": 3}),
        (lambda: eqopt.contrib.adopt, {"learning_rate": 1e-3}),
    ],
)
def test_inject_keeps_integer_and_function_arguments_static(factory, kwargs):
    params = [jnp.negative(jnp.ones((2, 3))), jnp.ones((2, 5, 2))]
    injected = eqopt.inject_hyperparams(factory())(**kwargs)
    plain = factory()(**kwargs)
    state = jax.jit(injected.init)(params)
    updates, state = jax.jit(injected.update)(params, state, params)
    expected, _ = plain.update(params, plain.init(params), params)
    assert "ns_steps" not in state.hyperparams
    assert "clip_value_fn" not in state.hyperparams
    for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_tree_map_params_on_lars_is_quiet():
    opt = eqopt.lars(1e-3)
    params = {"w": jnp.ones((3, 3)), "b": jnp.ones(3)}
    state = opt.init(params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mapped = eqopt.tree_map_params(opt, lambda x: x + 1, state)
    assert jax.tree.structure(mapped) == jax.tree.structure(state)


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: eqopt.scale_by_lion(mode="soft"),  # type: ignore[arg-type]
            "scale_by_lion: argument `mode` must be one of 'hard', 'smooth', "
            "'refined', got str 'soft'.",
        ),
        (
            lambda: eqopt.piecewise_interpolate_schedule(
                interpolate_type=None,  # type: ignore[arg-type]
                init_value=1.0,
                boundaries_and_scales={1: 0.5},
            ),
            "piecewise_interpolate_schedule: argument `interpolate_type` must be one "
            "of 'linear', 'cosine', got NoneType None.",
        ),
    ],
)
def test_a_bad_choice_is_a_value_error(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert isinstance(info.value, eqopt.ArgumentValueError)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "call, replacement",
    [
        (lambda: eqopt.global_norm({"a": jnp.ones(2)}), "eqopt.tree.norm"),
        (lambda: eqopt.optimistic_adam(1e-3), "eqopt.optimistic_adam_v2"),
        (
            lambda: eqopt.inject_stateful_hyperparams(eqopt.sgd)(learning_rate=0.1),
            "eqopt.inject_hyperparams",
        ),
        (
            lambda: eqopt.losses.convex_kl_divergence(jnp.zeros(2), jnp.ones(2)),
            "eqopt.losses.generalized_kl_divergence",
        ),
        (lambda: eqopt.dpsgd, "eqopt.contrib.dpsgd"),
        (
            lambda: eqopt.differentially_private_aggregate,
            "eqopt.contrib.differentially_private_aggregate",
        ),
    ],
)
def test_names_optax_deprecates_warn(call, replacement):
    with pytest.warns(DeprecationWarning, match=replacement) as caught:
        call()
    assert caught[0].filename == __file__  # points at the caller


@pytest.mark.parametrize(
    "call, optax_says",
    [
        # The sentences Optax's own tests match: Optax code that checks its
        # warnings ports too.
        (lambda: eqopt.optimistic_adam(1e-3), "use `optimistic_adam_v2` instead"),
        (
            lambda: eqopt.losses.convex_kl_divergence(jnp.zeros(2), jnp.ones(2)),
            "use generalized_kl_divergence",
        ),
    ],
)
def test_deprecations_keep_optaxs_sentence(call, optax_says):
    with pytest.warns(DeprecationWarning, match=optax_says):
        call()


def test_the_deprecated_global_norm_gives_the_same_number():
    tree = {"a": jnp.array([3.0]), "b": jnp.array([4.0])}
    with pytest.warns(DeprecationWarning):
        assert float(eqopt.global_norm(tree)) == float(eqopt.tree.norm(tree)) == 5.0


# ---------------------------------------------------------------------------
# Reading the current learning rate
# ---------------------------------------------------------------------------


def test_current_hyperparams_reads_schedules_at_the_step():
    model = _mlp()
    schedule = eqopt.linear_schedule(1.0, 0.0, 10)
    opt = eqopt.chain(
        eqopt.clip_by_global_norm(1.0), eqopt.adamw(schedule, weight_decay=1e-2)
    )
    state = opt.init(model)
    step = eqx.filter_jit(lambda opt, state: opt.update(_grads(model), state, model))
    for _ in range(3):
        _, state = step(opt, state)
    values = eqopt.current_hyperparams(opt, state)
    np.testing.assert_allclose(values["learning_rate"], 0.7, rtol=1e-6)
    np.testing.assert_allclose(values["weight_decay"], 1e-2, rtol=1e-6)
    np.testing.assert_allclose(values["max_norm"], 1.0)
    jitted = eqx.filter_jit(eqopt.current_hyperparams)(opt, state)
    np.testing.assert_allclose(jitted["learning_rate"], 0.7, rtol=1e-6)


def test_current_hyperparams_names_repeats_by_their_part():
    model = _mlp()
    opt = eqopt.partition(
        {
            "matrices": eqopt.adam(eqopt.linear_schedule(1.0, 0.0, 10)),
            "vectors": eqopt.sgd(0.1, momentum=0.9),
        },
        {"matrices": lambda x: x.ndim > 1, "vectors": lambda x: x.ndim <= 1},
    )
    state = opt.init(model)
    _, state = opt.update(_grads(model), state, model)
    values = eqopt.current_hyperparams(opt, state)
    key = "scale_by_learning_rate.learning_rate"
    np.testing.assert_allclose(values[f"matrices.{key}"], 0.9, rtol=1e-6)
    np.testing.assert_allclose(values[f"vectors.{key}"], 0.1)
    assert "learning_rate" not in values


def test_current_hyperparams_full_keys_do_not_move_when_a_part_is_added():
    model = _mlp()
    adamw = eqopt.adamw(1e-3, weight_decay=1e-2)
    before = eqopt.current_hyperparams(adamw, adamw.init(model))
    assert {"b1", "eps", "learning_rate", "weight_decay"} <= set(before)
    full = {k: v for k, v in before.items() if "." in k}
    assert set(full) == {
        "scale_by_adam.b1",
        "scale_by_adam.b2",
        "scale_by_adam.eps",
        "scale_by_adam.eps_root",
        "add_decayed_weights.weight_decay",
        "scale_by_learning_rate.learning_rate",
    }
    # A second part with an `eps` and a `learning_rate` of its own: the full
    # keys stay; only the shortcuts of the shared names go.
    opt = eqopt.named_chain(
        ("adamw", adamw),
        ("sgd", eqopt.chain(eqopt.scale_by_rms(eps=1e-3), eqopt.sgd(0.1))),
    )
    after = eqopt.current_hyperparams(opt, opt.init(model))
    for key, value in full.items():
        np.testing.assert_allclose(after[f"adamw.{key}"], value)
    assert "learning_rate" not in after and "eps" not in after
    assert after["b1"] == before["b1"]  # still the only `b1`


def test_current_hyperparams_of_injected_and_wrapped_optimisers():
    model = _mlp()
    schedule = eqopt.linear_schedule(1.0, 0.0, 10)
    injected = eqopt.inject_hyperparams(eqopt.adam)(learning_rate=schedule, b1=0.8)
    state = injected.init(model)
    _, state = injected.update(_grads(model), state, model)
    values = eqopt.current_hyperparams(injected, state)
    np.testing.assert_allclose(values["learning_rate"], 0.9, rtol=1e-6)
    np.testing.assert_allclose(values["b1"], 0.8, rtol=1e-6)
    wrapped = eqopt.MultiSteps(eqopt.adam(schedule), every_k_schedule=2)
    values = eqopt.current_hyperparams(wrapped, wrapped.init(model))
    np.testing.assert_allclose(values["learning_rate"], 1.0)


# ---------------------------------------------------------------------------
# Real programs run with `import eqopt as optax`
# ---------------------------------------------------------------------------


def _train_step_optimisers():
    schedule = eqopt.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10)
    return (
        eqopt.adamw(schedule, weight_decay=0.1),
        eqopt.chain(eqopt.clip_by_global_norm(1.0), eqopt.sgd(1e-2, momentum=0.9)),
        eqopt.inject_hyperparams(eqopt.adam)(learning_rate=1e-2),
    )


def _loss_fn(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def test_on_host_optimiser_survives_a_step_that_donates_everything():
    # `train_step(model, opt_state, optim, batch)` under `donate="all"`: the loss
    # (a float32 scalar output) takes the first float32 scalar input buffer left
    # unclaimed, the learning rate's when it is a device array, and the second
    # call fails with "Array has been deleted". `eqopt.on_host` keeps every
    # hyperparameter in host memory, which no step can take.
    @eqx.filter_jit(donate="all")
    def train_step(model, opt_state, optim, x, y):
        loss, grads = eqx.filter_value_and_grad(_loss_fn)(model, x, y)
        updates, opt_state = optim.update(grads, opt_state, model)
        return eqx.apply_updates(model, updates), opt_state, loss

    for optim in map(eqopt.on_host, _train_step_optimisers()):
        model = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))
        opt_state = optim.init(model)
        losses = []
        for _ in range(3):
            x, y = jnp.ones((4, 3)), jnp.zeros((4, 2))
            model, opt_state, loss = train_step(model, opt_state, optim, x, y)
            losses.append(float(loss))
        assert losses[2] < losses[0]
        # The optimiser holds no device buffer for a step to take.
        assert not [x for x in jax.tree.leaves(optim) if isinstance(x, jax.Array)]


def test_a_train_state_survives_a_step_that_donates_everything():
    # The step returns the optimiser inside the state, so each donated buffer
    # goes to an output the caller keeps (the docs point `donate="all"` users
    # here and to `eqopt.on_host`).
    @eqx.filter_jit(donate="all")
    def train_step(state, x, y):
        loss, grads = eqx.filter_value_and_grad(_loss_fn)(state.model, x, y)
        return state.apply_gradients(grads), loss

    for optim in _train_step_optimisers():
        model = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))
        state = eqopt.TrainState.create(model=model, tx=optim)
        x, y = jnp.ones((4, 3)), jnp.zeros((4, 2))
        losses = []
        for _ in range(3):
            state, loss = train_step(state, x, y)
            losses.append(float(loss))
        assert losses[2] < losses[0] and int(state.step) == 3


def test_the_documented_step_keeps_the_optimiser_and_does_not_recompile():
    # Getting started: the optimiser and the batch in the first argument, which
    # `donate="all-except-first"` keeps; the model and the state are donated.
    traces = []

    @eqx.filter_jit(donate="all-except-first")
    def train_step(inputs, model, opt_state):
        traces.append(None)
        optim, x, y = inputs
        loss, grads = eqx.filter_value_and_grad(_loss_fn)(model, x, y)
        updates, opt_state = optim.update(grads, opt_state, model)
        return eqx.apply_updates(model, updates), opt_state, loss

    for optim in _train_step_optimisers():
        traces.clear()
        model = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))
        opt_state = optim.init(model)
        x, y = jnp.ones((4, 3)), jnp.zeros((4, 2))
        first = None
        for step in range(4):
            if step == 2 and isinstance(optim, eqopt.Chain):
                # A new gradient-clipping threshold or weight decay: no new program.
                leaves, treedef = jax.tree.flatten(optim)
                optim = jax.tree.unflatten(
                    treedef,
                    [
                        x * 0.5 if eqx.is_inexact_array(x) and x.ndim == 0 else x
                        for x in leaves
                    ],
                )
            model, opt_state, loss = train_step((optim, x, y), model, opt_state)
            first = float(loss) if first is None else first
        assert float(loss) < first
        assert len(traces) == 1


@pytest.mark.parametrize(
    "opt",
    [eqopt.adam(1e-3), eqopt.sgd(0.1, momentum=0.9), eqopt.lion(1e-3)],
    ids=["adam", "sgd-momentum", "lion"],
)
def test_a_gradient_where_the_state_holds_nothing_names_the_path(opt):
    state = opt.init({"w": jnp.ones(2), "p": 0.1})
    with pytest.raises(ValueError) as info:
        opt.update({"w": jnp.ones(2), "p": jnp.asarray(1.0)}, state)
    message = str(info.value)
    assert message.startswith("`updates` at ['p'] is an array but the state")
    assert "not trainable" in message


def _encoder_only(params):
    # Written for Optax: a function of the whole params, selecting by path.
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "encoder" in jax.tree_util.keystr(path), params
    )


_PARAMS = {"encoder": {"w": jnp.ones((2, 2))}, "head": {"w": jnp.ones((2, 2))}}


@pytest.mark.parametrize(
    "build, fix",
    [
        (
            lambda: eqopt.adamw(0.1, weight_decay=0.5, mask=_encoder_only),
            "call it yourself and pass the tree it returns",
        ),
        (
            lambda: eqopt.masked(eqopt.sgd(0.1), _encoder_only),
            "`masked(inner, mask_fn(params))`",
        ),
        (
            lambda: eqopt.partition(
                {"enc": eqopt.sgd(1.0), "rest": eqopt.sgd(0.1)},
                lambda p: jax.tree_util.tree_map_with_path(
                    lambda path, _: (
                        "enc" if "encoder" in jax.tree_util.keystr(path) else "rest"
                    ),
                    p,
                ),
            ),
            "`partition(transforms, label_fn(params))`",
        ),
    ],
    ids=["adamw-mask", "masked", "partition-labels"],
)
def test_a_whole_params_function_is_never_silently_read_per_leaf(build, fix):
    with pytest.raises(ValueError) as info:
        build().init(_PARAMS)
    message = str(info.value)
    assert "reads as a function of the whole params" in message
    assert "['encoder']['w']" in message or "['head']['w']" in message
    assert fix in message


def test_a_function_that_reads_the_same_both_ways_is_kept():
    # `jax.tree.map(predicate, params)` works on a leaf too, with the same result.
    opt = eqopt.masked(
        eqopt.scale(2.0), lambda p: jax.tree.map(lambda x: x.ndim > 1, p)
    )
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}
    updates, _ = opt.update(params, opt.init(params), params)
    np.testing.assert_array_equal(updates["w"], 2.0)
    np.testing.assert_array_equal(updates["b"], 1.0)
    # And the fix the message shows works.
    masked = eqopt.masked(eqopt.sgd(0.1), _encoder_only(_PARAMS))
    updates, _ = masked.update(_PARAMS, masked.init(_PARAMS), _PARAMS)
    np.testing.assert_allclose(updates["encoder"]["w"], -0.1)
    np.testing.assert_array_equal(updates["head"]["w"], 1.0)
