"""Generic tests run over every case of the registry (see registry.py)."""

import functools as ft
import io

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    Model,
    as_dict,
    assert_tree_allclose,
    make_model,
    model_loss,
    random_grads,
)
from registry import ALL_CASES, build

import eqopt

CASE_IDS = [case.name for case in ALL_CASES]


def _extra(case, model, grads) -> dict:
    """The case's extra keyword arguments for `update` (e.g. a line search's objective)."""
    return {} if case.extra_args is None else case.extra_args(model, grads)


def _for_optax(extra: dict) -> dict:
    """Extra arguments for Optax: a model-shaped value (a `grad`) as Optax's dict params."""
    return {k: as_dict(v) if isinstance(v, Model) else v for k, v in extra.items()}


@pytest.mark.parametrize("case", ALL_CASES, ids=CASE_IDS)
def test_whole_model_init_update(case):
    model = make_model()
    tx = build(case.make, model)
    state = tx.init(model)
    grads = eqx.filter_grad(model_loss)(model)
    assert grads.activation is None and grads.indices is None and grads.name is None
    for _ in range(2):
        updates, state = tx.update(grads, state, model, **_extra(case, model, grads))
        # Non-trainable leaves get None; trainable ones keep their shape.
        assert updates.activation is None and updates.indices is None
        assert updates.w.shape == (4, 3) and updates.s.shape == ()
        model = eqopt.apply_updates(model, updates)
    assert (
        model.activation is jax.nn.relu and model.depth == 2 and model.name == "model"
    )
    assert model.w.dtype == jnp.float32


@pytest.mark.parametrize("case", ALL_CASES, ids=CASE_IDS)
def test_jit_no_retrace_when_hyperparameter_changes(case):
    # The optimiser's arrays are device arrays (a NumPy argument is copied to
    # the device at every call: 45-75 us each on a GPU). Through `eqopt.on_host`
    # they are all on the host, and the optimiser survives a step that donates
    # all its arguments (the loss, a float32 scalar output, would take a
    # float32 scalar hyperparameter's buffer if one were on the device).
    model = make_model()
    device_tx = build(case.make, model)
    on_host = [
        jax.tree_util.keystr(path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(device_tx)
        if isinstance(leaf, np.ndarray)
    ]
    assert not on_host, f"host arrays in the optimiser: {on_host}"
    tx = eqopt.on_host(device_tx)
    # (A typed PRNG key has no host form; a step takes it only for an output key
    # that no input key of the model or the state claims first.)
    on_device = [
        jax.tree_util.keystr(path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tx)
        if isinstance(leaf, jax.Array)
        and not jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    ]
    assert not on_device, f"device buffers after eqopt.on_host: {on_device}"
    traces = []

    @eqx.filter_jit(donate="all")
    def step(tx, model, state):
        traces.append(None)
        loss, grads = eqx.filter_value_and_grad(model_loss)(model)
        updates, state = tx.update(grads, state, model, **_extra(case, model, grads))
        return eqopt.apply_updates(model, updates), state, loss

    state = tx.init(model)
    model, state, _ = step(tx, model, state)
    leaves, treedef = jax.tree.flatten(tx)
    changed = [
        leaf * 0.5 if eqx.is_inexact_array(leaf) and leaf.ndim == 0 else leaf
        for leaf in leaves
    ]
    model, state, _ = step(jax.tree.unflatten(treedef, changed), model, state)
    model, state, _ = step(tx, model, state)
    assert len(traces) == 1


@pytest.mark.parametrize("case", ALL_CASES, ids=CASE_IDS)
def test_jax_jit_of_bound_methods(case):
    """Optax's idiom `jax.jit(tx.init)`, `jax.jit(tx.update)`: transforms hash by identity.

    `jax.jit` takes arrays only, so the model's non-array leaves are filtered out,
    as Optax users do.
    """
    model = make_model()
    params = eqx.filter(model, eqx.is_array)
    tx = build(case.make, model)
    state = jax.jit(tx.init)(params)
    grads = random_grads(model, 0)
    extra = {} if case.extra_args is None else case.extra_args(model, grads)
    # Functions among the extra arguments (`value_fn`) cannot be `jax.jit` inputs.
    closed = {k: v for k, v in extra.items() if not eqx.is_array(v)}
    update = jax.jit(ft.partial(tx.update, **closed) if closed else tx.update)
    arrays = {k: v for k, v in extra.items() if k not in closed}
    updates, state = update(grads, state, params, **arrays)
    assert updates.activation is None and updates.w.shape == (4, 3)


def _modules(tree):
    return [
        x
        for x in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, eqx.Module))
        if isinstance(x, eqx.Module)
    ]


