"""Optimiser state keeps the sharding of the parameters it was built from.

Runs in a subprocess with 8 simulated CPU devices (the device count is fixed
when JAX starts), over every registry entry, on a mesh with automatic axes (on
the per-leaf, the packed and the bucketed path) and on one with explicit axes
(`jax.sharding.AxisType.Explicit`, the default of `jax.make_mesh`), where JAX
refuses operations whose output sharding is ambiguous.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import sys
    import time
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    sys.path.insert(0, {tests!r})
    jax.config.update("jax_numpy_rank_promotion", "raise")
    import eqopt
    from helpers import make_model, random_grads
    from registry import ALL_CASES, build

    assert len(jax.devices()) == 8
    auto_mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    explicit_mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
    # Cases checked further: a step on automatic axes, and the packed path on
    # explicit axes (one or two per kind of computation; the others run the
    # same code on other numbers).
    REPRESENTATIVE = {{
        "adamw-mask-tree-schedule", "multi_steps-3", "apply_if_finite-adam",
        "adaptive_grad_clip", "conditionally_mask-adam", "contrib.galore",
        "contrib.muon", "flatten-adam", "scale_by_lbfgs", "lbfgs",
        "scale_by_zoom_linesearch", "clip_by_global_norm", "lamb",
        "adafactor-factored", "sm3-tensors", "contrib.schedule_free_adamw",
        "contrib.sam", "partition-labels", "noisy_sgd",
    }}
    assert REPRESENTATIVE <= {{case.name for case in ALL_CASES}}

    failures = []
    checked = {{"auto": 0, "packed": 0, "bucketed": 0, "explicit": 0, "compared": 0}}

    def shard(tree, sharding):
        return eqx.tree_at(lambda m: m.w, tree, jax.device_put(tree.w, sharding))

    def check_state(kind, label, state, sharding, shape=(4, 3)):
        # Leaves shaped like the parameter, and stacks of them (L-BFGS's
        # memory), are sharded like the parameter.
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
            if not eqx.is_inexact_array(leaf) or leaf.shape[-len(shape):] != shape:
                continue
            checked[kind] += 1
            expected = sharding
            if leaf.ndim > len(shape):
                spec = P(*[None] * (leaf.ndim - len(shape)), *sharding.spec)
                expected = sharding.update(spec=spec)
            # (Where a leaf lives, device or host memory, is `eqopt.offload`'s
            # and test_offload.py's: the layout is the same.)
            actual = leaf.sharding.with_memory_kind("device")
            if not actual.is_equivalent_to(expected, leaf.ndim):
                failures.append(f"{{label}} {{jax.tree_util.keystr(path)}}: {{leaf.sharding}}")

    def compare(label, updates, reference):
        checked["compared"] += 1
        flat, treedef = jax.tree_util.tree_flatten_with_path(updates)
        for (path, a), b in zip(flat, treedef.flatten_up_to(reference), strict=True):
            # (The reference on the host: a state made by a jitted `init`, as
            # `eqopt.offload`'s, is committed to one device, outside the mesh.)
            if not jnp.allclose(a, jax.device_get(b), rtol=1e-5, atol=1e-6):
                failures.append(f"{{label}}: differs from the unsharded step at {{jax.tree_util.keystr(path)}}")

    start = time.perf_counter()
    for index, case in enumerate(ALL_CASES):
        plain = make_model()
        tx = build(case.make, plain)
        grads = random_grads(plain, 0)
        reference = None
        if not case.random:
            extra = {{}} if case.extra_args is None else case.extra_args(plain, grads)
            reference, _ = tx.update(grads, tx.init(plain), plain, **extra)
        representative = case.name in REPRESENTATIVE

        # Automatic axes: the state is laid out like the params, on the
        # per-leaf and the packed path.
        row = NamedSharding(auto_mesh, P("a", None))
        model = shard(plain, row)
        state = tx.init(model)
        check_state("auto", f"auto {{case.name}}", state, row)
        # Packed: the sharded leaf has a buffer of its own, and state buffers of
        # that size follow that buffer's sharding.
        packed = eqopt.pack(model)
        assert len(packed.buffers) == 2, [b.shape for b in packed.buffers]
        sharded = next(b for b in packed.buffers if b.shape == (12,))
        check_state("packed", f"packed {{case.name}}", tx.init(packed), sharded.sharding, (12,))
        if representative:
            extra = {{}} if case.extra_args is None else case.extra_args(model, grads)
            if reference is not None:
                compare(f"auto {{case.name}}", tx.update(grads, state, model, **extra)[0], reference)
            # Bucketed: the params stay as they are; the state's buffers are
            # grouped by sharding as packed params are.
            bucketed = eqopt.bucketed(tx, always=True)
            bucketed_state = bucketed.init(model)
            check_state("bucketed", f"bucketed {{case.name}}", bucketed_state, sharded.sharding, (12,))
            if reference is not None:
                updates, _ = bucketed.update(grads, bucketed_state, model, **extra)
                compare(f"auto bucketed {{case.name}}", eqx.filter(updates, eqx.is_inexact_array), reference)

        # Explicit axes: gradients come sharded like the params (as from
        # `jax.grad`); the update and the state keep that sharding, and the
        # update is the unsharded one. Every case whose update is not
        # element-wise, every third element-wise one (the same code on other
        # numbers).
        if index % 3 and not representative and tx.elementwise:
            continue
        row = NamedSharding(explicit_mesh, P("a", None))
        with jax.set_mesh(explicit_mesh):
            model, sharded_grads = shard(plain, row), shard(grads, row)
            extra = {{}} if case.extra_args is None else case.extra_args(model, sharded_grads)
            state = tx.init(model)
            check_state("explicit", f"explicit {{case.name}} init", state, row)
            try:
                updates, state = tx.update(sharded_grads, state, model, **extra)
            except Exception as error:
                failures.append(f"explicit {{case.name}}: {{type(error).__name__}}: {{error}}")
                continue
            check_state("explicit", f"explicit {{case.name}} update", state, row)
            check_state("explicit", f"explicit {{case.name}} updates", updates, row)
            if reference is not None:
                compare(f"explicit {{case.name}}", updates, reference)
            if representative:
                packed = eqopt.pack(model)
                sharding = next(b for b in packed.buffers if b.shape == (12,)).sharding
                packed_grads = eqopt.Packed.like(packed, sharded_grads)
                state = tx.init(packed)
                try:
                    updates, state = tx.update(packed_grads, state, packed, **extra)
                except Exception as error:
                    failures.append(f"explicit packed {{case.name}}: {{type(error).__name__}}: {{error}}")
                    continue
                check_state("packed", f"explicit packed {{case.name}}", (updates, state), sharding, (12,))
                if reference is not None:
                    unpacked = eqx.filter(updates.unpack(), eqx.is_inexact_array)
                    compare(f"explicit packed {{case.name}}", unpacked, reference)
                bucketed = eqopt.bucketed(tx, always=True)
                try:
                    updates, state = bucketed.update(sharded_grads, bucketed.init(model), model, **extra)
                except Exception as error:
                    failures.append(f"explicit bucketed {{case.name}}: {{type(error).__name__}}: {{error}}")
                    continue
                check_state("bucketed", f"explicit bucketed {{case.name}}", state, sharding, (12,))
                check_state("bucketed", f"explicit bucketed {{case.name}} updates", updates, row)
                if reference is not None:
                    compare(f"explicit bucketed {{case.name}}", eqx.filter(updates, eqx.is_inexact_array), reference)
    print("checked", checked, "in", round(time.perf_counter() - start), "s")
    assert checked["auto"] > 300 and checked["packed"] > 300, checked
    assert checked["bucketed"] > 40, checked
    assert checked["explicit"] > 600 and checked["compared"] > 250, checked
    assert not failures, "\\n".join(failures)
    print("ok")
    """
)


