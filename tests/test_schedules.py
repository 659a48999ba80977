"""Tests for `eqopt.schedules`, driven by a registry of every schedule.

Optax is the numerical oracle: each case is built by the same function from
`optax.schedules` and from `eqopt.schedules`.
"""

import dataclasses
import functools as ft
import inspect
import io
import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from helpers import assert_tree_allclose, tree_allclose

import eqopt.schedules as schedules


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Any], Any]  # the schedules namespace -> schedule
    cls: str  # the eqopt class the factory returns
    horizon: int  # every boundary of the schedule is below this step
    kwargs: dict | None = None  # set when `build` calls one factory with these
    factory: str | None = None
    # Whether the result has Optax's dtype and weak type (see `_assert_same_value`).
    same_dtype: bool = True


def _case(name, factory, cls, horizon, same_dtype=True, **kwargs) -> Case:
    return Case(
        name=name,
        build=lambda lib: getattr(lib, factory)(**kwargs),
        cls=cls,
        horizon=horizon,
        kwargs=kwargs,
        factory=factory,
        same_dtype=same_dtype,
    )


def _cycle(init_value, peak_value, warmup_steps, decay_steps, **kwargs):
    return dict(
        init_value=init_value,
        peak_value=peak_value,
        warmup_steps=warmup_steps,
        decay_steps=decay_steps,
        **kwargs,
    )


