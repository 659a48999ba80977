"""ZeRO-1: optimiser state split over the data axis of a mesh (`eqopt/_zero.py`).

The device count is fixed when JAX starts, so the checks on 8 simulated CPU
devices run in one subprocess each (as in `test_sharding.py`). Every registry
case runs one step eagerly on a mesh with explicit axes (every fourth on one
with automatic axes; all of them with EQOPT_ZERO_FULL=1), with replicated
params and its state split over the data axis: the updates equal the unsharded
step's (1e-6 relative), the params keep their sharding, the state keeps its
ZeRO sharding. A few representative cases also run jitted, initialised
straight into the ZeRO layout, and (automatic axes) on the packed and bucketed
paths.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

import eqopt

ROOT = Path(__file__).parent.parent

COMMON = """
import sys, time
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

sys.path.insert(0, {tests!r})
jax.config.update("jax_numpy_rank_promotion", "raise")
import eqopt
assert len(jax.devices()) == 8
failures = []


def close(label, ours, reference, rtol=1e-6):
    flat, treedef = jax.tree_util.tree_flatten_with_path(eqx.filter(ours, eqx.is_array))
    theirs = treedef.flatten_up_to(eqx.filter(reference, eqx.is_array))
    for (path, a), b in zip(flat, theirs, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = max(float(np.max(np.abs(b), initial=0.0)), 1e-30)
        if float(np.max(np.abs(a - b), initial=0.0)) > rtol * scale:
            failures.append(f"{{label}}: differs at {{jax.tree_util.keystr(path)}}")


def laid_out(label, tree, shardings):
    # Every array of `tree` is on the sharding at its place in `shardings`.
    def check(path, sharding, x):
        if sharding is not None and eqx.is_array(x):
            if not x.sharding.is_equivalent_to(sharding, x.ndim):
                failures.append(f"{{label}} {{jax.tree_util.keystr(path)}}: {{x.sharding}}, expected {{sharding.spec}}")
    jax.tree_util.tree_map_with_path(check, shardings, tree, is_leaf=lambda x: x is None)


def split_count(state):
    return sum(
        "b" in str(x.sharding.spec) or "data" in str(x.sharding.spec)
        for x in jax.tree.leaves(state) if eqx.is_array(x) and hasattr(x.sharding, "spec")
    )
"""

REGISTRY = """
from helpers import make_model, random_grads
from registry import ALL_CASES, build

# Cases also run jitted, initialised straight into the ZeRO layout, packed and
# bucketed: one per kind of state.
REPRESENTATIVE = {{
    "multi_steps-3", "inject_hyperparams-adam", "partition-labels",
    "adafactor-factored", "lbfgs", "contrib.muon",
}}
# ...of which these also on the packed and bucketed paths (on explicit axes
# the split update buffer is gathered before it is cut into leaves).
PACKED = {{"inject_hyperparams-adam", "multi_steps-3"}}
assert REPRESENTATIVE <= {{case.name for case in ALL_CASES}}
meshes = {{
    kind: jax.make_mesh((2, 4), ("a", "b"), axis_types=(kind,) * 2)
    for kind in (AxisType.Auto, AxisType.Explicit)
    if kind.name == {kind!r}
}}
counts = {{"cases": 0, "split": 0, "compared": 0, "jitted": 0}}
start = time.perf_counter()
import os
only = os.environ.get("ZERO_ONLY")
# Explicit axes (a layout that does not fit is an error there) run every case
# whose update is not element-wise and every third element-wise one (the same
# code on other numbers); automatic axes, where XLA reconciles layouts itself,
# every fourth; both the representative ones. EQOPT_ZERO_FULL=1 runs every case.
full = os.environ.get("EQOPT_ZERO_FULL")
every = 1 if full else 3 if {kind!r} == "Explicit" else 4
for index, case in enumerate(ALL_CASES):
    if only and case.name not in only.split(","):
        continue
    plain = make_model()
    tx = build(case.make, plain)
    thinned = index % every and case.name not in REPRESENTATIVE
    if thinned and ({kind!r} == "Auto" or tx.elementwise):
        continue
    grads = random_grads(plain, 0)
    extra = {{}} if case.extra_args is None else case.extra_args(plain, grads)
    reference = None if case.random else tx.update(grads, tx.init(plain), plain, **extra)[0]
    representative = case.name in REPRESENTATIVE
    counts["cases"] += 1
    for kind, mesh in meshes.items():
        label = f"{{kind.name}} {{case.name}}"
        with jax.set_mesh(mesh):
            model = eqx.filter_shard(plain, NamedSharding(mesh, P()))
            mesh_grads = eqx.filter_shard(grads, NamedSharding(mesh, P()))
            extra = {{}} if case.extra_args is None else case.extra_args(model, mesh_grads)
            try:
                plan = eqopt.zero_plan(tx, model, mesh, "b", min_size=0)
                state = plan.shard(tx.init(model))
                laid_out(f"{{label}} init", state, plan.state_shardings)
                counts["split"] += split_count(state) > 0
                updates, state = plan.update(tx, mesh_grads, state, model, **extra)
            except Exception as error:
                failures.append(f"{{label}}: {{type(error).__name__}}: {{error}}")
                continue
            laid_out(f"{{label}} state", state, plan.state_shardings)
            laid_out(f"{{label}} updates", updates, plan.param_shardings)
            if reference is not None:
                counts["compared"] += 1
                close(label, updates, reference)
            if not representative:
                continue
            # Jitted, initialised straight into the ZeRO layout, two steps.
            step = eqx.filter_jit(plan.update)
            try:
                state = plan.init(tx, model)
                laid_out(f"{{label}} direct init", state, plan.state_shardings)
                for _ in range(2):
                    updates, state = step(tx, mesh_grads, state, model, **extra)
                    model = eqopt.apply_updates(model, updates)
                laid_out(f"{{label}} jitted params", eqx.filter(model, eqx.is_inexact_array), plan.param_shardings)
                laid_out(f"{{label}} jitted state", state, plan.state_shardings)
                counts["jitted"] += 1
                if reference is not None:
                    unsharded, state0 = plain, tx.init(plain)
                    for _ in range(2):
                        u, state0 = tx.update(grads, state0, unsharded, **extra)
                        unsharded = eqopt.apply_updates(unsharded, u)
                    close(f"{{label}} jitted", model, unsharded)
                if case.name not in PACKED:
                    continue
                # Packed params, and bucketed state, split over the data axis.
                packed = eqopt.pack(eqx.filter_shard(plain, NamedSharding(mesh, P())))
                packed_grads = eqopt.Packed.like(packed, mesh_grads)
                packed_plan = eqopt.zero_plan(tx, packed, mesh, "b", min_size=0)
                packed_state = packed_plan.init(tx, packed)
                assert split_count(packed_state) > 0, "packed state not split"
                packed_updates, packed_state = eqx.filter_jit(packed_plan.update)(tx, packed_grads, packed_state, packed, **extra)
                laid_out(f"{{label}} packed state", packed_state, packed_plan.state_shardings)
                bucketed = eqopt.bucketed(tx, always=True)
                model = eqx.filter_shard(plain, NamedSharding(mesh, P()))
                bucketed_plan = eqopt.zero_plan(bucketed, model, mesh, "b", min_size=0)
                bucketed_state = bucketed_plan.init(bucketed, model)
                assert split_count(bucketed_state) > 0, "bucketed state not split"
                bucketed_updates, bucketed_state = eqx.filter_jit(bucketed_plan.update)(bucketed, mesh_grads, bucketed_state, model, **extra)
                laid_out(f"{{label}} bucketed state", bucketed_state, bucketed_plan.state_shardings)
                laid_out(f"{{label}} bucketed updates", bucketed_updates, bucketed_plan.param_shardings)
                if reference is not None:
                    close(f"{{label}} packed", packed_updates.unpack(), reference)
                    close(f"{{label}} bucketed", bucketed_updates, reference)
            except Exception as error:
                failures.append(f"{{label}} jitted: {{type(error).__name__}}: {{error}}")
import resource
cpu = resource.getrusage(resource.RUSAGE_SELF)
print(counts, "in", round(time.perf_counter() - start), "s; cpu", round(cpu.ru_utime + cpu.ru_stime), "s")
assert not failures, "\\n".join(failures[:40])
if not only:
    assert counts["cases"] >= len(ALL_CASES) // every, counts
    assert counts["compared"] > 150 // every and counts["split"] > 150 // every, counts
    assert counts["jitted"] == len(REPRESENTATIVE), counts
print("ok")
"""

CHECKPOINT = """
import contextlib, pathlib, tempfile
import orbax.checkpoint as ocp

model = eqx.nn.MLP(16, 8, 32, 2, key=jax.random.key(0))
opt = eqopt.adamw(1e-2, weight_decay=1e-3)
x = jax.random.normal(jax.random.key(1), (32, 16))
y = jnp.tanh(x[:, :8])


def loss_fn(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def replicate(tree, mesh):
    arrays, static = eqx.partition(tree, eqx.is_array)
    return eqx.combine(jax.device_put(arrays, NamedSharding(mesh, P())), static)


def train(plan, model, state, steps=3):
    @eqx.filter_jit
    def step(model, state):
        grads = eqx.filter_grad(loss_fn)(model, x, y)
        if plan is None:
            updates, state = opt.update(grads, state, model)
        else:
            updates, state = plan.update(opt, grads, state, model)
        return eqopt.apply_updates(model, updates), state

    for _ in range(steps):
        model, state = step(model, state)
    return model, state


def on_host(tree):
    return jax.tree.map(np.asarray, eqx.filter(tree, eqx.is_array))


mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
model = replicate(model, mesh)
plan = eqopt.zero_plan(opt, model, mesh, "data", min_size=0)
state = plan.init(opt, model)
model, state = train(plan, model, state)
laid_out("saved", state, plan.state_shardings)
assert "data" in str(state[0].mu.layers[1].weight.sharding.spec)
directory = pathlib.Path(tempfile.mkdtemp())
checkpointer = ocp.StandardCheckpointer()
checkpointer.save(directory / "model", eqx.filter(model, eqx.is_array))
checkpointer.save(directory / "state", state)
checkpointer.wait_until_finished()
reference = on_host(train(plan, model, state)[0])

targets = {{
    "4 devices": jax.make_mesh((4,), ("data",), devices=jax.devices()[:4], axis_types=(AxisType.Auto,)),
    "2-D": jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2),
    "replicated": None,
}}
for name, target in targets.items():
    fresh = eqx.nn.MLP(16, 8, 32, 2, key=jax.random.key(1))
    if target is None:
        restored_plan = None
        abstract = eqx.filter_eval_shape(opt.init, fresh)
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), abstract)
    else:
        fresh = replicate(fresh, target)
        restored_plan = eqopt.zero_plan(opt, fresh, target, "data", min_size=0)
        abstract = restored_plan.abstract_state
    arrays = eqx.filter(fresh, eqx.is_array)
    arrays = checkpointer.restore(directory / "model", jax.tree.map(ocp.utils.to_shape_dtype_struct, arrays))
    restored_model = eqx.combine(arrays, fresh)
    restored_state = checkpointer.restore(directory / "state", abstract)
    if restored_plan is not None:
        laid_out(f"{{name}} restored", restored_state, restored_plan.state_shardings)
        assert split_count(restored_state) > 0, name
    with jax.set_mesh(target) if target is not None else contextlib.nullcontext():
        continued = train(restored_plan, restored_model, restored_state)[0]
    close(f"continued on {{name}}", on_host(continued), reference)
    print(name, "continues like the uninterrupted run")
