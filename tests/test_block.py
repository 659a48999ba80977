"""Per-block transforms: scaling by the parameter block, block-RMS clipping, AGC, normalisation."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Case

import eqopt

ALL_F32 = ("float32", "bfloat16", "complex64")


def _vectors(x):
    return x.ndim >= 1


TRANSFORM_CASES = [
    # Alone, an update of the size of the parameters' norm makes the parameters
    # grow geometrically, and bfloat16 rounding then dominates the comparison:
    # these cases scale the step down, as a learning rate would.
    Case(
        "scale_by_param_block_norm",
        lambda: eqopt.chain(eqopt.scale_by_param_block_norm(), eqopt.scale(0.05)),
        lambda: optax.chain(optax.scale_by_param_block_norm(), optax.scale(0.05)),
        ALL_F32,
    ),
    Case(
        # A floor above the norm of the scalar leaf: the floor is used there.
        "scale_by_param_block_norm-min_scale",
        lambda: eqopt.chain(
            eqopt.scale_by_param_block_norm(min_scale=1.5), eqopt.scale(0.05)
        ),
        lambda: optax.chain(
            optax.scale_by_param_block_norm(min_scale=1.5), optax.scale(0.05)
        ),
        ALL_F32,
    ),
    Case(
        "scale_by_param_block_rms",
        eqopt.scale_by_param_block_rms,
        optax.scale_by_param_block_rms,
        ALL_F32,
    ),
    Case(
        "scale_by_param_block_rms-min_scale",
        lambda: eqopt.scale_by_param_block_rms(min_scale=0.9),
        lambda: optax.scale_by_param_block_rms(min_scale=0.9),
        ALL_F32,
    ),
    Case(
        "clip_by_block_rms",
        lambda: eqopt.clip_by_block_rms(0.8),
        lambda: optax.clip_by_block_rms(0.8),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "adaptive_grad_clip",
        lambda: eqopt.adaptive_grad_clip(0.3),
        lambda: optax.adaptive_grad_clip(0.3),
        ALL_F32,
    ),
    Case(
        "adaptive_grad_clip-eps",
        lambda: eqopt.adaptive_grad_clip(0.05, eps=0.5),
        lambda: optax.adaptive_grad_clip(0.05, eps=0.5),
        ALL_F32,
    ),
    Case(
        # An explicit axis does not exist for the scalar leaf, so it is masked out.
        "adaptive_grad_clip-axis-masked",
        lambda: eqopt.masked(eqopt.adaptive_grad_clip(0.3, axis=-1), _vectors),
        lambda: optax.masked(
            optax.adaptive_grad_clip(0.3, axis=-1), {"w": True, "b": True, "s": False}
        ),
        ALL_F32,
    ),
    Case(
        "normalize_by_update_norm",
        eqopt.normalize_by_update_norm,
        optax.normalize_by_update_norm,
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "normalize_by_update_norm-options",
        lambda: eqopt.normalize_by_update_norm(scale_factor=-0.5, eps=0.1),
        lambda: optax.normalize_by_update_norm(scale_factor=-0.5, eps=0.1),
        ALL_F32,
        needs_params=False,
    ),
]


def _norm(x):
    return float(jnp.sqrt(jnp.sum(jnp.abs(x) ** 2)))


def _rms(x):
    return float(jnp.sqrt(jnp.mean(jnp.abs(x) ** 2)))


PARAMS = {
    "w": jnp.arange(12.0).reshape(4, 3) / 10,
    "b": jnp.zeros(3),
    "s": jnp.asarray(2.0),
}
GRADS = {"w": jnp.ones((4, 3)), "b": jnp.ones(3), "s": jnp.asarray(-1.0)}


def test_scale_by_param_block_norm_and_rms_per_leaf():
    for tx, measure in [
        (eqopt.scale_by_param_block_norm(min_scale=0.01), _norm),
        (eqopt.scale_by_param_block_rms(min_scale=0.01), _rms),
    ]:
        updates, _ = tx.update(GRADS, tx.init(PARAMS), PARAMS)
        np.testing.assert_allclose(updates["w"], measure(PARAMS["w"]), rtol=1e-6)
        # A zero-initialised leaf is scaled by the floor, so it can move.
        np.testing.assert_allclose(updates["b"], 0.01, rtol=1e-6)
        np.testing.assert_allclose(updates["s"], -2.0, rtol=1e-6)


def test_scale_by_param_block_needs_params():
    tx = eqopt.scale_by_param_block_rms()
    with pytest.raises(ValueError, match="needs `params`"):
        tx.update(GRADS, tx.init(PARAMS))


def test_clip_by_block_rms_clips_each_leaf_on_its_own():
    grads = {"big": jnp.full((4, 3), 5.0), "small": jnp.full(3, 0.1)}
    tx = eqopt.clip_by_block_rms(1.0)
    updates, _ = tx.update(grads, tx.init(grads))
    np.testing.assert_allclose(_rms(updates["big"]), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(updates["small"], grads["small"])


def test_adaptive_grad_clip_clips_per_unit():
    # Default rule for a 2-D leaf: a unit is a column (the norm is over axis 0).
    params = {"w": jnp.ones((4, 3))}  # every column has norm 2
    grads = {"w": jnp.stack([jnp.array([0.1, 10.0, 0.5])] * 4)}  # norms .2, 20, 1
    tx = eqopt.adaptive_grad_clip(0.5)  # at most 0.5 * 2 = 1 per column
    updates, _ = tx.update(grads, tx.init(params), params)
    column_norms = np.linalg.norm(np.asarray(updates["w"]), axis=0)
    np.testing.assert_allclose(column_norms, [0.2, 1.0, 1.0], rtol=1e-5)
    # The small column is untouched; the others keep their direction.
    np.testing.assert_array_equal(updates["w"][:, 0], grads["w"][:, 0])
    np.testing.assert_allclose(updates["w"][:, 1], 0.5, rtol=1e-5)


class _Net(eqx.Module):
    """Layers of every kind the default units read, and a bare array."""

    conv: eqx.nn.Conv2d
    conv3d: eqx.nn.Conv3d
    embedding: eqx.nn.Embedding
    norm: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    mlp: eqx.nn.MLP
    table: jax.Array  # a bare (in, out) array: Optax's convention

    def __init__(self, key):
        keys = jax.random.split(key, 6)
        self.conv = eqx.nn.Conv2d(3, 5, 3, key=keys[0])
        self.conv3d = eqx.nn.Conv3d(2, 4, 2, key=keys[1])
        self.embedding = eqx.nn.Embedding(7, 6, key=keys[2])
        self.norm = eqx.nn.LayerNorm(6)
        self.attention = eqx.nn.MultiheadAttention(2, 6, key=keys[3])
        self.mlp = eqx.nn.MLP(6, 3, 8, 2, key=keys[4])
        self.table = jax.random.normal(keys[5], (4, 3))


def _agc_reference(g, p, norm_axes, clipping, eps):
    """The paper's rule in numpy, for units whose norm is over `norm_axes`."""
    g, p = np.asarray(g, np.float64), np.asarray(p, np.float64)
    g_norm = np.sqrt(np.sum(g**2, axis=norm_axes, keepdims=True))
    max_norm = clipping * np.maximum(
        np.sqrt(np.sum(p**2, axis=norm_axes, keepdims=True)), eps
    )
    return np.where(g_norm < max_norm, g, g * max_norm / np.maximum(g_norm, 1e-6))


