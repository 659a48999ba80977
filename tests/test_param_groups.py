"""Parameter groups (`eqopt/_groups.py`, `_param_groups.py`, `_groups_report.py`):
multipliers, overrides and layer decay give the numbers of the hand-written
partition, through packing, bucketing, injection, master weights, quantised
moments and checkpoints; the report; every bad configuration's one error."""

import re
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Case

import eqopt

# -- The registry's cases: Optax's `multi_transform` with one optimiser per group --


def _optax_groups(optimisers, labels):
    return lambda: optax.multi_transform(optimisers, labels)


LR, WD = 1e-2, 0.1
TRANSFORM_CASES = [
    Case(
        "param_groups-multipliers",
        lambda: eqopt.param_groups(
            eqopt.adamw(LR, weight_decay=WD),
            groups=[
                eqopt.Group(select=r"^b$", name="bias", lr_mult=3.0, wd_mult=0.0),
                eqopt.Group(select=r"^s$", name="scalar", lr_mult=0.5, wd_mult=2.0),
            ],
        ),
        _optax_groups(
            {
                "bias": optax.adamw(LR * 3.0, weight_decay=0.0),
                "scalar": optax.adamw(LR * 0.5, weight_decay=WD * 2.0),
                "default": optax.adamw(LR, weight_decay=WD),
            },
            {"w": "default", "b": "bias", "s": "scalar"},
        ),
        ("float32", "bfloat16", "complex64"),
    ),
    Case(
        "param_groups-schedule-override",
        lambda: eqopt.param_groups(
            eqopt.adamw(optax.linear_schedule(LR, 0.0, 10), weight_decay=WD),
            groups=[
                eqopt.Group(select=lambda x: x.ndim == 0, name="scalars", b2=0.9),
                eqopt.Group(select=r"^b", name="bias", lr_mult=2.0),
            ],
        ),
        _optax_groups(
            {
                "scalars": optax.adamw(
                    optax.linear_schedule(LR, 0.0, 10), b2=0.9, weight_decay=WD
                ),
                "bias": optax.adamw(
                    lambda t: 2.0 * optax.linear_schedule(LR, 0.0, 10)(t),
                    weight_decay=WD,
                ),
                "default": optax.adamw(
                    optax.linear_schedule(LR, 0.0, 10), weight_decay=WD
                ),
            },
            {"w": "default", "b": "bias", "s": "scalars"},
        ),
    ),
    Case(
        "param_groups-optimiser",
        lambda: eqopt.param_groups(
            eqopt.lion(1e-3, weight_decay=0.5),
            groups=[
                eqopt.Group(
                    select=r"^w$", name="matrices", optimiser=eqopt.sgd(0.1, 0.9)
                ),
                eqopt.Group(select=r"^s$", wd_mult=0.0),
            ],
        ),
        _optax_groups(
            {
                "matrices": optax.sgd(0.1, 0.9),
                "^s$": optax.lion(1e-3, weight_decay=0.0),
                "default": optax.lion(1e-3, weight_decay=0.5),
            },
            {"w": "matrices", "b": "default", "s": "^s$"},
        ),
    ),
]


# -- A transformer-like model -------------------------------------------------


class Block(eqx.Module):
    norm: eqx.nn.LayerNorm
    attn: eqx.nn.Linear
    mlp: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.norm = eqx.nn.LayerNorm(8)
        self.attn = eqx.nn.Linear(8, 8, key=k1)
        self.mlp = eqx.nn.Linear(8, 8, key=k2)


class Model(eqx.Module):
    embed: eqx.nn.Embedding
    blocks: list[Block]
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear
    activation: object = jax.nn.gelu

    def __init__(self, key, n_blocks=3, dtype=jnp.float32):
        keys = jax.random.split(key, n_blocks + 2)
        self.embed = eqx.nn.Embedding(16, 8, key=keys[0])
        self.blocks = [Block(k) for k in keys[1:-1]]
        self.norm = eqx.nn.LayerNorm(8)
        self.head = eqx.nn.Linear(8, 4, key=keys[-1])
        if dtype != jnp.float32:
            cast = jax.tree.map(
                lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, self
            )
            for name in ("embed", "blocks", "norm", "head"):
                object.__setattr__(self, name, getattr(cast, name))


