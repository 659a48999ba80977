"""State in host memory (`eqopt.offload`) against state in device memory:
`python benchmarks/memory_bench.py --offload`.

On one device, for Adam with float32 and with 8-bit moments, this reports:

- **the optimiser step alone** (`update` and `apply_updates` on fixed
  gradients, params and state donated) on `step_bench.py`'s transformer-like
  tree: the state's bytes in device memory, from the device's
  `memory_stats()` (bytes in use with the state built, less without) where the
  backend keeps them, otherwise from the arrays' memory kinds; the bytes in
  host memory; and the step time, offloaded against on the device, with an
  A/A pair (on the device against itself) for the noise: the geometric mean
  over rounds of the ratio of medians, the variants alternating within each
  round;
- **the whole training step** (loss and gradient of `train_step_bench.py`'s
  decoder on the same tree, `update`, `apply_updates`): its time, as above,
  and off a CPU its peak device memory, from XLA's buffer assignment (the
  arguments in device memory plus the largest set of live temporaries, which
  hold the state while the step runs) and from the device's
  `peak_bytes_in_use` (measured first offloaded, then on the device: the
  peak only grows).

On a CPU the host and the device memory are the same RAM: the offloaded state
carries the `pinned_host` memory kind and the transfers compile to nothing,
so the time says what the policy costs in the program (nothing but noise is
expected), not what a host link costs.
"""

import json
import math
import os
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import step_bench
import train_step_bench

import eqopt

EIGHT = eqopt.Quantized(8)
OPTIMISERS = {
    "adam": lambda: eqopt.adam(1e-3),
    "adam-8bit": lambda: eqopt.adam(1e-3, mu_dtype=EIGHT, nu_dtype=EIGHT),
}
#: The variants, in the order they run within a round: on the device, the
#: same again (A/A), offloaded.
VARIANTS = ("device", "device-aa", "offload")


def placed_bytes(tree) -> tuple[int, int]:
    """The bytes of `tree`'s arrays on its first device, in device memory and in
    host memory (from each array's memory kind)."""
    device, host = 0, 0
    for leaf in jax.tree.leaves(eqx.filter(tree, eqx.is_array)):
        shard = leaf.addressable_shards[0]
        if leaf.sharding.memory_kind == "pinned_host":
            host += shard.data.nbytes
        else:
            device += shard.data.nbytes
    return device, host


def in_use() -> int | None:
    """The device's bytes in use, where the backend reports them."""
    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats["bytes_in_use"]


def built(opt, params):
    """`opt.init(params)` and the device bytes it took (`memory_stats` where
    the backend has it, else the memory kinds), and where that came from."""
    before = in_use()
    state = jax.block_until_ready(opt.init(params))
    after = in_use()
    if before is None or after is None:
        return state, placed_bytes(state)[0], "memory kinds"
    return state, after - before, "memory_stats"


def geometric_mean(values) -> float:
    return math.exp(statistics.fmean(map(math.log, values)))


def interleaved(steps: dict, carried: dict, args) -> dict[str, float]:
    """Each variant's time against the first's: the geometric mean over rounds
    of the ratio of medians, the variants alternating within each round."""

    def timed(name):
        step, carry = steps[name], carried[name]
        start = time.perf_counter()
        for _ in range(args.steps):
            carry = step(*carry)
        jax.block_until_ready(carry)
        carried[name] = carry
        return (time.perf_counter() - start) / args.steps

    for name in steps:  # compile, and again for the committed outputs' layout
        timed(name)
        timed(name)
    ratios: dict[str, list[float]] = {name: [] for name in steps}
    base = 0.0
    for round_ in range(args.rounds):
        samples: dict[str, list[float]] = {name: [] for name in steps}
        order = list(steps) if round_ % 2 == 0 else list(reversed(steps))
        for _ in range(args.reps):
            for name in order:
                samples[name].append(timed(name))
        base = statistics.median(samples[VARIANTS[0]])
        for name in steps:
            ratios[name].append(statistics.median(samples[name]) / base)
    result = {name: geometric_mean(values) for name, values in ratios.items()}
    result["ms"] = base * 1e3
    return result