assert not failures, "\\n".join(failures)
print("ok")
"""
QUANTIZED = """
# Adam with 8-bit moments (4-bit on a 2-D mesh with explicit axes): the codes
# and scales of each quantised moment are split over the data axis (their
# block counts divide), and two jitted steps on fixed gradients give the
# unsharded updates and moments.
model = eqx.filter(eqx.nn.MLP(64, 64, 128, 2, key=jax.random.key(0)), eqx.is_array)
grads = [
    jax.tree.map(lambda p, k=k: jax.random.normal(jax.random.key(k), p.shape) * 1e-2, model)
    for k in range(2)
]
for name, bits, mesh in [
    ("8-bit", 8, jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))),
    ("4-bit", 4, jax.make_mesh((2, 4), ("model", "data"), axis_types=(AxisType.Explicit,) * 2)),
]:
    # 8-bit pinned to nearest: stochastic rounding (the default) hashes a
    # value's float bits, and a last bit that the sharded program computes
    # otherwise moves a code by one step.
    fmt = eqopt.Quantized(bits, rounding="nearest" if bits == 8 else None)
    opt = eqopt.adam(1e-2, mu_dtype=fmt, nu_dtype=fmt)
    state0 = opt.init(model)
    expected = []
    for g in grads:
        u, state0 = opt.update(g, state0, model)
        expected.append(u)
    with jax.set_mesh(mesh):
        replicated = NamedSharding(mesh, P())
        params = jax.device_put(model, replicated)
        plan = eqopt.zero_plan(opt, params, mesh, "data", min_size=0)
        state = plan.init(opt, params)
        mu = state[0].mu.layers[0].weight
        assert isinstance(mu, eqopt.QuantizedArray), type(mu)
        for leaf in (mu.codes, mu.scales, state[0].nu.layers[1].weight.codes):
            if "data" not in str(leaf.sharding.spec):
                failures.append(f"{{name}}: {{leaf.shape}} not split: {{leaf.sharding.spec}}")
        laid_out(f"{{name}} init", state, plan.state_shardings)
        step = eqx.filter_jit(plan.update)
        for k, g in enumerate(grads):
            updates, state = step(opt, jax.device_put(g, replicated), state, params)
            laid_out(f"{{name}} updates", updates, plan.param_shardings)
            close(f"{{name}} step {{k}}", updates, expected[k])
        laid_out(f"{{name}} state", state, plan.state_shardings)
        close(f"{{name}} mu", eqopt.tree.get(state, "mu"), eqopt.tree.get(state0, "mu"))
        close(f"{{name}} nu", eqopt.tree.get(state, "nu"), eqopt.tree.get(state0, "nu"))
        assert list(plan.unsplit) == [".states[0].count"], plan.unsplit
        print(name, "split and stepped like the unsharded state")
        # Packed: each buffer's moment is one quantised array, split over its
        # blocks where their number divides (32768 weights: 128 blocks of 256,
        # 256 of 128), as a leaf's are.
        unbiased = eqx.filter(eqx.nn.MLP(64, 64, 128, 2, use_bias=False, use_final_bias=False, key=jax.random.key(0)), eqx.is_array)
        packed0 = eqopt.pack(unbiased)
        packed_state0 = opt.init(packed0)
        packed_grads = [
            jax.tree.map(lambda p, k=k: jax.random.normal(jax.random.key(k), p.shape) * 1e-2, unbiased)
            for k in range(2)
        ]
        packed_expected = []
        for g in packed_grads:
            u, packed_state0 = opt.update(eqopt.Packed.like(packed0, g), packed_state0, packed0)
            packed_expected.append(u.unpack())
        packed = eqopt.pack(jax.device_put(unbiased, replicated))
        (moment,) = packed_state0[0].mu.buffers
        assert isinstance(moment, eqopt.QuantizedArray) and moment.shape == packed.buffers[0].shape
        plan = eqopt.zero_plan(opt, packed, mesh, "data", min_size=0)
        state = plan.init(opt, packed)
        codes = state[0].mu.buffers[0].codes
        if "data" not in str(codes.sharding.spec):
            failures.append(f"{{name}} packed: codes not split: {{codes.sharding.spec}}")
        laid_out(f"{{name}} packed init", state, plan.state_shardings)
        step = eqx.filter_jit(plan.update)
        for k, g in enumerate(packed_grads):
            g = eqopt.Packed.like(packed, jax.device_put(g, replicated))
            updates, state = step(opt, g, state, packed)
            close(f"{{name}} packed step {{k}}", updates.unpack(), packed_expected[k])
        laid_out(f"{{name}} packed state", state, plan.state_shardings)
        print(name, "packed: split and stepped like the unsharded packed state")