def test_adaptive_grad_clip_units_are_output_neurons_of_equinox_layers():
    """With `axis=None`: a unit per output neuron or channel of each Equinox
    layer, read from the layer; other leaves as Optax."""
    model = _Net(jax.random.key(0))
    params = eqx.filter(model, eqx.is_array)
    grads = jax.tree.map(
        lambda x: 3.0 * jax.random.normal(jax.random.key(x.size), x.shape), params
    )
    clipping, eps = 0.2, 1e-3
    tx = eqopt.adaptive_grad_clip(clipping, eps=eps)
    updates, _ = tx.update(grads, tx.init(model), model)

    attention = [
        lambda m, name=name: getattr(m.attention, name).weight
        for name in ("query_proj", "key_proj", "value_proj", "output_proj")
    ]
    # (where, the axes of one unit's norm): written out by hand from each layout.
    expected_axes = [
        (lambda m: m.conv.weight, (1, 2, 3)),  # (out, in, h, w): per output channel
        (lambda m: m.conv3d.weight, (1, 2, 3, 4)),  # 5-D, per output channel
        (lambda m: m.embedding.weight, (0,)),  # (tokens, features): per feature
        *[(where, (1,)) for where in attention],  # Linear (out, in): per row
        *[(lambda m, i=i: m.mlp.layers[i].weight, (1,)) for i in range(3)],
        (lambda m: m.table, (0,)),  # a bare array: Optax's (in, out), per column
        (lambda m: m.conv.bias, None),  # (out, 1, 1): one unit, as in Optax
        (lambda m: m.norm.weight, None),  # vectors: one unit
        (lambda m: m.mlp.layers[0].bias, None),
    ]
    for where, axes in expected_axes:
        expected = _agc_reference(where(grads), where(params), axes, clipping, eps)
        np.testing.assert_allclose(where(updates), expected, rtol=2e-5, atol=1e-7)
        assert not np.allclose(where(updates), where(grads))  # something was clipped


