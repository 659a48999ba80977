"""Optimiser state keeps the sharding of the parameters it was built from.

Runs in a subprocess with 8 simulated CPU devices (the device count is fixed
when JAX starts), over every registry entry, on both the per-leaf and the
packed path.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import sys
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    sys.path.insert(0, {tests!r})
    jax.config.update("jax_numpy_rank_promotion", "raise")
    import eqopt
    from helpers import make_model, random_grads
    from registry import ALL_CASES, build

    assert len(jax.devices()) == 8
    # Auto axes: sharding propagates through every operation (the default of
    # `jax.sharding.Mesh`; `jax.make_mesh` defaults to explicit axes in recent JAX).
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    row = NamedSharding(mesh, P("a", None))

    def shard(model):
        return eqx.tree_at(lambda m: m.w, model, jax.device_put(model.w, row))

    failures = []
    checked = 0
    for case in ALL_CASES:
        model = shard(make_model())
        tx = build(case.make, model)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tx.init(model))[0]:
            if eqx.is_inexact_array(leaf) and leaf.shape == (4, 3):
                checked += 1
                if not leaf.sharding.is_equivalent_to(row, 2):
                    failures.append(f"{{case.name}} {{jax.tree_util.keystr(path)}}: {{leaf.sharding}}")
        # Packed: the sharded leaf has a buffer of its own, and state buffers of
        # that size follow that buffer's sharding.
        packed = eqopt.pack(model)
        assert len(packed.buffers) == 2, [b.shape for b in packed.buffers]
        sharded = next(b for b in packed.buffers if b.shape == (12,))
        for path, leaf in jax.tree_util.tree_flatten_with_path(tx.init(packed))[0]:
            if eqx.is_inexact_array(leaf) and leaf.shape == (12,):
                checked += 1
                if not leaf.sharding.is_equivalent_to(sharded.sharding, 1):
                    failures.append(f"packed {{case.name}} {{jax.tree_util.keystr(path)}}: {{leaf.sharding}}")
        # One step on the sharded model matches the unsharded one.
        grads = random_grads(model, 0)
        extra = {{}} if case.extra_args is None else case.extra_args(model, grads)
        if not case.random:
            plain = make_model()
            updates, _ = tx.update(grads, tx.init(model), model, **extra)
            reference, _ = tx.update(grads, tx.init(plain), plain, **extra)
            if not jnp.allclose(updates.w, reference.w, rtol=1e-5, atol=1e-6):
                failures.append(f"{{case.name}}: sharded step differs")
    print("checked", checked)
    assert checked > 50, checked
    assert not failures, "\\n".join(failures)
    print("ok")
    """
)


def test_state_keeps_parameter_sharding():
    tests = str(Path(__file__).parent)
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
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
