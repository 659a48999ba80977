"""`eqopt.experimental.aggregating` against Optax's `optax.experimental.aggregating`."""

import inspect

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Case, assert_tree_allclose, make_model

import eqopt
from eqopt.experimental import aggregating

THEIRS = optax.experimental.aggregating

TRANSFORM_CASES = [
    Case(
        "accumulate_avg_updates-3",
        lambda: aggregating.accumulate_avg_updates(3),
        lambda: THEIRS.accumulate_avg_updates(3),
        ("float32", "bfloat16", "complex64"),
        steps=7,
        needs_params=False,
    ),
    Case(
        "process-accumulate-sgd",
        lambda: aggregating.process(
            eqopt.identity(),
            aggregating.accumulate_avg_updates(2),
            eqopt.sgd(0.1, momentum=0.9),
        ),
        lambda: THEIRS.process(
            optax.identity(),
            THEIRS.accumulate_avg_updates(2),
            optax.sgd(0.1, momentum=0.9),
        ),
        steps=6,
        needs_params=False,
    ),
]

# Optax's module also shows the `typing` names it imports.
_TYPING = {"Any", "NamedTuple", "Protocol", "Sequence"}


def _params():
    return {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "b": jnp.array([0.5, 2.0])}


def _per_element_grads(step, batch=4, dtype=jnp.float32):
    """One gradient per element, stacked on axis 0."""
    keys = jax.random.split(jax.random.key(step), 2)
    grads = {
        "w": jax.random.normal(keys[0], (batch, 2, 3)),
        "b": jax.random.normal(keys[1], (batch, 2)),
    }
    return jax.tree.map(lambda g: g.astype(dtype), grads)


def _run_both(ours, theirs, steps, grads=_per_element_grads, params=None):
    params = _params() if params is None else params
    state, their_state = ours.init(params), theirs.init(params)
    for step in range(steps):
        updates, state = ours.update(grads(step), state, params)
        their_updates, their_state = theirs.update(grads(step), their_state)
        assert_tree_allclose(updates, their_updates, rtol=1e-5, atol=1e-6)
    return state, their_state


def test_every_optax_name_resolves():
    names = {
        name
        for name in dir(THEIRS)
        if not name.startswith("_") and not inspect.ismodule(getattr(THEIRS, name))
    }
    assert sorted(n for n in names - _TYPING if not hasattr(aggregating, n)) == []
    assert eqopt.experimental.aggregating is aggregating


def test_aggregators_are_the_transforms_taking_per_element_updates():
    average = aggregating.average_per_element_updates()
    assert isinstance(average, aggregating.Aggregator)
    assert isinstance(
        aggregating.process(eqopt.identity(), average, eqopt.sgd(0.1)),
        aggregating.Aggregator,
    )
    assert isinstance(
        aggregating.average_incrementally_updates(0, 2), aggregating.Aggregator
    )
    assert isinstance(
        aggregating.add_mean_variance_to_opt(eqopt.sgd(0.1)), aggregating.Aggregator
    )
    accumulate = aggregating.average_incrementally_updates(None, 2)
    assert not isinstance(accumulate, aggregating.Aggregator)
    assert not isinstance(eqopt.sgd(0.1), aggregating.Aggregator)
    assert isinstance(
        eqopt.contrib.differentially_private_aggregate(1.0, 0.0, key=0),
        aggregating.Aggregator,
    )
    pair = aggregating.Aggregator(
        init=eqopt.init_empty_state,
        update=lambda gs, s, _: (jax.tree.map(lambda g: g.mean(0), gs), s),
    )
    assert isinstance(pair, aggregating.Aggregator) and pair.per_example_updates
    assert isinstance(pair, eqopt.GradientTransformation)
    assert isinstance(aggregating.accumulate_avg_updates(1), eqopt.Identity)


@pytest.mark.parametrize("axis", [0, (0, 1)])
def test_average_and_adam_match_optax(axis):
    def grads(step):
        g = _per_element_grads(step, batch=6)
        return (
            g if axis == 0 else jax.tree.map(lambda x: x.reshape(2, 3, *x.shape[1:]), g)
        )

    ours = aggregating.process(
        eqopt.identity(),
        aggregating.average_per_element_updates(axis),
        eqopt.adam(0.1),
    )
    theirs = THEIRS.process(
        optax.identity(), THEIRS.average_per_element_updates(axis), optax.adam(0.1)
    )
    state, _ = _run_both(ours, theirs, 3, grads)
    assert isinstance(state, aggregating.ProcessState)
    _, aggregate_state, adam_state = state
    assert isinstance(aggregate_state, eqopt.EmptyState)
    assert int(adam_state.scale_by_adam.count) == 3


