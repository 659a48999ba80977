"""The whole training step of eqopt against Optax's, interleaved in one process.

What a user runs each step: the loss and its gradient (a real forward and
backward pass), the optimiser's `update` and `apply_updates`, with the params
and the state donated. For each tree and optimiser case it times six
variants: Optax on `eqx.filter(model, eqx.is_array)`; Optax again (the A/A run,
whose ratio to the first is the noise of the measurement); eqopt's default path
on the whole model, with the optimiser passed into the step (its
hyperparameters are inputs of the program: changing them does not recompile);
the same with the optimiser closed over ("closed": its hyperparameters are
constants of the program, as Optax's Python floats are); `eqopt.bucketed(opt)`
(its automatic choice); and eqopt on `eqopt.pack`ed params, differentiating
`loss(packed.unpack())`. `--variants` runs a subset.

Trees (each with a real forward pass, CPU-sized):

- `res200`, `res1000`: a residual stack of `eqx.nn.Linear(16, 16)` layers
  (`x + tanh(layer(x))`), batch 32: 400 and 2000 small leaves;
- `resnet`: `step_bench.py`'s ResNet-50-shaped tree (161 leaves) with its
  convolutions, scales and biases applied to a small batch of images;
- `transformer`: `step_bench.py`'s decoder tree (embedding, attention, MLP,
  layer norms) on a small batch of token sequences, next-token cross-entropy.

Cases: `sgdm`, `adam`, `clip+adamw+cos` (global-norm clipping, AdamW on a warmup
cosine schedule, decay masked to matrices) and `lion`, built by `step_bench.py`.

The work runs in rounds. In each round every variant is traced and compiled
(`lower` + `compile` of a fresh closure after `jax.clear_caches()`, in an
order mirrored in the next round): the "first call" time. Then steps are timed
on those executables, the variants alternating, and each round gives each
variant the ratio of its median to Optax's. The table shows the geometric mean
of those ratios over the rounds (< 1: faster than Optax).

    python benchmarks/train_step_bench.py            # all trees and cases
    python benchmarks/train_step_bench.py --quick    # smaller trees, fewer repetitions
    python benchmarks/train_step_bench.py --trees res200 --cases adam --json out.json
    python benchmarks/train_step_bench.py --variants optax-aa,eqopt,eqopt-packed
"""

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time

import jax

# Compile timings must not come from a cache on disk.
jax.config.update("jax_enable_compilation_cache", False)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_bench  # noqa: E402
from bench_report import finish_args, stderr_log  # noqa: E402

import eqopt  # noqa: E402

VARIANTS = (
    "optax",
    "optax-aa",
    "eqopt",
    "eqopt-closed",
    "eqopt-bucketed",
    "eqopt-packed",
)
# Column titles of the table, by variant.
TITLES = {
    "eqopt": "eqopt",
    "eqopt-closed": "closed",
    "eqopt-bucketed": "bucketed",
    "eqopt-packed": "packed",
    "optax-aa": "A/A",
}
CASES = ("sgdm", "adam", "clip+adamw+cos", "lion")
TREES = ("res200", "res1000", "resnet", "transformer")
TOTAL_STEPS = 1000


# ---------------------------------------------------------------------------
# Models and their losses
# ---------------------------------------------------------------------------


class Residual(eqx.Module):
    """A residual stack of small dense layers: `x + tanh(layer(x))` each."""

    layers: list

    def __call__(self, x):
        for layer in self.layers:
            x = x + jnp.tanh(layer(x))
        return x


def make_residual(n_layers, args):
    keys = jax.random.split(jax.random.key(args.seed), n_layers)
    model = Residual([eqx.nn.Linear(16, 16, key=k) for k in keys])
    rng = np.random.default_rng(args.seed)
    batch = (
        jnp.asarray(rng.standard_normal((args.batch, 16), np.float32)),
        jnp.asarray(rng.standard_normal((args.batch, 16), np.float32)),
    )

    def loss(model, batch):
        x, y = batch
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    return model, batch, loss


