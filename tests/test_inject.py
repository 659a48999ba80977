"""Tests for `inject_hyperparams` (`eqopt/_wrappers/inject.py`) beyond the registry.

Optax is the oracle: every behaviour is compared with `optax.inject_hyperparams`
(which, in Optax 0.2.8, is also its stateful version). Stateful schedules are
tested in test_stateful_schedules.py."""

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
    is_matrix,
    optax_adam_b1_then_rate,
    optax_adam_then_rate,
    optax_matrices,
    run_both,
    small_grads,
    small_params,
)

import eqopt
import eqopt.schedules
import eqopt.tree

TRANSFORM_CASES = [
    Case(
        "inject_hyperparams-scale_by_learning_rate",
        lambda: eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(0.1),
        lambda: optax.inject_hyperparams(optax.scale_by_learning_rate)(0.1),
        ALL_DTYPES,
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
        lambda: eqopt.inject_hyperparams(adam_b1_then_rate)(
            learning_rate=decaying_schedule, b1=0.8
        ),
        lambda: optax.inject_hyperparams(optax_adam_b1_then_rate)(
            learning_rate=decaying_schedule, b1=0.8
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
            0.1, mask=is_matrix
        ),
        lambda: optax.inject_hyperparams(optax.add_decayed_weights, static_args="mask")(
            0.1, mask=optax_matrices
        ),
        ALL_DTYPES,
    ),
    Case(
        "inject_hyperparams-adam",
        lambda: eqopt.inject_hyperparams(eqopt.adam)(
            learning_rate=decaying_schedule, b1=0.8
        ),
        lambda: optax.inject_hyperparams(optax.adam)(
            learning_rate=decaying_schedule, b1=0.8
        ),
        ("float32",),
        needs_params=False,
        steps=5,
    ),
]


# ---------------------------------------------------------------------------
# Reading and changing hyperparameters
# ---------------------------------------------------------------------------


def test_read_hyperparams_after_init():
    tx = eqopt.inject_hyperparams(eqopt.scale_by_adam)(b1=0.8)
    state = tx.init(small_params())
    assert isinstance(tx, eqopt.InjectHyperparams)
    assert isinstance(state, eqopt.InjectHyperparamsState)
    assert set(state.hyperparams) == {
        "b1",
        "b2",
        "eps",
        "eps_root",
    }  # defaults included
    reference = optax.inject_hyperparams(optax.scale_by_adam)(b1=0.8).init(
        small_params()
    )
    assert_tree_allclose(state.hyperparams, dict(reference.hyperparams), rtol=0, atol=0)
    assert (
        state.hyperparams["b1"].dtype == jnp.float32
        and not state.hyperparams["b1"].weak_type
    )


def test_change_learning_rate_in_state_as_in_optax():
    """Assigning into `state.hyperparams` changes the next update exactly as in Optax."""

    def change(step, state):
        if step == 2:
            state.hyperparams["learning_rate"] = 0.01
        if step == 3:
            state.hyperparams["b1"] = jnp.asarray(0.5)
        return state

    tx = eqopt.inject_hyperparams(adam_then_rate)(learning_rate=0.1)
    reference = optax.inject_hyperparams(optax_adam_then_rate)(learning_rate=0.1)
    state, _ = run_both(tx, reference, steps=5, change=change)
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(0.01)
    assert float(state.hyperparams["b1"]) == 0.5
    assert state.hyperparams["learning_rate"].dtype == jnp.float32


def test_change_with_tree_at_under_jit_does_not_retrace():
    tx = eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(learning_rate=0.1)
    params, grads = small_params(), small_grads(0)
    traces = []

    @eqx.filter_jit
    def step(tx, state):
        traces.append(None)
        return tx.update(grads, state, params)

    state = tx.init(params)
    updates, state = step(tx, state)
    assert_tree_allclose(updates, jax.tree.map(lambda g: -0.1 * g, grads))
    for learning_rate in (0.02, 0.3):
        state = eqx.tree_at(
            lambda s: s.hyperparams["learning_rate"], state, jnp.float32(learning_rate)
        )
        updates, state = step(tx, state)
        assert_tree_allclose(
            updates, jax.tree.map(lambda g, lr=learning_rate: -lr * g, grads)
        )
    assert len(traces) == 1