def _grads(model, step):
    key = jax.random.key(step)
    return jax.tree.map(
        lambda x: (
            (jax.random.normal(key, x.shape) * 0.1).astype(x.dtype)
            if eqx.is_inexact_array(x)
            else None
        ),
        model,
    )


NO_DECAY = eqopt.Group(
    select=(eqx.nn.LayerNorm, eqopt.in_layer(eqx.nn.Linear, field="bias")),
    name="no_decay",
    wd_mult=0.0,
)
HEAD = eqopt.Group(select=r"^head\.", name="head", lr_mult=10.0)


def _recipe(optimiser):
    return eqopt.param_groups(
        optimiser, groups=[HEAD, NO_DECAY], layer_decay=eqopt.layer_decay(0.5)
    )


def _equivalent(model, lr, wd, make):
    """The hand-written partition: one optimiser per (lr, wd) multiplier pair."""
    opt = _recipe(eqopt.adamw(lr, weight_decay=wd))
    state = opt.init(model)
    pairs, labels = {}, []
    for row in opt.rows(state.assignment):
        pair = (row.lr_mult, row.wd_mult)
        pairs.setdefault(pair, f"g{len(pairs)}")
        labels.append((row.paths, pairs[pair]))
    by_path = {path: label for paths, label in labels for path in paths}
    flat = jax.tree_util.tree_flatten_with_path(model)[0]
    from eqopt._leaves import path_str

    leaves = [
        by_path.get(path_str(p, relative=True)) if eqx.is_inexact_array(x) else None
        for p, x in flat
    ]
    tree = jax.tree.unflatten(jax.tree.structure(model), leaves)
    lr32, wd32 = jnp.asarray(lr, jnp.float32), jnp.asarray(wd, jnp.float32)
    transforms = {
        label: make(lr_mult, wd_mult, lr32, wd32)
        for (lr_mult, wd_mult), label in pairs.items()
    }
    return eqopt.partition(transforms, tree)


def _run(opt, model, steps=3, pack=None):
    params = model if pack is None else pack(model)
    state = opt.init(params)
    step = eqx.filter_jit(opt.update)
    out = []
    for k in range(steps):
        grads = _grads(model, k)
        if pack is not None:
            grads = eqopt.Packed.like(params, grads)
        updates, state = step(grads, state, params)
        out.append(updates if pack is None else updates.unpack())
    return out, state


def _same(xs, ys, ulps=0):
    """Equal, or within `ulps` units in the last place (two programs that XLA
    compiles apart may contract a multiply-add in one and not the other)."""
    for x, y in zip(jax.tree.leaves(xs), jax.tree.leaves(ys), strict=True):
        assert x.dtype == y.dtype
        dtype = x.dtype
        if not ulps:
            np.testing.assert_array_equal(
                np.asarray(x, np.float32), np.asarray(y, np.float32)
            )
            continue
        # An ulp of the leaf's largest term: a sum that cancels keeps its error.
        x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
        tolerance = ulps * float(jnp.finfo(dtype).eps) * np.abs(y).max()
        np.testing.assert_allclose(x, y, rtol=0, atol=tolerance)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_multipliers_and_layer_decay_equal_the_hand_written_partition(dtype):
    model = Model(jax.random.key(0), dtype=dtype)
    lr, wd = 3e-3, 0.05

    def make(lr_mult, wd_mult, lr32, wd32):
        return eqopt.adamw(lr32 * lr_mult, weight_decay=wd32 * wd_mult)

    ours, _ = _run(_recipe(eqopt.adamw(lr, weight_decay=wd)), model)
    theirs, _ = _run(_equivalent(model, lr, wd, make), model)
    _same(ours, theirs, ulps=4)