def optimiser_step(name, params, grads, args) -> dict:
    row: dict = {"optimiser": name}
    steps, carried = {}, {}
    for variant in VARIANTS:
        inner = OPTIMISERS[name]()
        opt = eqopt.offload(inner) if variant == "offload" else inner

        def update(params, state, opt=opt):
            updates, state = opt.update(grads, state, params)
            return eqopt.apply_updates(params, updates), state

        state, device, source = built(opt, params)
        if variant != "device-aa":
            row[f"{variant} bytes"] = device
            row[f"{variant} host bytes"] = placed_bytes(state)[1]
            row["source"] = source
            steps[variant] = jax.jit(update, donate_argnums=(0, 1))
        else:  # the same program, on a state of its own
            steps[variant] = steps["device"]
        carried[variant] = (jax.tree.map(jnp.copy, params), state)
        del state
        if variant != "device-aa":
            row[f"{variant} program"] = program(steps[variant], carried[variant])
    if args.rounds:
        row["time"] = interleaved(steps, carried, args)
    else:
        for variant in VARIANTS:
            carried[variant] = steps[variant](*carried[variant])
    # As many steps each: the params and the state must be the same bits.
    row["bitwise"] = _bits(carried["device"]) == _bits(carried["offload"])
    return row


def program(step, args) -> dict:
    """What XLA compiled: its fused kernels, its transfers between memories
    (asynchronous copies) and its temporaries' bytes."""
    compiled = step.lower(*args).compile()
    text = compiled.as_text()
    return {
        "fusions": text.count(" fusion("),
        "transfers": text.count(" copy-start("),
        "temporaries": compiled.memory_analysis().temp_size_in_bytes,
    }


def _bits(tree) -> list[bytes]:
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


def zero_check(name, params, grads) -> bool:
    """A ZeRO-1 plan on a mesh of this one device, offloaded against on the
    device: two jitted steps, the same bits (the plan's constraints on state
    in host memory run where the backend compiles them)."""
    mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
    results = []
    for offloaded in (False, True):
        inner = OPTIMISERS[name]()
        opt = eqopt.offload(inner) if offloaded else inner
        plan = eqopt.zero_plan(opt, params, mesh, min_size=0)
        state = plan.init(opt, params)
        step = eqx.filter_jit(plan.update)
        for _ in range(2):
            updates, state = step(opt, grads, state, params)
        results.append((_bits((updates, state)), placed_bytes(state)))
    (device_bits, _), (offload_bits, (on_device, _)) = results
    return device_bits == offload_bits and on_device < results[0][1][0] / 10


def training_step(name, args, ts_args) -> dict:
    params, tokens, loss = train_step_bench.make_transformer(ts_args)
    params = jax.device_put(params, jax.devices()[0])
    row: dict = {"optimiser": name}
    steps, carried = {}, {}
    # Offloaded first: the device's peak only grows (on a GPU).
    for variant in ("offload", "device", "device-aa"):
        inner = OPTIMISERS[name]()
        opt = eqopt.offload(inner) if variant == "offload" else inner

        def step(params, state, opt=opt):
            grads = jax.grad(loss)(params, tokens)
            updates, state = opt.update(grads, state, params)
            return eqopt.apply_updates(params, updates), state

        copy = jax.tree.map(jnp.copy, params)
        state = opt.init(copy)
        if variant == "device-aa":  # the same program, on a state of its own
            steps[variant], carried[variant] = steps["device"], (copy, state)
            continue
        jitted = jax.jit(step, donate_argnums=(0, 1)).lower(copy, state).compile()
        analysis = jitted.memory_analysis()
        arguments = placed_bytes((copy, state))[0]
        row[f"{variant} peak"] = arguments + analysis.temp_size_in_bytes
        carry = (copy, state)
        for _ in range(2):
            carry = jax.block_until_ready(jitted(*carry))
        stats = jax.devices()[0].memory_stats()
        if stats:
            row[f"{variant} peak_bytes_in_use"] = stats["peak_bytes_in_use"]
        steps[variant], carried[variant] = jitted, carry
    if args.rounds:
        steps = {v: steps[v] for v in VARIANTS}
        row["time"] = interleaved(steps, {v: carried[v] for v in VARIANTS}, args)
    return row