def test_eqopt_tree_get_and_set_on_injected_state():
    tx = eqopt.inject_hyperparams(adam_then_rate)(learning_rate=0.1)
    params = small_params()
    state = tx.init(params)
    assert float(eqopt.tree.get(state, "learning_rate")) == pytest.approx(0.1)
    state = eqopt.tree.set(state, learning_rate=jnp.asarray(0.0))
    updates, state = tx.update(small_grads(0), state, params)
    assert_tree_allclose(updates, jax.tree.map(jnp.zeros_like, params), rtol=0, atol=0)
    assert state.hyperparams["learning_rate"].dtype == jnp.float32


def test_schedule_evaluated_each_step():
    tx = eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(
        learning_rate=decaying_schedule
    )
    reference = optax.inject_hyperparams(optax.scale_by_learning_rate)(
        learning_rate=decaying_schedule
    )
    params = small_params()
    state = tx.init(params)
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(
        decaying_schedule(0)
    )
    for step in range(4):
        grads = small_grads(step)
        updates, state = tx.update(grads, state, params)
        # The state holds the value this update used: the schedule at the old count.
        assert float(state.hyperparams["learning_rate"]) == pytest.approx(
            decaying_schedule(step)
        )
        assert int(state.count) == step + 1
        assert_tree_allclose(
            updates, jax.tree.map(lambda g, t=step: -decaying_schedule(t) * g, grads)
        )
    run_both(tx, reference, steps=4)


def test_replacing_a_scheduled_value_has_no_effect():
    def change(step, state):
        state.hyperparams["learning_rate"] = 123.0
        return state

    tx = eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(
        learning_rate=decaying_schedule
    )
    reference = optax.inject_hyperparams(optax.scale_by_learning_rate)(
        learning_rate=decaying_schedule
    )
    state, _ = run_both(tx, reference, steps=3, change=change)
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(
        decaying_schedule(2)
    )


def test_schedule_module_and_positional_arguments():
    schedule = eqopt.schedules.warmup_cosine_decay_schedule(0.0, 0.1, 2, 6)
    tx = eqopt.inject_hyperparams(adam_then_rate)(schedule, 0.7)
    reference = optax.inject_hyperparams(optax_adam_then_rate)(
        optax.warmup_cosine_decay_schedule(0.0, 0.1, 2, 6), 0.7
    )
    assert set(tx.schedules) == {"learning_rate"} and set(tx.hyperparams) == {
        "b1",
        "b2",
    }
    run_both(tx, reference, steps=7)


def test_static_args_pass_callables_through():
    tx = eqopt.inject_hyperparams(eqopt.add_decayed_weights, static_args="mask")(
        0.1, mask=lambda x: x.ndim > 1
    )
    assert tx.other_args["mask"] is not None and "mask" not in tx.schedules
    reference = optax.inject_hyperparams(
        optax.add_decayed_weights, static_args=("mask",)
    )(0.1, mask=lambda p: {k: v.ndim > 1 for k, v in p.items()})
    run_both(tx, reference, steps=2)