def test_state_keeps_parameter_sharding():
    tests = str(Path(__file__).parent)
    env = dict(os.environ)
    # Eager steps compile many small programs: skip XLA's backend optimisations.
    env["XLA_FLAGS"] = (
        "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
        "--xla_cpu_collective_call_terminate_timeout_seconds=600"
    )
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tests=tests)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(Path(__file__).parent.parent),
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "ok" in result.stdout


def test_helpers_add_nothing_without_explicit_axes():
    """On arrays without explicit axes the helpers trace to the plain operations."""
    import jax
    import jax.numpy as jnp

    from eqopt import _sharding

    highest = jax.lax.Precision.HIGHEST
    pairs = [
        (lambda x: _sharding.inner(x, x), lambda x: jnp.vdot(x, x, precision=highest)),
        (_sharding.zeros_like, jnp.zeros_like),
        (
            lambda x: _sharding.zeros_like(x, jnp.bfloat16),
            lambda x: jnp.zeros_like(x, jnp.bfloat16),
        ),
        (
            lambda x: _sharding.zeros(jax.ShapeDtypeStruct(x.shape, x.dtype)),
            lambda x: jnp.zeros(x.shape, x.dtype),
        ),
        (
            lambda x: _sharding.stacked_zeros(2, x),
            lambda x: jnp.zeros((2, *x.shape), x.dtype),
        ),
        (
            lambda x: _sharding.where(x[:1] > 0, x, -x),
            lambda x: jnp.where(x[:1] > 0, x, -x),
        ),
        (lambda x: _sharding.replicated_matmul(x.T, x), lambda x: x.T @ x),
        (lambda x: _sharding.like(2 * x, x), lambda x: 2 * x),
        (lambda x: _sharding.gathered(x)[1](_sharding.gathered(x)[0]), lambda x: x),
    ]
    x = jnp.arange(12.0).reshape(4, 3)
    for helper, plain in pairs:
        assert str(jax.make_jaxpr(helper)(x)) == str(jax.make_jaxpr(plain)(x))
        assert str(jax.make_jaxpr(jax.jit(helper))(x)) == str(
            jax.make_jaxpr(jax.jit(plain))(x)
        )
