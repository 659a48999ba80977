"""Parameter groups in a whole training step: eqopt's groups against no groups and Optax.

A transformer-like Equinox model (24 blocks in a list field `blocks`, each with
two `eqx.nn.LayerNorm`s, an attention-like and two MLP `eqx.nn.Linear`s with
biases; an `eqx.nn.Embedding` for the tokens and one for the positions, a final
`LayerNorm`, a head `Linear`), trained on a small batch of token sequences with
next-token cross-entropy. The optimiser is clipping by the global norm, then
AdamW (weight decay 0.05) on a warmup-cosine schedule. Variants, interleaved in
one process:

- `eqopt`: that optimiser without groups, (a) in the table;
- `eqopt-aa`: the same again, the A/A run (its ratio to (a) is the noise);
- `groups`: `eqopt.param_groups` with layer decay 0.75 and a no-decay group
  (every `LayerNorm` and every `Linear` bias): one group per (layer,
  decay/no-decay), each a multiplier of the one optimiser;
- `optax`: Optax's `multi_transform` with one label per (layer,
  decay/no-decay) group, each label its own `optax.adamw(lambda t: schedule(t) *
  mult, weight_decay=...)`, as a user writes it by hand; (b) in the table;
- `packed`, `packed-groups`: `eqopt.pack`ed params, the gradient taken through
  `unpack`, without and with the groups.

The step (loss, gradient, `update`, `apply_updates`) is jitted with
`eqx.filter_jit`, the model and the state donated, the optimiser and the batch
passed in (Optax's optimiser closed over, its params `eqx.filter(model,
eqx.is_array)`). Before the timings the groups must give Optax's numbers (and
packed, the groups'): `update` alone on the same gradients, and three training
steps from the same params; else the script stops.

The work runs in rounds. In each round every variant is traced, compiled and
runs its first step (a fresh closure after `jax.clear_caches()`, in an order
mirrored in the next round): the "first call". Then steps are timed, the
variants alternating, each sample a few steps back to back. The table shows the
geometric mean over the rounds of each variant's ratio of medians to (a)'s and
(b)'s in the same round (wall clock; and in process CPU time, less moved by other
jobs on the machine).

    python benchmarks/param_groups_bench.py --json benchmarks/param_groups_bench.json
    python benchmarks/param_groups_bench.py --quick   # 2 rounds, fewer samples
    python benchmarks/param_groups_bench.py --blocks 4 --rounds 2 --variants eqopt,groups,optax
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
from jax.tree_util import GetAttrKey, SequenceKey  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_report import (  # noqa: E402
    finish_args,
    geometric_mean,
    markdown_table,
    stderr_log,
)

import eqopt  # noqa: E402

VARIANTS = ("eqopt", "eqopt-aa", "groups", "optax", "packed", "packed-groups")
BASE, OPTAX = "eqopt", "optax"
ROWS = {
    "eqopt": "(a) eqopt, no groups",
    "eqopt-aa": "(a) again: A/A",
    "groups": "param_groups",
    "optax": "(b) Optax multi_transform",
    "packed": "packed, no groups",
    "packed-groups": "packed, param_groups",
}
LEARNING_RATE, WEIGHT_DECAY, DECAY_RATE, CLIP = 1e-3, 0.05, 0.75, 1.0
TOTAL_STEPS, WARMUP_STEPS = 10_000, 10
CHECK_STEPS = 3


def _dense(layer, x):
    return x @ layer.weight.T + layer.bias


def _norm(layer, x):
    mean = jnp.mean(x, -1, keepdims=True)
    var = jnp.var(x, -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + layer.eps) * layer.weight + layer.bias


class Block(eqx.Module):
    ln1: eqx.nn.LayerNorm
    qkv: eqx.nn.Linear
    out: eqx.nn.Linear
    ln2: eqx.nn.LayerNorm
    mlp_in: eqx.nn.Linear
    mlp_out: eqx.nn.Linear
    heads: int = eqx.field(static=True)

    def __init__(self, width, heads, key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.ln1 = eqx.nn.LayerNorm(width)
        self.qkv = eqx.nn.Linear(width, 3 * width, key=k1)
        self.out = eqx.nn.Linear(width, width, key=k2)
        self.ln2 = eqx.nn.LayerNorm(width)
        self.mlp_in = eqx.nn.Linear(width, 4 * width, key=k3)
        self.mlp_out = eqx.nn.Linear(4 * width, width, key=k4)
        self.heads = heads

    def __call__(self, x, mask):
        qkv = _dense(self.qkv, _norm(self.ln1, x))
        q, k, v = jnp.split(qkv.reshape(*x.shape[:-1], 3 * self.heads, -1), 3, -2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
        scores = jnp.where(mask, scores, -1e9)
        attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores), v)
        x = x + _dense(self.out, attended.reshape(x.shape))
        h = jax.nn.gelu(_dense(self.mlp_in, _norm(self.ln2, x)))
        return x + _dense(self.mlp_out, h)


class Transformer(eqx.Module):
    embed: eqx.nn.Embedding
    pos: eqx.nn.Embedding
    blocks: list[Block]
    ln_f: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, args):
        keys = jax.random.split(jax.random.key(args.seed), args.blocks + 3)
        d = args.width
        self.embed = eqx.nn.Embedding(args.vocab, d, key=keys[0])
        self.pos = eqx.nn.Embedding(args.context, d, key=keys[1])
        self.blocks = [Block(d, args.heads, k) for k in keys[2:-1]]
        self.ln_f = eqx.nn.LayerNorm(d)
        self.head = eqx.nn.Linear(d, args.vocab, key=keys[-1])

    def __call__(self, tokens):
        n = tokens.shape[-1]
        x = self.embed.weight[tokens] + self.pos.weight[:n]
        mask = jnp.tril(jnp.ones((n, n), bool))
        for block in self.blocks:
            x = block(x, mask)
        return _dense(self.head, _norm(self.ln_f, x))


def loss(model, tokens):
    logits = model(tokens[:, :-1])
    labels = tokens[:, 1:]
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def make_batch(args):
    rng = np.random.default_rng(args.seed)
    return jnp.asarray(rng.integers(0, args.vocab, (args.batch, args.context + 1)))


def schedule(lib):
    return lib.warmup_cosine_decay_schedule(
        0.0, LEARNING_RATE, WARMUP_STEPS, TOTAL_STEPS, end_value=LEARNING_RATE / 100
    )


NO_DECAY = eqopt.Group(
    select=(eqx.nn.LayerNorm, eqopt.in_layer(eqx.nn.Linear, field="bias")),
    name="no_decay",
    wd_mult=0.0,
)


def make_eqopt(groups):
    opt = eqopt.chain(
        eqopt.clip_by_global_norm(CLIP),
        eqopt.adamw(learning_rate=schedule(eqopt), weight_decay=WEIGHT_DECAY),
    )
    if not groups:
        return opt
    return eqopt.param_groups(
        opt, groups=[NO_DECAY], layer_decay=eqopt.layer_decay(DECAY_RATE)
    )


def optax_labels(params, n_blocks):
    """Each leaf's label by hand, from its path: `layer3.decay`, `layer25.no_decay`.

    Block k is layer k + 1, the embeddings layer 0, the final norm and the head
    layer n = n_blocks + 1 (BEiT's numbering); no decay on norms and biases.
    """

    def label(path, leaf):
        names = [k.name for k in path if isinstance(k, GetAttrKey)]
        index = [k.idx for k in path if isinstance(k, SequenceKey)]
        if names[0] == "blocks":
            layer = index[0] + 1
        else:
            layer = 0 if names[0] in ("embed", "pos") else n_blocks + 1
        no_decay = names[-1] == "bias" or names[-2].startswith("ln")
        return f"layer{layer}.{'no_decay' if no_decay else 'decay'}"

    return jax.tree_util.tree_map_with_path(label, params)


def make_optax(params, n_blocks):
    labels = optax_labels(params, n_blocks)
    base, n = schedule(optax), n_blocks + 1
    transforms = {}
    for name in sorted(set(jax.tree.leaves(labels))):
        layer, kind = name.removeprefix("layer").split(".")
        mult = DECAY_RATE ** (n - int(layer))
        transforms[name] = optax.adamw(
            lambda t, mult=mult: base(t) * mult,
            weight_decay=0.0 if kind == "no_decay" else WEIGHT_DECAY,
        )
    tx = optax.chain(
        optax.clip_by_global_norm(CLIP),
        # A function of the params: a model (the labels' tree) is itself callable.
        optax.multi_transform(transforms, lambda p: optax_labels(p, n_blocks)),
    )
    return tx, len(transforms)


def copy_arrays(tree):
    """A copy in fresh device buffers (through NumPy, so nothing is compiled)."""
    return jax.tree.map(
        lambda x: jnp.asarray(np.array(x)) if eqx.is_array(x) else x, tree
    )


class Runner:
    """One variant: a step factory, its arguments (the model and state donated)."""

    def __init__(self, variant, model, batch, n_blocks):
        self.variant = variant
        if variant == OPTAX:
            params, static = eqx.partition(model, eqx.is_array)
            tx, self.groups = make_optax(params, n_blocks)
            self.state, self.opt = tx.init(params), tx

            def factory():
                def step(batch, params, state):
                    value, grads = eqx.filter_value_and_grad(loss)(
                        eqx.combine(params, static), batch
                    )
                    updates, state = tx.update(grads, state, params)
                    return optax.apply_updates(params, updates), state, value

                return step

            self.fixed = batch
        else:
            opt = make_eqopt(groups=variant.endswith("groups"))
            user_loss = loss
            if variant.startswith("packed"):
                params = eqopt.pack(model)

                def user_loss(packed, batch):
                    return loss(packed.unpack(), batch)

            else:
                params = model
            self.state, self.opt = opt.init(params), opt
            self.groups = (
                len(eqopt.param_groups_report(opt, self.state).rows)
                if isinstance(opt, eqopt.ParamGroups)
                else 1
            )

            def factory():
                def step(fixed, model, state):
                    opt, batch = fixed
                    value, grads = eqx.filter_value_and_grad(user_loss)(model, batch)
                    updates, state = opt.update(grads, state, model)
                    return eqopt.apply_updates(model, updates), state, value

                return step

            self.fixed = (opt, batch)
        self.factory = factory
        self.params = copy_arrays(params)
        self.step = None

    def first_call(self):
        """Seconds (wall, process CPU) to trace, lower and compile a fresh closure
        (caches cleared) and run its first step."""
        jax.clear_caches()
        gc.collect()
        jitted = eqx.filter_jit(self.factory(), donate="all-except-first")
        t0, c0 = time.perf_counter(), time.process_time()
        self.step = jitted.lower(self.fixed, self.params, self.state).compile()
        self.run(1)
        return time.perf_counter() - t0, time.process_time() - c0

    def run(self, n):
        """Seconds (wall, process CPU) per step over `n` steps back to back."""
        params, state = self.params, self.state
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            params, state, value = self.step(self.fixed, params, state)
        jax.block_until_ready((params, state, value))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        self.params, self.state = params, state
        return wall / n, cpu / n

    def model(self):
        """The trained model's arrays as NumPy, as a tree of the model's shape."""
        params = self.params
        if isinstance(params, eqopt.Packed):
            params = params.unpack()
        return jax.tree.map(np.asarray, eqx.filter(params, eqx.is_array))


PAIRS = (
    ("groups", OPTAX),
    ("packed-groups", "groups"),
    ("eqopt-aa", BASE),
    ("packed", BASE),
)
#: Largest difference allowed, relative to the largest value of its leaf: the
#: updates of the optimisers alone, on the same gradients (float rounding: the
#: same clipped AdamW without groups differs from Optax's by 7e-6 after a step;
#: weight decay is 0.5% of these updates)...
UPDATE_TOLERANCE = 1e-4
#: ...and the change of the params after training steps, where it is the median
#: over each leaf: two programs' gradients differ in the last bits, and early
#: Adam steps (v small) magnify that where a gradient is zero but for rounding
#: (the key bias: softmax ignores it; its sign decides the step). Wrong
#: multipliers move whole leaves by 25% (layer decay 0.75).
TRAIN_TOLERANCE = 1e-2


def _worst(xs, ys):
    """The largest `max |x - y| / max |y|` over the leaves."""
    return max(
        float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30))
        for x, y in zip(xs, ys, strict=True)
    )


def _random_like(tree, seed):
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return treedef.unflatten(
        [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
    )


def check_updates(runners, model, log):
    """The groups' `update` gives Optax's (and packed, the groups'), on the same
    random gradients, for `CHECK_STEPS` steps from the same params."""
    found = {}
    arrays = eqx.filter(model, eqx.is_array)
    shown = [v for v in ("groups", OPTAX, "packed-groups") if v in runners]
    updates = {}
    for variant in shown:
        opt = runners[variant].opt
        params = eqopt.pack(model) if variant.startswith("packed") else arrays
        state, update, out = opt.init(params), eqx.filter_jit(opt.update), []
        for step in range(CHECK_STEPS):
            grads = _random_like(arrays, step)
            if isinstance(params, eqopt.Packed):
                grads = eqopt.Packed.like(params, grads)
            u, state = update(grads, state, params)
            u = u.unpack() if isinstance(u, eqopt.Packed) else u
            out.extend(np.asarray(x) for x in jax.tree.leaves(u))
        updates[variant] = out
    for a, b in PAIRS[:2]:
        if a in updates and b in updates:
            found[f"{a} vs {b}"] = _worst(updates[a], updates[b])
    log(
        f"  updates over {CHECK_STEPS} steps, max |difference| / max |update| "
        "per leaf: " + ", ".join(f"{k} {v:.2g}" for k, v in found.items())
    )
    for pair, value in found.items():
        if value > UPDATE_TOLERANCE:
            raise AssertionError(f"{pair}: the updates differ ({value:.2g})")
    return found


def check_training(runners, initial, log):
    """After `CHECK_STEPS` training steps each from the same params, the groups
    changed the params as Optax did (and packed as per leaf; the A/A run exactly),
    and not as without groups: per leaf, the median `|difference| / max |change|`."""
    start = jax.tree.leaves(initial)
    change = {
        v: [a - b for a, b in zip(jax.tree.leaves(r.model()), start, strict=True)]
        for v, r in runners.items()
    }
    found = {
        f"{a} vs {b}": max(
            float(np.median(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30))
            for x, y in zip(change[a], change[b], strict=True)
        )
        for a, b in (*PAIRS, ("groups", BASE))
        if a in change and b in change
    }
    log(
        f"  after {CHECK_STEPS} training steps, median |difference| / max |change|, "
        "its worst leaf: " + ", ".join(f"{k} {v:.2g}" for k, v in found.items())
    )
    for pair, value in found.items():
        if pair == f"groups vs {BASE}":
            assert value > 0.1, f"{pair}: the groups changed nothing ({value:.2g})"
        elif value > (0 if pair == f"eqopt-aa vs {BASE}" else TRAIN_TOLERANCE):
            raise AssertionError(f"{pair}: the params differ ({value:.2g})")
    return found


def mirrored(round_, variants):
    k = (round_ // 2) % len(variants)
    order = variants[k:] + variants[:k]
    return order if round_ % 2 == 0 else order[::-1]


def bench(args, log):
    variants = args.variants
    model = Transformer(args)
    batch = make_batch(args)
    initial = jax.tree.map(np.asarray, eqx.filter(model, eqx.is_array))
    runners = {v: Runner(v, model, batch, args.blocks) for v in variants}
    leaves = jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array))
    result = {
        "leaves": len(leaves),
        "params": sum(x.size for x in leaves),
        "groups": {v: r.groups for v, r in runners.items()},
        # Per clock and variant: one number a round (the steps' median).
        **{
            f"{what}_{clock}": {v: [] for v in variants}
            for what in ("first_call", "step")
            for clock in ("s", "cpu_s")
        },
        "samples": [],  # every step sample, per round: (wall, CPU) per variant
    }
    for round_ in range(args.rounds):
        for variant in mirrored(round_, variants):
            wall, cpu = runners[variant].first_call()
            result["first_call_s"][variant].append(wall)
            result["first_call_cpu_s"][variant].append(cpu)
        if round_ == 0:
            for runner in runners.values():
                runner.run(CHECK_STEPS - 1)
            result["check"] = {
                "updates": check_updates(runners, model, log),
                "training": check_training(runners, initial, log),
            }
        for runner in runners.values():
            runner.run(args.warmup)
        # Steps per sample: about `rep_seconds` of (a)'s steps.
        per_step = runners[BASE].run(1)[0]
        n = max(1, round(args.rep_seconds / max(per_step, 1e-6)))
        samples = {v: [] for v in variants}
        for rep in range(args.step_reps):
            order = variants if rep % 2 == 0 else variants[::-1]
            for variant in order:
                samples[variant].append(runners[variant].run(n))
        result["samples"].append(samples)
        for variant in variants:
            for i, clock in enumerate(("s", "cpu_s")):
                times = [sample[i] for sample in samples[variant]]
                result[f"step_{clock}"][variant].append(statistics.median(times))
        log(
            f"  round {round_ + 1}/{args.rounds} ({n} steps a sample, load "
            f"{os.getloadavg()[0]:.1f}): step ms "
            + " ".join(f"{v}={1e3 * result['step_s'][v][-1]:.4g}" for v in variants)
            + "; first call s "
            + " ".join(f"{v}={result['first_call_s'][v][-1]:.3g}" for v in variants)
        )
    return result


def ratios(result, metric, base):
    times = result[metric]
    return {
        v: geometric_mean([x / b for x, b in zip(t, times[base], strict=True)])
        for v, t in times.items()
    }


def table(result):
    step_a = ratios(result, "step_s", BASE)
    step_b = ratios(result, "step_s", OPTAX) if OPTAX in result["step_s"] else {}
    first_a = ratios(result, "first_call_s", BASE)
    cpu_a = ratios(result, "step_cpu_s", BASE)
    first_cpu_a = ratios(result, "first_call_cpu_s", BASE)
    header = (
        "variant",
        "groups",
        "step vs (a)",
        "step vs (b)",
        "first call vs (a)",
        "CPU time: step vs (a)",
        "CPU time: first call vs (a)",
        "step ms",
        "first call s",
    )
    rows = [
        (
            ROWS[v],
            str(result["groups"][v]),
            f"{step_a[v]:.3f}",
            f"{step_b[v]:.3f}" if step_b else "-",
            f"{first_a[v]:.3f}",
            f"{cpu_a[v]:.3f}",
            f"{first_cpu_a[v]:.3f}",
            f"{1e3 * geometric_mean(result['step_s'][v]):.3g}",
            f"{geometric_mean(result['first_call_s'][v]):.3g}",
        )
        for v in result["step_s"]
    ]
    return markdown_table(header, rows, numeric=set(range(1, len(header))))


QUICK = {"rounds": 2, "step_reps": 11, "rep_seconds": 0.2}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds, fewer samples")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="a subset of " + ",".join(VARIANTS) + f" ({BASE} is always run)",
    )
    parser.add_argument("--rounds", type=int, default=4, help="compile rounds (even)")
    parser.add_argument("--step-reps", type=int, default=21, help="samples per round")
    parser.add_argument("--rep-seconds", type=float, default=0.3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args(argv)
    return finish_args(parser, args, argv, VARIANTS, BASE, QUICK)


def main(argv=None):
    args = parse_args(argv)
    log = stderr_log()

    machine = (
        f"{jax.devices()[0].device_kind}, {platform.machine()}, {os.cpu_count()} cores"
    )
    load_before = os.getloadavg()
    versions = (
        f"jax {jax.__version__}, equinox {eqx.__version__}, optax {optax.__version__}"
    )
    log(f"{versions}, {machine}, load average {load_before[0]:.1f}")
    result = bench(args, log)
    load_after = os.getloadavg()
    log(f"done, load average {load_after[0]:.1f}")
    text = table(result)
    print(
        f"{args.blocks} blocks of width {args.width}, {result['params']:,} params in "
        f"{result['leaves']} leaves, batch {args.batch}x{args.context} tokens; "
        f"{args.rounds} rounds of {args.step_reps} interleaved samples; {machine}, "
        f"load {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    print(text)
    if args.json:
        result.update(
            args=vars(args),
            versions=versions,
            machine=machine,
            load_average={"before": load_before, "after": load_after},
            table=text,
        )
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
