"""The optimisers: Optax's signatures, readable printing, clear errors, Optax's chain layout.

Their numerics are checked against Optax by the registry cases below.
"""

import inspect
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    ALL_DTYPES,
    REAL_DTYPES,
    Case,
    decaying_schedule,
    is_matrix,
    optax_matrices,
    spec_like,
)

import eqopt
import eqopt.schedules

TRANSFORM_CASES = [
    Case(
        "sgd",
        lambda: eqopt.sgd(0.1),
        lambda: optax.sgd(0.1),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "sgd-momentum",
        lambda: eqopt.sgd(0.1, momentum=0.9),
        lambda: optax.sgd(0.1, momentum=0.9),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "sgd-nesterov-schedule",
        lambda: eqopt.sgd(decaying_schedule, momentum=0.8, nesterov=True),
        lambda: optax.sgd(decaying_schedule, momentum=0.8, nesterov=True),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "sgd-accumulator_dtype",
        lambda: eqopt.sgd(0.1, momentum=0.9, accumulator_dtype=jnp.bfloat16),
        lambda: optax.sgd(0.1, momentum=0.9, accumulator_dtype=jnp.bfloat16),
        ("float32",),
        needs_params=False,
        rtol=1e-2,
        atol=1e-2,
    ),
    Case(
        "adam",
        lambda: eqopt.adam(1e-2),
        lambda: optax.adam(1e-2),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "adam-cosine_schedule",
        lambda: eqopt.adam(
            eqopt.schedules.cosine_decay_schedule(0.1, 5), b1=0.8, eps_root=1e-8
        ),
        lambda: optax.adam(optax.cosine_decay_schedule(0.1, 5), b1=0.8, eps_root=1e-8),
        REAL_DTYPES,
        needs_params=False,
    ),
    Case(
        "nadam",
        lambda: eqopt.nadam(1e-2),
        lambda: optax.nadam(1e-2),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case("adamw", lambda: eqopt.adamw(1e-2), lambda: optax.adamw(1e-2), ALL_DTYPES),
    Case(
        # eqopt's callable mask is a per-leaf predicate; Optax's is a function of
        # the whole params returning a tree of bools.
        "adamw-mask-predicate",
        lambda: eqopt.adamw(1e-2, weight_decay=0.1, mask=is_matrix),
        lambda: optax.adamw(1e-2, weight_decay=0.1, mask=optax_matrices),
        ALL_DTYPES,
    ),
    Case(
        "adamw-mask-tree-schedule",
        lambda p: eqopt.adamw(
            1e-2, weight_decay=decaying_schedule, mask=spec_like(p, w=True, s=True)
        ),
        lambda: optax.adamw(
            1e-2,
            weight_decay=decaying_schedule,
            mask={"w": True, "b": False, "s": True},
        ),
    ),
    Case(
        "nadamw",
        lambda: eqopt.nadamw(1e-2, weight_decay=0.1),
        lambda: optax.nadamw(1e-2, weight_decay=0.1),
        ALL_DTYPES,
    ),
    Case(
        "amsgrad",
        lambda: eqopt.amsgrad(1e-2),
        lambda: optax.amsgrad(1e-2),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "amsgrad-no_bias_correction",
        lambda: eqopt.amsgrad(1e-2, bias_correction_mu=False, bias_correction_nu=False),
        lambda: optax.amsgrad(1e-2, bias_correction_mu=False, bias_correction_nu=False),
        needs_params=False,
    ),
    Case(
        "adamax",
        lambda: eqopt.adamax(1e-2),
        lambda: optax.adamax(1e-2),
        needs_params=False,
    ),
    Case(
        "adamaxw",
        lambda: eqopt.adamaxw(1e-2, weight_decay=0.1, mask=is_matrix),
        lambda: optax.adamaxw(1e-2, weight_decay=0.1, mask=optax_matrices),
    ),
    Case(
        "rmsprop",
        lambda: eqopt.rmsprop(1e-2),
        lambda: optax.rmsprop(1e-2),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "rmsprop-centered-nesterov",
        lambda: eqopt.rmsprop(
            1e-2, centered=True, eps=1e-2, momentum=0.9, nesterov=True
        ),
        lambda: optax.rmsprop(
            1e-2, centered=True, eps=1e-2, momentum=0.9, nesterov=True
        ),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        # PyTorch's RMSprop: eps outside the root.
        "rmsprop-eps_outside-bias_correction",
        lambda: eqopt.rmsprop(
            decaying_schedule,
            decay=0.5,
            eps_in_sqrt=False,
            bias_correction=True,
            initial_scale=0.1,
        ),
        lambda: optax.rmsprop(
            decaying_schedule,
            decay=0.5,
            eps_in_sqrt=False,
            bias_correction=True,
            initial_scale=0.1,
        ),
        REAL_DTYPES,
        needs_params=False,
    ),
    Case(
        "adagrad",
        lambda: eqopt.adagrad(0.1),
        lambda: optax.adagrad(0.1),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case("lion", lambda: eqopt.lion(1e-3), lambda: optax.lion(1e-3), ALL_DTYPES),
    Case(
        "lion-mask-mu_dtype",
        lambda: eqopt.lion(
            1e-3, b1=0.5, weight_decay=0.1, mask=is_matrix, mu_dtype=jnp.bfloat16
        ),
        lambda: optax.lion(
            1e-3, b1=0.5, weight_decay=0.1, mask=optax_matrices, mu_dtype=jnp.bfloat16
        ),
        ("float32",),
    ),
    Case(
        "sign_sgd",
        lambda: eqopt.sign_sgd(0.1),
        lambda: optax.sign_sgd(0.1),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "signum",
        lambda: eqopt.signum(decaying_schedule, beta=0.5),
        lambda: optax.signum(decaying_schedule, beta=0.5),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "noisy_sgd",
        lambda: eqopt.noisy_sgd(0.1, key=jax.random.key(1)),
        lambda: optax.noisy_sgd(0.1, key=jax.random.key(1)),
        ALL_DTYPES,
        needs_params=False,
        random=True,
        no_parity_reason="random; bit-exact parity on equal trees in test_noise.py",
    ),
]

OPTIMISERS = [
    "sgd",
    "adam",
    "adamw",
    "nadam",
    "nadamw",
    "amsgrad",
    "adamax",
    "adamaxw",
    "rmsprop",
    "adagrad",
    "lion",
    "sign_sgd",
    "signum",
    "noisy_sgd",
]
TRANSFORMS = [
    "scale_by_rms",
    "scale_by_stddev",
    "scale_by_rss",
    "scale_by_sign",
    "scale_by_lion",
    "add_noise",
    "centralize",
    "zero_nans",
    "keep_params_nonnegative",
]
WITH_B1 = ["adam", "adamw", "nadam", "nadamw", "amsgrad", "adamax", "adamaxw"]


def _same_default(ours, theirs):
    if (
        isinstance(theirs, float)
        and isinstance(ours, (int, float))
        and not isinstance(ours, bool)
    ):
        return ours == theirs or (math.isnan(ours) and math.isnan(theirs))
    return type(ours) is type(theirs) and ours == theirs


@pytest.mark.parametrize("name", OPTIMISERS + TRANSFORMS)
def test_signature_matches_optax(name):
    """Each Optax parameter exists with the same name, kind and default; extras are keyword-only."""
    theirs = inspect.signature(getattr(optax, name)).parameters
    mine = inspect.signature(getattr(eqopt, name)).parameters
    assert list(mine)[: len(theirs)] == list(theirs), (
        "same parameters, in the same order"
    )
    for parameter_name, parameter in theirs.items():
        ours = mine[parameter_name]
        assert ours.kind == parameter.kind, parameter_name
        if parameter.default is inspect.Parameter.empty:
            assert ours.default is inspect.Parameter.empty, parameter_name
        else:
            assert _same_default(ours.default, parameter.default), (
                f"{parameter_name}: {ours.default!r} != {parameter.default!r}"
            )
    for parameter_name in set(mine) - set(theirs):
        assert mine[parameter_name].kind is inspect.Parameter.KEYWORD_ONLY, (
            parameter_name
        )


def _build(name, learning_rate=1e-3):
    return getattr(eqopt, name)(learning_rate)


@pytest.mark.parametrize("name", OPTIMISERS)
def test_optimiser_is_a_chain_with_optax_layout(name):
    """Same parts in the same positions as Optax's chain, so `state[i]` ports unchanged."""
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    opt = _build(name)
    assert isinstance(opt, eqopt.Chain)
    state = opt.init(params)
    extra = {"key": 0} if name == "noisy_sgd" else {}
    reference_state = getattr(optax, name)(1e-3, **extra).init(params)
    assert len(state) == len(reference_state) == len(opt)
    assert opt.names == tuple(eqopt.Chain(*opt.transforms).names), (
        "parts are named after their classes"
    )
    assert state[opt.names[-1]] is state[-1]


@pytest.mark.parametrize("name", OPTIMISERS)
def test_optimiser_prints_readably(name):
    text = repr(_build(name))
    assert "learning_rate=0.001" in text
    assert "Array(" not in text and "weak_type" not in text and "f32[]" not in text
    assert text.startswith("Chain(") and "ScaleByLearningRate(" in text
    assert str(_build(name)) == text


def test_printed_adamw():
    text = str(eqopt.adamw(1e-3))
    for part in (
        "ScaleByAdam(b1=0.9, b2=0.999, eps=1e-08, eps_root=0.0)",
        "AddDecayedWeights(weight_decay=",
        "ScaleByLearningRate(learning_rate=0.001)",
        "names=('scale_by_adam', 'add_decayed_weights', 'scale_by_learning_rate')",
    ):
        assert part in text, text
    assert "0.0001" in text or "1e-04" in text
    assert "momentum" not in str(eqopt.sgd(0.1)) and "Trace(decay=0.9)" in str(
        eqopt.sgd(0.1, 0.9)
    )


@pytest.mark.parametrize("name", OPTIMISERS)
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_learning_rate_is_an_error_naming_it(name, value):
    with pytest.raises(ValueError, match="learning_rate"):
        _build(name, value)


@pytest.mark.parametrize("name", WITH_B1)
@pytest.mark.parametrize("b1", [1.0, -0.1, 1.5, float("nan")])
def test_b1_outside_unit_interval_is_an_error_naming_it(name, b1):
    with pytest.raises(ValueError, match="`b1`"):
        getattr(eqopt, name)(1e-3, b1=b1)


@pytest.mark.parametrize(
    "make,argument",
    [
        (lambda: eqopt.lion(1e-3, b1=1.5), "b1"),
        (lambda: eqopt.lion(1e-3, b2=-0.1), "b2"),
        (lambda: eqopt.lion(1e-3, weight_decay=float("inf")), "weight_decay"),
        (lambda: eqopt.adamw(1e-3, weight_decay=float("nan")), "weight_decay"),
        (lambda: eqopt.adam(1e-3, b2=1.0), "b2"),
        (lambda: eqopt.adam(1e-3, eps=-1.0), "eps"),
        (lambda: eqopt.sgd(1e-3, momentum=float("nan")), "decay"),
        (lambda: eqopt.rmsprop(1e-3, decay=1.5), "decay"),
        (lambda: eqopt.rmsprop(1e-3, eps=-1e-8, centered=True), "eps"),
        (lambda: eqopt.rmsprop(1e-3, initial_scale=-1.0), "initial_scale"),
        (
            lambda: eqopt.adagrad(1e-3, initial_accumulator_value=-0.1),
            "initial_accumulator_value",
        ),
        (lambda: eqopt.signum(1e-3, beta=2.0), "decay"),
        (lambda: eqopt.noisy_sgd(1e-3, eta=-1.0), "eta"),
        (lambda: eqopt.scale_by_lion(smooth_beta=0.0), "smooth_beta"),
    ],
)
def test_bad_hyperparameter_is_an_error_naming_it(make, argument):
    with pytest.raises(ValueError, match=f"`{argument}`"):
        make()


def test_bad_lion_mode_names_it():
    # The annotation is a Literal, so jaxtyping's check (a TypeError) or
    # __check_init__ (a ValueError, with checking off) names the argument.
    with pytest.raises((TypeError, ValueError), match="mode"):
        eqopt.ScaleByLion(mode="soft")


def test_integer_learning_rate_and_traced_hyperparameters():
    params = {"w": jnp.ones(3)}
    opt = eqopt.sgd(1)
    updates, _ = opt.update({"w": jnp.full(3, 0.5)}, opt.init(params))
    np.testing.assert_allclose(updates["w"], -0.5)

    @jax.jit
    def lion_step(b1):  # hyperparameters may be tracers: no Python check, no error
        opt = eqopt.lion(1e-3, b1=b1)
        return opt.update({"w": jnp.full(3, 0.5)}, opt.init(params), params)[0]

    np.testing.assert_allclose(lion_step(0.9)["w"], -1e-3 * (1 + 1e-3))


def test_adamw_mask_is_an_equinox_filter_spec():
    """A prefix tree built with eqx.tree_at selects the decayed leaves of a whole model."""
    model = eqx.nn.MLP(3, 2, 4, 1, key=jax.random.key(0))
    mask = eqx.tree_at(
        lambda m: m.layers[0].weight, jax.tree.map(lambda _: False, model), True
    )
    grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(3)) ** 2))(model)
    weight_decay, learning_rate = 0.5, 0.1
    decayed = eqopt.adamw(learning_rate, weight_decay=weight_decay, mask=mask)
    plain = eqopt.adam(learning_rate)
    updates, _ = decayed.update(grads, decayed.init(model), model)
    reference, _ = plain.update(grads, plain.init(model), model)
    np.testing.assert_allclose(
        updates.layers[0].weight,
        reference.layers[0].weight
        - learning_rate * weight_decay * model.layers[0].weight,
        rtol=1e-6,
    )
    for path in (lambda m: m.layers[0].bias, lambda m: m.layers[1].weight):
        np.testing.assert_array_equal(path(updates), path(reference))
    assert not decayed.elementwise and plain.elementwise


