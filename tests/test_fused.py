"""The fused engine: packed parameters give the per-leaf path's numbers."""

import io

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Model, assert_tree_allclose, make_model, random_grads
from registry import ALL_CASES, build

import eqopt


def _loss(model):
    x = jnp.arange(4.0)
    y = model.activation(jnp.real(x @ model.w + model.b)) * jnp.real(model.s)
    return jnp.sum(y**2) + model.depth


def _trainable(model):
    return eqx.filter(model, eqx.is_inexact_array)


PACKABLE = [c for c in ALL_CASES if not c.random]


def _quantised_on_buffers(tx, state):
    """Whether `tx` quantises a packed buffer's moments as one array (the default
    of `eqopt.Quantized`'s `packed_blocks`): then its numbers are those of the
    transform on the buffers taken as leaves, not on the model's leaves."""
    quantised = [
        x
        for x in jax.tree.leaves(
            state, is_leaf=lambda x: isinstance(x, eqopt.QuantizedArray)
        )
        if isinstance(x, eqopt.QuantizedArray)
    ]
    return bool(quantised) and tx.runs_on_buffers and not tx.elementwise


def _check_quantised_on_buffers(tx, model):
    """A packed model's quantised moments are the transform's on its buffers."""
    packed = eqopt.pack(model)
    buffers = list(packed.buffers)
    state, packed_state = tx.init(buffers), tx.init(packed)
    for step in range(3):
        grads = eqopt.Packed.like(packed, random_grads(model, step))
        updates, state = tx.update(list(grads.buffers), state, buffers)
        packed_updates, packed_state = tx.update(grads, packed_state, packed)
        assert isinstance(packed_updates, eqopt.Packed)
        assert_tree_allclose(
            list(packed_updates.buffers), updates, rtol=1e-5, atol=1e-6
        )
        buffers = eqopt.apply_updates(buffers, updates)
        packed = eqopt.apply_updates(packed, packed_updates)
        model = packed.unpack()


@pytest.mark.parametrize("case", PACKABLE, ids=[c.name for c in PACKABLE])
def test_packed_matches_per_leaf(case):
    """Every registry transform gives the same updates on packed and unpacked params
    (quantised moments: the same as on the buffers taken as leaves)."""
    model = make_model()
    packed = eqopt.pack(model)
    tx = build(case.make, model)
    state, packed_state = tx.init(model), tx.init(packed)
    if _quantised_on_buffers(tx, packed_state):
        _check_quantised_on_buffers(tx, model)
        return
    for step in range(3):
        grads = random_grads(model, step)
        packed_grads = eqopt.Packed.like(packed, grads)
        extra = {} if case.extra_args is None else case.extra_args(model, grads)
        updates, state = tx.update(grads, state, model, **extra)
        packed_updates, packed_state = tx.update(
            packed_grads, packed_state, packed, **extra
        )
        assert isinstance(packed_updates, eqopt.Packed)
        assert_tree_allclose(
            _trainable(packed_updates.unpack()),
            _trainable(updates),
            rtol=1e-5,
            atol=1e-6,
        )
        model = eqopt.apply_updates(model, updates)
        packed = eqopt.apply_updates(packed, packed_updates)
    assert packed.unpack().activation is jax.nn.relu


def _mixed_model():
    keys = jax.random.split(jax.random.key(3), 4)
    return {
        "a": jax.random.normal(keys[0], (5, 3)),
        "b": jax.random.normal(keys[1], (7,)).astype(jnp.bfloat16),
        "frozen": jnp.arange(3),
        "c": jax.random.normal(keys[2], (2, 2)),
        "f": jnp.tanh,
        "none": None,
    }


def test_pack_groups_by_dtype_and_round_trips():
    model = _mixed_model()
    packed = eqopt.pack(model)
    assert [buffer.dtype for buffer in packed.buffers] == [jnp.float32, jnp.bfloat16]
    assert [buffer.shape for buffer in packed.buffers] == [(19,), (7,)]
    unpacked = packed.unpack()
    assert unpacked["f"] is jnp.tanh and unpacked["none"] is None
    assert_tree_allclose(
        eqx.filter(unpacked, eqx.is_array), eqx.filter(model, eqx.is_array)
    )
    assert unpacked["b"].dtype == jnp.bfloat16


