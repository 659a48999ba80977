"""Registry cases for the wrappers: inject_hyperparams and inject_stateful_hyperparams."""

import jax.numpy as jnp
import optax
from jaxtyping import Array, Float
from registry import Case

import eqopt
import eqopt.schedules

ALL_F32 = ("float32", "bfloat16", "complex64")


def _schedule(count):
    return 0.1 / (1.0 + count)


# Factories are module-level so that each case's transform keeps the same
# (hashable, static) factory across calls.
def _adam_then_rate(learning_rate, b1=0.9):
    return eqopt.chain(
        eqopt.scale_by_adam(b1=b1), eqopt.scale_by_learning_rate(learning_rate)
    )


def _optax_adam_then_rate(learning_rate, b1=0.9):
    return optax.chain(
        optax.scale_by_adam(b1=b1), optax.scale_by_learning_rate(learning_rate)
    )


def _matrices(x):
    return x.ndim > 1


def _optax_matrices(params):
    return {k: v.ndim > 1 for k, v in params.items()}


class GeometricDecay(eqopt.AbstractStatefulSchedule):
    """A stateful schedule: its state is the current value, multiplied by `decay` each step.

    It has Optax's `init` / `update` / `__call__`, so the same object is given to
    Optax as the oracle.
    """

    init_value: float
    decay: float

    def init(self) -> Float[Array, ""]:
        return jnp.asarray(self.init_value, jnp.float32)

    def update(self, state, **extra_args):
        return state * self.decay

    def __call__(self, state, **extra_args):
        return state


TRANSFORM_CASES = [
    Case(
        "inject_hyperparams-scale_by_learning_rate",
        lambda: eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(0.1),
        lambda: optax.inject_hyperparams(optax.scale_by_learning_rate)(0.1),
        ALL_F32,
        needs_params=False,
    ),
    Case(
        "inject_hyperparams-scale_by_adam",
        lambda: eqopt.inject_hyperparams(eqopt.scale_by_adam)(b1=0.8, eps_root=1e-8),
        lambda: optax.inject_hyperparams(optax.scale_by_adam)(b1=0.8, eps_root=1e-8),
        # With bfloat16 params both round b2=0.999 to 1 and give nan: see the
        # hyperparam_dtype case.
        ("float32",),
        needs_params=False,
    ),
    Case(
        "inject_hyperparams-scale_by_adam-hyperparam_dtype",
        lambda: eqopt.inject_hyperparams(
            eqopt.scale_by_adam, hyperparam_dtype=jnp.float32
        )(),
        lambda: optax.inject_hyperparams(
            optax.scale_by_adam, hyperparam_dtype=jnp.float32
        )(),
        needs_params=False,
    ),
    Case(
        "inject_hyperparams-schedule",
        lambda: eqopt.inject_hyperparams(_adam_then_rate)(
            learning_rate=_schedule, b1=0.8
        ),
        lambda: optax.inject_hyperparams(_optax_adam_then_rate)(
            learning_rate=_schedule, b1=0.8
        ),
        ("float32",),
        needs_params=False,
        steps=5,
    ),
    Case(
        "inject_hyperparams-schedule_module",
        lambda: eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(
            learning_rate=eqopt.schedules.cosine_decay_schedule(0.1, 4, alpha=0.1)
        ),
        lambda: optax.inject_hyperparams(optax.scale_by_learning_rate)(
            learning_rate=optax.cosine_decay_schedule(0.1, 4, alpha=0.1)
        ),
        needs_params=False,
        steps=6,
    ),
    Case(
        "inject_hyperparams-static_args",
        lambda: eqopt.inject_hyperparams(eqopt.add_decayed_weights, static_args="mask")(
            0.1, mask=_matrices
        ),
        lambda: optax.inject_hyperparams(optax.add_decayed_weights, static_args="mask")(
            0.1, mask=_optax_matrices
        ),
        ALL_F32,
    ),
    Case(
        "inject_stateful_hyperparams-schedule",
        lambda: eqopt.inject_stateful_hyperparams(_adam_then_rate)(
            learning_rate=_schedule
        ),
        # Optax's inject_hyperparams is its stateful one (inject_stateful_hyperparams
        # is a deprecated alias).
        lambda: optax.inject_hyperparams(_optax_adam_then_rate)(
            learning_rate=_schedule
        ),
        ("float32",),
        needs_params=False,
    ),
    Case(
        "inject_hyperparams-stateful_schedule",
        lambda: eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(
            learning_rate=GeometricDecay(0.2, 0.5)
        ),
        lambda: optax.inject_hyperparams(optax.scale_by_learning_rate)(
            learning_rate=GeometricDecay(0.2, 0.5)
        ),
        ALL_F32,
        needs_params=False,
    ),
]

if hasattr(eqopt, "adam"):  # the optimiser aliases may land after this file
    TRANSFORM_CASES.append(
        Case(
            "inject_hyperparams-adam",
            lambda: eqopt.inject_hyperparams(eqopt.adam)(
                learning_rate=_schedule, b1=0.8
            ),
            lambda: optax.inject_hyperparams(optax.adam)(
                learning_rate=_schedule, b1=0.8
            ),
            ("float32",),
            needs_params=False,
            steps=5,
        )
    )