def test_schedule_times_multiplier():
    model = Model(jax.random.key(1))
    schedule = eqopt.cosine_decay_schedule(1e-2, 10)

    def make(lr_mult, wd_mult, lr32, wd32):
        return eqopt.adamw(lambda t: schedule(t) * lr_mult, weight_decay=wd32 * wd_mult)

    ours, state = _run(_recipe(eqopt.adamw(schedule, weight_decay=0.1)), model)
    theirs, _ = _run(_equivalent(model, 1e-2, 0.1, make), model)
    _same(ours, theirs, ulps=4)
    # The rates in use, per group and layer, inside `jit` too.
    opt = _recipe(eqopt.adamw(schedule, weight_decay=0.1))
    values = eqx.filter_jit(eqopt.current_hyperparams)(opt, state)
    n = state.assignment.n_layers
    assert n == 4
    np.testing.assert_allclose(values["head.layer4.learning_rate"], schedule(3) * 10)
    np.testing.assert_allclose(
        values["default.layer1.learning_rate"], schedule(3) * 0.5**3, rtol=1e-6
    )
    np.testing.assert_allclose(values["no_decay.layer1.weight_decay"], 0.0)
    np.testing.assert_allclose(values["learning_rate"], schedule(3))


def test_packed_bucketed_injected_and_master_weights_give_the_same_numbers():
    model = Model(jax.random.key(2))
    reference, _ = _run(_recipe(eqopt.adamw(1e-3, weight_decay=0.1)), model)
    packed, _ = _run(
        _recipe(eqopt.adamw(1e-3, weight_decay=0.1)), model, pack=eqopt.pack
    )
    _same(reference, packed, ulps=4)
    bucketed = eqopt.bucketed(_recipe(eqopt.adamw(1e-3, weight_decay=0.1)), always=True)
    out, state = _run(bucketed, model)
    assert state.is_bucketed
    _same(reference, out, ulps=4)
    inside = _recipe(eqopt.bucketed(eqopt.adamw(1e-3, weight_decay=0.1), always=True))
    _same(reference, _run(inside, model)[0], ulps=4)
    injected = _recipe(
        eqopt.inject_hyperparams(eqopt.adamw)(learning_rate=1e-3, weight_decay=0.1)
    )
    _same(reference, _run(injected, model)[0])
    master = eqopt.master_weights(_recipe(eqopt.adamw(1e-3, weight_decay=0.1)))
    low = Model(jax.random.key(2), dtype=jnp.bfloat16)
    ours = _run(master, low)[0]
    plain = eqopt.master_weights(eqopt.adamw(1e-3, weight_decay=0.1))
    assert not all(
        np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
        for a, b in zip(
            jax.tree.leaves(ours), jax.tree.leaves(_run(plain, low)[0]), strict=True
        )
    )


def test_quantised_moments_one_state():
    """Multipliers keep one optimiser: the state is the optimiser's (quantised) state,
    and a multiplier of 2 doubles the leaf's update exactly."""
    eight = eqopt.Quantized(8, rounding="nearest", min_size=0)
    model = Model(jax.random.key(3))
    plain = eqopt.adam(1e-3, mu_dtype=eight, nu_dtype=eight)
    grouped = eqopt.param_groups(
        plain, groups=[eqopt.Group(select=r"^head\.weight$", lr_mult=2.0)]
    )
    ours, state = _run(grouped, model)
    theirs, plain_state = _run(plain, model)
    assert jax.tree.structure(state.inner) == jax.tree.structure(plain_state)
    assert isinstance(state.inner[0].mu.head.weight, eqopt.QuantizedArray)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a.head.weight, 2 * b.head.weight)
        np.testing.assert_array_equal(a.blocks[1].mlp.weight, b.blocks[1].mlp.weight)


def test_checkpoint_restores_the_groups(tmp_path):
    model = Model(jax.random.key(4))
    opt = _recipe(eqopt.adamw(1e-3, weight_decay=0.1))
    updates, state = _run(opt, model, steps=2)
    eqx.tree_serialise_leaves(tmp_path / "state.eqx", state)
    restored = eqx.tree_deserialise_leaves(tmp_path / "state.eqx", opt.init(model))
    assert restored.assignment is state.assignment
    step = eqx.filter_jit(opt.update)
    a, _ = step(_grads(model, 9), state, model)
    b, _ = step(_grads(model, 9), restored, model)
    _same(a, b)


