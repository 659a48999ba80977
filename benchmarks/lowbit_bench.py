"""Memory and step time of low-bit optimiser states against float32 Adam.

For Adam with float32, bfloat16, 8-bit and 4-bit moments ([`eqopt.Quantized`]),
on a ~4M-parameter MLP (`eqx.nn.MLP`, 10 leaves), this reports

- state bytes per parameter (codes and per-block scales included);
- the step time of `update` + `apply_updates` on fixed gradients (params and
  state donated), on the default path (the model as it is) and on the packed
  path ([`eqopt.pack`]), as a ratio to float32 Adam on the same path;
- a whole training step (loss, gradient, update, apply; `training_steps`) on
  the MLP and on one of as many parameters in 17 layers, per leaf and packed:
  XLA's peak memory (arguments and temporaries: what the state saves, less
  what the step's temporaries take back) and the step's time against float32
  Adam's;
- two reference kernels that are not optimisers (`KERNELS`), the floor under
  any 8-bit state on XLA CPU: the codes only read and written back, and Adam
  on linear 8-bit codes with a fixed scale (no block maximum).

The variants run interleaved in rounds (the order rotates every round), each
round timing every variant's median over a few timings of 5 steps run back to
back (`time_steps`: as a training loop runs them); the table gives the
geometric mean over rounds of each variant's ratio to float32 Adam's median in
the same round; the last column is each variant's packed step over its own
default step. `float32 (A/A)` is float32 Adam timed again as another
variant: its distance from 1.00 is the noise of the machine.

    python benchmarks/lowbit_bench.py              # about 4 minutes on 2 busy cores
    python benchmarks/lowbit_bench.py --quick      # smoke run
"""

import argparse
import json
import math
import os
import platform
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp

import eqopt

VARIANTS = {
    "float32": dict(),
    "float32 (A/A)": dict(),
    "bfloat16": dict(mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16),
    "8-bit": dict(mu_dtype=eqopt.Quantized(8), nu_dtype=eqopt.Quantized(8)),
    "8-bit linear": dict(
        mu_dtype=eqopt.Quantized(8, first_moment_map="linear"),
        nu_dtype=eqopt.Quantized(8),
    ),
    "4-bit": dict(mu_dtype=eqopt.Quantized(4), nu_dtype=eqopt.Quantized(4)),
    # Packed, the model unpacked for the transform (blocks within leaves, the
    # per-leaf numbers); the rows above quantise each buffer as one array.
    "8-bit, leaf blocks": dict(
        mu_dtype=eqopt.Quantized(8, packed_blocks="leaf"),
        nu_dtype=eqopt.Quantized(8, packed_blocks="leaf"),
    ),
}


#: Reference kernels, not optimisers: what any 8-bit state costs in XLA here.
#: `codes copy` reads the params, gradients and two uint8 codes per parameter
#: and writes them back with no arithmetic (the memory traffic alone);
#: `8-bit floor` is Adam on two linear 8-bit codes per parameter with a fixed
#: scale: decode, update, encode in one pass per output, no block maximum.
KERNELS = ("codes copy", "8-bit floor")


def _kernel_step(name: str):
    b1, b2, learning_rate, eps = 0.9, 0.999, 1e-3, 1e-8

    def leaf(p, g, mu, nu):
        if name == "codes copy":
            return p + g, mu + jnp.uint8(1), nu + jnp.uint8(1)
        m = b1 * ((mu.astype(jnp.float32) - 127.0) * (1 / 127)) + (1 - b1) * g
        root = (nu.astype(jnp.float32) + 1.0) * (1 / 256)
        v = b2 * root * root + (1 - b2) * g * g
        p = p - learning_rate * m / (jnp.sqrt(v) + eps)
        mu = (jnp.round(jnp.clip(m, -1.0, 1.0) * 127.0) + 127.0).astype(jnp.uint8)
        nu = jnp.clip(jnp.round(jnp.sqrt(v) * 256.0) - 1.0, 0.0, 255.0)
        return p, mu, nu.astype(jnp.uint8)

    def step(params, state, grads):
        leaves, treedef = jax.tree.flatten(params)
        out = [
            leaf(p, g, mu, nu)
            for p, g, mu, nu in zip(leaves, jax.tree.leaves(grads), *state, strict=True)
        ]
        new_params = jax.tree.unflatten(treedef, [o[0] for o in out])
        return new_params, ([o[1] for o in out], [o[2] for o in out])

    return step