def _conv(x, w, stride=1):
    return jax.lax.conv_general_dilated(
        x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _norm(x, p):
    return x * p["scale"] + p["bias"]


def make_resnet(args):
    params = step_bench.make_resnet(args, None)
    rng = np.random.default_rng(args.seed)
    size = args.image_size
    batch = (
        jnp.asarray(rng.standard_normal((args.image_batch, size, size, 3), np.float32)),
        jnp.asarray(rng.integers(0, 1000, (args.image_batch,))),
    )

    def forward(p, x):
        x = jax.nn.relu(_norm(_conv(x, p["stem"]["w"], 2), p["stem"]["bn"]))
        for stage, n_blocks in enumerate((3, 4, 6, 3)):
            for block in range(n_blocks):
                layer = p[f"s{stage}b{block}"]
                stride = 2 if block == 0 and stage > 0 else 1
                h = jax.nn.relu(_norm(_conv(x, layer["conv1"]), layer["bn1"]))
                h = jax.nn.relu(_norm(_conv(h, layer["conv2"], stride), layer["bn2"]))
                h = _norm(_conv(h, layer["conv3"]), layer["bn3"])
                if "proj" in layer:
                    x = _norm(_conv(x, layer["proj"], stride), layer["proj_bn"])
                x = jax.nn.relu(x + h)
        x = jnp.mean(x, axis=(1, 2))
        return x @ p["head"]["w"] + p["head"]["b"]

    def loss(p, batch):
        x, labels = batch
        logits = forward(p, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return params, batch, loss


def _layer_norm(x, p):
    mean = jnp.mean(x, -1, keepdims=True)
    var = jnp.var(x, -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]


def make_transformer(args):
    params = step_bench.make_transformer(args, None)
    rng = np.random.default_rng(args.seed)
    tokens = jnp.asarray(
        rng.integers(0, args.tf_vocab, (args.tf_batch, args.tf_context + 1))
    )
    heads = args.tf_heads

    def forward(p, tokens):
        n = tokens.shape[-1]
        x = p["embed"][tokens] + p["pos_embed"][:n]
        mask = jnp.tril(jnp.ones((n, n), bool))
        for block in p["blocks"]:
            h = _layer_norm(x, block["ln1"])
            qkv = h @ block["qkv"]["w"] + block["qkv"]["b"]
            q, k, v = jnp.split(qkv.reshape(*qkv.shape[:-1], 3 * heads, -1), 3, -2)
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
            scores = jnp.where(mask, scores, -1e9)
            attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores), v)
            attended = attended.reshape(*x.shape)
            x = x + attended @ block["out"]["w"] + block["out"]["b"]
            h = _layer_norm(x, block["ln2"])
            h = jax.nn.gelu(h @ block["mlp_in"]["w"] + block["mlp_in"]["b"])
            x = x + h @ block["mlp_out"]["w"] + block["mlp_out"]["b"]
        x = _layer_norm(x, p["ln_f"])
        return x @ p["embed"].T

    def loss(p, tokens):
        logits = forward(p, tokens[:, :-1])
        labels = tokens[:, 1:]
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return params, tokens, loss


def make_tree(name, args):
    if name == "res200":
        return make_residual(200, args)
    if name == "res1000":
        return make_residual(1000, args)
    if name == "resnet":
        return make_resnet(args)
    return make_transformer(args)


# ---------------------------------------------------------------------------
# One variant's jitted step
# ---------------------------------------------------------------------------