def test_hyperparam_dtype():
    low = {"w": jnp.ones(3, jnp.bfloat16)}
    # As in Optax, floats follow the highest dtype of the params...
    state = eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(0.1).init(low)
    assert state.hyperparams["learning_rate"].dtype == jnp.bfloat16
    reference = optax.inject_hyperparams(optax.scale_by_learning_rate)(0.1).init(low)
    assert reference.hyperparams["learning_rate"].dtype == jnp.bfloat16
    # ... unless fixed.
    tx = eqopt.inject_hyperparams(
        eqopt.scale_by_learning_rate, hyperparam_dtype=jnp.float32
    )(0.1)
    state = tx.init(low)
    assert state.hyperparams["learning_rate"].dtype == jnp.float32
    updates, state = tx.update({"w": jnp.ones(3, jnp.bfloat16)}, state, low)
    assert updates["w"].dtype == jnp.bfloat16
    # Mixed: the highest. Complex: its real dtype (Optax would store complex).
    mixed = {
        "a": jnp.ones(2, jnp.bfloat16),
        "b": jnp.ones(2, jnp.float32),
        "i": jnp.arange(2),
    }
    assert (
        eqopt.inject_hyperparams(eqopt.scale)(0.5)
        .init(mixed)
        .hyperparams["step_size"]
        .dtype
        == jnp.float32
    )
    complex_params = {"z": jnp.ones(2, jnp.complex64)}
    state = eqopt.inject_hyperparams(eqopt.scale)(0.5).init(complex_params)
    assert state.hyperparams["step_size"].dtype == jnp.float32


def test_strongly_typed_values_and_ints_kept():
    def factory(step_size, every):
        return eqopt.scale(step_size * every)

    tx = eqopt.inject_hyperparams(factory)(jnp.bfloat16(0.5), 3)
    state = tx.init(small_params())
    assert state.hyperparams["step_size"].dtype == jnp.bfloat16
    assert jnp.issubdtype(state.hyperparams["every"].dtype, jnp.integer)
    updates, _ = tx.update(small_grads(0), state, small_params())
    assert_tree_allclose(
        updates, jax.tree.map(lambda g: 1.5 * g, small_grads(0)), rtol=1e-2
    )


# ---------------------------------------------------------------------------
# Factories
# ---------------------------------------------------------------------------


def test_module_class_as_factory():
    tx = eqopt.inject_hyperparams(eqopt.ScaleByAdam)(b1=0.5, nesterov=True)
    assert tx.other_args["nesterov"] is True
    reference = optax.inject_hyperparams(optax.scale_by_adam)(b1=0.5, nesterov=True)
    run_both(tx, reference, steps=2)


def test_positional_only_and_var_keyword_factory():
    def factory(learning_rate, /, **kwargs):
        return eqopt.chain(
            eqopt.trace(**kwargs), eqopt.scale_by_learning_rate(learning_rate)
        )

    tx = eqopt.inject_hyperparams(factory)(0.1, decay=0.5)
    assert set(tx.hyperparams) == {"learning_rate", "decay"}
    state = tx.init(small_params())
    state = eqx.tree_at(lambda s: s.hyperparams["decay"], state, jnp.float32(0.0))
    grads = small_grads(0)
    _, state = tx.update(grads, state)
    updates, state = tx.update(grads, state)
    # With decay 0 the trace is the gradient itself.
    assert_tree_allclose(updates, jax.tree.map(lambda g: -0.1 * g, grads))


@pytest.mark.skipif(not hasattr(eqopt, "adam"), reason="eqopt.adam not yet available")
def test_adam_alias_with_schedule():
    schedule = optax.linear_schedule(0.1, 0.01, 3)
    tx = eqopt.inject_hyperparams(eqopt.adam)(learning_rate=schedule, b1=0.8)
    reference = optax.inject_hyperparams(optax.adam)(learning_rate=schedule, b1=0.8)
    run_both(tx, reference, steps=4)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


def test_unknown_hyperparameter_name():
    with pytest.raises(
        TypeError, match="'lr' is not an argument of scale_by_learning_rate"
    ):
        eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(lr=0.1)
    with pytest.raises(ValueError, match="static_args.*'msk'"):
        eqopt.inject_hyperparams(eqopt.add_decayed_weights, static_args="msk")