def map_kernels(n: int, rounds: int) -> dict[str, float]:
    """Each map's encoding and decoding of `n` elements alone, as a ratio to a
    float32 Adam step on `n` elements (interleaved, median over rounds). Timed
    one call at a time: back to back, each call's new output buffer cost more
    than the kernel."""
    from eqopt._quantize import _decode_dynamic, _encode

    values = jnp.sin(jnp.arange(n, dtype=jnp.float32)) ** 5
    codes = (jnp.arange(n) % 256).astype(jnp.uint8)

    def adam(p, m, v, g):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        return p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), m, v

    kernels = {
        # Inputs are arguments: a captured constant would be folded at compile time.
        "dynamic encode": (lambda y: _encode(y, "dynamic", 8), (values,)),
        "dynamic decode": (lambda c: _decode_dynamic(c, 8), (codes,)),
        "linear encode": (lambda y: _encode(y, "linear", 8), (values,)),
        "linear decode": (
            lambda c: (c.astype(jnp.float32) - 127.0) * (1 / 127),
            (codes,),
        ),
    }
    compiled = {
        name: (jax.jit(fn).lower(*args).compile(), args)
        for name, (fn, args) in kernels.items()
    }
    step = jax.jit(adam, donate_argnums=(0, 1, 2))
    state = (jnp.copy(values), jnp.zeros(n), jnp.zeros(n))

    def timed(fn, *args):
        times = []
        for _ in range(7):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    state = step(*state, values)
    ratios = {name: [] for name in kernels}
    for _ in range(rounds):
        times = []
        for _ in range(7):
            start = time.perf_counter()
            state = jax.block_until_ready(step(*state, values))
            times.append(time.perf_counter() - start)
        adam_time = statistics.median(times)
        for name, (fn, args) in compiled.items():
            ratios[name].append(timed(fn, *args) / adam_time)
    return {name: statistics.median(r) for name, r in ratios.items()}


#: Variants of the whole-training-step table (peak memory and time).
PEAK_VARIANTS = ("float32", "float32 (A/A)", "bfloat16", "8-bit", "4-bit")


def training_step(variant: str, model, packed: bool, batch: int = 64):
    """A whole training step of `model` with Adam and `variant`'s moments (loss,
    gradient, update, apply; params and state donated), compiled, and XLA's
    peak memory for it in bytes per parameter: the arguments (params, state,
    batch) and the largest set of temporaries alive at once (gradients,
    copies, decoded moments), from the compiled program's buffer assignment.
    `packed`: the params are [`eqopt.pack`]ed and the loss differentiated
    through `unpack()`. Returns the peak and an entry for `time_steps`."""
    params, static = eqx.partition(model, eqx.is_inexact_array)
    size = sum(x.size for x in jax.tree.leaves(params))
    x = jnp.ones((batch, model.in_size))
    opt = eqopt.adam(1e-3, **VARIANTS[variant])
    if packed:
        params = eqopt.pack(params)
    # A copy: the step donates its params.
    params = jax.tree.map(jnp.copy, params)

    def step(params, state, x):
        def loss(params):
            leaves = params.unpack() if packed else params
            return jnp.mean(jax.vmap(eqx.combine(leaves, static))(x) ** 2)

        grads = jax.grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return eqopt.apply_updates(params, updates), state

    state = opt.init(params)
    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, x).compile()
    analysis = compiled.memory_analysis()
    peak = (analysis.argument_size_in_bytes + analysis.temp_size_in_bytes) / size
    return peak, [compiled, params, state, x]


