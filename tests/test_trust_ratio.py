"""Trust ratios: scale_by_trust_ratio, LAMB, LARS and Fromage."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Case, spec_like

import eqopt

ALL_F32 = ("float32", "bfloat16", "complex64")


def _schedule(count):
    return 0.1 / (1.0 + count)


def _matrices(x):
    return x.ndim > 1


def _optax_matrices(params):
    return {k: v.ndim > 1 for k, v in params.items()}


TRANSFORM_CASES = [
    Case(
        "scale_by_trust_ratio",
        eqopt.scale_by_trust_ratio,
        optax.scale_by_trust_ratio,
        ALL_F32,
    ),
    Case(
        "scale_by_trust_ratio-options",
        lambda: eqopt.scale_by_trust_ratio(
            min_norm=0.5, trust_coefficient=2.0, eps=0.1
        ),
        lambda: optax.scale_by_trust_ratio(
            min_norm=0.5, trust_coefficient=2.0, eps=0.1
        ),
        ALL_F32,
    ),
    Case("lamb", lambda: eqopt.lamb(1e-2), lambda: optax.lamb(1e-2), ALL_F32),
    Case(
        # eqopt's callable mask is a per-leaf predicate; Optax's a function of the
        # whole params returning a tree of bools.
        "lamb-mask-predicate-schedule",
        lambda: eqopt.lamb(_schedule, weight_decay=0.1, mask=_matrices),
        lambda: optax.lamb(_schedule, weight_decay=0.1, mask=_optax_matrices),
        ALL_F32,
    ),
    Case(
        "lamb-mask-tree",
        lambda p: eqopt.lamb(
            1e-2,
            b1=0.5,
            eps_root=1e-8,
            weight_decay=_schedule,
            mask=spec_like(p, w=True),
        ),
        lambda: optax.lamb(
            1e-2,
            b1=0.5,
            eps_root=1e-8,
            weight_decay=_schedule,
            mask={"w": True, "b": False, "s": False},
        ),
    ),
    Case("lars", lambda: eqopt.lars(0.1), lambda: optax.lars(0.1), ALL_F32),
    Case(
        "lars-masks-nesterov",
        lambda: eqopt.lars(
            _schedule,
            weight_decay=0.1,
            weight_decay_mask=_matrices,
            trust_coefficient=0.01,
            eps=1e-3,
            trust_ratio_mask=_matrices,
            momentum=0.5,
            nesterov=True,
        ),
        lambda: optax.lars(
            _schedule,
            weight_decay=0.1,
            weight_decay_mask=_optax_matrices,
            trust_coefficient=0.01,
            eps=1e-3,
            trust_ratio_mask=_optax_matrices,
            momentum=0.5,
            nesterov=True,
        ),
        ALL_F32,
    ),
    Case(
        "lars-mask-tree",
        lambda p: eqopt.lars(
            0.1, weight_decay=0.1, trust_ratio_mask=spec_like(p, w=True, b=True)
        ),
        lambda: optax.lars(
            0.1, weight_decay=0.1, trust_ratio_mask={"w": True, "b": True, "s": False}
        ),
    ),
    Case("fromage", lambda: eqopt.fromage(0.1), lambda: optax.fromage(0.1), ALL_F32),
    Case(
        "fromage-schedule",
        lambda: eqopt.fromage(_schedule),
        lambda: optax.fromage(_schedule),
        ALL_F32,
    ),
    Case(
        "fromage-min_norm",
        lambda: eqopt.fromage(0.5, min_norm=1.5),
        lambda: optax.fromage(0.5, min_norm=1.5),
        ALL_F32,
    ),
]


# ---------------------------------------------------------------------------
# Behaviour
# ---------------------------------------------------------------------------


def _norm(x):
    return float(jnp.sqrt(jnp.sum(jnp.abs(x) ** 2)))


PARAMS = {"w": jnp.arange(1.0, 13.0).reshape(4, 3) / 10, "b": jnp.array([1.0, -2.0])}
GRADS = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(4, 3), "b": jnp.array([3.0, 4.0])}


def test_trust_ratio_is_per_leaf():
    tx = eqopt.scale_by_trust_ratio(trust_coefficient=0.5)
    updates, _ = tx.update(GRADS, tx.init(PARAMS), PARAMS)
    for name in PARAMS:
        # Each leaf's update has norm c * ||theta_leaf||, in the gradient's direction.
        np.testing.assert_allclose(
            _norm(updates[name]), 0.5 * _norm(PARAMS[name]), rtol=1e-6
        )
        cosine = jnp.vdot(updates[name], GRADS[name]) / (
            _norm(updates[name]) * _norm(GRADS[name])
        )
        np.testing.assert_allclose(cosine, 1.0, rtol=1e-6)
    # Rescaling one leaf's gradient changes nothing, in that leaf or another.
    scaled = {"w": 10 * GRADS["w"], "b": GRADS["b"]}
    again, _ = tx.update(scaled, tx.init(PARAMS), PARAMS)
    for name in PARAMS:
        np.testing.assert_allclose(again[name], updates[name], rtol=1e-6)
    assert not tx.elementwise


def test_trust_ratio_is_one_where_a_norm_is_zero():
    params = {"zero_param": jnp.zeros(3), "zero_grad": jnp.ones(3)}
    grads = {"zero_param": jnp.array([1.0, 2.0, 3.0]), "zero_grad": jnp.zeros(3)}
    tx = eqopt.scale_by_trust_ratio()
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_array_equal(updates["zero_param"], grads["zero_param"])
    np.testing.assert_array_equal(updates["zero_grad"], jnp.zeros(3))


def test_trust_ratio_needs_params():
    tx = eqopt.scale_by_trust_ratio()
    with pytest.raises(ValueError, match="needs `params`"):
        tx.update(GRADS, tx.init(PARAMS))


def _mlp():
    return eqx.nn.MLP(3, 2, 8, 1, key=jax.random.key(0))


def test_lamb_mask_is_a_filter_spec_on_a_whole_model():
    """With zero gradients only the decay acts: matrices move by -lr * theta, biases not at all."""
    model = _mlp()
    grads = jax.tree.map(jnp.zeros_like, eqx.filter(model, eqx.is_inexact_array))
    predicate = eqopt.lamb(0.1, weight_decay=0.5, mask=_matrices)
    prefix = jax.tree.map(lambda _: False, model)
    prefix = eqx.tree_at(
        lambda m: [layer.weight for layer in m.layers], prefix, [True, True]
    )
    full_tree = eqopt.lamb(0.1, weight_decay=0.5, mask=prefix)
    for opt in (predicate, full_tree):
        updates, _ = opt.update(grads, opt.init(model), model)
        for layer, update in zip(model.layers, updates.layers, strict=True):
            np.testing.assert_allclose(update.weight, -0.1 * layer.weight, rtol=1e-5)
            np.testing.assert_array_equal(update.bias, jnp.zeros_like(layer.bias))


def test_lars_trust_ratio_mask_leaves_biases_unscaled():
    model = _mlp()
    grads = jax.tree.map(jnp.ones_like, eqx.filter(model, eqx.is_inexact_array))
    opt = eqopt.lars(0.1, trust_ratio_mask=_matrices, momentum=0.0)
    updates, _ = opt.update(grads, opt.init(model), model)
    for layer, update in zip(model.layers, updates.layers, strict=True):
        np.testing.assert_allclose(update.bias, -0.1 * jnp.ones_like(layer.bias))
        np.testing.assert_allclose(
            _norm(update.weight), 0.1 * 0.001 * _norm(layer.weight), rtol=1e-5
        )


def test_fromage_keeps_the_norm_for_an_orthogonal_gradient():
    params = {"w": jnp.array([3.0, 4.0, 0.0])}
    grads = {"w": jnp.array([0.0, 0.0, 2.0])}  # orthogonal to the weights
    opt = eqopt.fromage(0.3)
    updates, _ = opt.update(grads, opt.init(params), params)
    new = eqopt.apply_updates(params, updates)
    np.testing.assert_allclose(_norm(new["w"]), 5.0, rtol=1e-6)
    # The step is in the gradient's direction, of relative size eta / sqrt(1 + eta^2).
    np.testing.assert_allclose(new["w"][2], -0.3 * 5.0 / np.sqrt(1.09), rtol=1e-6)


def test_fromage_accepts_a_schedule():
    """A constant schedule gives the numbers of a constant learning rate."""
    params = {"w": jnp.array([3.0, 4.0, 0.0])}
    grads = {"w": jnp.array([1.0, 0.0, 2.0])}
    scheduled = eqopt.fromage(eqopt.schedules.constant_schedule(0.3))
    constant = eqopt.fromage(0.3)
    state, constant_state = scheduled.init(params), constant.init(params)
    for _ in range(3):
        updates, state = scheduled.update(grads, state, params)
        expected, constant_state = constant.update(grads, constant_state, params)
        np.testing.assert_allclose(updates["w"], expected["w"], rtol=1e-6)


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


def _regression():
    keys = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(keys[0], (64, 3))
    y = jnp.stack([jnp.sin(x[:, 0]) + x[:, 1] ** 2, x[:, 2] * x[:, 0]], axis=-1)
    model = eqx.nn.MLP(3, 2, 16, 2, key=keys[2])
    return model, x, y


def _loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


@eqx.filter_jit
def _train(opt, model, x, y, steps: int = 60):
    state = opt.init(model)

    def body(carry, _):
        model, state = carry
        grads = eqx.filter_grad(_loss)(model, x, y)
        updates, state = opt.update(grads, state, model)
        return (eqx.apply_updates(model, updates), state), None

    params, static = eqx.partition(model, eqx.is_array)

    def scan_body(carry, _):
        params, state = carry
        (model, state), _ = body((eqx.combine(params, static), state), None)
        return (eqx.filter(model, eqx.is_array), state), None

    (params, _), _ = jax.lax.scan(scan_body, (params, state), length=steps)
    return eqx.combine(params, static)


@pytest.mark.parametrize(
    "opt",
    [
        eqopt.lamb(3e-2, weight_decay=1e-4, mask=_matrices),
        eqopt.lars(5.0, weight_decay=1e-4, weight_decay_mask=_matrices),
        eqopt.fromage(3e-2),
    ],
    ids=["lamb", "lars", "fromage"],
)
def test_training_reduces_the_loss(opt):
    model, x, y = _regression()
    trained = _train(opt, model, x, y)
    assert _loss(trained, x, y) < 0.25 * _loss(model, x, y)
