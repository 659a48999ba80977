"""The parameter trees and optimiser cases of `step_bench.py` (and `train_step_bench.py`).

Split from `step_bench.py`, which imports them (and re-exports them, so
`step_bench.make_resnet` still works).
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import eqopt

LEARNING_RATE = 1e-3
WEIGHT_DECAY = 1e-4


# ---------------------------------------------------------------------------
# Parameter trees
# ---------------------------------------------------------------------------


def make_mlp(args, key):
    """An `eqx.nn.MLP`: array leaves plus activation functions and sizes."""
    return eqx.nn.MLP(
        args.mlp_in, 10, width_size=args.mlp_width, depth=args.mlp_depth, key=key
    )


def make_transformer(args, key):
    """A dict shaped like a decoder-only transformer's parameters."""
    d, f, vocab = args.tf_width, 4 * args.tf_width, args.tf_vocab
    rng = np.random.default_rng(args.seed)

    def normal(shape, scale):
        return jnp.asarray(rng.standard_normal(shape, np.float32) * scale)

    def dense(n_in, n_out):
        return {
            "w": normal((n_in, n_out), 1 / math.sqrt(n_in)),
            "b": jnp.zeros((n_out,), jnp.float32),
        }

    def layer_norm():
        return {
            "scale": jnp.ones((d,), jnp.float32),
            "bias": jnp.zeros((d,), jnp.float32),
        }

    blocks = [
        {
            "ln1": layer_norm(),
            "qkv": dense(d, 3 * d),
            "out": dense(d, d),
            "ln2": layer_norm(),
            "mlp_in": dense(d, f),
            "mlp_out": dense(f, d),
        }
        for _ in range(args.tf_blocks)
    ]
    return {
        "embed": normal((vocab, d), 0.02),
        "pos_embed": normal((args.tf_context, d), 0.02),
        "blocks": blocks,
        "ln_f": layer_norm(),
    }


SMALL_SHAPES = ((8, 8), (16,), (4, 16), (32,), (2, 4, 8))


def make_small(args, key):
    """A dict of many small leaves of mixed shapes (matrices and vectors)."""
    rng = np.random.default_rng(args.seed)
    width = len(str(args.small_leaves - 1))
    return {
        f"p{i:0{width}d}": jnp.asarray(
            rng.standard_normal(SMALL_SHAPES[i % len(SMALL_SHAPES)], np.float32)
        )
        for i in range(args.small_leaves)
    }


def make_resnet(args, key):
    """A dict shaped like a ResNet-50's parameters, narrowed to ~11M parameters.

    Bottleneck blocks (1x1, 3x3, 1x1 convolutions, each followed by a batch-norm
    scale and bias) in stages of 3, 4, 6 and 3 blocks, a projection at the start
    of each stage, a stem and a dense head: 161 leaves, from a 1344x1000 head
    and 3x3x336x336 convolutions down to 42-element scales.
    """
    rng = np.random.default_rng(args.seed)
    width = args.resnet_width

    def conv(k, c_in, c_out):
        return jnp.asarray(
            rng.standard_normal((k, k, c_in, c_out), np.float32)
            / math.sqrt(k * k * c_in)
        )

    def norm(c):
        return {
            "scale": jnp.ones((c,), jnp.float32),
            "bias": jnp.zeros((c,), jnp.float32),
        }

    params = {"stem": {"w": conv(7, 3, width), "bn": norm(width)}}
    channels = width
    for stage, n_blocks in enumerate((3, 4, 6, 3)):
        mid = width * 2**stage
        out = 4 * mid
        for block in range(n_blocks):
            layer = {
                "conv1": conv(1, channels, mid),
                "bn1": norm(mid),
                "conv2": conv(3, mid, mid),
                "bn2": norm(mid),
                "conv3": conv(1, mid, out),
                "bn3": norm(out),
            }
            if block == 0:
                layer["proj"] = conv(1, channels, out)
                layer["proj_bn"] = norm(out)
            params[f"s{stage}b{block}"] = layer
            channels = out
    params["head"] = {
        "w": jnp.asarray(rng.standard_normal((channels, 1000), np.float32) * 0.01),
        "b": jnp.zeros((1000,), jnp.float32),
    }
    return params


def make_onebig(args, key):
    """One large leaf: the case where the step should run at memory bandwidth."""
    rng = np.random.default_rng(args.seed)
    # A matrix, so that the weight-decay mask of `clip+adamw+cos` selects it.
    rows = max(1, args.onebig_size // 1024)
    return {"w": jnp.asarray(rng.standard_normal((rows, 1024), np.float32))}


TREE_MAKERS = {
    "mlp": make_mlp,
    "resnet": make_resnet,
    "transformer": make_transformer,
    "small": make_small,
    "onebig": make_onebig,
}


# ---------------------------------------------------------------------------
# Optimisers
# ---------------------------------------------------------------------------


def is_matrix(x):
    return x.ndim > 1


def make_optimiser(lib, case, total_steps):
    """The same optimiser in either library (`lib` is `optax` or `eqopt`)."""
    m = optax if lib == "optax" else eqopt
    if case == "sgdm":
        return m.sgd(LEARNING_RATE, momentum=0.9)
    if case == "adam":
        return m.adam(LEARNING_RATE)
    if case == "adamw":
        return m.adamw(LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    if case == "lion":
        return m.lion(LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    if case == "rmsprop":
        return m.rmsprop(LEARNING_RATE)
    if case == "adafactor":
        return m.adafactor(LEARNING_RATE)
    schedule = m.warmup_cosine_decay_schedule(
        0.0,
        LEARNING_RATE,
        total_steps // 10,
        total_steps,
        end_value=LEARNING_RATE / 100,
    )
    if lib == "optax":
        # An Optax callable mask is a function of the whole params.
        mask = lambda params: jax.tree.map(is_matrix, params)  # noqa: E731
    else:
        # An eqopt callable mask is a per-leaf predicate (an Equinox filter spec).
        mask = is_matrix
    return m.chain(
        m.clip_by_global_norm(1.0),
        m.adamw(schedule, weight_decay=WEIGHT_DECAY, mask=mask),
    )


# ---------------------------------------------------------------------------
# Jitted steps
# ---------------------------------------------------------------------------
