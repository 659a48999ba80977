"""Factored second moments (scale_by_factored_rms) and Adafactor."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Case, spec_like

import eqopt
from eqopt._transform.factored import factored_dims

ALL_F32 = ("float32", "bfloat16", "complex64")
REAL = ("float32", "bfloat16")


def _schedule(count):
    return 0.1 / (1.0 + count)


def _matrices(x):
    return x.ndim > 1


def _optax_matrices(params):
    return {k: v.ndim > 1 for k, v in params.items()}


def _capped_decay(step, decay_rate):
    return jnp.minimum(0.9, 1.0 - (step + 1.0) ** (-decay_rate))


# The standard model's `w` is 4 x 3: `min_dim_size_to_factor=2` factors it, the
# default (128) keeps it whole.
TRANSFORM_CASES = [
    Case(
        "scale_by_factored_rms",
        eqopt.scale_by_factored_rms,
        optax.scale_by_factored_rms,
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_factored_rms-factored",
        lambda: eqopt.scale_by_factored_rms(min_dim_size_to_factor=2),
        lambda: optax.scale_by_factored_rms(min_dim_size_to_factor=2),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_factored_rms-options",
        lambda: eqopt.scale_by_factored_rms(
            decay_rate=0.5,
            step_offset=-2,
            min_dim_size_to_factor=2,
            epsilon=1e-3,
            decay_rate_fn=_capped_decay,
        ),
        lambda: optax.scale_by_factored_rms(
            decay_rate=0.5,
            step_offset=-2,
            min_dim_size_to_factor=2,
            epsilon=1e-3,
            decay_rate_fn=_capped_decay,
        ),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_factored_rms-not_factored",
        lambda: eqopt.scale_by_factored_rms(factored=False, min_dim_size_to_factor=2),
        lambda: optax.scale_by_factored_rms(factored=False, min_dim_size_to_factor=2),
        ALL_F32,
        needs_params=False,
    ),
    Case("adafactor", eqopt.adafactor, optax.adafactor, ALL_F32),
    Case(
        "adafactor-factored",
        lambda: eqopt.adafactor(0.1, min_dim_size_to_factor=2),
        lambda: optax.adafactor(0.1, min_dim_size_to_factor=2),
        ALL_F32,
    ),
    Case(
        # The momentum buffer is float32 by default (`dtype_momentum`), which
        # drops the imaginary part of complex updates in both libraries: real
        # dtypes only.
        "adafactor-momentum-decay-mask-predicate",
        lambda: eqopt.adafactor(
            _schedule,
            min_dim_size_to_factor=2,
            clipping_threshold=None,
            momentum=0.9,
            weight_decay_rate=0.1,
            weight_decay_mask=_matrices,
        ),
        lambda: optax.adafactor(
            _schedule,
            min_dim_size_to_factor=2,
            clipping_threshold=None,
            momentum=0.9,
            weight_decay_rate=0.1,
            weight_decay_mask=_optax_matrices,
        ),
        REAL,
    ),
    Case(
        "adafactor-options-mask-tree",
        lambda p: eqopt.adafactor(
            0.1,
            min_dim_size_to_factor=2,
            decay_rate=0.6,
            decay_offset=-3,
            multiply_by_parameter_scale=False,
            clipping_threshold=0.5,
            weight_decay_rate=_schedule,
            eps=1e-3,
            weight_decay_mask=spec_like(p, w=True, s=True),
        ),
        lambda: optax.adafactor(
            0.1,
            min_dim_size_to_factor=2,
            decay_rate=0.6,
            decay_offset=-3,
            multiply_by_parameter_scale=False,
            clipping_threshold=0.5,
            weight_decay_rate=_schedule,
            eps=1e-3,
            weight_decay_mask={"w": True, "b": False, "s": True},
        ),
        ALL_F32,
    ),
    Case(
        "adafactor-not_factored",
        lambda: eqopt.adafactor(0.1, min_dim_size_to_factor=2, factored=False),
        lambda: optax.adafactor(0.1, min_dim_size_to_factor=2, factored=False),
        ALL_F32,
    ),
]


# ---------------------------------------------------------------------------
# The factoring rule and the state's shapes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,factored,min_size,expected",
    [
        ((4, 3), True, 2, (1, 0)),  # (second largest, largest)
        ((3, 4), True, 2, (0, 1)),
        ((4, 3), True, 4, None),  # the second largest axis is too short
        ((4, 3), False, 2, None),
        ((7,), True, 1, None),  # fewer than two axes
        ((), True, 1, None),
        ((5, 2, 7), True, 2, (0, 2)),  # the two largest axes of three
        ((3, 3), True, 2, (0, 1)),  # ties: by position
        ((200, 100), True, 128, None),
        ((200, 130), True, 128, (1, 0)),
    ],
)
def test_factoring_rule(shape, factored, min_size, expected):
    assert factored_dims(shape, factored, min_size) == expected


def _mlp():
    return eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))


def test_state_on_an_equinox_mlp_has_row_and_column_moments():
    model = _mlp()
    state = eqopt.scale_by_factored_rms(min_dim_size_to_factor=2).init(model)
    for layer, v_row, v_col, v in zip(
        model.layers,
        state.v_row.layers,
        state.v_col.layers,
        state.v.layers,
        strict=True,
    ):
        out_size, in_size = layer.weight.shape
        largest = 0 if out_size >= in_size else 1
        # The weight keeps one mean per row and per column, nothing of full size.
        assert v.weight is None
        assert {v_row.weight.shape, v_col.weight.shape} == {(out_size,), (in_size,)}
        kept = in_size if largest == 0 else out_size
        assert v_row.weight.shape == (kept,)
        # The bias (one axis) keeps a full second moment.
        assert v.bias.shape == layer.bias.shape
        assert v_row.bias is None and v_col.bias is None
    # Non-array leaves (the activations) have no state.
    assert state.v.activation is None and state.v_row.activation is None
    # Memory: O(n + m) per matrix instead of O(nm).
    stored = sum(x.size for x in jax.tree.leaves(state))
    parameters = sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_array)))
    assert stored < parameters / 2


def test_complex_moments_are_real():
    params = {"w": jnp.ones((4, 3), jnp.complex64), "b": jnp.ones(3, jnp.complex64)}
    tx = eqopt.scale_by_factored_rms(min_dim_size_to_factor=2)
    _, state = tx.update(params, tx.init(params))
    for leaf in jax.tree.leaves(state):
        assert not jnp.iscomplexobj(leaf)


def test_factored_estimate_is_exact_for_a_rank_one_square():
    """If |G|^2 is an outer product, the factored estimate is |G|^2 itself."""
    rows, columns = jnp.array([1.0, 2.0, 3.0, 4.0]), jnp.array([0.5, -1.0, 2.0])
    grads = {"w": jnp.outer(rows, columns)}
    tx = eqopt.scale_by_factored_rms(min_dim_size_to_factor=2, epsilon=0.0)
    # The first step has decay 0: V_1 = G^2, so the update is sign(G).
    updates, state = tx.update(grads, tx.init(grads))
    np.testing.assert_allclose(updates["w"], jnp.sign(grads["w"]), rtol=1e-6)
    # A second rank-one step keeps the estimate exact: every |update| is equal.
    updates, _ = tx.update({"w": 5 * grads["w"]}, state)
    np.testing.assert_allclose(jnp.abs(updates["w"]), jnp.abs(updates["w"][0, 0]))
    assert not tx.elementwise


def test_decay_schedule_and_step_offset():
    grads = {"v": jnp.array([2.0])}
    # The first decay is 1 - 1^-c = 0: v_1 = g^2, then constant gradients keep it.
    tx = eqopt.scale_by_factored_rms(epsilon=0.0)
    state = tx.init(grads)
    for _ in range(2):
        _, state = tx.update(grads, state)
        np.testing.assert_allclose(state.v["v"], 4.0, rtol=1e-6)
    # With an offset t0 = -3, the first decay is 1 - 4^-c: v_1 = 4^-c g^2.
    tx = eqopt.scale_by_factored_rms(epsilon=0.0, step_offset=-3)
    _, state = tx.update(grads, tx.init(grads))
    np.testing.assert_allclose(state.v["v"], 4.0 ** (-0.8) * 4.0, rtol=1e-6)


def test_state_for_other_params_is_an_error_naming_the_leaf():
    tx = eqopt.scale_by_factored_rms(min_dim_size_to_factor=2)
    state = tx.init({"w": jnp.ones((4, 3))})
    with pytest.raises(ValueError, match=r"\['w'\].*other params"):
        tx.update({"w": jnp.ones((5, 3))}, state)


def test_min_dim_size_to_factor_must_be_a_positive_int():
    with pytest.raises(ValueError, match="min_dim_size_to_factor"):
        eqopt.scale_by_factored_rms(min_dim_size_to_factor=0)


# ---------------------------------------------------------------------------
# Adafactor
# ---------------------------------------------------------------------------


def test_adafactor_chain_matches_optax_layout():
    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    for kwargs in [
        {},
        {"learning_rate": 0.1, "momentum": 0.9, "weight_decay_rate": 0.1},
        {"clipping_threshold": None, "multiply_by_parameter_scale": False},
    ]:
        opt = eqopt.adafactor(**kwargs)
        assert isinstance(opt, eqopt.Chain)
        assert len(opt.init(params)) == len(optax.adafactor(**kwargs).init(params))
    opt = eqopt.adafactor(0.1, momentum=0.9)
    state = opt.init(params)
    assert state.ema.ema["w"].dtype == jnp.float32
    assert opt.names[0] == "scale_by_factored_rms" and opt.names[-1] == "scale"


def test_adafactor_weight_decay_mask_is_a_filter_spec():
    """A predicate, a prefix tree and a full bool tree select the same leaves."""
    model = _mlp()
    grads = jax.tree.map(jnp.ones_like, eqx.filter(model, eqx.is_inexact_array))
    prefix = jax.tree.map(lambda _: False, model)
    prefix = eqx.tree_at(
        lambda m: [layer.weight for layer in m.layers], prefix, [True] * 3
    )
    results = []
    for mask in (_matrices, prefix):
        opt = eqopt.adafactor(0.1, weight_decay_rate=0.5, weight_decay_mask=mask)
        updates, _ = opt.update(grads, opt.init(model), model)
        results.append(updates)
    no_decay = eqopt.adafactor(0.1)
    plain, _ = no_decay.update(grads, no_decay.init(model), model)
    for layer, a, b, c in zip(
        model.layers,
        results[0].layers,
        results[1].layers,
        plain.layers,
        strict=True,
    ):
        np.testing.assert_allclose(a.weight, b.weight, rtol=1e-6)
        np.testing.assert_allclose(a.weight, c.weight - 0.5 * layer.weight, rtol=1e-5)
        np.testing.assert_array_equal(a.bias, c.bias)


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
    params, static = eqx.partition(model, eqx.is_array)

    def step(carry, _):
        params, state = carry
        model = eqx.combine(params, static)
        grads = eqx.filter_grad(_loss)(model, x, y)
        updates, state = opt.update(grads, state, model)
        return (
            eqx.filter(eqx.apply_updates(model, updates), eqx.is_array),
            state,
        ), None

    (params, _), _ = jax.lax.scan(step, (params, opt.init(model)), length=steps)
    return eqx.combine(params, static)


@pytest.mark.parametrize(
    "opt",
    [
        eqopt.adafactor(3e-2, min_dim_size_to_factor=2),
        eqopt.adafactor(
            0.1, min_dim_size_to_factor=2, momentum=0.9, weight_decay_rate=1e-4
        ),
    ],
    ids=["adafactor", "adafactor-momentum"],
)
def test_training_reduces_the_loss(opt):
    model, x, y = _regression()
    trained = _train(opt, model, x, y)
    assert _loss(trained, x, y) < 0.25 * _loss(model, x, y)