def test_adaptive_grad_clip_explicit_axis_wins_on_equinox_layers():
    mlp = eqx.nn.MLP(3, 2, 4, 1, key=jax.random.key(0))
    grads = jax.tree.map(
        lambda x: 100.0 * jnp.ones_like(x), eqx.filter(mlp, eqx.is_array)
    )

    def clipped(tx):
        return tx.update(grads, tx.init(mlp), mlp)[0]

    by_default = clipped(eqopt.adaptive_grad_clip(0.1))
    # `axis=-1` is the norm over the inputs of `(out, in)`: the default's units.
    by_rows = clipped(eqopt.adaptive_grad_clip(0.1, axis=-1))
    # `axis=0` is Optax's rule on this layout: one unit per input.
    by_columns = clipped(eqopt.adaptive_grad_clip(0.1, axis=0))
    for layer, default, rows, columns in zip(
        mlp.layers, by_default.layers, by_rows.layers, by_columns.layers, strict=True
    ):
        np.testing.assert_allclose(default.weight, rows.weight, rtol=1e-6)
        for update, axis in ((rows, -1), (columns, 0)):
            np.testing.assert_allclose(
                np.linalg.norm(np.asarray(update.weight), axis=axis),
                0.1
                * np.maximum(np.linalg.norm(np.asarray(layer.weight), axis=axis), 1e-3),
                rtol=1e-5,
            )


def test_adaptive_grad_clip_errors_name_the_leaf():
    params = {"deep": jnp.ones((2,) * 6), "s": jnp.ones(())}
    tx = eqopt.adaptive_grad_clip(0.1)
    with pytest.raises(ValueError, match=r"\['deep'\].*axis="):
        tx.update(params, tx.init(params), params)
    tx = eqopt.adaptive_grad_clip(0.1, axis=-1)
    with pytest.raises(ValueError, match=r"`axis=-1` does not exist .*\['s'\]"):
        tx.update(params, tx.init(params), params)


def test_normalize_by_update_norm_is_global():
    grads = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([0.0, 12.0])}  # norm 13
    tx = eqopt.normalize_by_update_norm(scale_factor=2.0, eps=0.0)
    updates, _ = tx.update(grads, tx.init(grads))
    np.testing.assert_allclose(updates["a"], [6 / 13, 8 / 13], rtol=1e-6)
    np.testing.assert_allclose(updates["b"], [0.0, 24 / 13], rtol=1e-6)
    assert tx.elementwise


def test_floored_norms_have_finite_gradients_at_zero():
    def scaled(p):
        tx = eqopt.scale_by_param_block_norm()
        updates, _ = tx.update({"w": jnp.ones(3)}, tx.init(p), p)
        return jnp.sum(updates["w"])

    gradient = jax.grad(scaled)({"w": jnp.zeros(3)})
    assert np.all(np.isfinite(gradient["w"]))


def test_hyperparameter_ranges():
    with pytest.raises(ValueError, match="threshold"):
        eqopt.clip_by_block_rms(0.0)
    with pytest.raises(ValueError, match="min_scale"):
        eqopt.scale_by_param_block_rms(-1.0)