# fmt: off
CASES = [
    _case("constant", "constant_schedule", "ConstantSchedule", 2, value=0.5),
    _case("constant_int", "constant_schedule", "ConstantSchedule", 2, value=3),
    _case("linear", "linear_schedule", "LinearSchedule", 12,
          init_value=1.0, end_value=0.1, transition_steps=10),
    _case("linear_begin", "linear_schedule", "LinearSchedule", 12,
          init_value=0.0, end_value=2.0, transition_steps=8, transition_begin=3),
    _case("linear_no_steps", "linear_schedule", "LinearSchedule", 4,
          init_value=0.3, end_value=2.0, transition_steps=0),
    _case("linear_negative_begin", "linear_schedule", "LinearSchedule", 8,
          init_value=1, end_value=0, transition_steps=5, transition_begin=-2),
    _case("polynomial", "polynomial_schedule", "PolynomialSchedule", 12,
          init_value=1.0, end_value=0.01, power=2, transition_steps=10),
    _case("polynomial_begin", "polynomial_schedule", "PolynomialSchedule", 14,
          init_value=0.5, end_value=2.0, power=0.5, transition_steps=8,
          transition_begin=4),
    _case("polynomial_no_steps", "polynomial_schedule", "PolynomialSchedule", 4,
          init_value=0.5, end_value=2.0, power=3.0, transition_steps=-1),
    _case("exponential", "exponential_decay", "ExponentialDecaySchedule", 16,
          init_value=1.0, transition_steps=5, decay_rate=0.5),
    _case("exponential_staircase", "exponential_decay", "ExponentialDecaySchedule",
          20, init_value=2.0, transition_steps=4, decay_rate=0.7,
          transition_begin=3, staircase=True),
    _case("exponential_lower", "exponential_decay", "ExponentialDecaySchedule", 20,
          init_value=1.0, transition_steps=3, decay_rate=0.5, end_value=0.2),
    _case("exponential_upper", "exponential_decay", "ExponentialDecaySchedule", 20,
          init_value=0.1, transition_steps=2, decay_rate=1.5, end_value=0.5,
          transition_begin=-3),
    # Optax returns `init_value` itself for a zero rate; ours selects it with
    # `where` (the rate is a leaf), so a strongly typed count gives a strong result.
    _case("exponential_zero_rate", "exponential_decay", "ExponentialDecaySchedule",
          6, same_dtype=False, init_value=0.7, transition_steps=2, decay_rate=0.0, end_value=0.5),
    _case("exponential_no_steps", "exponential_decay", "ExponentialDecaySchedule",
          6, init_value=0.7, transition_steps=0, decay_rate=0.5),
    _case("cosine", "cosine_decay_schedule", "CosineDecaySchedule", 12,
          init_value=1.0, decay_steps=10),
    _case("cosine_alpha", "cosine_decay_schedule", "CosineDecaySchedule", 9,
          init_value=0.5, decay_steps=7, alpha=0.1, exponent=2.0),
    _case("warmup_cosine", "warmup_cosine_decay_schedule",
          "WarmupCosineDecaySchedule", 14,
          init_value=0.0, peak_value=1.0, warmup_steps=3, decay_steps=12,
          end_value=0.1),
    _case("warmup_cosine_exponent", "warmup_cosine_decay_schedule",
          "WarmupCosineDecaySchedule", 10,
          init_value=0.1, peak_value=2.0, warmup_steps=0, decay_steps=8,
          exponent=1.5),
    _case("warmup_cosine_zero_peak", "warmup_cosine_decay_schedule",
          "WarmupCosineDecaySchedule", 10,
          init_value=0.5, peak_value=0.0, warmup_steps=2, decay_steps=6,
          end_value=0.3),
    _case("warmup_exponential", "warmup_exponential_decay_schedule",
          "WarmupExponentialDecaySchedule", 16,
          init_value=0.0, peak_value=1.0, warmup_steps=3, transition_steps=4,
          decay_rate=0.5),
    _case("warmup_exponential_staircase", "warmup_exponential_decay_schedule",
          "WarmupExponentialDecaySchedule", 24,
          init_value=0.1, peak_value=1.0, warmup_steps=4, transition_steps=3,
          decay_rate=0.6, transition_begin=2, staircase=True, end_value=0.3),
    _case("warmup_constant", "warmup_constant_schedule", "WarmupConstantSchedule",
          8, init_value=0.1, peak_value=1.0, warmup_steps=5),
    _case("warmup_constant_no_warmup", "warmup_constant_schedule",
          "WarmupConstantSchedule", 4, init_value=0.1, peak_value=1.0,
          warmup_steps=0),
    _case("piecewise_constant", "piecewise_constant_schedule",
          "PiecewiseConstantSchedule", 8,
          init_value=1.0, boundaries_and_scales={3: 0.5, 6: 0.1}),
    _case("piecewise_constant_unsorted", "piecewise_constant_schedule",
          "PiecewiseConstantSchedule", 10,
          init_value=0.5, boundaries_and_scales={8: 2.0, 0: 0.5, 2: 3.0}),
    _case("piecewise_constant_none", "piecewise_constant_schedule",
          "PiecewiseConstantSchedule", 2, init_value=0.25),
    _case("piecewise_linear", "piecewise_interpolate_schedule",
          "PiecewiseInterpolateSchedule", 10, interpolate_type="linear",
          init_value=1.0, boundaries_and_scales={4: 0.1, 8: 0.01}),
    _case("piecewise_cosine", "piecewise_interpolate_schedule",
          "PiecewiseInterpolateSchedule", 12, interpolate_type="cosine",
          init_value=0.5, boundaries_and_scales={0: 2.0, 5: 0.5, 9: 3.0}),
    _case("piecewise_interpolate_none", "piecewise_interpolate_schedule",
          "PiecewiseInterpolateSchedule", 2, interpolate_type="linear",
          init_value=0.3, boundaries_and_scales=None),
    _case("cosine_onecycle", "cosine_onecycle_schedule", "CosineOnecycleSchedule",
          22, transition_steps=20, peak_value=1.0),
    _case("cosine_onecycle_custom", "cosine_onecycle_schedule",
          "CosineOnecycleSchedule", 12, transition_steps=10, peak_value=2.0,
          pct_start=0.5, div_factor=10.0, final_div_factor=100.0),
    _case("cosine_onecycle_full_rise", "cosine_onecycle_schedule",
          "CosineOnecycleSchedule", 8, transition_steps=6, peak_value=1.0,
          pct_start=1.0),
    _case("linear_onecycle", "linear_onecycle_schedule", "LinearOnecycleSchedule",
          22, transition_steps=20, peak_value=1.0),
    _case("linear_onecycle_custom", "linear_onecycle_schedule",
          "LinearOnecycleSchedule", 12, transition_steps=10, peak_value=0.5,
          pct_start=0.2, pct_final=0.6, div_factor=5.0, final_div_factor=50.0),
    _case("sgdr", "sgdr_schedule", "JoinSchedules", 20, cosine_kwargs=[
        _cycle(0.0, 1.0, 2, 8, end_value=0.1),
        _cycle(0.1, 0.5, 1, 6),
        _cycle(0.0, 0.3, 0, 4, exponent=2.0),
    ]),
    Case("join", lambda lib: lib.join_schedules(
        [lib.linear_schedule(0.0, 1.0, 4), lib.cosine_decay_schedule(1.0, 6),
         lib.constant_schedule(0.05)], [4, 10]), "JoinSchedules", 12),
    Case("join_unsorted", lambda lib: lib.join_schedules(
        [lib.constant_schedule(1.0), lib.exponential_decay(0.5, 2, 0.5),
         lib.linear_schedule(0.2, 0.0, 3)], [6, 2]), "JoinSchedules", 9),
    Case("join_plain_callable", lambda lib: lib.join_schedules(
        [lambda count: 0.1 * count, lib.polynomial_schedule(0.3, 0.0, 2.0, 4)],
        [5]), "JoinSchedules", 10),
]
# fmt: on
CASE_IDS = [case.name for case in CASES]
CASES_BY_NAME = {case.name: case for case in CASES}