assert not failures, "\\n".join(failures)
print("ok")
"""


def test_rule_on_an_abstract_state():
    """The rule, on shapes alone: the first unsharded dimension that divides."""
    mesh = AbstractMesh((2, 4), ("model", "data"), axis_types=(AxisType.Auto,) * 2)

    def leaf(shape, spec=None):
        sharding = None if spec is None else NamedSharding(mesh, spec)
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)

    state = {
        "rows": leaf((8, 4096)),
        "columns": leaf((6, 1000)),
        "on_top": leaf((4096, 8), P(None, "model")),
        "already": leaf((4096,), P("data")),
        "count": leaf(()),
        "small": leaf((12,)),
        "odd": leaf((1030,)),
        "not_an_array": None,
    }
    specs = jax.tree.map(lambda s: s.spec, eqopt.zero_shardings(state, mesh))
    assert specs == {
        "rows": P("data", None),
        "columns": P(None, "data"),
        "on_top": P("data", "model"),
        "already": P("data"),
        "count": P(),
        "small": P(None),
        "odd": P(None),
        "not_an_array": None,
    }
    assert eqopt.zero_unsplit(state, mesh) == {
        "['count']": "a scalar",
        "['odd']": "no unsharded dimension of (1030,) divisible by 4",
        "['small']": "12 elements, fewer than min_size=1024",
    }
    assert "['small']" not in eqopt.zero_unsplit(state, mesh, min_size=0)
    both = eqopt.zero_shardings(state, mesh, ("model", "data"))
    assert both["rows"].spec == P(("model", "data"), None)
    with pytest.raises(ValueError, match="no axis 'batch'"):
        eqopt.zero_shardings(state, mesh, "batch")


def test_quantized_moments_split_over_blocks():
    """A quantised moment's codes and scales split together over their blocks,
    never across a block's width (explicit axes cannot read such codes back)."""
    mesh = AbstractMesh((4,), ("data",), axis_types=(AxisType.Auto,))
    fmt = eqopt.Quantized(8, block_size=8, min_size=0)
    opt = eqopt.adam(1e-3, mu_dtype=fmt, nu_dtype=fmt)
    params = {"two_blocks": jnp.ones((2, 8)), "eight_blocks": jnp.ones((8, 8))}
    state = eqx.filter_eval_shape(opt.init, params)
    shardings = eqopt.zero_shardings(state, mesh, min_size=0)
    for moment in (shardings[0].mu, shardings[0].nu):
        assert moment["eight_blocks"].codes.spec == P("data", None)
        assert moment["eight_blocks"].scales.spec == P("data")
        assert moment["two_blocks"].codes.spec == P(None, None)
        assert moment["two_blocks"].scales.spec == P(None)
    unsplit = eqopt.zero_unsplit(state, mesh, min_size=0)
    assert unsplit[".states[0].mu['two_blocks'].codes"] == (
        "2 blocks of codes, not divisible by 4 "
        "(`eqopt.zero_plan` and `eqopt.shard_state` pad them)"
    )
    assert ".states[0].nu['eight_blocks'].codes" not in unsplit
    assert eqopt.zero_unsplit(state, mesh)[".states[0].mu['eight_blocks'].scales"] == (
        "64 elements, fewer than min_size=1024"
    )