def test_report():
    model = Model(jax.random.key(5), n_blocks=4)
    opt = eqopt.param_groups(
        eqopt.adamw(1e-3, weight_decay=0.1), groups=[HEAD, NO_DECAY]
    )
    state = opt.init(model)
    text = str(eqopt.param_groups_report(opt, state))
    lines = text.splitlines()
    assert lines[0] == "3 groups, 820 parameters, at step 0"
    assert lines[1].split() == [
        "group",
        "params",
        "lr",
        "x",
        "lr",
        "wd",
        "x",
        "wd",
        "paths",
    ]
    assert re.search(r"^head +36 +x10 +0\.01 +x1 +0\.1 +head\.weight$", text, re.M)
    assert re.search(
        r"^no_decay +144 +x1 +0\.001 +x0 +0 +blocks\[0-3\]\.norm\.weight$", text, re.M
    )
    assert "blocks[0-3].attn.bias" in text and "blocks[0-3].mlp.weight" in text
    report = eqopt.param_groups_report(opt, state)
    assert [r.group for r in report.rows] == ["head", "no_decay", "default"]
    assert sum(r.size for r in report.rows) == 820
    assert report.rows[2].paths[0] == "embed.weight"


def test_layer_ids_follow_beit():
    model = Model(jax.random.key(6), n_blocks=3)
    opt = eqopt.param_groups(eqopt.sgd(1.0), layer_decay=eqopt.layer_decay(0.5))
    state = opt.init(model)
    layers = {
        p: layer
        for p, layer in zip(
            state.assignment.paths, state.assignment.layers, strict=True
        )
        if layer is not None
    }
    assert layers["embed.weight"] == 0
    assert layers["blocks[0].attn.weight"] == 1 and layers["blocks[2].mlp.bias"] == 3
    assert layers["norm.weight"] == 4 and layers["head.weight"] == 4
    updates = opt.update(
        jax.tree.map(jnp.ones_like, eqx.filter(model, eqx.is_array)), state, model
    )[0]
    assert float(updates.head.weight[0, 0]) == -1.0
    assert float(updates.blocks[0].attn.weight[0, 0]) == -(0.5**3)
    assert float(updates.embed.weight[0, 0]) == -(0.5**4)
    # The report spans a group's layers; by layer, one line each.
    report = eqopt.param_groups_report(opt, state)
    assert re.search(
        r"^default +0-4 +660 +x0\.0625\.\.x1 +0\.0625\.\.1 +x1 +- +embed\.weight$",
        str(report),
        re.M,
    ), str(report)
    by_layer = str(eqopt.param_groups_report(opt, state, by_layer=True))
    assert re.search(
        r"^default +2 +\S+ +x0\.25 +0\.25 +x1 +- +blocks\[1\]", by_layer, re.M
    )
    by_function = eqopt.layer_decay(
        0.5, layer_of=lambda path: 2 if path.startswith("head") else 0
    )
    state = eqopt.param_groups(eqopt.sgd(1.0), layer_decay=by_function).init(model)
    assert state.assignment.n_layers == 2


# -- Bad configurations: one error (or warning) naming the group and the path ----


def _error(match, build, model=None):
    with pytest.raises(ValueError, match=match) as info:
        opt = build()
        if model is not None:
            opt.init(model)
    assert len(str(info.value).splitlines()) == 1, str(info.value)