@pytest.mark.parametrize("case", ALL_CASES, ids=CASE_IDS)
def test_state_is_typed_module_and_serialises(case):
    model = make_model()
    tx = build(case.make, model)
    state = tx.init(model)
    assert isinstance(state, eqx.Module)
    grads = eqx.filter_grad(model_loss)(model)
    _, state = tx.update(grads, state, model, **_extra(case, model, grads))
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, state)
    buffer.seek(0)
    # (`jnp.zeros`: JAX 0.10's `jnp.zeros_like` fails on an array in host
    # memory, as `eqopt.offload` keeps state.)
    like = jax.tree.map(
        lambda x: jnp.zeros(x.shape, x.dtype) if eqx.is_array(x) else x, state
    )
    restored = eqx.tree_deserialise_leaves(buffer, like)
    assert_tree_allclose(restored, state, rtol=0, atol=0)
    # Every field of every state Module is annotated.
    for module in [state, *_modules(state)]:
        annotations = {}
        for cls in reversed(type(module).__mro__):
            annotations.update(getattr(cls, "__annotations__", {}))
        for field in module.__dataclass_fields__:
            assert field in annotations, (
                f"{type(module).__name__}.{field} is not annotated"
            )


def _parity_cases():
    for case in ALL_CASES:
        # A case without parity is reported as skipped, with its reason.
        marks = (
            [pytest.mark.skip(reason=f"no parity: {case.no_parity_reason}")]
            if case.no_parity_reason is not None
            else []
        )
        for dtype in case.dtypes:
            yield pytest.param(case, dtype, id=f"{case.name}-{dtype}", marks=marks)


def test_every_case_without_parity_says_why():
    silent = [
        case.name
        for case in ALL_CASES
        if (case.optax is None or case.random) and case.no_parity_reason is None
    ]
    assert silent == [], "give these cases a no_parity_reason (and test them directly)"


@pytest.mark.parametrize(
    "case", [c for c in ALL_CASES if not c.needs_params], ids=lambda c: c.name
)
def test_update_without_params(case):
    # A case that declares it does not need params gives the same updates without them.
    model = make_model()
    tx = build(case.make, model)
    state = tx.init(model)
    for step in range(2):
        grads = random_grads(model, step)
        extra = _extra(case, model, grads)
        updates, new_state = tx.update(grads, state, model, **extra)
        without, without_state = tx.update(grads, state, **extra)
        assert_tree_allclose(as_dict(without), as_dict(updates), rtol=0, atol=0)
        assert_tree_allclose(
            eqx.filter(without_state, eqx.is_array),
            eqx.filter(new_state, eqx.is_array),
            rtol=0,
            atol=0,
        )
        state = new_state
        model = eqopt.apply_updates(model, updates)


@pytest.mark.parametrize("case,dtype", list(_parity_cases()))
def test_parity_with_optax(case, dtype):
    dtype = jnp.dtype(dtype)
    model = make_model(dtype)
    params = as_dict(model)
    tx = build(case.make, model)
    reference = build(case.optax, params)
    state, reference_state = tx.init(model), reference.init(params)
    low_precision = dtype == jnp.bfloat16
    rtol = 2e-2 if low_precision else case.rtol
    atol = 2e-2 if low_precision else case.atol
    for step in range(case.steps):
        grads = random_grads(model, step)
        extra = _extra(case, model, grads)
        updates, state = tx.update(grads, state, model, **extra)
        reference_updates, reference_state = reference.update(
            as_dict(grads), reference_state, params, **_for_optax(extra)
        )
        assert_tree_allclose(as_dict(updates), reference_updates, rtol=rtol, atol=atol)
        model = eqopt.apply_updates(model, updates)
        params = optax.apply_updates(params, reference_updates)
        assert_tree_allclose(as_dict(model), params, rtol=rtol, atol=atol)
        assert jax.tree.map(lambda x: x.dtype, as_dict(model)) == jax.tree.map(
            lambda x: x.dtype, params
        )


ELEMENTWISE_CASES = [c for c in ALL_CASES if build(c.make, make_model()).elementwise]


def test_elementwise_declared():
    for case in ALL_CASES:
        assert isinstance(build(case.make, make_model()).elementwise, bool), case.name
    # The claim is made where docs/design.md, "Elementwise updates", says it holds.
    assert (
        eqopt.scale_by_adam().elementwise and eqopt.clip_by_global_norm(1.0).elementwise
    )
    assert not eqopt.masked(eqopt.scale(1.0), lambda x: x.ndim > 1).elementwise


@pytest.mark.parametrize(
    "case", ELEMENTWISE_CASES, ids=[c.name for c in ELEMENTWISE_CASES]
)
def test_elementwise_claim(case):
    """An elementwise transform gives the same result on leaves and on their concatenation."""
    model = make_model()
    params = as_dict(model)
    order = ("w", "b", "s")

    def flat(tree):
        return {"all": jnp.concatenate([jnp.ravel(tree[k]) for k in order])}

    tx = build(case.make, params)
    flat_params = flat(params)
    flat_tx = build(case.make, flat_params)
    state, flat_state = tx.init(params), flat_tx.init(flat_params)
    for step in range(3):
        grads = as_dict(random_grads(model, step))
        updates, state = tx.update(grads, state, params, **_extra(case, params, grads))
        flat_updates, flat_state = flat_tx.update(
            flat(grads),
            flat_state,
            flat_params,
            **_extra(case, flat_params, flat(grads)),
        )
        assert_tree_allclose(flat(updates), flat_updates, rtol=1e-5, atol=1e-6)
        params = eqopt.apply_updates(params, updates)
        flat_params = eqopt.apply_updates(flat_params, flat_updates)
