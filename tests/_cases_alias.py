"""Registry cases for the optimisers of `eqopt/_alias.py`."""

import jax
import jax.numpy as jnp
import optax
from registry import Case, spec_like

import eqopt
import eqopt.schedules

ALL_F32 = ("float32", "bfloat16", "complex64")
REAL = ("float32", "bfloat16")


def _schedule(count):
    return 0.1 / (1.0 + count)


def _matrices(x):
    return x.ndim > 1


def _optax_matrices(params):
    return {k: v.ndim > 1 for k, v in params.items()}


TRANSFORM_CASES = [
    Case(
        "sgd",
        lambda: eqopt.sgd(0.1),
        lambda: optax.sgd(0.1),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "sgd-momentum",
        lambda: eqopt.sgd(0.1, momentum=0.9),
        lambda: optax.sgd(0.1, momentum=0.9),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "sgd-nesterov-schedule",
        lambda: eqopt.sgd(_schedule, momentum=0.8, nesterov=True),
        lambda: optax.sgd(_schedule, momentum=0.8, nesterov=True),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "sgd-accumulator_dtype",
        lambda: eqopt.sgd(0.1, momentum=0.9, accumulator_dtype=jnp.bfloat16),
        lambda: optax.sgd(0.1, momentum=0.9, accumulator_dtype=jnp.bfloat16),
        ("float32",),
        needs_params=False,
        rtol=1e-2,
        atol=1e-2,
    ),
    Case(
        "adam",
        lambda: eqopt.adam(1e-2),
        lambda: optax.adam(1e-2),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "adam-cosine_schedule",
        lambda: eqopt.adam(
            eqopt.schedules.cosine_decay_schedule(0.1, 5), b1=0.8, eps_root=1e-8
        ),
        lambda: optax.adam(optax.cosine_decay_schedule(0.1, 5), b1=0.8, eps_root=1e-8),
        REAL,
        needs_params=False,
    ),
    Case(
        "nadam",
        lambda: eqopt.nadam(1e-2),
        lambda: optax.nadam(1e-2),
        ALL_F32,
        needs_params=False,
    ),
    Case("adamw", lambda: eqopt.adamw(1e-2), lambda: optax.adamw(1e-2), ALL_F32),
    Case(
        # eqopt's callable mask is a per-leaf predicate; Optax's is a function of
        # the whole params returning a tree of bools.
        "adamw-mask-predicate",
        lambda: eqopt.adamw(1e-2, weight_decay=0.1, mask=_matrices),
        lambda: optax.adamw(1e-2, weight_decay=0.1, mask=_optax_matrices),
        ALL_F32,
    ),
    Case(
        "adamw-mask-tree-schedule",
        lambda p: eqopt.adamw(
            1e-2, weight_decay=_schedule, mask=spec_like(p, w=True, s=True)
        ),
        lambda: optax.adamw(
            1e-2, weight_decay=_schedule, mask={"w": True, "b": False, "s": True}
        ),
    ),
    Case(
        "nadamw",
        lambda: eqopt.nadamw(1e-2, weight_decay=0.1),
        lambda: optax.nadamw(1e-2, weight_decay=0.1),
        ALL_F32,
    ),
    Case(
        "amsgrad",
        lambda: eqopt.amsgrad(1e-2),
        lambda: optax.amsgrad(1e-2),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "amsgrad-no_bias_correction",
        lambda: eqopt.amsgrad(1e-2, bias_correction_mu=False, bias_correction_nu=False),
        lambda: optax.amsgrad(1e-2, bias_correction_mu=False, bias_correction_nu=False),
        needs_params=False,
    ),
    Case(
        "adamax",
        lambda: eqopt.adamax(1e-2),
        lambda: optax.adamax(1e-2),
        needs_params=False,
    ),
    Case(
        "adamaxw",
        lambda: eqopt.adamaxw(1e-2, weight_decay=0.1, mask=_matrices),
        lambda: optax.adamaxw(1e-2, weight_decay=0.1, mask=_optax_matrices),
    ),
    Case(
        "rmsprop",
        lambda: eqopt.rmsprop(1e-2),
        lambda: optax.rmsprop(1e-2),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "rmsprop-centered-nesterov",
        lambda: eqopt.rmsprop(
            1e-2, centered=True, eps=1e-2, momentum=0.9, nesterov=True
        ),
        lambda: optax.rmsprop(
            1e-2, centered=True, eps=1e-2, momentum=0.9, nesterov=True
        ),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        # PyTorch's RMSprop: eps outside the root.
        "rmsprop-eps_outside-bias_correction",
        lambda: eqopt.rmsprop(
            _schedule,
            decay=0.5,
            eps_in_sqrt=False,
            bias_correction=True,
            initial_scale=0.1,
        ),
        lambda: optax.rmsprop(
            _schedule,
            decay=0.5,
            eps_in_sqrt=False,
            bias_correction=True,
            initial_scale=0.1,
        ),
        REAL,
        needs_params=False,
    ),
    Case(
        "adagrad",
        lambda: eqopt.adagrad(0.1),
        lambda: optax.adagrad(0.1),
        ALL_F32,
        needs_params=False,
    ),
    Case("lion", lambda: eqopt.lion(1e-3), lambda: optax.lion(1e-3), ALL_F32),
    Case(
        "lion-mask-mu_dtype",
        lambda: eqopt.lion(
            1e-3, b1=0.5, weight_decay=0.1, mask=_matrices, mu_dtype=jnp.bfloat16
        ),
        lambda: optax.lion(
            1e-3, b1=0.5, weight_decay=0.1, mask=_optax_matrices, mu_dtype=jnp.bfloat16
        ),
        ("float32",),
    ),
    Case(
        "sign_sgd",
        lambda: eqopt.sign_sgd(0.1),
        lambda: optax.sign_sgd(0.1),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "signum",
        lambda: eqopt.signum(_schedule, beta=0.5),
        lambda: optax.signum(_schedule, beta=0.5),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "noisy_sgd",
        lambda: eqopt.noisy_sgd(0.1, key=jax.random.key(1)),
        lambda: optax.noisy_sgd(0.1, key=jax.random.key(1)),
        ALL_F32,
        needs_params=False,
        random=True,
        no_parity_reason="random; bit-exact parity on equal trees in test_noise.py",
    ),
]