def test_bad_configurations():
    model = Model(jax.random.key(7))
    adamw = eqopt.adamw(1e-3)
    _error(
        r"Group 'x': 'blocks\[' is not a valid regular expression",
        lambda: eqopt.Group(select=r"blocks[", name="x"),
    )
    _error(
        r"Group 'y': `lr_mult` must be finite and >= 0, got -1.0",
        lambda: eqopt.Group(select="a", name="y", lr_mult=-1),
    )
    _error(
        r"names \['a'\] are used twice",
        lambda: eqopt.param_groups(
            adamw, [eqopt.Group("x", name="a"), eqopt.Group("y", name="a")]
        ),
    )
    _error(
        r"group 'head' overrides b3, which its optimiser does not have; its hyperparameters are b1, b2",
        lambda: eqopt.param_groups(adamw, [eqopt.Group(r"^head", name="head", b3=0.9)]),
    )
    _error(
        r"`wd_mult` multiplies the rate of the optimiser's `AddDecayedWeights` step, and it has none",
        lambda: eqopt.param_groups(
            eqopt.adam(1e-3), [eqopt.Group("bias", wd_mult=0.0)]
        ),
    )
    _error(
        r"uses its learning rate beyond a `ScaleByLearningRate` step",
        lambda: eqopt.param_groups(
            eqopt.contrib.schedule_free_adamw(1e-3), [eqopt.Group("bias", lr_mult=2.0)]
        ),
    )
    frozen = eqopt.chain(eqopt.freeze(lambda x: x.ndim == 1), adamw)
    _error(
        r"group 'no_decay' sets multipliers or overrides on blocks\[0\]\.norm\.weight, which the optimiser freezes",
        lambda: eqopt.param_groups(frozen, [NO_DECAY]),
        model,
    )
    _error(
        r"3 parameters are in no group: embed\.weight, blocks\[0\]\.attn\.weight, blocks\[0\]\.mlp\.weight, \.\.\.|parameters are in no group",
        lambda: eqopt.param_groups(adamw, [HEAD, NO_DECAY], strict=True),
        model,
    )
    _error(  # the way out it names is the other setting
        r"Add a group for them, or pass strict=False to put them in the default group",
        lambda: eqopt.param_groups(adamw, [HEAD, NO_DECAY], strict=True),
        model,
    )
    _error(
        r"layer_decay found no list of layers",
        lambda: eqopt.param_groups(adamw, layer_decay=eqopt.layer_decay(0.9)),
        {"w": jnp.ones(3)},
    )
    _error(
        r"layer_decay\(layers='encoder'\): the model has no list or stack of layers at that path; it has \['blocks'\]",
        lambda: eqopt.param_groups(
            adamw, layer_decay=eqopt.layer_decay(0.9, layers="encoder")
        ),
        model,
    )
    _error(
        r"cannot be named 'default'",
        lambda: eqopt.param_groups(adamw, [eqopt.Group("x", name="default", b1=0.8)]),
    )


def test_groups_that_select_nothing_warn():
    model = Model(jax.random.key(8))
    opt = eqopt.param_groups(
        eqopt.adamw(1e-3),
        [
            NO_DECAY,
            eqopt.Group(eqx.nn.LayerNorm, name="norms"),
            eqopt.Group(r"^decoder\.", name="decoder"),
        ],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.init(model)
    messages = [str(w.message) for w in caught]
    assert messages == [
        "param_groups: group 'norms' (LayerNorm) selects nothing: every parameter it "
        "matches went to an earlier group (no_decay).",
        "param_groups: group 'decoder' ('^decoder\\\\.') selects nothing: it matches no "
        "trainable parameter.",
    ]
    assert all(w.filename == __file__ for w in caught)


SCRIPT = """
params = {{"w": jnp.ones((64, 32)), "b": jnp.ones(32)}}
mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
opt = eqopt.param_groups(eqopt.adamw(1e-3, weight_decay=0.1),
                         [eqopt.Group(r"^b$", lr_mult=2.0, wd_mult=0.0)])
replicated = jax.device_put(params, NamedSharding(mesh, P()))
plan = eqopt.zero_plan(opt, replicated, mesh, min_size=0)
state = plan.init(opt, replicated)
assert len(state.inner[0].mu["w"].sharding.device_set) == 8, state.inner[0].mu["w"].sharding
grads = jax.tree.map(lambda p: p * 0.01, params)
u, _ = eqx.filter_jit(opt.update)(grads, state, replicated)
u0, _ = eqx.filter_jit(opt.update)(grads, opt.init(params), params)
for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(u0)):
    assert (a == b).all()
print("ok")
"""


def test_zero_plan_splits_the_one_state():
    from test_zero import run_script

    assert "ok" in run_script(SCRIPT, timeout=300)


def test_getting_started_shows_the_report_it_prints():
    from pathlib import Path

    page = (Path(__file__).parent.parent / "docs/getting-started.md").read_text()
    shown = page.split("print(eqopt.param_groups_report(opt, state))\n```\n\n```\n")[
        1
    ].split("```")[0]
    model = eqx.nn.MLP(2, 1, 32, 2, key=jax.random.key(0))
    opt = eqopt.param_groups(
        eqopt.adamw(learning_rate=1e-3, weight_decay=1e-2),
        groups=[
            eqopt.Group(
                select=eqopt.in_layer(eqx.nn.Linear, field="bias"),
                name="no_decay",
                wd_mult=0.0,
            ),
            eqopt.Group(select=r"^layers\[2\]\.", name="head", lr_mult=10.0),
        ],
    )
    assert str(eqopt.param_groups_report(opt, opt.init(model))) == shown.rstrip("\n")
