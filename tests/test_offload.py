"""Optimiser state in host memory between steps (`eqopt/_wrappers/offload.py`).

On a CPU the host and device memories are the same RAM: the state carries the
`pinned_host` memory kind and the transfers compile to nothing, so these tests
check where each leaf is declared to live (`x.sharding.memory_kind`) and that
the numbers are bit for bit the on-device state's. Under ZeRO-1 on 8 simulated
devices, see `test_offload_zero.py`.
"""

import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Case

import eqopt
from eqopt import _backend
from eqopt._quantize import is_quantized

TRANSFORM_CASES = [
    Case(
        "offload-adam",
        lambda: eqopt.offload(eqopt.adam(1e-2), min_size=0),  # w's and b's moments
        lambda: optax.adam(1e-2),
    ),
]

#: Leaves of at least this many elements are offloaded in these tests: the
#: MLP's two larger weights (256 and 1024 elements), not its last weight (128),
#: biases or counts.
MIN_SIZE = 200


def _model(dtype=jnp.float32):
    model = eqx.nn.MLP(8, 4, 32, 2, key=jax.random.key(0))
    return jax.tree.map(lambda x: x.astype(dtype) if eqx.is_array(x) else x, model)


def _grads(model, step):
    key = jax.random.key(100 + step)
    return jax.tree.map(
        lambda x: (
            (jax.random.normal(key, x.shape) * 1e-2).astype(x.dtype)
            if eqx.is_inexact_array(x)
            else None
        ),
        model,
    )


@eqx.filter_jit
def _step(opt, grads, state, params):
    return opt.update(grads, state, params)


def _misplaced(state, min_size):
    """The leaves of `state` not where `eqopt.offload(..., min_size)` puts them."""
    wrong = []

    def check(path, x, size):
        expected = "pinned_host" if x.ndim and size >= min_size else "device"
        if x.sharding.memory_kind != expected:
            wrong.append(f"{jax.tree_util.keystr(path)}: {x.sharding.memory_kind}")

    flat = jax.tree_util.tree_flatten_with_path(state, is_leaf=is_quantized)[0]
    for path, x in flat:
        if is_quantized(x):
            check(path, x.codes, x.size)
            check(path, x.scales, x.size)
        elif isinstance(x, jax.Array):
            check(path, x, x.size)
    return wrong


def _on_host(tree):
    return [
        x.shape
        for x in jax.tree.leaves(tree)
        if isinstance(x, jax.Array) and x.sharding.memory_kind == "pinned_host"
    ]


def _bits(tree):
    return [
        (np.asarray(x).dtype, np.asarray(x).tobytes())
        for x in jax.tree.leaves(eqx.filter(tree, eqx.is_array))
    ]


def _run(opt, params, grads, state=None):
    state = opt.init(params) if state is None else state
    placements = []
    for g in grads:
        updates, state = _step(opt, g, state, params)
        placements.append(state)
    return updates, state, placements