def training_steps(columns, rounds, steps, block, result, path) -> None:
    """The peak memory and the time of a whole training step for each of
    `PEAK_VARIANTS`, column by column (the time as a ratio to float32 Adam's in
    the same round, geometric mean over interleaved rounds), saved after each
    column so that a run cut short keeps the columns it finished."""
    result["training_step"] = {}
    for column, (model, packed) in columns.items():
        entries, peaks = {}, {}
        for name in PEAK_VARIANTS:
            peaks[name], entries[name] = training_step(name, model, packed)
            time_steps(entries[name], 1)  # warm-up
        ratios = {name: [] for name in PEAK_VARIANTS}
        for r in range(rounds):
            order = PEAK_VARIANTS[r % len(PEAK_VARIANTS) :]
            order += PEAK_VARIANTS[: r % len(PEAK_VARIANTS)]
            medians = {name: time_steps(entries[name], steps, block) for name in order}
            for name in PEAK_VARIANTS:
                ratios[name].append(medians[name] / medians["float32"])
        result["training_step"][column] = {
            name: {"peak": peaks[name], "time": geometric_mean(ratios[name])}
            for name in PEAK_VARIANTS
        }
        save(result, path)


def geometric_mean(values):
    return math.exp(statistics.fmean(math.log(x) for x in values))


def make_model(width: int, depth: int):
    return eqx.nn.MLP(width, width, width, depth, key=jax.random.key(0))


def state_bytes(state) -> int:
    return sum(
        x.size * x.dtype.itemsize
        for x in jax.tree.leaves(state)
        if eqx.is_array(x) and x.ndim > 0
    )


def build(variant: str, path: str, model):
    # A copy: the step donates its params.
    params = jax.tree.map(jnp.copy, eqx.filter(model, eqx.is_array))
    if path == "packed":
        params = eqopt.pack(params)
    grads = jax.tree.map(lambda x: jnp.cos(x * 3.0) * 1e-2, params)
    if variant in KERNELS:
        codes = [jnp.full(x.shape, 127, jnp.uint8) for x in jax.tree.leaves(params)]
        state = (codes, [jnp.copy(c) for c in codes])
        step = _kernel_step(variant)
    else:
        opt = eqopt.adam(1e-3, **VARIANTS[variant])
        state = opt.init(params)

        def step(params, state, grads):
            updates, state = opt.update(grads, state, params)
            return eqopt.apply_updates(params, updates), state

    compiled = (
        jax.jit(step, donate_argnums=(0, 1)).lower(params, state, grads).compile()
    )
    return compiled, params, state, grads