_traces = []


def _evaluate_all(schedule, dense_counts, python_int, python_float):
    # Dense integer and float counts with `vmap`, a traced integer count, and
    # Python numbers (the latter are static under `jit`, so they keep their
    # eager dtype semantics).
    return (
        jax.vmap(schedule)(dense_counts),
        jax.vmap(schedule)(dense_counts.astype(jnp.float32) + 0.25),
        schedule(dense_counts[-1]),
        schedule(python_int),
        schedule(python_float),
    )


# Jitted functions are shared by every case, so that only new structures compile.
@eqx.filter_jit
def _evaluate(schedule, dense_counts, python_int, python_float):
    _traces.append(None)
    return _evaluate_all(schedule, dense_counts, python_int, python_float)


def _arguments(case):
    dense_counts = jnp.arange(-3, case.horizon + 4, dtype=jnp.int32)
    return dense_counts, case.horizon + 1, case.horizon / 2 + 0.5


@eqx.filter_jit
def _evaluate_at(schedule, count):
    _traces.append(None)
    return schedule(count)


@eqx.filter_jit
def _evaluate_batched(schedules, count):
    return eqx.filter_vmap(lambda schedule: schedule(count))(schedules)


def _scale_hyperparameters(schedule, factor=0.9):
    return jax.tree.map(
        lambda x: x * factor if eqx.is_inexact_array(x) else x, schedule
    )