def run_script(script: str, *, devices: int = 8, timeout: int = 600, **values) -> str:
    env = dict(os.environ)
    # Eager steps compile many small programs: skip XLA's backend optimisations.
    # On a loaded 2-core machine one simulated device's thread can be starved for
    # longer than XLA's 40 s collective deadline (an abort, seen once under
    # `pytest -n 2`): allow 10 minutes, within the script's own timeout.
    env["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={devices} "
        "--xla_backend_optimization_level=0 "
        "--xla_cpu_collective_call_terminate_timeout_seconds=600"
    )
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    code = textwrap.dedent(COMMON + script).format(tests=str(ROOT / "tests"), **values)
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "ok" in result.stdout.split(), result.stdout
    return result.stdout


@pytest.mark.parametrize("kind", ["Auto", "Explicit"])
def test_every_registry_case_under_zero(kind):
    print(run_script(REGISTRY, kind=kind, timeout=1500))


def test_checkpoint_restores_onto_other_meshes():
    """A ZeRO-1 state saved with Orbax on 8 devices, restored onto 4 devices, a
    2-D mesh and one device, trains on like the uninterrupted run."""
    pytest.importorskip("orbax.checkpoint")
    print(run_script(CHECKPOINT, timeout=300))


def test_quantized_moments_split_and_step():
    """8-bit and 4-bit Adam under ZeRO-1: codes and scales split over the data
    axis (automatic and explicit axes), two jitted steps equal the unsharded ones."""
    print(run_script(QUANTIZED, timeout=300))
