"""Registry cases for the core transforms and combinators."""

import jax
import jax.numpy as jnp
import optax
from registry import Case, spec_like

import eqopt

ALL_F32 = ("float32", "bfloat16", "complex64")


def _double_plus_params(updates, params):
    return jax.tree.map(
        lambda g, p: None if g is None else 2 * g + p,
        updates,
        params,
        is_leaf=lambda x: x is None,
    )


def _schedule(count):
    return 0.1 / (1.0 + count)


TRANSFORM_CASES = [
    Case("identity", eqopt.identity, optax.identity, ALL_F32, needs_params=False),
    Case(
        "set_to_zero", eqopt.set_to_zero, optax.set_to_zero, ALL_F32, needs_params=False
    ),
    Case(
        "scale",
        lambda: eqopt.scale(-0.3),
        lambda: optax.scale(-0.3),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_learning_rate",
        lambda: eqopt.scale_by_learning_rate(0.1),
        lambda: optax.scale_by_learning_rate(0.1),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_learning_rate-schedule",
        lambda: eqopt.scale_by_learning_rate(_schedule),
        lambda: optax.scale_by_learning_rate(_schedule),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_schedule",
        lambda: eqopt.scale_by_schedule(_schedule),
        lambda: optax.scale_by_schedule(_schedule),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "trace",
        lambda: eqopt.trace(0.9),
        lambda: optax.trace(0.9),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "trace-nesterov",
        lambda: eqopt.trace(0.9, nesterov=True),
        lambda: optax.trace(0.9, nesterov=True),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "ema",
        lambda: eqopt.ema(0.9),
        lambda: optax.ema(0.9),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "ema-nodebias",
        lambda: eqopt.ema(0.8, debias=False),
        lambda: optax.ema(0.8, debias=False),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "add_decayed_weights",
        lambda: eqopt.add_decayed_weights(0.1),
        lambda: optax.add_decayed_weights(0.1),
        ALL_F32,
    ),
    Case(
        "add_decayed_weights-mask",
        lambda: eqopt.add_decayed_weights(0.1, mask=lambda x: x.ndim > 1),
        lambda: optax.add_decayed_weights(
            0.1, mask=lambda p: {k: v.ndim > 1 for k, v in p.items()}
        ),
        ALL_F32,
    ),
    Case(
        "add_decayed_weights-schedule",
        lambda: eqopt.add_decayed_weights(_schedule),
        lambda: optax.add_decayed_weights(_schedule),
        ALL_F32,
    ),
    Case("clip", lambda: eqopt.clip(0.5), lambda: optax.clip(0.5), needs_params=False),
    Case(
        "clip_by_global_norm",
        lambda: eqopt.clip_by_global_norm(1.0),
        lambda: optax.clip_by_global_norm(1.0),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_adam",
        eqopt.scale_by_adam,
        optax.scale_by_adam,
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_adam-nesterov",
        lambda: eqopt.scale_by_adam(b1=0.8, eps_root=1e-8, nesterov=True),
        lambda: optax.scale_by_adam(b1=0.8, eps_root=1e-8, nesterov=True),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_adam-mu_dtype",
        lambda: eqopt.scale_by_adam(mu_dtype=jnp.bfloat16),
        lambda: optax.scale_by_adam(mu_dtype=jnp.bfloat16),
        ("float32",),
        needs_params=False,
        rtol=1e-2,
        atol=1e-2,
    ),
    Case(
        "scale_by_amsgrad",
        eqopt.scale_by_amsgrad,
        optax.scale_by_amsgrad,
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "scale_by_adamax",
        eqopt.scale_by_adamax,
        optax.scale_by_adamax,
        needs_params=False,
    ),
    Case(
        "chain",
        lambda: eqopt.chain(
            eqopt.clip_by_global_norm(1.0), eqopt.scale_by_adam(), eqopt.scale(-0.1)
        ),
        lambda: optax.chain(
            optax.clip_by_global_norm(1.0), optax.scale_by_adam(), optax.scale(-0.1)
        ),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "named_chain",
        lambda: eqopt.named_chain(
            ("clip", eqopt.clip(1.0)), ("momentum", eqopt.trace(0.5))
        ),
        lambda: optax.named_chain(
            ("clip", optax.clip(1.0)), ("momentum", optax.trace(0.5))
        ),
        needs_params=False,
    ),
    Case(
        "masked",
        lambda: eqopt.masked(eqopt.scale_by_adam(), lambda x: x.ndim > 1),
        lambda: optax.masked(
            optax.scale_by_adam(), lambda p: {k: v.ndim > 1 for k, v in p.items()}
        ),
        ALL_F32,
    ),
    Case(
        "masked-tree",
        lambda p: eqopt.masked(eqopt.trace(0.9), spec_like(p, w=True, s=True)),
        lambda: optax.masked(optax.trace(0.9), {"w": True, "b": False, "s": True}),
    ),
    Case(
        "masked-nested",
        lambda p: eqopt.masked(
            eqopt.masked(eqopt.scale(2.0), spec_like(p, w=True, b=True)),
            lambda x: x.ndim >= 1,
        ),
        lambda: optax.masked(
            optax.masked(optax.scale(2.0), {"w": True, "b": True, "s": False}),
            lambda p: {k: v.ndim >= 1 for k, v in p.items()},
        ),
    ),
    Case(
        "partition",
        lambda: eqopt.partition(
            {"adam": eqopt.scale_by_adam(), "sgd": eqopt.scale(-0.1)},
            {"adam": lambda x: x.ndim > 1, "sgd": lambda x: x.ndim <= 1},
        ),
        lambda: optax.partition(
            {"adam": optax.scale_by_adam(), "sgd": optax.scale(-0.1)},
            lambda p: {k: "adam" if v.ndim > 1 else "sgd" for k, v in p.items()},
        ),
    ),
    Case(
        "partition-labels",
        lambda p: eqopt.partition(
            {"a": eqopt.trace(0.5), "b": eqopt.scale(-0.1)},
            spec_like(p, w="a", b="b", s="a"),
        ),
        lambda: optax.partition(
            {"a": optax.trace(0.5), "b": optax.scale(-0.1)},
            {"w": "a", "b": "b", "s": "a"},
        ),
    ),
    Case(
        "freeze",
        lambda p: eqopt.chain(eqopt.freeze(spec_like(p, b=True)), eqopt.scale(-0.1)),
        lambda: optax.chain(
            optax.freeze({"w": False, "b": True, "s": False}), optax.scale(-0.1)
        ),
    ),
    Case(
        "selective_transform",
        lambda: eqopt.selective_transform(
            eqopt.scale_by_adam(), freeze_mask=lambda x: x.ndim == 1
        ),
        lambda: optax.selective_transform(
            optax.scale_by_adam(), freeze_mask={"w": False, "b": True, "s": False}
        ),
    ),
    Case(
        "stateless",
        lambda: eqopt.stateless(_double_plus_params),
        lambda: optax.stateless(_double_plus_params),
    ),
    Case(
        "stateless_with_tree_map",
        lambda: eqopt.stateless_with_tree_map(lambda g, p: g * 2 + p),
        lambda: optax.stateless_with_tree_map(lambda g, p: g * 2 + p),
        ALL_F32,
    ),
]