def test_an_aggregator_of_a_transforms_methods_runs_it():
    inner = aggregating.average_incrementally_updates(0, 2)
    ours = aggregating.process(
        eqopt.identity(),
        aggregating.Aggregator(inner.init, inner.update),
        eqopt.sgd(1.0),
    )
    theirs = THEIRS.process(
        optax.identity(), THEIRS.average_incrementally_updates(0, 2), optax.sgd(1.0)
    )
    _run_both(ours, theirs, 4)


@pytest.mark.parametrize("per_elt_axis", [None, 0])
def test_accumulation_matches_optax_and_emits_every_k(per_elt_axis):
    batch = None if per_elt_axis is None else 4

    def grads(step):
        g = _per_element_grads(step, batch=batch or 1)
        return g if batch else jax.tree.map(lambda x: x[0], g)

    ours = aggregating.process(
        eqopt.identity(),
        aggregating.average_incrementally_updates(per_elt_axis, 3),
        eqopt.sgd(0.5, momentum=0.9),
    )
    theirs = THEIRS.process(
        optax.identity(),
        THEIRS.average_incrementally_updates(per_elt_axis, 3),
        optax.sgd(0.5, momentum=0.9),
    )
    params = _params()
    state, their_state = ours.init(params), theirs.init(params)
    traces = []

    @eqx.filter_jit
    def step(g, s):
        traces.append(None)
        return ours.update(g, s, params)

    for i in range(7):
        updates, state = step(grads(i), state)
        their_updates, their_state = theirs.update(grads(i), their_state)
        assert_tree_allclose(updates, their_updates, rtol=1e-5, atol=1e-6)
        ready = eqopt.tree.get(state, "ready")
        assert bool(ready) == (i % 3 == 2)
        assert bool(jnp.any(updates["w"] != 0)) == (i % 3 == 2)
    assert len(traces) == 1


def test_accumulated_average_keeps_the_parameters_dtype():
    params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), _params())
    opt = aggregating.accumulate_avg_updates(2)
    state = opt.init(params)
    grads = jax.tree.map(lambda g: g[0], _per_element_grads(0))  # float32
    updates, state = opt.update(grads, state, params)
    assert state.avg_grad["w"].dtype == jnp.bfloat16
    assert updates["w"].dtype == jnp.float32


@pytest.mark.parametrize("accumulation_steps", [1, 3])
@pytest.mark.parametrize("axis", [0, (0, 1)])
def test_mean_and_sum_sq_diff_match_optax(accumulation_steps, axis):
    def grads(step):
        g = _per_element_grads(step, batch=6)
        return (
            g if axis == 0 else jax.tree.map(lambda x: x.reshape(2, 3, *x.shape[1:]), g)
        )

    ours = aggregating.get_per_element_mean_and_sum_sq_diff_grads(
        axis, accumulation_steps
    )
    theirs = THEIRS.get_per_element_mean_and_sum_sq_diff_grads(axis, accumulation_steps)
    params = _params()
    state, their_state = ours.init(params), theirs.init(params)
    for step in range(2 * accumulation_steps):
        (mean, aux), state = ours.update(grads(step), state, params)
        (their_mean, their_aux), their_state = theirs.update(
            grads(step), their_state, None
        )
        assert_tree_allclose(mean, their_mean, rtol=1e-5, atol=1e-6)
        assert_tree_allclose(
            aux["sum_sq_diff_grads"], their_aux["sum_sq_diff_grads"], rtol=1e-5
        )
        assert int(aux["sample_size"]) == int(their_aux["sample_size"])


def test_accumulated_variance_is_the_variance_of_all_the_batches():
    opt = aggregating.get_per_element_mean_and_sum_sq_diff_grads(0, 3)
    state = opt.init(_params())
    batches = [_per_element_grads(step, batch=3) for step in range(3)]
    for batch in batches:
        (mean, aux), state = opt.update(batch, state)
    every = jax.tree.map(lambda *g: jnp.concatenate(g), *batches)
    assert int(aux["sample_size"]) == 9
    assert_tree_allclose(mean, jax.tree.map(lambda g: g.mean(0), every), rtol=1e-5)
    assert_tree_allclose(
        jax.tree.map(lambda s: s / 8, aux["sum_sq_diff_grads"]),
        jax.tree.map(lambda g: jnp.var(g, 0, ddof=1), every),
        rtol=1e-5,
    )