def test_training_step_on_packed_mlp_matches_unpacked():
    model = eqx.nn.MLP(3, 2, 16, 3, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (8, 3))

    def loss(model):
        return jnp.mean(jax.vmap(model)(x) ** 2)

    # A chain mixing elementwise parts (Adam) and per-leaf ones (masked decay).
    opt = eqopt.chain(
        eqopt.clip_by_global_norm(1.0),
        eqopt.scale_by_adam(),
        eqopt.add_decayed_weights(1e-2, mask=lambda x: x.ndim > 1),
        eqopt.scale_by_learning_rate(1e-2),
    )

    @eqx.filter_jit
    def step(model, state):
        grads = eqx.filter_grad(loss)(model)
        updates, state = opt.update(grads, state, model)
        return eqopt.apply_updates(model, updates), state

    @eqx.filter_jit
    def packed_step(packed, state):
        grads = eqx.filter_grad(lambda p: loss(p.unpack()))(packed)
        updates, state = opt.update(grads, state, packed)
        return eqopt.apply_updates(packed, updates), state

    packed = eqopt.pack(model)
    state, packed_state = opt.init(model), opt.init(packed)
    for _ in range(5):
        model, state = step(model, state)
        packed, packed_state = packed_step(packed, packed_state)
    assert_tree_allclose(
        _trainable(packed.unpack()), _trainable(model), rtol=1e-5, atol=1e-6
    )
    # The elementwise parts keep their moments in the buffers.
    adam_state = packed_state.scale_by_adam
    assert isinstance(adam_state.mu, eqopt.Packed)
    assert len(jax.tree.leaves(adam_state.mu)) == 1
    assert_tree_allclose(
        _trainable(adam_state.mu.unpack()),
        _trainable(state.scale_by_adam.mu),
        rtol=1e-5,
    )


def test_packed_no_retrace_and_serialises():
    model = make_model()
    packed = eqopt.pack(model)
    opt = eqopt.adamw(1e-2)
    traces = []

    @eqx.filter_jit
    def step(opt, packed, state):
        traces.append(None)
        grads = eqx.filter_grad(lambda p: _loss(p.unpack()))(packed)
        updates, state = opt.update(grads, state, packed)
        return eqopt.apply_updates(packed, updates), state

    state = opt.init(packed)
    packed, state = step(opt, packed, state)
    faster = eqx.tree_at(
        lambda o: o.scale_by_learning_rate.learning_rate, opt, eqopt.as_scalar(3e-2)
    )
    packed, state = step(faster, packed, state)
    assert len(traces) == 1
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, (packed, state))
    buffer.seek(0)
    like = jax.tree.map(
        lambda x: jnp.zeros_like(x) if eqx.is_array(x) else x, (packed, state)
    )
    restored = eqx.tree_deserialise_leaves(buffer, like)
    assert_tree_allclose(restored, (packed, state), rtol=0, atol=0)


def test_pack_without_trainable_arrays_is_an_error():
    with pytest.raises(ValueError, match="no trainable array"):
        eqopt.pack({"n": jnp.arange(3), "f": jnp.tanh})


def test_packed_gradient_for_unpacked_model_is_an_error():
    model = make_model()
    packed = eqopt.pack(model)
    grads = eqx.filter_grad(lambda p: _loss(p.unpack()))(packed)
    with pytest.raises(ValueError, match="packed"):
        eqopt.apply_updates(model, grads)
    with pytest.raises(ValueError, match="packed"):
        eqopt.adam(1e-3).update(grads, eqopt.adam(1e-3).init(model), model)


def test_packed_like_with_other_structure_is_an_error():
    packed = eqopt.pack(make_model())
    with pytest.raises(ValueError, match="structure of the packed model"):
        eqopt.Packed.like(packed, {"w": jnp.zeros((4, 3))})


def test_buffers_of_wrong_size_are_an_error():
    packed = eqopt.pack(make_model())
    with pytest.raises(ValueError, match="made for another model"):
        eqx.tree_at(lambda p: p.buffers, packed, (jnp.zeros(3),)).__class__(
            buffers=(jnp.zeros(3),), rest=packed.rest, layout=packed.layout
        )


def test_sharded_leaves_go_to_their_own_buffers():
    # On one device every leaf shares a buffer; the grouping key is the sharding.
    model = Model(jnp.ones((4, 3)), jnp.ones(3), jnp.ones(()), jnp.array([0, 1]))
    packed = eqopt.pack(model)
    assert len(packed.buffers) == 1
    np.testing.assert_array_equal(packed.buffers[0][:12], np.ones(12))