def test_non_numeric_value():
    with pytest.raises(
        TypeError, match="Hyperparameter `b1` of scale_by_adam must be a number"
    ):
        eqopt.inject_hyperparams(eqopt.scale_by_adam)(b1="fast")
    # An argument without a numeric default is checked by the factory itself,
    # when the transform is built (with a note saying where).
    with pytest.raises(Exception, match="learning_rate") as info:
        eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(learning_rate="fast")
    assert any(
        "inject_hyperparams" in note for note in getattr(info.value, "__notes__", [])
    )
    # The factory's range checks run at construction too.
    with pytest.raises(ValueError, match="b1") as info:
        eqopt.inject_hyperparams(eqopt.scale_by_adam)(b1=1.5)


def test_bad_state_hyperparams():
    tx = eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(0.1)
    params = small_params()
    state = tx.init(params)
    state.hyperparams["learning_rate"] = "fast"
    with pytest.raises(
        TypeError, match="Hyperparameter `learning_rate`.*must be a number"
    ):
        tx.update(small_grads(0), state, params)
    state = tx.init(params)
    state.hyperparams["lr"] = 0.1
    with pytest.raises(KeyError, match="'lr'"):
        tx.update(small_grads(0), state, params)


def test_schedule_returning_non_numeric():
    with pytest.raises(
        TypeError, match="Hyperparameter `learning_rate` \\(value of its schedule\\)"
    ):
        eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(
            learning_rate=lambda count: "fast"
        )


def test_elementwise_follows_inner():
    assert eqopt.inject_hyperparams(eqopt.scale_by_adam)().elementwise
    masked = eqopt.inject_hyperparams(eqopt.add_decayed_weights, static_args="mask")(
        0.1, mask=lambda x: x.ndim > 1
    )
    assert not masked.elementwise


def test_vmap_over_initial_value():
    """The injected transform is a pytree: a sweep over a hyperparameter is one vmap."""
    params, grads = small_params(), small_grads(0)

    def run(learning_rate):
        tx = eqopt.inject_hyperparams(eqopt.scale_by_learning_rate)(learning_rate)
        updates, _ = tx.update(grads, tx.init(params), params)
        return updates["b"]

    swept = jax.vmap(run)(jnp.array([0.1, 0.2]))
    np.testing.assert_allclose(
        swept, jnp.stack([-0.1 * grads["b"], -0.2 * grads["b"]]), rtol=1e-6
    )


def test_a_traced_integer_seed_builds_the_noise():
    """An integer hyperparameter that builds a key (`noisy_sgd(key=0)`) is traced
    when `init` is jitted: the key is made from it as from the number, and the
    noise is Optax's."""
    params = [-jnp.ones((2, 3)), jnp.ones((2, 5, 2))]
    grads = [jnp.ones((2, 3)), -jnp.ones((2, 5, 2))]
    kwargs = {"learning_rate": 1e-3, "eta": 1e-4, "key": 0}
    ours = eqopt.inject_hyperparams(eqopt.noisy_sgd)(**kwargs)
    state = jax.jit(ours.init)(params)
    updates, _ = jax.jit(ours.update)(grads, state, params)
    theirs = optax.noisy_sgd(**kwargs)
    expected, _ = theirs.update(grads, theirs.init(params), params)
    assert_tree_allclose(updates, expected, rtol=1e-5)


def test_a_prng_key_is_passed_through_not_injected():
    """A typed key given to the factory is data for it, not a number to inject:
    it is not in `state.hyperparams`, and the optimiser jits."""
    tx = eqopt.inject_hyperparams(eqopt.add_noise)(
        eta=1.0, gamma=0.5, key=jax.random.key(17)
    )
    params = [jnp.ones((1, 2)), jnp.ones(2)]
    state = jax.jit(tx.init)(params)
    assert set(state.hyperparams) == {"eta", "gamma"}
    updates, _ = jax.jit(tx.update)(params, state, params)
    expected, _ = optax.add_noise(1.0, 0.5, key=jax.random.key(17)).update(
        params, optax.add_noise(1.0, 0.5, key=jax.random.key(17)).init(params)
    )
    assert_tree_allclose(updates, expected)