EIGHT = eqopt.Quantized(8, min_size=0)
CASES = {
    "adam": lambda: eqopt.adam(1e-3),
    "adamw-schedule-clip": lambda: eqopt.chain(
        eqopt.clip_by_global_norm(1e-2),
        eqopt.adamw(eqopt.cosine_decay_schedule(1e-3, 100), weight_decay=1e-2),
    ),
    "lion": lambda: eqopt.lion(1e-4, weight_decay=1e-2),
    "adafactor": lambda: eqopt.adafactor(1e-3, min_dim_size_to_factor=32),
    "muon": lambda: eqopt.contrib.muon(1e-3),
    "adam-8bit": lambda: eqopt.adam(1e-3, mu_dtype=EIGHT, nu_dtype=EIGHT),
    "master-weights": lambda: eqopt.master_weights(eqopt.adamw(1e-3)),
    "packed": lambda: eqopt.adam(1e-3),
    "bucketed": lambda: eqopt.bucketed(eqopt.adam(1e-3), always=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_state_lives_on_the_host_and_steps_bit_for_bit(name):
    """Every state leaf of at least `min_size` elements is in `pinned_host`
    memory after `init` and after each jitted step, the others on the device,
    and updates and state are bit for bit those of the on-device state."""
    params = _model(jnp.bfloat16 if name == "master-weights" else jnp.float32)
    grads = [_grads(params, k) for k in range(2)]
    if name == "packed":
        params = eqopt.pack(params)
        grads = [eqopt.Packed.like(params, g) for g in grads]
    reference = CASES[name]()
    opt = eqopt.offload(reference, min_size=MIN_SIZE)
    state = opt.init(params)
    assert not _misplaced(state, MIN_SIZE), _misplaced(state, MIN_SIZE)
    if name in ("packed", "bucketed"):
        # One buffer for the whole model: its moments are offloaded whole.
        assert _on_host(state) == [(1476,), (1476,)], _on_host(state)
    else:
        assert _on_host(state) and _misplaced(state, 0), "all or nothing offloaded"
    updates, state, placements = _run(opt, params, grads, state)
    for placed in placements:
        assert not _misplaced(placed, MIN_SIZE), _misplaced(placed, MIN_SIZE)
    expected_updates, expected_state, _ = _run(reference, params, grads)
    assert _bits(updates) == _bits(expected_updates)
    assert _bits(state) == _bits(expected_state)
    # The user reads the state as without offload.
    assert jax.tree.structure(state) == jax.tree.structure(expected_state)


def _loss(model, x):
    return jnp.mean(jax.vmap(model)(x) ** 2)


@eqx.filter_jit(donate="all-except-first")
def _train_step(opt, model, state, x):
    loss, grads = eqx.filter_value_and_grad(_loss)(model, x)
    updates, state = opt.update(grads, state, model)
    return eqopt.apply_updates(model, updates), state, loss


def test_a_step_that_donates_model_and_state():
    """The usual training step, donating the model, the state and the batch:
    the state stays in host memory, the numbers are the on-device state's."""
    x = jax.random.normal(jax.random.key(1), (16, 8))
    runs = []
    for opt in (eqopt.adamw(1e-2), eqopt.offload(eqopt.adamw(1e-2), min_size=MIN_SIZE)):
        model = _model()
        state = opt.init(model)
        for _ in range(3):
            model, state, loss = _train_step(opt, model, state, x.copy())
            assert not _misplaced(state, MIN_SIZE if len(runs) else 10**9)
        runs.append((model, state, loss))
    assert _bits(runs[0]) == _bits(runs[1])


def test_init_allocates_nothing_on_the_device():
    """`init` builds the state in one program whose outputs are in host memory:
    no array of the state above `min_size` is ever in device memory."""
    params = _model()
    opt = eqopt.offload(eqopt.adamw(1e-3), min_size=MIN_SIZE)
    before = {id(x) for x in jax.live_arrays()}
    state = opt.init(params)
    new = [x for x in jax.live_arrays() if id(x) not in before]
    assert new and all(
        x.sharding.memory_kind == "pinned_host" for x in new if x.size >= MIN_SIZE
    ), [(x.shape, x.sharding.memory_kind) for x in new]
    offloaded = len(_on_host(state))
    assert offloaded == 4  # mu and nu of the two larger weights
    # The program's outputs are placed in host memory by the program itself.
    text = eqx.filter_jit(opt.init).lower(params).as_text()
    assert text.count('mhlo.memory_kind = "pinned_host"') == offloaded, text
    # And the abstract state needs no device at all.
    abstract = eqx.filter_eval_shape(opt.init, params)
    assert jax.tree.structure(abstract) == jax.tree.structure(state)


def test_checkpoint_restores_on_and_off_the_host(tmp_path: pathlib.Path):
    """A state saved from host memory restores onto the device (Equinox reads
    arrays back onto the device) and trains there, its next state back on the
    host; `to_host` puts it back in host memory, and Orbax restores it there
    directly. All train on bit for bit as the uninterrupted run."""
    params = _model()
    opt = eqopt.offload(eqopt.adamw(1e-3), min_size=MIN_SIZE)
    g0, g1 = _grads(params, 0), _grads(params, 1)
    _, state = _step(opt, g0, opt.init(params), params)
    expected = _step(opt, g1, state, params)
    path = tmp_path / "state.eqx"
    eqx.tree_serialise_leaves(path, state)
    restored = eqx.tree_deserialise_leaves(path, opt.init(params))
    assert len(_misplaced(restored, MIN_SIZE)) == 4  # on the device
    stepped = _step(opt, g1, restored, params)
    assert _bits(stepped) == _bits(expected)
    assert not _misplaced(stepped[1], MIN_SIZE)
    on_host = opt.to_host(restored)
    assert not _misplaced(on_host, MIN_SIZE)
    assert _bits(_step(opt, g1, on_host, params)) == _bits(expected)
    assert not _misplaced(opt.to_device(on_host), 10**9)  # all on the device

    ocp = pytest.importorskip("orbax.checkpoint")
    checkpointer = ocp.StandardCheckpointer()
    arrays, static = eqx.partition(state, eqx.is_array)
    checkpointer.save(tmp_path / "orbax", arrays)
    checkpointer.wait_until_finished()
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, arrays)
    restored = eqx.combine(checkpointer.restore(tmp_path / "orbax", target), static)
    assert not _misplaced(restored, MIN_SIZE)
    assert _bits(_step(opt, g1, restored, params)) == _bits(expected)


def test_capabilities_are_the_inner_optimisers():
    adam, adafactor = eqopt.offload(eqopt.adam(1e-3)), eqopt.offload(eqopt.adafactor())
    assert adam.elementwise and adam.runs_on_buffers and adam.handles_packed
    assert not adafactor.elementwise and not adafactor.runs_on_buffers
    assert not eqopt.offload(eqopt.bucketed(eqopt.adam(1e-3))).advises_bucketing
    frozen = eqopt.offload(eqopt.chain(eqopt.freeze(lambda x: x.ndim == 1)))
    assert frozen.freezes and frozen.frozen_selection({"b": jnp.ones(2)}) == {"b": True}
    assert not eqopt.offload(
        eqopt.lookahead(eqopt.sgd(0.1), 2, 0.5)
    ).params_like_updates
    assert isinstance(eqopt.offload(eqopt.adam(1e-3)), eqopt.Offload)
    assert eqopt.offload(eqopt.adam(1e-3)).min_size == 4096
    # Read as the inner optimiser: its hyperparameters, its moments by name.
    inner = eqopt.adamw(eqopt.cosine_decay_schedule(1e-3, 100))
    opt, params = eqopt.offload(inner, min_size=4), {"w": jnp.ones((4, 4))}
    state = opt.init(params)
    current = eqopt.current_hyperparams(opt, state)
    assert current == eqopt.current_hyperparams(inner, state) and current
    assert eqopt.tree.get(state, "mu")["w"].shape == (4, 4)


def test_bad_configurations_get_one_clear_error(monkeypatch):
    with pytest.raises(ValueError, match=r"eqopt.offload: min_size=-1; .* 0 or more"):
        eqopt.offload(eqopt.adam(1e-3), min_size=-1)
    monkeypatch.setattr(
        _backend,
        "lacks_host_memory",
        lambda: "the tpu backend's devices have no 'pinned_host' memory",
    )
    opt = eqopt.offload(eqopt.adam(1e-3))
    message = r"eqopt.offload: the tpu backend's .*\(drop `eqopt.offload`\)"
    with pytest.raises(ValueError, match=message):
        opt.init({"w": jnp.ones(3)})
    with pytest.raises(ValueError, match=message):
        opt.update({"w": jnp.ones(3)}, eqopt.adam(1e-3).init({"w": jnp.ones(3)}))