def test_lion_mask_predicate_sees_leaves_not_the_model():
    model = eqx.nn.Linear(3, 2, key=jax.random.key(0))
    seen = []

    def matrices(leaf):
        seen.append(type(leaf))
        return leaf.ndim > 1

    opt = eqopt.lion(1e-3, mask=matrices)
    grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(3))))(model)
    updates, _ = opt.update(grads, opt.init(model), model)
    # Each selection is made per leaf; the only other call is the one probe on
    # the whole model that refuses an Optax-style whole-params mask function
    # (`_filters.refuse_whole_params_reading`).
    assert any(issubclass(t, jax.Array) for t in seen)
    assert all(issubclass(t, jax.Array) or t is eqx.nn.Linear for t in seen)
    # The mask selects the weight decay: the bias (a vector) is not decayed.
    plain, _ = eqopt.lion(1e-3, weight_decay=0.0).update(grads, opt.init(model), model)
    np.testing.assert_array_equal(updates.bias, plain.bias)
    assert not np.array_equal(updates.weight, plain.weight)


def test_elementwise_claims():
    for name in (
        "sgd",
        "adam",
        "nadam",
        "amsgrad",
        "adamax",
        "rmsprop",
        "adagrad",
        "lion",
        "sign_sgd",
        "signum",
    ):
        assert _build(name).elementwise, name
    assert eqopt.adamw(1e-3).elementwise
    assert not eqopt.adamw(1e-3, mask=lambda x: x.ndim > 1).elementwise
    assert not eqopt.noisy_sgd(1e-3).elementwise


def test_rmsprop_parts():
    assert isinstance(eqopt.rmsprop(0.1)[0], eqopt.ScaleByRms)
    assert isinstance(eqopt.rmsprop(0.1, centered=True)[0], eqopt.ScaleByStddev)
    assert isinstance(eqopt.rmsprop(0.1)[2], eqopt.Identity)
    assert eqopt.rmsprop(0.1, momentum=0.5, nesterov=True)[2].nesterov
    assert (
        eqopt.nadam(0.1).scale_by_adam.nesterov
        and not eqopt.adam(0.1).scale_by_adam.nesterov
    )


def test_learning_rate_changed_by_name_without_retrace():
    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.full(3, 0.5)}
    traces = []

    @eqx.filter_jit
    def step(opt, state):
        traces.append(None)
        return opt.update(grads, state, params)

    opt = eqopt.adamw(1e-3)
    state = opt.init(params)
    first, _ = step(opt, state)
    faster = eqx.tree_at(
        lambda o: o.scale_by_learning_rate.learning_rate, opt, eqopt.as_scalar(2e-3)
    )
    second, _ = step(faster, state)
    assert len(traces) == 1
    np.testing.assert_allclose(second["w"], 2 * first["w"], rtol=1e-6)