@pytest.mark.parametrize(
    "make",
    [
        lambda: eqopt.sgd(0.1, momentum=0.9),
        lambda: eqopt.adam(1e-2),
        lambda: eqopt.lion(1e-3),
        lambda: eqopt.rmsprop(1e-2),
        lambda: eqopt.chain(eqopt.clip_by_global_norm(1.0), eqopt.adamw(1e-2)),
        lambda: eqopt.adamw(1e-2, mask=lambda x: x.ndim > 1),
    ],
    ids=["sgd", "adam", "lion", "rmsprop", "clip+adamw", "adamw-mask"],
)
def test_packed_mixed_dtypes_and_frozen_leaves(make):
    model = _mixed_model()
    packed = eqopt.pack(model)
    opt = make()
    state, packed_state = opt.init(model), opt.init(packed)
    for step in range(3):
        keys = jax.random.split(jax.random.key(step), 3)
        grads = {
            "a": jax.random.normal(keys[0], (5, 3)),
            "b": jax.random.normal(keys[1], (7,)).astype(jnp.bfloat16),
            "frozen": None,
            "c": None,  # a trainable leaf without a gradient this step
            "f": None,
            "none": None,
        }
        updates, state = opt.update(grads, state, model)
        packed_updates, packed_state = opt.update(
            eqopt.Packed.like(packed, grads), packed_state, packed
        )
        unpacked = packed_updates.unpack()
        assert_tree_allclose(unpacked["a"], updates["a"], rtol=1e-5, atol=1e-6)
        assert_tree_allclose(unpacked["b"], updates["b"], rtol=2e-2, atol=2e-2)
        model = eqopt.apply_updates(model, updates)
        packed = eqopt.apply_updates(packed, packed_updates)
    assert packed.unpack()["b"].dtype == jnp.bfloat16


@pytest.mark.parametrize("case", PACKABLE, ids=[c.name for c in PACKABLE])
def test_bucketed_matches_per_leaf(case):
    """`bucketed(tx)` gives every registry transform's per-leaf updates, model-shaped."""
    model = make_model()
    tx = build(case.make, model)
    bucketed = eqopt.bucketed(build(case.make, model), always=True)
    state, bucketed_state = tx.init(model), bucketed.init(model)
    if _quantised_on_buffers(tx, bucketed_state):
        # Bucketed, the moments are those of the packed buffers.
        packed = eqopt.pack(model)
        packed_state = tx.init(packed)
        for step in range(3):
            grads = random_grads(model, step)
            packed_updates, packed_state = tx.update(
                eqopt.Packed.like(packed, grads), packed_state, packed
            )
            bucketed_updates, bucketed_state = bucketed.update(
                grads, bucketed_state, model
            )
            assert_tree_allclose(
                _trainable(bucketed_updates),
                _trainable(packed_updates.unpack()),
                rtol=1e-5,
                atol=1e-6,
            )
            packed = eqopt.apply_updates(packed, packed_updates)
            model = eqopt.apply_updates(model, bucketed_updates)

        # Model-shaped once unpacked, each moment dequantised.
        def quantised(x):
            return isinstance(x, eqopt.QuantizedArray)

        unpacked = bucketed_state.unpacked()
        assert jax.tree.structure(unpacked) == jax.tree.structure(
            state, is_leaf=quantised
        )
        return
    for step in range(3):
        grads = random_grads(model, step)
        extra = {} if case.extra_args is None else case.extra_args(model, grads)
        updates, state = tx.update(grads, state, model, **extra)
        bucketed_updates, bucketed_state = bucketed.update(
            grads, bucketed_state, model, **extra
        )
        assert_tree_allclose(
            _trainable(bucketed_updates), _trainable(updates), rtol=1e-5, atol=1e-6
        )
        assert bucketed_updates.activation is None
        model = eqopt.apply_updates(model, updates)
    # The state reads model-shaped once unpacked.
    unpacked = bucketed_state.unpacked()
    assert jax.tree.structure(unpacked) == jax.tree.structure(state)