class Runner:
    """One variant on one (tree, case): a step factory, its arguments, its timings."""

    def __init__(self, variant, case, model, batch, loss):
        self.variant = variant
        self.batch = batch
        params = eqx.filter(model, eqx.is_array)
        if variant.startswith("optax"):
            tx = step_bench.make_optimiser("optax", case, TOTAL_STEPS)
            self.state = tx.init(params)

            def factory():
                def step(params, state, batch):
                    value, grads = jax.value_and_grad(loss)(params, batch)
                    updates, state = tx.update(grads, state, params)
                    return optax.apply_updates(params, updates), state, value

                return jax.jit(step, donate_argnums=(0, 1))

            self.prefix = ()
        else:
            opt = step_bench.make_optimiser("eqopt", case, TOTAL_STEPS)
            if variant == "eqopt-bucketed":
                opt = eqopt.bucketed(opt)
            if variant == "eqopt-packed":
                model = eqopt.pack(model)
                user_loss = loss

                def loss(packed, batch):
                    return user_loss(packed.unpack(), batch)

                params = eqx.filter(model, eqx.is_array)
            self.state = opt.init(model)
            opt_arrays, opt_static = eqx.partition(opt, eqx.is_array)
            model_static = eqx.filter(model, eqx.is_array, inverse=True)
            if variant == "eqopt-closed":
                # The optimiser closed over, as Equinox's examples keep `optim`
                # global: its hyperparameters are constants of the program.
                opt_static, opt_arrays = opt, None

            def factory():
                # Arrays in, arrays out, as `eqx.filter_jit` would pass them.
                def step(opt_arrays, params, state, batch):
                    opt = (
                        opt_static
                        if opt_arrays is None
                        else eqx.combine(opt_arrays, opt_static)
                    )
                    model = eqx.combine(params, model_static)
                    value, grads = eqx.filter_value_and_grad(loss)(model, batch)
                    updates, state = opt.update(grads, state, model)
                    model = eqopt.apply_updates(model, updates)
                    return eqx.filter(model, eqx.is_array), state, value

                return jax.jit(step, donate_argnums=(1, 2))

            self.prefix = (opt_arrays,)
        self.factory = factory
        self.params = step_bench.copy_arrays(params)
        self.step = None

    def time_compile(self):
        """Seconds to trace, lower and compile a fresh closure, caches cleared."""
        jax.clear_caches()
        gc.collect()
        jitted = self.factory()
        args = (*self.prefix, self.params, self.state, self.batch)
        t0 = time.perf_counter()
        self.step = jitted.lower(*args).compile()
        return time.perf_counter() - t0

    def run(self, n):
        """Seconds per step over `n` steps, blocking on the result."""
        params, state = self.params, self.state
        t0 = time.perf_counter()
        for _ in range(n):
            params, state, value = self.step(*self.prefix, params, state, self.batch)
        jax.block_until_ready((params, state, value))
        elapsed = time.perf_counter() - t0
        self.params, self.state = params, state
        return elapsed / n