def _mb(n) -> str:
    return f"{n / 2**20:.1f}MB"


def run(args) -> None:
    tree_args = [arg for flags in args.tree_args for arg in flags.split()]
    sizes = step_bench.parse_args((["--quick"] if args.quick else []) + tree_args)
    ts_args = train_step_bench.parse_args(
        [
            f"--tf-width={sizes.tf_width}",
            f"--tf-blocks={sizes.tf_blocks}",
            f"--tf-vocab={sizes.tf_vocab}",
            f"--tf-context={args.context}",
            f"--tf-batch={args.batch}",
        ]
    )
    device = jax.devices()[0]
    print(
        f"{device.platform} {device.device_kind}, jax {jax.__version__}; "
        f"{os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f})"
    )
    results: dict = {"optimiser step": [], "training step": []}
    ordered = args.offload_optimisers.split(",")
    # The whole step first: on a GPU the device's peak only grows.
    if args.training_step:
        print(
            f"whole training step: transformer, batch {args.batch}, context "
            f"{args.context}; peak device memory (off a CPU): arguments in device "
            "memory + temporaries (XLA), and peak_bytes_in_use"
        )
        for name in ordered:
            row = training_step(name, args, ts_args)
            results["training step"].append(row)
            parts = []
            if device.platform != "cpu":  # on a CPU the state is never copied
                parts.append(
                    f"peak {_mb(row['device peak'])} -> {_mb(row['offload peak'])}"
                )
            if "device peak_bytes_in_use" in row:
                parts.append(
                    f"peak_bytes_in_use {_mb(row['offload peak_bytes_in_use'])} "
                    f"offloaded, {_mb(row['device peak_bytes_in_use'])} after"
                )
            if "time" in row:
                t = row["time"]
                parts.append(
                    f"time offload/device {t['offload']:.2f} "
                    f"(A/A {t['device-aa']:.2f}, {t['ms']:.0f} ms)"
                )
            print(f"  {name:10} " + "; ".join(parts), flush=True)
    tree = step_bench.TREE_MAKERS["transformer"](sizes, jax.random.key(0))
    params = jax.device_put(tree, device)
    rng = np.random.default_rng(1)
    grads = jax.device_put(
        jax.tree.map(lambda x: rng.standard_normal(x.shape, np.float32) * 1e-3, tree),
        device,
    )
    count = sum(x.size for x in jax.tree.leaves(tree))
    print(
        f"optimiser step: transformer tree, {count / 1e6:.1f}M params; "
        "state in device memory, on the device -> offloaded"
    )
    print(
        f"  {'optimiser':10}{'device memory':>22}{'host memory':>13}"
        f"{'from':>14}{'time off/dev':>14}{'A/A':>6}{'ms':>8}"
    )
    for name in ordered:
        row = optimiser_step(name, params, grads, args)
        results["optimiser step"].append(row)
        timing = ""
        if "time" in row:
            t = row["time"]
            timing = f"{t['offload']:>14.2f}{t['device-aa']:>6.2f}{t['ms']:>8.1f}"
        print(
            f"  {name:10}{_mb(row['device bytes']):>11} -> "
            f"{_mb(row['offload bytes']):>8}{_mb(row['offload host bytes']):>13}"
            f"{row['source']:>14}{timing}",
            flush=True,
        )
    checks = {name: zero_check(name, params, grads) for name in ordered}
    results["zero check"] = checks
    print(
        "compiled step, on the device -> offloaded: "
        + "; ".join(
            f"{r['optimiser']} "
            + ", ".join(
                f"{key} {r['device program'][key]} -> {r['offload program'][key]}"
                for key in ("fusions", "transfers", "temporaries")
            )
            for r in results["optimiser step"]
        )
    )
    print(
        "bit for bit the on-device state after as many steps: "
        + ", ".join(
            f"{r['optimiser']} {r['bitwise']}" for r in results["optimiser step"]
        )
        + "; ZeRO-1 plan on a 1-device mesh, offloaded (bits, state on the host): "
        + ", ".join(f"{name} {ok}" for name, ok in checks.items())
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"jax": jax.__version__, "device": str(device), **results}, f)