def test_complex_sum_sq_diff_is_real_squared_modulus():
    g = jax.random.normal(jax.random.key(0), (2, 5, 3))
    grads = {"w": (g[0] + 1j * g[1]).astype(jnp.complex64)}
    params = {"w": jnp.zeros(3, jnp.complex64)}
    for steps in (1, 2):
        opt = aggregating.get_per_element_mean_and_sum_sq_diff_grads(0, steps)
        state = opt.init(params)
        for _ in range(steps):
            (mean, aux), state = opt.update(grads, state, params)
        w = np.asarray(grads["w"])
        expected = np.sum(np.abs(w - w.mean(0, keepdims=True)) ** 2, 0)
        assert aux["sum_sq_diff_grads"]["w"].dtype == jnp.float32
        np.testing.assert_allclose(
            aux["sum_sq_diff_grads"]["w"], steps * expected, 1e-5
        )
        np.testing.assert_allclose(mean["w"], grads["w"].mean(0), rtol=1e-5)


@pytest.mark.parametrize("accumulation_steps", [1, 2])
@pytest.mark.parametrize("ema_decay", [0.0, 0.9])
def test_mean_variance_tracking_matches_optax(accumulation_steps, ema_decay):
    ours = aggregating.add_mean_variance_to_opt(
        eqopt.sgd(0.1), ema_decay, accumulation_steps=accumulation_steps
    )
    theirs = THEIRS.add_mean_variance_to_opt(
        optax.sgd(0.1), ema_decay, accumulation_steps=accumulation_steps
    )
    params = _params()
    state, their_state = ours.init(params), theirs.init(params)
    step = jax.jit(ours.update)
    for i in range(2 * accumulation_steps + 1):
        updates, state = step(_per_element_grads(i), state, params)
        their_updates, their_state = theirs.update(_per_element_grads(i), their_state)
        assert_tree_allclose(updates, their_updates, rtol=1e-5, atol=1e-6)
        assert_tree_allclose(
            aggregating.get_unbiased_mean_and_variance_ema(state),
            THEIRS.get_unbiased_mean_and_variance_ema(their_state),
            rtol=1e-5,
            equal_nan=True,  # before the first emitted statistics: 0 / 0
        )
    tracked = eqopt.tree.get(state, "PerElementMeanAndVarianceEMAState")
    count, decay, mean, variance = tracked
    assert int(count) == (2 * accumulation_steps + 1) // accumulation_steps
    assert decay.dtype == jnp.float32


def test_whole_model_with_non_array_leaves():
    model = make_model()

    def loss(model, x):
        return jnp.sum((x @ model.w + model.b) * model.s) ** 2

    per_element = eqx.filter_vmap(eqx.filter_grad(loss), in_axes=(None, 0))
    opt = aggregating.add_mean_variance_to_opt(eqopt.adam(1e-2), accumulation_steps=2)
    state = opt.init(model)
    for step in range(2):
        x = jax.random.normal(jax.random.key(step), (5, 4))
        grads = per_element(model, x)
        updates, state = opt.update(grads, state, model)
        model = eqopt.apply_updates(model, updates)
    assert updates.indices is None and updates.activation is None
    mean, variance = aggregating.get_unbiased_mean_and_variance_ema(state)
    assert mean.indices is None and variance.w.shape == (4, 3)
    assert bool(jnp.all(variance.w >= 0))


def test_bad_input_is_one_clear_error():
    grads = {"w": jnp.ones((4, 3)), "b": jnp.ones((5,))}
    with pytest.raises(ValueError, match=r"5 elements at \['b'\] but 4 at \['w'\]"):
        aggregating.get_batch_size_from_per_elt_updates(grads, 0)
    with pytest.raises(ValueError, match=r"at \['b'\] has shape \(5,\), without"):
        aggregating.get_batch_size_from_per_elt_updates(grads, 1)
    assert aggregating.get_batch_size_from_per_elt_updates({"a": None}, 0) == 0
    assert aggregating.get_batch_size_from_per_elt_updates(grads["w"], [0, 1]) == 12
    with pytest.raises(ValueError, match="at least 1"):
        aggregating.accumulate_avg_updates(0)
    track = aggregating.track_per_element_mean_and_variance_with_ema()
    params = {"w": jnp.ones(3)}
    with pytest.raises(TypeError, match="sum_sq_diff_grads` and `sample_size"):
        track.update(params, track.init(params))
    one = aggregating.add_mean_variance_to_opt(eqopt.sgd(0.1))
    with pytest.raises(ValueError, match="at least two elements"):
        one.update({"w": jnp.ones((1, 3))}, one.init(params))
    with pytest.raises(ValueError, match="no PerElementMeanAndVarianceEMAState"):
        aggregating.get_unbiased_mean_and_variance_ema(eqopt.sgd(0.1).init(params))
    no_aux = aggregating.process(
        eqopt.identity(),
        aggregating.average_per_element_updates(),
        eqopt.sgd(0.1),
        aggregator_has_aux=True,
    )
    with pytest.raises(
        TypeError, match="must return `\\(\\(updates, aux\\), state\\)`"
    ):
        no_aux.update({"w": jnp.ones((2, 3))}, no_aux.init(params))
