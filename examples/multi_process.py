"""Training across several processes: one `jax.distributed` job, ZeRO-1 Adam.

Every process runs this same script. They form one JAX job through a
coordinator, and JAX sees the devices of all of them as one list: a mesh over
those devices spans the processes, and a jitted step runs on all of them at
once (on CPU, JAX's collectives go through gloo). The model is replicated for
data parallelism, each batch is split over the `data` axis, and Adam's state is
split over it too (ZeRO-1, [`eqopt.zero_plan`][]): each device keeps 1/8 of the
two moments, built there directly, never whole.

Which process this is comes from the environment, so the same command runs on
one machine or on several:

    EQOPT_COORDINATOR   host:port of process 0 (default 127.0.0.1:12355)
    EQOPT_NUM_PROCESSES how many processes (default 1: no coordinator)
    EQOPT_PROCESS_ID    this process's index, 0 to EQOPT_NUM_PROCESSES - 1

On one machine, `--spawn 2` starts the two processes itself (on a free port),
each with 4 simulated CPU devices, and prints what each printed:

    python examples/multi_process.py --spawn 2       # two processes, 8 devices
    python examples/multi_process.py                 # one process, 8 devices
    python examples/multi_process.py --spawn 2 --short   # the quick run the tests use

On two hosts with 4 devices each:

    EQOPT_COORDINATOR=host0:12355 EQOPT_NUM_PROCESSES=2 EQOPT_PROCESS_ID=0 python examples/multi_process.py --local-devices 4
    EQOPT_COORDINATOR=host0:12355 EQOPT_NUM_PROCESSES=2 EQOPT_PROCESS_ID=1 python examples/multi_process.py --local-devices 4

Each process prints its losses, its device count, how much of Adam's state its
devices hold, and a checksum of the trained parameters: every process ends with
the same parameters, and they are those of the one-process run on 8 devices.
"""

import argparse
import os
import socket
import subprocess
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--short", action="store_true", help="a quick run (20 steps)")
    parser.add_argument(
        "--local-devices",
        type=int,
        default=None,
        help="simulated CPU devices in this process (default: 8 / processes)",
    )
    parser.add_argument(
        "--spawn", type=int, default=0, help="start this many local processes"
    )
    parser.add_argument("--save", default=None, help="save the trained params (.npz)")
    parser.add_argument("--out", default=None, help="unused (the gallery's plot flag)")
    args = parser.parse_args()
    if args.short:
        args.steps = 20
    return args


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(args) -> int:
    """Runs `args.spawn` copies of this script as one job; returns their exit status."""
    port = free_port()
    command = [sys.executable, __file__, "--steps", str(args.steps)]
    command += ["--local-devices", str(8 // args.spawn)]
    processes = []
    try:
        for index in range(args.spawn):
            env = dict(
                os.environ,
                EQOPT_COORDINATOR=f"127.0.0.1:{port}",
                EQOPT_NUM_PROCESSES=str(args.spawn),
                EQOPT_PROCESS_ID=str(index),
            )
            extra = ["--save", args.save] if args.save and index == 0 else []
            processes.append(
                subprocess.Popen(
                    command + extra,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        outputs = [process.communicate(timeout=300)[0] for process in processes]
    finally:
        for process in processes:  # a failed or hung peer does not outlive us
            if process.poll() is None:
                process.kill()
                process.wait()
    for index, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        print(f"--- process {index} (exit {process.returncode}) ---")
        print(output.rstrip())
    return max(process.returncode for process in processes)


def main(args):
    num_processes = int(os.environ.get("EQOPT_NUM_PROCESSES", "1"))
    local = args.local_devices or 8 // num_processes
    # Before JAX starts: simulate `local` CPU devices (keep any other flags).
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={local}"
    )

    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import eqopt

    if num_processes > 1:
        jax.distributed.initialize(
            coordinator_address=os.environ.get("EQOPT_COORDINATOR", "127.0.0.1:12355"),
            num_processes=num_processes,
            process_id=int(os.environ["EQOPT_PROCESS_ID"]),
        )
    start = time.perf_counter()
    rank = jax.process_index()
    print(
        f"process {rank} of {jax.process_count()}: {jax.local_device_count()} local "
        f"devices, {jax.device_count()} in the job"
    )
    mesh = jax.make_mesh((jax.device_count(),), ("data",))

    def global_array(value, sharding):
        # Every process holds the same host value and gives JAX its own devices' parts.
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, sharding, lambda i: value[i])

    replicated = NamedSharding(mesh, P())
    by_example = NamedSharding(mesh, P("data"))
    model = eqx.nn.MLP(32, 8, 64, 2, activation=jnp.tanh, key=jax.random.key(0))
    arrays, static = eqx.partition(model, eqx.is_array)
    model = eqx.combine(
        jax.tree.map(lambda a: global_array(a, replicated), arrays), static
    )

    opt = eqopt.adam(1e-2)
    plan = eqopt.zero_plan(opt, model, mesh, axis="data")
    state = plan.init(opt, model)  # each device builds its own eighth
    print(
        "left whole:",
        ", ".join(f"{path} ({why})" for path, why in plan.unsplit.items()),
    )
    mu = state[0].mu.layers[0].weight
    print(
        f"mu of layers[0].weight {mu.shape}: {mu.sharding.spec}, "
        f"{mu.addressable_shards[0].data.shape} on each device"
    )
    local_bytes = sum(
        shard.data.nbytes
        for leaf in jax.tree.leaves(eqx.filter(state, eqx.is_array))
        for shard in leaf.addressable_shards
    )
    whole = sum(
        leaf.nbytes for leaf in jax.tree.leaves(eqx.filter(state, eqx.is_array))
    )
    replicated_bytes = whole * jax.local_device_count()
    print(
        f"Adam state held by this process's devices: {local_bytes} bytes "
        f"({replicated_bytes} if replicated)"
    )

    def loss_fn(model, x, y):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    @eqx.filter_jit(donate="all-except-first")
    def step(opt, model, state, x, y):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        updates, state = plan.update(opt, grads, state, model)
        return eqopt.apply_updates(model, updates), state, loss

    rng = np.random.default_rng(0)  # the same batches in every process
    target = rng.normal(size=(32, 8)) / np.sqrt(32)
    for i in range(args.steps):
        x = rng.normal(size=(64, 32)).astype(np.float32)
        y = np.tanh(x @ target).astype(np.float32)
        batch = global_array(x, by_example), global_array(y, by_example)
        model, state, loss = step(opt, model, state, *batch)
        if i % max(1, args.steps // 4) == 0 or i == args.steps - 1:
            print(f"step {i:4d}  loss {float(loss):.6f}")

    arrays = [
        np.asarray(leaf.addressable_data(0))
        for leaf in jax.tree.leaves(eqx.filter(model, eqx.is_array))
    ]
    kept = all(
        leaf.sharding.is_equivalent_to(replicated, leaf.ndim)
        for leaf in jax.tree.leaves(eqx.filter(model, eqx.is_array))
    )
    print(f"params still replicated: {kept}")
    print(f"params checksum: {sum(float(np.sum(a * a)) for a in arrays):.9f}")
    if args.save:
        np.savez(args.save, *arrays)
    print(f"done in {time.perf_counter() - start:.1f} s")
    if num_processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    arguments = parse_args()
    sys.exit(spawn(arguments) if arguments.spawn else main(arguments))