def _assert_same_value(ours, theirs, *, check_dtype):
    assert isinstance(ours, jax.Array) and ours.shape == ()
    assert jnp.issubdtype(ours.dtype, jnp.floating)
    assert_tree_allclose(ours, jnp.asarray(theirs))
    # Optax may return its argument unchanged (a Python number, an integer);
    # ours is always a float array. Otherwise the dtypes agree, weak typing too.
    if (
        check_dtype
        and isinstance(theirs, jax.Array)
        and jnp.issubdtype(theirs.dtype, jnp.floating)
    ):
        assert ours.dtype == theirs.dtype
        assert ours.weak_type == theirs.weak_type


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_factory_returns_class(case):
    schedule = case.build(schedules)
    assert type(schedule) is getattr(schedules, case.cls)
    assert isinstance(schedule, schedules.AbstractSchedule)
    for leaf in jax.tree.leaves(schedule):
        if eqx.is_array(leaf):
            # Device scalars (no copy at the `jit` boundary), weak where used.
            assert isinstance(leaf, jax.Array) and leaf.weak_type
            assert leaf.shape == () and jnp.issubdtype(leaf.dtype, jnp.floating)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_parity_with_optax(case):
    ours = case.build(schedules)
    theirs = case.build(optax.schedules)
    horizon = case.horizon
    # Eagerly, before, at and after the end.
    for count in (0, horizon - 1, horizon, 3 * horizon + 17, -2):
        _assert_same_value(ours(count), theirs(count), check_dtype=case.same_dtype)
    # Under `filter_jit`, around every boundary (Optax under `jax.jit`).
    arguments = _arguments(case)
    expected = jax.jit(ft.partial(_evaluate_all, theirs), static_argnums=(1, 2))(
        *arguments
    )
    result = _evaluate(ours, *arguments)
    assert_tree_allclose(result[:2], expected[:2])
    for ours_value, their_value in zip(result[2:], expected[2:], strict=True):
        _assert_same_value(ours_value, their_value, check_dtype=case.same_dtype)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_changing_hyperparameter_does_not_retrace(case):
    schedule = case.build(schedules)
    # A field changed with `eqx.tree_at` where the schedule has one, else all.
    name = next(
        (
            f.name
            for f in dataclasses.fields(schedule)
            if eqx.is_inexact_array(getattr(schedule, f.name))
        ),
        None,
    )
    if name is None:
        changed = _scale_hyperparameters(schedule)
    else:
        changed = eqx.tree_at(
            lambda s: getattr(s, name), schedule, replace_fn=lambda x: x * 0.9
        )
    count = case.horizon // 2
    first = _evaluate_at(schedule, jnp.int32(count))
    num_traces = len(_traces)
    second = _evaluate_at(changed, jnp.int32(count))
    assert len(_traces) == num_traces
    assert tree_allclose(first, schedule(count))
    assert tree_allclose(second, changed(count))


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_vmap_over_hyperparameters(case):
    schedule = case.build(schedules)
    scaled = _scale_hyperparameters(schedule)
    stacked = jax.tree.map(
        lambda x, y: jnp.stack([x, y]) if eqx.is_array(x) else x, schedule, scaled
    )
    count = case.horizon // 2
    values = _evaluate_batched(stacked, count)
    assert_tree_allclose(values, jnp.stack([schedule(count), scaled(count)]))


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_serialise_round_trip(case):
    schedule = case.build(schedules)
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, schedule)
    buffer.seek(0)
    like = _scale_hyperparameters(schedule, 0.0)
    restored = eqx.tree_deserialise_leaves(buffer, like)
    assert tree_allclose(restored, schedule)
    assert tree_allclose(restored(case.horizon // 2), schedule(case.horizon // 2))


_NON_FINITE_CASES = [
    (case, key)
    for case in CASES
    if case.kwargs is not None
    for key, value in case.kwargs.items()
    if isinstance(value, float) or (isinstance(value, dict) and value)
]


@pytest.mark.parametrize(
    "case, key", _NON_FINITE_CASES, ids=[f"{c.name}-{k}" for c, k in _NON_FINITE_CASES]
)
def test_non_finite_hyperparameter_raises(case, key):
    kwargs = dict(case.kwargs)
    if isinstance(kwargs[key], dict):
        boundary = next(iter(kwargs[key]))
        kwargs[key] = {**kwargs[key], boundary: math.nan}
        name = "scales"
    else:
        kwargs[key] = math.nan
        name = key
    with pytest.raises(ValueError, match=f"`{name}"):
        getattr(schedules, case.factory)(**kwargs)


_GRADIENT_CASES = [
    ("cosine_alpha", lambda s: s.alpha, 3),
    ("cosine_alpha", lambda s: s.exponent, 5),
    ("polynomial", lambda s: s.power, 4),
    ("exponential_lower", lambda s: s.decay_rate, 4),
    ("exponential_upper", lambda s: s.end_value, 9),
    ("warmup_cosine", lambda s: s.peak_value, 6),
    ("piecewise_cosine", lambda s: s.scales[1], 7),
    ("linear_onecycle", lambda s: s.div_factor, 9),
]


@pytest.mark.parametrize(
    "name, where, count", _GRADIENT_CASES, ids=[c[0] for c in _GRADIENT_CASES]
)
def test_gradient_matches_finite_differences(name, where, count):
    schedule = CASES_BY_NAME[name].build(schedules)
    value_at = lambda v: eqx.tree_at(where, schedule, v)(count)
    value = where(schedule)
    grad = jax.grad(value_at)(value)
    assert jnp.isfinite(grad)
    step = 1e-3 * max(1.0, abs(float(value)))
    finite_difference = (value_at(value + step) - value_at(value - step)) / (2 * step)
    assert_tree_allclose(grad, finite_difference, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize(
    "name",
    [
        "constant_schedule",
        "linear_schedule",
        "polynomial_schedule",
        "exponential_decay",
        "cosine_decay_schedule",
        "warmup_cosine_decay_schedule",
        "warmup_exponential_decay_schedule",
        "warmup_constant_schedule",
        "piecewise_constant_schedule",
        "piecewise_interpolate_schedule",
        "cosine_onecycle_schedule",
        "linear_onecycle_schedule",
        "sgdr_schedule",
        "join_schedules",
    ],
)
def test_optax_signature(name):
    ours = inspect.signature(getattr(schedules, name)).parameters
    theirs = inspect.signature(getattr(optax.schedules, name)).parameters
    assert [(k, p.default) for k, p in ours.items()] == [
        (k, p.default) for k, p in theirs.items()
    ]


def test_abstract_or_final():
    classes = [
        obj
        for obj in vars(schedules).values()
        if inspect.isclass(obj)
        and obj.__module__.startswith("eqopt.schedules")
        # Stateful schedules have their own protocol (checked in test_api.py).
        and not issubclass(obj, schedules.AbstractStatefulSchedule)
    ]
    assert schedules.AbstractSchedule in classes
    for cls in classes:
        assert issubclass(cls, schedules.AbstractSchedule)
        if cls.__name__.startswith("Abstract"):
            assert inspect.isabstract(cls)
        else:
            assert not inspect.isabstract(cls)
            subclasses = [
                s for s in cls.__subclasses__() if s.__module__.startswith("eqopt")
            ]
            assert subclasses == [], f"{cls.__name__} is subclassed"


def test_wrapped_plain_callable():
    schedule = schedules.FunctionSchedule(lambda count: 0.1 / (1 + count))
    assert_tree_allclose(schedule(9), jnp.asarray(0.01))
    assert_tree_allclose(eqx.filter_jit(schedule)(jnp.int32(9)), jnp.asarray(0.01))
    values = jax.vmap(schedule)(jnp.arange(3))
    assert_tree_allclose(values, 0.1 / (1 + jnp.arange(3.0)))
    # An integer result comes back as a float; an Optax schedule can be wrapped.
    assert schedules.FunctionSchedule(lambda count: 3)(0).dtype == jnp.float32
    wrapped_optax = schedules.as_schedule(optax.cosine_decay_schedule(1.0, 10))
    assert isinstance(wrapped_optax, schedules.FunctionSchedule)
    assert_tree_allclose(wrapped_optax(4), schedules.cosine_decay_schedule(1.0, 10)(4))
    # `as_schedule` keeps schedules and wraps numbers.
    cosine = schedules.CosineDecaySchedule(1.0, 10)
    assert schedules.as_schedule(cosine) is cosine
    assert isinstance(schedules.as_schedule(0.5), schedules.ConstantSchedule)
    with pytest.raises(TypeError):
        schedules.FunctionSchedule(0.5)


def test_validation_like_optax():
    with pytest.raises(ValueError, match="decay_steps"):
        schedules.cosine_decay_schedule(1.0, 0)
    with pytest.raises(ValueError, match="decay_steps"):
        schedules.warmup_cosine_decay_schedule(0.0, 1.0, 5, 5)
    with pytest.raises(ValueError, match="scales"):
        schedules.piecewise_constant_schedule(1.0, {2: -0.5})
    with pytest.raises(ValueError, match="scales"):
        schedules.piecewise_interpolate_schedule("linear", 1.0, {2: -0.5})
    with pytest.raises(ValueError, match="interpolate_type"):
        schedules.piecewise_interpolate_schedule("cubic", 1.0)
    with pytest.raises(ValueError, match="transition_steps"):
        schedules.cosine_onecycle_schedule(0, 1.0)
    with pytest.raises(ValueError, match="transition_steps"):
        schedules.linear_onecycle_schedule(-3, 1.0)
    with pytest.raises(ValueError, match="div_factor"):
        schedules.cosine_onecycle_schedule(10, 1.0, div_factor=-2.0)
    # Ours only: the class wants sorted boundaries, and a join one per switch.
    with pytest.raises(ValueError, match="increasing"):
        schedules.PiecewiseConstantSchedule(1.0, boundaries=(5, 2), scales=(0.1, 0.1))
    with pytest.raises(ValueError, match="boundaries"):
        schedules.join_schedules([schedules.constant_schedule(1.0)], [3])


def test_type_checked():
    if not hasattr(schedules.LinearSchedule.__call__, "__wrapped__"):
        pytest.skip(
            "`eqopt/__init__.py` does not import `schedules` under its hook yet"
        )
    with pytest.raises(TypeError, match="count"):
        schedules.linear_schedule(1.0, 0.0, 10)(jnp.zeros(3, jnp.complex64))
    with pytest.raises(Exception, match="init_value"):
        schedules.linear_schedule(jnp.ones(2), 0.0, 10)


def test_repr_reads_well():
    schedule = schedules.warmup_cosine_decay_schedule(0.0, 1.0, 3, 12, end_value=0.1)
    text = repr(schedule)
    assert text.startswith("WarmupCosineDecaySchedule(")
    for part in ("init_value=0.0", "peak_value=1.0", "warmup_steps=3", "end_value=0.1"):
        assert part in text


def test_polynomial_fractional_power_finite_under_jit():
    # Under `jit`, XLA may round `1 - 7 / 7` below zero; Optax then returns NaN
    # from the last step on. Ours clips it.
    schedule = schedules.polynomial_schedule(0.5, 2.0, 0.5, transition_steps=7)
    values = eqx.filter_jit(jax.vmap(schedule))(jnp.arange(12))
    assert jnp.all(jnp.isfinite(values))
    assert_tree_allclose(values[7:], jnp.full(5, 2.0))


# ---------------------------------------------------------------------------
# Arrays of steps (Optax's `schedule(jnp.arange(n))`, for plotting)
# ---------------------------------------------------------------------------


def _optax_on_steps(theirs, counts):
    # Optax returns a scalar for schedules that ignore the step, and its
    # piecewise-interpolated schedules fail on arrays: evaluate it step by step.
    flat = jnp.ravel(counts)
    return jax.vmap(theirs)(flat).reshape(counts.shape)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_jax_jit_on_array_of_steps(case):
    """`jax.jit(schedule)(jnp.arange(n))` works and gives the value at each step."""
    ours = case.build(schedules)
    theirs = case.build(optax.schedules)
    n = case.horizon + 3
    counts = jnp.arange(-2, n - 2)
    values = jax.jit(ours)(counts)
    assert values.shape == (n,) and jnp.issubdtype(values.dtype, jnp.floating)
    assert_tree_allclose(values, _optax_on_steps(theirs, counts))
    # Any shape, integer or float steps, eagerly too.
    grid = jnp.arange(6).reshape(2, 3) * (case.horizon // 4 + 1)
    assert_tree_allclose(ours(grid), _optax_on_steps(theirs, grid))
    halves = jnp.arange(4, dtype=jnp.float32) * 1.5
    assert_tree_allclose(ours(halves), _optax_on_steps(theirs, halves))
    # Each entry is the schedule at that step.
    assert_tree_allclose(values[3], ours(int(counts[3])))


def test_linear_schedule_on_steps_like_optax():
    import eqopt

    values = eqopt.linear_schedule(0.0, 1.0, 10)(jnp.arange(4))
    assert_tree_allclose(values, jnp.array([0.0, 0.1, 0.2, 0.3]))
    assert_tree_allclose(values, optax.linear_schedule(0.0, 1.0, 10)(jnp.arange(4)))


def test_step_independent_schedules_broadcast():
    """Ours gives one value per step where Optax returns a single scalar."""
    counts = jnp.arange(5)
    for ours, theirs in (
        (schedules.constant_schedule(0.5), optax.constant_schedule(0.5)),
        (schedules.linear_schedule(0.3, 1.0, 0), optax.linear_schedule(0.3, 1.0, 0)),
        (
            schedules.piecewise_constant_schedule(0.25),
            optax.piecewise_constant_schedule(0.25),
        ),
    ):
        assert jnp.shape(theirs(counts)) == ()
        assert_tree_allclose(ours(counts), jnp.full(5, theirs(counts)))
    # A plain function that ignores the step, too.
    assert schedules.as_schedule(lambda count: 0.1)(counts).shape == (5,)


def test_piecewise_interpolate_on_steps_where_optax_fails():
    ours = schedules.linear_onecycle_schedule(20, 1.0)
    theirs = optax.linear_onecycle_schedule(20, 1.0)
    counts = jnp.arange(24)
    with pytest.raises((TypeError, ValueError)):
        theirs(counts)
    assert_tree_allclose(ours(counts), _optax_on_steps(theirs, counts))