def time_steps(entry, steps: int, block: int = 1) -> float:
    """The median over `steps` timings of `block` steps run back to back (the
    next dispatched while one runs, as in a training loop; one wait at the
    end), per step. Timed one by one, each step also pays the wait and the
    dispatch, a fixed cost that pulls every ratio towards 1 (on the 2-core
    CPU 8-bit Adam's 2.4x read 1.9x)."""
    compiled, params, state, grads = entry
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        for _ in range(block):
            params, state = compiled(params, state, grads)
        jax.block_until_ready((params, state))
        times.append((time.perf_counter() - start) / block)
    entry[1], entry[2] = params, state
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--width", type=int, default=None, help="MLP width (1024)")
    parser.add_argument("--steps", type=int, default=None, help="timings per median")
    parser.add_argument(
        "--block", type=int, default=None, help="steps back to back per timing (5)"
    )
    parser.add_argument(
        "--no-peak",
        action="store_true",
        help="leave out the training-step table (16 more compiles)",
    )
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="also list the compiled step's kernels (fusions) for float32 and 8-bit",
    )
    args = parser.parse_args()
    width, depth = (512, 3) if args.quick else (1024, 3)
    width = args.width or width
    rounds = args.rounds or (2 if args.quick else 6)
    steps = args.steps or (3 if args.quick else 7)
    block = args.block or (2 if args.quick else 5)
    model = make_model(width, depth)
    n_params = sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_array)))
    names = [*VARIANTS, *KERNELS]
    entries, memory = {}, {}
    for path in ("default", "packed"):
        for name in names:
            entry = list(build(name, path, model))
            entries[path, name] = entry
            memory[name] = state_bytes(entry[2]) / n_params
            time_steps(entry, 1)  # warm-up
    ratios = {key: [] for key in entries}
    packed_over_default = {name: [] for name in names}
    for r in range(rounds):
        medians = {}
        for path in ("default", "packed"):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                medians[path, name] = time_steps(entries[path, name], steps, block)
            for name in names:
                ratios[path, name].append(
                    medians[path, name] / medians[path, "float32"]
                )
        for name in names:
            packed_over_default[name].append(
                medians["packed", name] / medians["default", name]
            )
    result = {
        "params": n_params,
        "leaves": len(jax.tree.leaves(eqx.filter(model, eqx.is_array))),
        "rounds": rounds,
        "steps": steps,
        "block": block,
        "machine": f"{jax.devices()[0].device_kind}, {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "rows": [],
    }
    print(
        f"Adam on an MLP of {n_params / 1e6:.1f}M params; {rounds} interleaved rounds "
        f"of {steps} timings of {block} steps; "
        f"{result['machine']}"
    )
    print(
        "| moments | state bytes/param | step vs float32, default "
        "| step vs float32, packed | packed vs default |"
    )
    print("|---|---|---|---|---|")

    for name in names:
        geo = {
            path: geometric_mean(ratios[path, name]) for path in ("default", "packed")
        }
        geo["packed_over_default"] = geometric_mean(packed_over_default[name])
        result["rows"].append(dict(variant=name, bytes=memory[name], **geo))
        print(
            f"| {name} | {memory[name]:.3f} | {geo['default']:.2f}x | "
            f"{geo['packed']:.2f}x | {geo['packed_over_default']:.2f}x |"
        )
    save(result, args.json)  # each table as soon as it is measured
    kernels = map_kernels(n_params, rounds)
    result["map_kernels"] = kernels
    save(result, args.json)
    print(
        f"\nThe maps' arithmetic alone on {n_params / 1e6:.1f}M elements, "
        "as a fraction of a float32 Adam step on as many:"
    )
    print("| kernel | time vs float32 Adam step |")
    print("|---|---|")
    for name, ratio in kernels.items():
        print(f"| {name} | {ratio:.2f}x |")
    if args.kernels:
        result["kernels"] = {}
        for path in ("default", "packed"):
            for name in ("float32", "8-bit"):
                listing = kernel_list(entries[path, name][0])
                result["kernels"][f"{path} {name}"] = listing
                print(f"\n{path} {name}: {len(listing)} kernels")
                print("\n".join(f"  {line}" for line in listing))
    if not args.no_peak:
        # As many parameters in 17 layers as in the MLP's 4 (a step's temporaries
        # are per layer, the state per parameter); the deep MLP first.
        deep = make_model(width // 2, 16)
        columns = {
            f"17 layers of {width // 2}": (deep, False),
            f"17 layers of {width // 2}, packed": (deep, True),
            f"{depth + 1} layers of {width}": (model, False),
            f"{depth + 1} layers of {width}, packed": (model, True),
        }
        training_steps(columns, min(rounds, 3), steps, block, result, args.json)
        table = result["training_step"]
        print(
            "\nA whole training step (loss, gradient, update, apply; batch 64): XLA's"
            " peak memory in bytes per parameter (arguments and temporaries, from"
            " its buffer assignment), and the step's time as a ratio to float32"
            " Adam's:"
        )
        print(f"| moments | {' | '.join(table)} |")
        print("|---" * (len(table) + 1) + "|")
        for name in PEAK_VARIANTS:
            cells = [
                f"{column[name]['peak']:.2f} B, {column[name]['time']:.2f}x"
                for column in table.values()
            ]
            print(f"| {name} | {' | '.join(cells)} |")
    save(result, args.json)


def save(result: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def kernel_list(compiled) -> list[str]:
    """The fusions and library calls of a compiled step, each as `kind: outputs`
    (what runs as a kernel of its own; scalar ones left out)."""
    text = compiled.as_text()
    entry = text[text.index("ENTRY") :]
    listing = []
    for line in entry.splitlines():
        line = line.strip()
        if " fusion(" not in line and "custom-call(" not in line:
            continue
        outputs = line.split(" = ", 1)[1].split(" fusion(")[0].split(" custom-call(")[0]
        if outputs.startswith(("f32[] ", "s32[] ")) or outputs in ("f32[]", "s32[]"):
            continue
        kind = (
            line.split("kind=")[1].split(",")[0] if "kind=" in line else "custom-call"
        )
        listing.append(f"{kind}: {outputs}")
    return listing


if __name__ == "__main__":
    main()
