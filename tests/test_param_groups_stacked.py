"""Parameter groups on a stack of layers (`eqx.filter_vmap` blocks run by `lax.scan`):
groups, layer decay, the report and the rates count the layers inside the stack,
and give the numbers of the same model written as a list of blocks."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqopt

DEPTH, WIDTH, VOCAB = 4, 8, 11


class Block(eqx.Module):
    norm: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.norm = eqx.nn.LayerNorm(WIDTH)
        self.up = eqx.nn.Linear(WIDTH, 2 * WIDTH, key=k1)
        self.down = eqx.nn.Linear(2 * WIDTH, WIDTH, key=k2)

    def __call__(self, x):
        return x + self.down(jax.nn.relu(self.up(self.norm(x))))


class Stacked(eqx.Module):
    embed: eqx.nn.Embedding
    blocks: Block  # every leaf stacked DEPTH deep
    head: eqx.nn.Linear

    def __call__(self, token):
        arrays, static = eqx.partition(self.blocks, eqx.is_array)

        def body(x, block):
            return eqx.combine(block, static)(x), None

        return self.head(jax.lax.scan(body, self.embed(token), arrays)[0])


class Listed(eqx.Module):
    embed: eqx.nn.Embedding
    blocks: list[Block]
    head: eqx.nn.Linear


def _unstack(tree):
    blocks = [jax.tree.map(lambda x, k=k: x[k], tree.blocks) for k in range(DEPTH)]
    return Listed(tree.embed, blocks, tree.head)


def _models():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    blocks = eqx.filter_vmap(Block)(jax.random.split(k1, DEPTH))
    stacked = Stacked(
        eqx.nn.Embedding(VOCAB, WIDTH, key=k2),
        blocks,
        eqx.nn.Linear(WIDTH, 3, key=k3),
    )
    return stacked, _unstack(stacked)


def _grads(stacked, step):
    def loss(model):
        tokens = jnp.arange(5) + step
        return jnp.sum(jax.vmap(model)(tokens % VOCAB) ** 2)

    return eqx.filter_grad(loss)(stacked)


def _opt(**kwargs):
    return eqopt.param_groups(
        eqopt.adamw(1e-2, weight_decay=0.1),
        groups=[
            # One slice of the stack, by its path as a layer.
            eqopt.Group(select=r"^blocks\[3\]\.up\.", name="last_up", lr_mult=2.0),
            eqopt.Group(
                select=(eqx.nn.LayerNorm, eqopt.in_layer(eqx.nn.Linear, field="bias")),
                name="no_decay",
                wd_mult=0.0,
            ),
        ],
        layer_decay=eqopt.layer_decay(0.7),
        **kwargs,
    )


def _run(opt, model, grads_of, jit, pack, steps=3):
    params = eqopt.pack(model) if pack else model
    state = opt.init(params)
    step = eqx.filter_jit(opt.update) if jit else opt.update
    for k in range(steps):
        grads = grads_of(k)
        if pack:
            grads = eqopt.Packed.like(params, grads)
        updates, state = step(grads, state, params)
        params = eqopt.apply_updates(params, updates)
    return (updates.unpack() if pack else updates), state


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("jit", [True, False])
def test_stack_equals_list_slice_by_slice(jit, pack):
    stacked, listed = _models()
    opt = _opt()
    ours, state = _run(opt, stacked, lambda k: _grads(stacked, k), jit, pack)
    theirs, _ = _run(opt, listed, lambda k: _unstack(_grads(stacked, k)), jit, pack)
    for a, b in zip(
        jax.tree.leaves(_unstack(ours)), jax.tree.leaves(theirs), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    # Slice k of the stack is layer k + 1 (the embedding is layer 0, the head
    # layer 5), its multipliers a vector over the slices kept in the state.
    assignment = state.assignment
    assert assignment.n_layers == DEPTH + 1
    assert assignment.stacks.count((DEPTH,)) == 6
    assert {1, 2, 3, 4} in [set(x) for x in assignment.layers if isinstance(x, tuple)]
    vectors = [v for v in state.lr_scales.values if v.shape == (DEPTH,)]
    np.testing.assert_allclose(vectors[0], [0.7**4, 0.7**3, 0.7**2, 0.7], rtol=1e-6)


def test_multipliers_are_inputs_of_the_program():
    """Changing a multiplier in the state changes the step without a new trace."""
    stacked, _ = _models()
    opt = _opt()
    state = opt.init(stacked)
    traces = []

    @eqx.filter_jit
    def step(grads, state, params):
        traces.append(None)
        return opt.update(grads, state, params)[0]

    grads = _grads(stacked, 0)
    first = step(grads, state, stacked)
    doubled = eqx.tree_at(
        lambda s: s.lr_scales.values,
        state,
        tuple(2 * v for v in state.lr_scales.values),
    )
    second = step(grads, doubled, stacked)
    assert len(traces) == 1
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True):
        np.testing.assert_allclose(2 * a, b, rtol=1e-6)


def test_report_and_rates_show_the_stack_as_its_layers():
    stacked, listed = _models()
    opt = _opt()
    ours, theirs = opt.init(stacked), opt.init(listed)
    report = str(eqopt.param_groups_report(opt, ours))
    assert report == str(eqopt.param_groups_report(opt, theirs))
    assert "blocks[0-3].norm.weight" in report
    assert "blocks[3].up.weight" in report
    by_layer = eqopt.param_groups_report(opt, ours, by_layer=True)
    assert [r.layer for r in by_layer.rows if r.group == "no_decay"] == [1, 2, 3, 4, 5]
    rates, expected = (
        eqopt.current_hyperparams(opt, ours),
        eqopt.current_hyperparams(opt, theirs),
    )
    assert rates.keys() == expected.keys()
    for key in rates:
        np.testing.assert_allclose(rates[key], expected[key])
    np.testing.assert_allclose(rates["default.layer2.learning_rate"], 1e-2 * 0.7**3)
    np.testing.assert_allclose(rates["last_up.layer4.learning_rate"], 1e-2 * 0.7 * 2)


def test_nested_stacks_number_their_layers_in_order():
    blocks = eqx.filter_vmap(eqx.filter_vmap(Block))(
        jax.random.split(jax.random.key(1), (2, 3))
    )
    model = {"blocks": blocks, "head": eqx.nn.Linear(WIDTH, 2, key=jax.random.key(2))}
    opt = eqopt.param_groups(eqopt.adam(1e-3), layer_decay=eqopt.layer_decay(0.5))
    state = opt.init(model)
    assert state.assignment.n_layers == 7
    assert (1, 2, 3, 4, 5, 6) in state.assignment.layers
    report = str(eqopt.param_groups_report(opt, state))
    assert "blocks[0-1][0-2].up.weight" in report
    grads = jax.tree.map(jnp.ones_like, eqx.filter(model, eqx.is_inexact_array))
    updates, _ = opt.update(grads, state, model)
    # Adam's first step is -lr * sign(g) times the layer's multiplier.
    factors = np.asarray(updates["blocks"].up.bias[:, :, 0]) / -1e-3
    np.testing.assert_allclose(
        factors, [[0.5**6, 0.5**5, 0.5**4], [0.5**3, 0.5**2, 0.5]], rtol=1e-4
    )


class Custom(eqx.Module):
    lin: eqx.nn.Linear
    scale: jax.Array  # a bare array: eqopt cannot tell it is stacked


def test_a_bare_array_in_a_stack_needs_its_stack_axes():
    blocks = eqx.filter_vmap(
        lambda k: Custom(eqx.nn.Linear(WIDTH, WIDTH, key=k), jnp.ones(WIDTH))
    )(jax.random.split(jax.random.key(3), DEPTH))
    model = {"blocks": blocks, "head": jnp.ones(2)}
    decay = eqopt.layer_decay(0.5)
    with pytest.raises(ValueError, match=r"blocks\.scale is inside the stack"):
        eqopt.param_groups(eqopt.adam(1e-3), layer_decay=decay).init(model)
    opt = eqopt.with_stack_axes(
        eqopt.param_groups(eqopt.adam(1e-3), layer_decay=decay),
        lambda path: 1 if path.startswith("['blocks']") else None,
    )
    state = opt.init(model)
    assignment = state.assignment  # the state is the inner optimiser's
    position = assignment.paths.index(tuple(f"blocks[{k}].scale" for k in range(DEPTH)))
    assert assignment.stacks[position] == (DEPTH,)
    assert assignment.layers[position] == (1, 2, 3, 4)


def test_a_group_with_its_own_optimiser_takes_whole_stacks():
    stacked, listed = _models()
    part = eqopt.param_groups(
        eqopt.adamw(1e-2), [eqopt.Group(r"^blocks\[0\]\.", name="first", b2=0.9)]
    )
    with pytest.raises(ValueError, match=r"takes whole stacks"):
        part.init(stacked)
    whole = eqopt.param_groups(
        eqopt.adamw(1e-2), [eqopt.Group(r"^blocks\.", name="blocks", b2=0.9)]
    )
    ours, _ = _run(whole, stacked, lambda k: _grads(stacked, k), True, False)
    by_regex = eqopt.param_groups(
        eqopt.adamw(1e-2), [eqopt.Group(r"^blocks\[", name="blocks", b2=0.9)]
    )
    theirs, _ = _run(
        by_regex, listed, lambda k: _unstack(_grads(stacked, k)), True, False
    )
    for a, b in zip(
        jax.tree.leaves(_unstack(ours)), jax.tree.leaves(theirs), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


SCRIPT = """
from test_param_groups_stacked import _models, _opt
stacked, _ = _models()
mesh = jax.make_mesh((2, 4), ("model", "data"), axis_types=(AxisType.Auto,) * 2)
params = jax.device_put(stacked, NamedSharding(mesh, P()))
opt = _opt()
plan = eqopt.zero_plan(opt, params, mesh, min_size=0)
state = plan.init(opt, params)
mu = state.inner[0].mu.blocks.up.weight
# The stack of 4 layers is split along its stack axis over the data axis (4).
assert mu.shape == (4, 16, 8) and mu.sharding.spec[0] == "data", mu.sharding
assert mu.addressable_shards[0].data.shape == (1, 16, 8)
print("ok")
"""


def test_zero_splits_a_stacked_state_along_the_stack():
    from test_zero import run_script

    assert "ok" in run_script(SCRIPT, timeout=300)