def test_bucketed_state_is_few_buffers_and_jits_without_retrace():
    model = eqx.nn.MLP(3, 2, 8, 4, key=jax.random.key(0))
    opt = eqopt.bucketed(eqopt.adamw(1e-2), always=True)
    state = opt.init(model)
    moments = [x for x in jax.tree.leaves(state) if eqx.is_inexact_array(x)]
    assert len(moments) == 2  # mu and nu, one buffer each
    traces = []

    @eqx.filter_jit
    def step(opt, model, state):
        traces.append(None)
        grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(3)) ** 2))(model)
        updates, state = opt.update(grads, state, model)
        return eqopt.apply_updates(model, updates), state

    model, state = step(opt, model, state)
    faster = eqx.tree_at(
        lambda o: o.inner.scale_by_learning_rate.learning_rate,
        opt,
        eqopt.as_scalar(3e-2),
    )
    model, state = step(faster, model, state)
    assert len(traces) == 1
    mu = state.unpacked().scale_by_adam.mu
    assert jax.tree.structure(mu) == jax.tree.structure(
        eqx.filter(model, eqx.is_inexact_array)
    )


def test_bucketed_updates_for_other_params_is_an_error():
    opt = eqopt.bucketed(eqopt.adam(1e-2))
    state = opt.init({"w": jnp.ones(3)})
    with pytest.raises(ValueError, match="made by this transform's `init`"):
        opt.update({"v": jnp.ones(3)}, state)


def test_bucketed_chooses_buckets_only_where_they_pay():
    """By default `bucketed` buckets many small leaves and keeps few or large ones per leaf."""
    many_small = {f"w{i}": jnp.full((4, 3), 0.1 * i) for i in range(40)}
    few_large = {"w": jnp.ones((20_000,)), "b": jnp.ones((3,))}
    opt = eqopt.bucketed(eqopt.adam(1e-2))
    small_state = opt.init(many_small)
    large_state = opt.init(few_large)
    assert small_state.is_bucketed
    assert not large_state.is_bucketed
    assert eqopt.bucketed(eqopt.adam(1e-2), always=True).init(few_large).is_bucketed
    # Bucketed: one buffer per moment. Per leaf: exactly the inner transform.
    moments = [x for x in jax.tree.leaves(small_state) if eqx.is_inexact_array(x)]
    assert len(moments) == 2
    inner = eqopt.adam(1e-2)
    inner_state = inner.init(few_large)
    grads = jax.tree.map(lambda x: 0.5 * x, few_large)
    updates, large_state = opt.update(grads, large_state, few_large)
    expected, inner_state = inner.update(grads, inner_state, few_large)
    assert_tree_allclose(updates, expected, rtol=0, atol=0)
    assert_tree_allclose(large_state.unpacked(), inner_state, rtol=0, atol=0)
    # Both plans reject updates for other params with the same message.
    with pytest.raises(ValueError, match="made by this transform's `init`"):
        opt.update({"v": jnp.ones(3)}, large_state)


def test_packed_crosses_jit_as_its_buffers():
    """A packed model of many leaves flattens to its buffers (and its few
    non-trainable leaves), its static metadata is one interned object, and a
    jitted step takes its own outputs without retracing."""
    import copy
    import pickle

    model = {f"w{i}": jnp.full((3, 2), 0.1 * i, jnp.float32) for i in range(100)}
    model["act"] = jax.nn.relu
    packed = eqopt.pack(model)
    grads = eqopt.Packed.like(packed, jax.tree.map(lambda x: x, model))
    assert len(jax.tree.leaves(packed)) == 2  # the buffer and the function
    assert len(jax.tree.leaves(grads)) == 1
    assert jax.tree.structure(grads) == jax.tree.structure(
        eqopt.Packed.like(packed, model)
    )
    assert eqopt.pack(model).structure is packed.structure
    assert eqopt.pack(model).layout is packed.layout
    for clone in (copy.deepcopy(packed), pickle.loads(pickle.dumps(packed.layout))):
        assert (
            clone.layout if isinstance(clone, eqopt.Packed) else clone
        ) == packed.layout
    opt = eqopt.adam(1e-2)
    traces = []

    @eqx.filter_jit
    def step(packed, state, grads):
        traces.append(None)
        updates, state = opt.update(grads, state, packed)
        return eqopt.apply_updates(packed, updates), state

    state = opt.init(packed)
    for _ in range(3):
        packed, state = step(packed, state, grads)
    assert len(traces) == 1
    assert packed.unpack()["act"] is jax.nn.relu