def mirrored(round_, variants):
    k = (round_ // 2) % len(variants)
    order = variants[k:] + variants[:k]
    return order if round_ % 2 == 0 else order[::-1]


def bench_one(tree, case, args, log):
    variants = args.variants
    model, batch, loss = make_tree(tree, args)
    runners = {v: Runner(v, case, model, batch, loss) for v in variants}
    leaves = eqx.filter(model, eqx.is_inexact_array)
    result = {
        "tree": tree,
        "case": case,
        "leaves": len(jax.tree.leaves(leaves)),
        "params": sum(x.size for x in jax.tree.leaves(leaves)),
        "compile_s": {v: [] for v in variants},
        "step_s": {v: [] for v in variants},
        "bucketed": bool(
            "eqopt-bucketed" in runners and runners["eqopt-bucketed"].state.is_bucketed
        ),
    }
    for round_ in range(args.rounds):
        for variant in mirrored(round_, variants):
            seconds = runners[variant].time_compile()
            result["compile_s"][variant].append(seconds)
        for runner in runners.values():
            runner.run(args.warmup)
        # Steps per sample: about `rep_seconds` of work for the Optax step.
        per_step = runners["optax"].run(1)
        n = max(1, round(args.rep_seconds / max(per_step, 1e-6)))
        samples = {v: [] for v in variants}
        for rep in range(args.step_reps):
            order = variants if rep % 2 == 0 else variants[::-1]
            for variant in order:
                samples[variant].append(runners[variant].run(n))
        for variant in variants:
            result["step_s"][variant].append(statistics.median(samples[variant]))
        log(
            f"  {tree} {case} round {round_ + 1}/{args.rounds}: step ms "
            + " ".join(f"{v}={1e3 * result['step_s'][v][-1]:.3g}" for v in variants)
            + "; first call s "
            + " ".join(f"{v}={result['compile_s'][v][-1]:.3g}" for v in variants)
        )
    return result


def ratios(result, metric):
    base = result[metric]["optax"]
    return {
        v: step_bench.geometric_mean([x / b for x, b in zip(times, base, strict=True)])
        for v, times in result[metric].items()
    }


def table(results):
    shown = [v for v in TITLES if v in results[0]["step_s"]]
    header = (
        "| tree | case | leaves | params | "
        + " | ".join(f"step {TITLES[v]}" for v in shown)
        + " | "
        + " | ".join(f"first call {TITLES[v]}" for v in shown)
        + " | step ms Optax | first call s Optax |"
    )
    lines = [header, "|" + "---|" * 4 + "--:|" * (2 * len(shown) + 2)]
    for r in results:
        step, first = ratios(r, "step_s"), ratios(r, "compile_s")
        optax_step = statistics.median(r["step_s"]["optax"]) * 1e3
        optax_first = statistics.median(r["compile_s"]["optax"])
        per_leaf = " (per leaf)" if not r["bucketed"] else ""
        cells = [
            r["tree"],
            r["case"],
            str(r["leaves"]),
            step_bench.fmt_count(r["params"]),
            *(
                f"{step[v]:.2f}{per_leaf if v == 'eqopt-bucketed' else ''}"
                for v in shown
            ),
            *(f"{first[v]:.2f}" for v in shown),
            f"{optax_step:.3g}",
            f"{optax_first:.3g}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


QUICK = {
    "trees": "res200,resnet,transformer",
    "rounds": 2,
    "step_reps": 7,
    "rep_seconds": 0.05,
    "resnet_width": 8,
    "image_size": 16,
    "image_batch": 2,
    "tf_width": 64,
    "tf_blocks": 2,
    "tf_vocab": 512,
    "tf_context": 32,
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="smaller trees, 2 rounds")
    parser.add_argument("--trees", default=",".join(TREES))
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="a subset of " + ",".join(VARIANTS) + " (optax is always run)",
    )
    parser.add_argument("--rounds", type=int, default=4, help="compile rounds (even)")
    parser.add_argument("--step-reps", type=int, default=11, help="samples per round")
    parser.add_argument("--rep-seconds", type=float, default=0.1)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32, help="residual stacks")
    parser.add_argument("--resnet-width", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--image-batch", type=int, default=4)
    parser.add_argument("--tf-width", type=int, default=128)
    parser.add_argument("--tf-blocks", type=int, default=4)
    parser.add_argument("--tf-heads", type=int, default=4)
    parser.add_argument("--tf-vocab", type=int, default=2000)
    parser.add_argument("--tf-context", type=int, default=64)
    parser.add_argument("--tf-batch", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args(argv)
    return finish_args(parser, args, argv, VARIANTS, "optax", QUICK)


def main(argv=None):
    args = parse_args(argv)
    log = stderr_log()

    log(
        f"jax {jax.__version__}, equinox {eqx.__version__}, optax {optax.__version__}, "
        f"{platform.machine()} {jax.devices()[0].device_kind}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    results = []
    for tree in args.trees.split(","):
        for case in args.cases.split(","):
            results.append(bench_one(tree, case, args, log))
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"args": vars(args), "results": results}, f, indent=1)
    log(f"done, load average {os.getloadavg()[0]:.1f}")
    print(table(results))


if __name__ == "__main__":
    main()
