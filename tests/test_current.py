"""`eqopt.current_hyperparams` on transforms written from the guide, and where it finds the count."""

import pathlib
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import PRNGKeyArray

import eqopt

ROOT = pathlib.Path(__file__).parent.parent


@pytest.fixture(scope="module")
def guide():
    # The code of "Writing your own transform", run as the page shows it.
    page = (ROOT / "docs/custom-transforms.md").read_text()
    namespace = {}
    for block in re.findall(r"```python\n(.*?)```", page, re.S):
        exec(compile(block, "docs/custom-transforms.md", "exec"), namespace)
    return namespace


def _step(opt, state, model, grads):
    return eqx.filter_jit(lambda opt, state: opt.update(grads, state, model))(
        opt, state
    )


def test_the_guide_transform_with_a_count_and_a_key(guide, capsys):
    # The page's own run: two steps of a linear schedule from 1 to 0 over 10.
    values = eqopt.current_hyperparams(guide["noisy"], guide["noisy_state"])
    np.testing.assert_allclose(values["strength"], 0.8, rtol=1e-6)
    np.testing.assert_allclose(values["noise"], 1e-3, rtol=1e-6)
    np.testing.assert_allclose(values["learning_rate"], 1e-2, rtol=1e-6)
    # Inside jit, after more steps, and with the strength a number (no count kept).
    opt, state = guide["noisy"], guide["noisy_state"]
    model, grads = guide["model"], guide["grads"]
    _, state = _step(opt, state, model, grads)
    jitted = eqx.filter_jit(eqopt.current_hyperparams)(opt, state)
    np.testing.assert_allclose(jitted["strength"], 0.7, rtol=1e-6)
    fixed = guide["NoisyScale"](strength=0.5)
    assert isinstance(fixed.init(model).count, eqopt.EmptyState)
    assert float(eqopt.current_hyperparams(fixed, fixed.init(model))["strength"]) == 0.5


def _scaled_with_key(state_class, count_field):
    # The guide's transform, with the schedule's state kept in another field.
    class Scaled(eqopt.AbstractGradientTransformation):
        strength: eqopt.ScalarOrSchedule = eqx.field(
            converter=eqopt.as_scalar_or_schedule
        )

        @property
        def elementwise(self) -> bool:
            return True

        def init(self, params):
            return state_class(
                eqopt.init_count_if_scheduled(self.strength), jax.random.key(0)
            )

        def update(self, updates, state, params=None, **extra_args):
            strength, count = eqopt.current_value(
                self.strength, getattr(state, count_field)
            )
            key, _ = jax.random.split(state.key)
            updates = eqopt.leafwise(lambda g: strength * g, updates)
            return updates, state_class(count, key)

    return Scaled(strength=eqopt.linear_schedule(1.0, 0.0, 10))


class _ScheduleState(eqx.Module):
    schedule: eqopt.ScaleByScheduleState | eqopt.EmptyState
    key: PRNGKeyArray


class _IntegerCountState(eqx.Module):
    count: jax.Array
    key: PRNGKeyArray


def test_the_count_is_found_in_any_one_field():
    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.ones(3)}
    scaled = _scaled_with_key(_ScheduleState, "schedule")
    state = scaled.init(params)
    for _ in range(3):
        _, state = scaled.update(grads, state, params)
    values = eqopt.current_hyperparams(scaled, state)
    np.testing.assert_allclose(values["strength"], 0.7, rtol=1e-6)


def test_an_integer_count_field():
    class Scaled(eqopt.AbstractGradientTransformation):
        strength: eqopt.ScalarOrSchedule = eqx.field(
            converter=eqopt.as_scalar_or_schedule
        )

        @property
        def elementwise(self) -> bool:
            return True

        def init(self, params):
            return _IntegerCountState(jnp.array(4, jnp.int32), jax.random.key(0))

        def update(self, updates, state, params=None, **extra_args):
            return updates, state

    scaled = Scaled(strength=eqopt.linear_schedule(1.0, 0.0, 10))
    values = eqopt.current_hyperparams(scaled, scaled.init({"w": jnp.ones(3)}))
    np.testing.assert_allclose(values["strength"], 0.6, rtol=1e-6)


class _KeyOnlyState(eqx.Module):
    key: PRNGKeyArray


class _TwoSchedulesState(eqx.Module):
    first: eqopt.ScaleByScheduleState | eqopt.EmptyState
    second: eqopt.ScaleByScheduleState | eqopt.EmptyState


@pytest.mark.parametrize(
    "state, said",
    [
        (_KeyOnlyState(jax.random.key(0)), "holds no step count"),
        (
            _TwoSchedulesState(
                eqopt.init_count_if_scheduled(abs), eqopt.init_count_if_scheduled(abs)
            ),
            "several step counts (`first`, `second`)",
        ),
    ],
    ids=["none", "several"],
)
def test_a_schedule_without_its_count_says_what_the_state_must_hold(state, said):
    class Scaled(eqopt.AbstractGradientTransformation):
        strength: eqopt.ScalarOrSchedule = eqx.field(
            converter=eqopt.as_scalar_or_schedule
        )

        @property
        def elementwise(self) -> bool:
            return True

        def init(self, params):
            return state

        def update(self, updates, state, params=None, **extra_args):
            return updates, state

    scaled = Scaled(strength=eqopt.linear_schedule(1.0, 0.0, 10))
    with pytest.raises(TypeError) as info:
        eqopt.current_hyperparams(scaled, state)
    message = str(info.value)
    for needle in ("`Scaled.strength` is a schedule", said, "init_count_if_scheduled"):
        assert needle in message, message


def test_schedule_free_learning_rate_is_read_at_its_step_count():
    params = {"w": jnp.ones(3)}
    opt = eqopt.contrib.schedule_free(
        eqopt.sgd(1.0), learning_rate=eqopt.linear_schedule(1.0, 0.0, 10)
    )
    state = opt.init(params)
    _, state = opt.update({"w": jnp.ones(3)}, state, params)
    # Its count starts at 1, as the schedule sees it in `update`.
    expected = eqopt.linear_schedule(1.0, 0.0, 10)(state.step_count)
    values = eqopt.current_hyperparams(opt, state)
    np.testing.assert_allclose(values["learning_rate"], expected, rtol=1e-6)
