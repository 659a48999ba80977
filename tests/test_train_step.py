"""The whole training step (loss, gradient, update, apply) on packed, bucketed and
per-leaf params: the same numbers, and a gradient through `unpack` that costs one
pass over the buffer (issue 18)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqopt


class Residual(eqx.Module):
    layers: list

    def __call__(self, x):
        for layer in self.layers:
            x = x + jnp.tanh(layer(x))
        return x


def _model(n_layers=12, width=8):
    keys = jax.random.split(jax.random.key(0), n_layers)
    return Residual([eqx.nn.Linear(width, width, key=k) for k in keys])


_X = jax.random.normal(jax.random.key(1), (16, 8))


def _loss(model):
    return jnp.mean(jax.vmap(model)(_X) ** 2)


def _arrays(tree):
    return jax.tree.leaves(eqx.filter(tree, eqx.is_inexact_array))


def _assert_identical(a, b):
    for x, y in zip(_arrays(a), _arrays(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _cosine_clipped_adamw():
    schedule = eqopt.schedules.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10)
    return eqopt.chain(
        eqopt.clip_by_global_norm(0.1),
        eqopt.adamw(schedule, weight_decay=1e-2, mask=lambda x: x.ndim > 1),
    )


def _run(opt, steps=5):
    """The per-leaf, packed and bucketed models after `steps` whole training steps."""
    bucketed = eqopt.bucketed(opt, always=True)

    @eqx.filter_jit(donate="all-except-first")
    def step(opt, model, state):
        grads = eqx.filter_grad(_loss)(model)
        updates, state = opt.update(grads, state, model)
        return eqopt.apply_updates(model, updates), state

    @eqx.filter_jit(donate="all-except-first")
    def packed_step(opt, packed, state):
        grads = eqx.filter_grad(lambda p: _loss(p.unpack()))(packed)
        updates, state = opt.update(grads, state, packed)
        return eqopt.apply_updates(packed, updates), state

    # Three copies: the steps donate their inputs.
    per_leaf, buckets = _model(), _model()
    state, bucket_state = opt.init(per_leaf), bucketed.init(buckets)
    packed = eqopt.pack(_model())
    packed_state = opt.init(packed)
    for _ in range(steps):
        per_leaf, state = step(opt, per_leaf, state)
        packed, packed_state = packed_step(opt, packed, packed_state)
        buckets, bucket_state = step(bucketed, buckets, bucket_state)
    return per_leaf, packed.unpack(), buckets


def test_gradient_through_unpack_is_the_per_leaf_gradient():
    model = _model()
    packed = eqopt.pack(model)
    expected = eqx.filter_grad(_loss)(model)
    grads = eqx.filter_grad(lambda p: _loss(p.unpack()))(packed)
    assert isinstance(grads, eqopt.Packed)
    _assert_identical(grads.unpack(), expected)


def test_gradient_of_unpack_is_one_concatenation():
    """No full-buffer pad per leaf: the transpose of `unpack` is one concatenation
    per buffer, and the forward reads every leaf at a runtime offset, so that the
    leaves of a shape share their kernels."""
    packed = eqopt.pack(_model())
    n_leaves = packed.layout.n_leaves()
    jaxpr = jax.make_jaxpr(eqx.filter_grad(lambda p: _loss(p.unpack())))(packed)
    text = str(jaxpr)
    assert " pad[" not in text
    assert text.count("concatenate[") == 1
    assert text.count("dynamic_slice[") == n_leaves
    lowered = jax.jit(lambda p: _loss(p.unpack())).lower(packed).as_text()
    # One static slice: the element the runtime offsets' predicate reads.
    assert lowered.count("stablehlo.slice ") == 1


def test_unpack_supports_forward_mode_vmap_and_second_order():
    model = {"a": jnp.arange(6.0).reshape(2, 3), "b": jnp.arange(3.0), "n": 4}
    packed = eqopt.pack(model)

    def with_buffer(buffer):
        return eqx.tree_at(lambda p: p.buffers[0], packed, buffer)

    def f(buffer):
        tree = with_buffer(buffer).unpack()
        return jnp.sum(tree["a"] ** 2) * tree["n"] + jnp.sum(jnp.sin(tree["b"]))

    buffer = packed.buffers[0]
    tangent = jnp.concatenate([jnp.ones(6), -jnp.ones(3)])
    _, jvp = jax.jvp(f, (buffer,), (tangent,))
    _, expected = jax.jvp(
        lambda a, b: jnp.sum(a**2) * 4 + jnp.sum(jnp.sin(b)),
        (model["a"], model["b"]),
        (jnp.ones((2, 3)), -jnp.ones(3)),
    )
    np.testing.assert_allclose(jvp, expected, rtol=1e-6)
    hessian = jax.hessian(f)(buffer)
    np.testing.assert_allclose(
        np.diag(hessian),
        np.concatenate([np.full(6, 8.0), -np.sin(np.arange(3.0))]),
        rtol=1e-6,
        atol=1e-6,
    )
    stacked = jnp.stack([buffer, 2 * buffer])
    out = jax.vmap(lambda b: with_buffer(b).unpack()["b"])(stacked)
    np.testing.assert_array_equal(out, np.stack([np.arange(3.0), 2 * np.arange(3.0)]))


@pytest.mark.parametrize(
    "make",
    [
        lambda: eqopt.sgd(1e-2, momentum=0.9),
        lambda: eqopt.lion(1e-3, weight_decay=1e-2),
    ],
    ids=["sgdm", "lion"],
)
def test_whole_steps_agree_exactly(make):
    """Packed, bucketed and per-leaf training steps give bit-identical params: the
    gradient through `unpack` is the per-leaf gradient to the bit."""
    per_leaf, packed, buckets = _run(make())
    _assert_identical(packed, per_leaf)
    _assert_identical(buckets, per_leaf)


@pytest.mark.parametrize(
    "make",
    [
        lambda: eqopt.adam(1e-2),
        lambda: eqopt.adamw(1e-2, weight_decay=1e-2),
        _cosine_clipped_adamw,
    ],
    ids=["adam", "adamw", "clip+adamw+cos"],
)
def test_whole_steps_agree_to_a_few_roundings(make):
    """Adam's bias correction divides by a scalar, which XLA on CPU turns into a
    multiplication by its reciprocal on some kernels (one large buffer) and not on
    others (many small leaves); global-norm clipping sums the squares leaf by leaf
    or over the buffer. The params agree to a few units in the last place."""
    per_leaf, packed, buckets = _run(make())
    for x, y, z in zip(
        _arrays(per_leaf), _arrays(packed), _arrays(buckets), strict=True
    ):
        np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(z, x, rtol=1e-6, atol=1e-7)


def test_masked_decay_in_a_chain_runs_on_the_buffers():
    """A chain nested in a chain (AdamW with a decay mask, then clipping) keeps
    the packed buffers: one square root per buffer, not one per leaf. Only a chain
    that holds a `freeze` (directly or nested) unpacks, and it still freezes."""
    packed = eqopt.pack(_model())
    grads = jax.tree.map(jnp.ones_like, packed)
    opt = _cosine_clipped_adamw()
    state = opt.init(packed)
    jaxpr = jax.make_jaxpr(opt.update)(grads, state, packed)
    n_buffers = len([b for b in packed.buffers if b is not None])
    assert str(jaxpr).count(" sqrt ") == 2 * n_buffers  # global norm + Adam

    frozen = eqx.tree_at(
        lambda m: m.layers[0].weight, jax.tree.map(lambda _: False, _model()), True
    )
    freezing = eqopt.chain(
        eqopt.chain(eqopt.freeze(frozen)), eqopt.adamw(1e-2, mask=lambda x: x.ndim > 1)
    )
    assert not freezing.handles_packed and _cosine_clipped_adamw().handles_packed
    updates, _ = freezing.update(grads, freezing.init(packed), packed)
    unpacked = updates.unpack()
    assert not np.any(np.asarray(unpacked.layers[0].weight))
    assert np.all(np.asarray(unpacked.layers[0].bias) != 0)


def test_automatic_choice_on_a_residual_stack():
    """`bucketed` buckets a stack of small layers and keeps a few large leaves per leaf;
    its step on the small layers gives the per-leaf numbers."""
    model = _model(40)
    opt = eqopt.bucketed(eqopt.adam(1e-2))
    assert opt.init(model).is_bucketed
    big = {"w": jnp.ones((256, 256)), "b": jnp.ones((256,))}
    assert not opt.init(big).is_bucketed
    many_large = {f"w{i}": jnp.ones((200, 100)) for i in range(10)}
    assert not opt.init(many_large).is_bucketed
    # A decay mask is not elementwise, but it runs on segments of the buffers.
    masked = eqopt.adamw(1e-2, mask=lambda x: x.ndim > 1)
    assert not masked.elementwise and masked.runs_on_buffers
    assert eqopt.bucketed(masked).init(model).is_bucketed
    # A per-leaf part that unpacks (trust ratios, a freeze) keeps the per-leaf plan.
    for per_leaf in (
        eqopt.lamb(1e-2),
        eqopt.chain(eqopt.freeze(lambda x: x.ndim == 1), eqopt.adam(1e-2)),
    ):
        assert not per_leaf.runs_on_buffers
        assert not eqopt.bucketed(per_leaf).init(model).is_bucketed
        assert eqopt.bucketed(per_leaf, always=True).init(model).is_bucketed


def test_default_path_hints_bucketing_once(monkeypatch):
    """The default path's automatic choice: it stays per leaf (its state is shaped
    like the model) and, where `bucketed` would bucket, says so once per process."""
    import warnings

    import eqopt._base

    monkeypatch.setattr(eqopt._entry, "_hinted", [False])
    stack = _model(70)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # No hint: few or large leaves, a bucketed optimiser, packed params.
        eqopt.adam(1e-2).init({"w": jnp.ones((256, 256)), "b": jnp.ones((256,))})
        eqopt.adam(1e-2).init(_model(40))  # 80 leaves: bucketed, but no hint
        eqopt.bucketed(eqopt.adam(1e-2)).init(stack)
        eqopt.adam(1e-2).init(eqopt.pack(stack))
        eqopt.lamb(1e-2).init(stack)  # per-leaf trust ratios
        assert not [w for w in caught if w.category is eqopt.PerformanceHint]
        state = eqopt.chain(eqopt.clip_by_global_norm(1.0), eqopt.adam(1e-2)).init(
            stack
        )
        eqopt.sgd(1e-2, momentum=0.9).init(stack)
    hints = [w for w in caught if w.category is eqopt.PerformanceHint]
    assert len(hints) == 1  # once, by the outermost init only
    assert str(hints[0].message).startswith(
        "These params have 140 trainable leaves of 36 elements on average"
    )
    assert "eqopt.bucketed(opt)" in str(hints[0].message)
    # It points at the user's call, not at eqopt or the type checker's wrapper.
    assert hints[0].filename == __file__
    # The default path's state stays shaped like the model.
    assert state[1][0].mu.layers[0].weight.shape == (8, 8)
