"""Stateful schedules (`eqopt/schedules/_stateful.py`): `AbstractStatefulSchedule`,
Optax's protocol, `WrappedSchedule`, and their use by `inject_hyperparams` and
`inject_stateful_hyperparams`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    ALL_DTYPES,
    Case,
    adam_b1_then_rate,
    adam_then_rate,
    assert_tree_allclose,
    decaying_schedule,
    optax_adam_b1_then_rate,
    optax_adam_then_rate,
    run_both,
    small_grads,
    small_params,
)
from jaxtyping import Array, Float

import eqopt


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
        "inject_stateful_hyperparams-schedule",
        lambda: eqopt.inject_stateful_hyperparams(adam_b1_then_rate)(
            learning_rate=decaying_schedule
        ),
        # Optax's inject_hyperparams is its stateful one (inject_stateful_hyperparams
        # is a deprecated alias).
        lambda: optax.inject_hyperparams(optax_adam_b1_then_rate)(
            learning_rate=decaying_schedule
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
        ALL_DTYPES,
        needs_params=False,
    ),
]


# ---------------------------------------------------------------------------
# Stateful schedules
# ---------------------------------------------------------------------------


class HalveOnIncrease(eqopt.AbstractStatefulSchedule):
    """Halves the value whenever the loss is worse than the best so far."""

    init_value: float

    def init(self) -> dict[str, Float[Array, ""]]:
        return {"scale": jnp.array(1.0), "best": jnp.array(jnp.inf)}

    def update(self, state, *, loss, **extra_args):
        worse = loss > state["best"]
        return {
            "scale": jnp.where(worse, state["scale"] / 2, state["scale"]),
            "best": jnp.minimum(loss, state["best"]),
        }

    def __call__(self, state, **extra_args):
        return self.init_value * state["scale"]


LOSSES = [3.0, 2.0, 2.5, 1.0, 1.5, 1.8]


def test_stateful_schedule_matches_optax():
    schedule = HalveOnIncrease(0.4)
    tx = eqopt.inject_hyperparams(adam_then_rate)(learning_rate=schedule)
    assert isinstance(tx, eqopt.InjectStatefulHyperparams)
    # The same object satisfies Optax's StatefulSchedule protocol.
    reference = optax.inject_hyperparams(optax_adam_then_rate)(learning_rate=schedule)
    state, _ = run_both(
        tx,
        reference,
        steps=len(LOSSES),
        extra_args=lambda step: {"loss": jnp.asarray(LOSSES[step])},
    )
    assert isinstance(state, eqopt.InjectStatefulHyperparamsState)
    # Worse at steps 2, 4 and 5: halved three times, the last halving not used yet.
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(0.1)
    assert float(state.hyperparams_states["learning_rate"]["scale"]) == pytest.approx(
        0.125
    )


def test_stateful_schedule_under_jit():
    tx = eqopt.inject_stateful_hyperparams(eqopt.scale_by_learning_rate)(
        learning_rate=HalveOnIncrease(0.4)
    )
    params, grads = small_params(), small_grads(0)
    traces = []

    @eqx.filter_jit
    def step(tx, state, loss):
        traces.append(None)
        return tx.update(grads, state, params, loss=loss)

    state = tx.init(params)
    for loss in LOSSES:
        updates, state = step(tx, state, jnp.asarray(loss))
    assert len(traces) == 1
    assert_tree_allclose(updates, jax.tree.map(lambda g: -0.1 * g, grads))


def test_stateful_wrapper_with_plain_schedule():
    tx = eqopt.inject_stateful_hyperparams(eqopt.scale_by_learning_rate)(
        learning_rate=decaying_schedule, flip_sign=False
    )
    assert isinstance(tx, eqopt.InjectStatefulHyperparams)
    state = tx.init(small_params())
    assert isinstance(
        state.hyperparams_states["learning_rate"], eqopt.ScheduleCountState
    )
    for step in range(3):
        grads = small_grads(step)
        updates, state = tx.update(grads, state)
        assert_tree_allclose(
            updates, jax.tree.map(lambda g, t=step: decaying_schedule(t) * g, grads)
        )
    assert int(state.hyperparams_states["learning_rate"].count) == 3 == int(state.count)


def test_inject_hyperparams_class_rejects_stateful_schedule():
    with pytest.raises(TypeError, match="`learning_rate` is a stateful schedule"):
        eqopt.InjectHyperparams(
            eqopt.scale_by_learning_rate, kwargs={"learning_rate": HalveOnIncrease(0.1)}
        )


@pytest.mark.filterwarnings("ignore:inject_stateful_hyperparams is deprecated")
def test_wrapped_schedule_matches_optax():
    """`WrappedSchedule` is Optax's: a plain schedule made stateful, counting its own steps."""
    import optax

    schedule = lambda count: 0.1 / (1.0 + count)  # noqa: E731
    params = {"w": jnp.arange(3.0)}
    grads = {"w": jnp.array([1.0, -2.0, 0.5])}
    ours = eqopt.inject_stateful_hyperparams(eqopt.scale_by_learning_rate)(
        learning_rate=eqopt.WrappedSchedule(schedule)
    )
    theirs = optax.inject_stateful_hyperparams(optax.scale_by_learning_rate)(
        learning_rate=optax.WrappedSchedule(schedule)
    )
    state, reference_state = ours.init(params), theirs.init(params)
    for _ in range(4):
        updates, state = ours.update(grads, state, params)
        reference_updates, reference_state = theirs.update(
            grads, reference_state, params
        )
        np.testing.assert_allclose(updates["w"], reference_updates["w"], rtol=1e-6)
    wrapped = eqopt.WrappedSchedule(schedule)
    assert float(wrapped(wrapped.update(wrapped.init()))) == pytest.approx(0.05)


def test_wrapped_schedule_state_reads_as_its_count():
    """Optax's `WrappedSchedule` state is a one-field NamedTuple that NumPy reads
    as `[count]`: eqopt's reads the same, so `np.testing.assert_allclose(count,
    state)` holds for both, step after step."""
    schedule = eqopt.schedules.linear_schedule(1.0, 0.0, 10)
    for wrapped in (eqopt.WrappedSchedule(schedule), optax.WrappedSchedule(schedule)):
        state = wrapped.init()
        for step in range(3):
            np.testing.assert_array_equal(np.asarray(state), [step])
            np.testing.assert_allclose(schedule(step), wrapped(state), atol=0.0)
            state = wrapped.update(state, loss=jnp.ones([]))
