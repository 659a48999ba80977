"""Hyperparameter fields (`eqopt/_hyper.py`): the converters, `check_fields` and the range checks."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float, Int

import eqopt
from eqopt import _hyper
from eqopt._hyper import (
    Scalar,
    Schedule,
    as_int_scalar,
    as_number,
    as_optional_scalar,
    as_optional_scalar_or_schedule,
    as_scalar,
    as_scalar_or_schedule,
    check_decays,
    check_fields,
    check_hyperparameter,
    is_concrete,
)


class Fields(eqx.Module):
    rate: Scalar = eqx.field(default=0.1, converter=as_scalar)
    maybe: Scalar | None = eqx.field(default=None, converter=as_optional_scalar)
    scheduled: Scalar | Schedule = eqx.field(
        default=1.0, converter=as_scalar_or_schedule
    )
    either: Scalar | Schedule | None = eqx.field(
        default=None, converter=as_optional_scalar_or_schedule
    )
    steps: Int[Array, ""] = eqx.field(default=3, converter=as_int_scalar)
    static: int = eqx.field(default=2, static=True)

    def __check_init__(self):
        check_fields(self)


@pytest.mark.parametrize(
    "value", [0.5, 1, np.float32(0.5), np.int64(2), np.array(0.5), jnp.asarray(0.5)]
)
def test_as_scalar_gives_a_device_float_scalar(value):
    # A JAX scalar crosses the `jit` boundary without a copy (a NumPy one is
    # copied to the device at every call: 45-75 us each on a GPU); a number
    # gives a weakly-typed one.
    out = as_scalar(value)
    assert isinstance(out, jax.Array) and out.shape == ()
    assert jnp.issubdtype(out.dtype, jnp.floating)
    assert float(out) == float(value)
    if isinstance(value, (int, float, np.number)):
        assert out.weak_type


def test_on_host_moves_every_array_but_typed_keys_to_numpy():
    opt = eqopt.chain(
        eqopt.add_noise(0.1, 0.55, key=jax.random.key(1)),
        eqopt.adamw(eqopt.cosine_decay_schedule(1e-3, 10), weight_decay=1e-4),
    )
    host = eqopt.on_host(opt)
    arrays = [x for x in jax.tree.leaves(host) if eqx.is_array(x)]
    assert arrays and all(
        isinstance(x, np.ndarray) or jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
        for x in arrays
    )
    assert any(isinstance(x, np.ndarray) for x in arrays)
    # The same optimiser: same structure, same numbers.
    assert jax.tree.structure(host) == jax.tree.structure(opt)
    params = {"w": jnp.linspace(-1.0, 1.0, 6)}
    grads = {"w": jnp.cos(params["w"])}
    for o in (opt, host):
        updates, _ = eqx.filter_jit(lambda o, g, p: o.update(g, o.init(p), p))(
            o, grads, params
        )
        if o is opt:
            expected = updates
    np.testing.assert_array_equal(updates["w"], expected["w"])


def test_hyperparameters_are_weakly_typed_where_used():
    # A weak type does not promote a bfloat16 moment to float32: eagerly, and
    # under `jit`, where a strong or NumPy leaf arrives as a strongly-typed input.
    moment = jnp.ones(3, jnp.bfloat16)
    for value in (0.9, 1, np.float32(0.9), jnp.float32(0.9), np.asarray(0.9)):
        weak = _hyper.weakly_typed(as_scalar(value))
        assert weak.weak_type and (weak * moment).dtype == jnp.bfloat16
        weak = _hyper.weakly_typed(eqopt.on_host(as_scalar(value)))
        assert weak.weak_type and (weak * moment).dtype == jnp.bfloat16
    for value in (as_scalar(0.9), jnp.float32(0.9), np.asarray(0.9)):
        scaled = jax.jit(lambda h, m: _hyper.weakly_typed(h) * m)(value, moment)
        assert scaled.dtype == jnp.bfloat16
    # Through a transform's `update`, under `jit` with the optimiser an argument.
    for opt in (eqopt.scale_by_adam(), eqopt.on_host(eqopt.scale_by_adam())):
        state = opt.init({"w": moment})
        step = eqx.filter_jit(lambda opt, g, s: opt.update(g, s))
        updates, state = step(opt, {"w": moment}, state)
        assert updates["w"].dtype == jnp.bfloat16
        assert state.mu["w"].dtype == jnp.bfloat16
    # Anything but a real 0-d leaf is left alone.
    for other in (np.ones(2), jnp.asarray(True), "x", None):
        assert _hyper.weakly_typed(other) is other


def test_converters_leave_what_they_cannot_convert_for_check_fields():
    schedule = eqopt.constant_schedule(1.0)
    assert as_scalar_or_schedule(schedule) is schedule
    assert as_optional_scalar(None) is None
    # (Called unchecked, as `check_fields` sees a field set by `eqx.tree_at`.)
    assert _hyper._to_scalar("x") == "x"
    assert _hyper._to_scalar(True) is True


def test_as_int_scalar_and_as_number_keep_integers():
    assert jnp.issubdtype(as_int_scalar(3).dtype, jnp.integer)
    assert jnp.issubdtype(as_int_scalar(np.array(4)).dtype, jnp.integer)
    assert jnp.issubdtype(as_number(np.int64(5)).dtype, jnp.integer)
    assert jnp.issubdtype(as_number(2.5).dtype, jnp.floating)
    assert as_int_scalar(3).weak_type and as_number(2.5).weak_type
    assert _hyper.weakly_typed(as_int_scalar(3)).dtype == jnp.int32


def test_a_module_of_fields_converts_and_checks():
    module = Fields(rate=1, maybe=2.0, scheduled=lambda count: 0.1, steps=4)
    assert jnp.issubdtype(module.rate.dtype, jnp.floating)
    assert jnp.issubdtype(module.steps.dtype, jnp.integer)
    assert callable(module.scheduled) and module.either is None
    # Dynamic leaves: filtering for arrays keeps every hyperparameter.
    leaves = jax.tree.leaves(eqx.filter(module, eqx.is_array))
    assert len(leaves) == 3


def test_the_constructor_refuses_through_the_converter_annotation():
    # What a user sees: the converter's argument annotation, checked by the hook
    # when eqopt's own Module is built, names the class and the field.
    with pytest.raises(
        eqopt.ArgumentTypeError,
        match=r"ScaleByAdam: argument `b1` must be a real number .*got str 'x'",
    ):
        eqopt.ScaleByAdam(b1="x")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="`b1` must be finite, got nan"):
        eqopt.ScaleByAdam(b1=float("nan"))


def _replaced(field: str, value):
    # A module whose field holds what no converter would give it (as after
    # `eqx.tree_at`), for `check_fields` to judge.
    return eqx.tree_at(lambda m: getattr(m, field), Fields(), value)


@pytest.mark.parametrize(
    "field, value, error, message",
    [
        (
            "rate",
            "0.1",
            TypeError,
            "`rate` must be a real number.*got str.*not a string",
        ),
        ("rate", jnp.ones(2), TypeError, r"`rate`.*shape \(2,\).*jax.vmap"),
        ("rate", jnp.asarray(True), TypeError, "`rate` must be a real number"),
        ("rate", jnp.asarray(1j), TypeError, "`rate` must be a real number"),
        ("steps", jnp.asarray(1.5), TypeError, "`steps` must be an integer"),
        ("rate", jnp.asarray(jnp.inf), ValueError, "`rate` must be finite, got inf"),
    ],
)
def test_check_fields_names_the_class_and_field(field, value, error, message):
    with pytest.raises(error, match=f"Fields: hyperparameter {message}"):
        check_fields(_replaced(field, value))


def test_check_fields_lets_schedules_and_none_through_where_allowed():
    check_fields(_replaced("scheduled", lambda count: 0.1))
    with pytest.raises(TypeError, match="`rate`"):
        check_fields(_replaced("rate", lambda count: 0.1))


def test_traced_values_are_checked_for_kind_only():
    @jax.jit
    def build(rate):
        module = Fields(rate=rate)
        check_hyperparameter("rate", module.rate, low=0.0, high=0.5)
        return module.rate

    assert float(build(jnp.asarray(0.9))) == pytest.approx(0.9)
    assert is_concrete(jnp.ones(())) and not is_concrete(1.0)


@pytest.mark.parametrize(
    "value, kwargs, ok",
    [
        (0.0, {"low": 0.0}, True),
        (0.0, {"low": 0.0, "low_inclusive": False}, False),
        (1.0, {"high": 1.0}, False),
        (1.0, {"high": 1.0, "high_inclusive": True}, True),
        (float("inf"), {}, False),
        (float("inf"), {"finite": False}, True),
    ],
)
def test_check_hyperparameter_intervals(value, kwargs, ok):
    if ok:
        check_hyperparameter("h", jnp.asarray(value), **kwargs)
    else:
        with pytest.raises(ValueError, match="Hyperparameter `h` must be"):
            check_hyperparameter("h", jnp.asarray(value), **kwargs)


def test_check_decays_and_its_use_in_a_transform():
    class Decays(eqx.Module):
        b1: Float[Array, ""] = eqx.field(converter=as_scalar)

    check_decays(Decays(b1=0.9), "b1")
    check_decays(Decays(b1=1.0), "b1", high_inclusive=True)
    with pytest.raises(ValueError, match=r"`b1` must be in \[0.0, 1.0\), got 1.0"):
        check_decays(Decays(b1=1.0), "b1")
    with pytest.raises(ValueError, match="`b2`"):
        eqopt.scale_by_adam(b2=1.5)


# ---------------------------------------------------------------------------
# A hyperparameter set after construction meets the constructor's check
# ---------------------------------------------------------------------------


def _set_learning_rate(value):
    opt = eqopt.adamw(1e-3)
    return eqx.tree_at(lambda o: o.scale_by_learning_rate.learning_rate, opt, value)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_wrong_type_set_after_construction_is_refused_at_update(jit):
    params = {"w": jnp.ones(3)}
    state = eqopt.adamw(1e-3).init(params)
    opt = _set_learning_rate("1e-3")
    update = lambda opt, g, s: opt.update(g, s, g)  # noqa: E731
    with pytest.raises(eqopt.ArgumentTypeError) as raised:
        (eqx.filter_jit(update) if jit else update)(opt, params, state)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("ScaleByLearningRate: hyperparameter `learning_rate`")
    assert "got str '1e-3'" in message and "Pass a number" in message
    # The same check, from `init` and from `current_hyperparams`.
    for call in (
        lambda: opt.init(params),
        lambda: eqopt.current_hyperparams(opt, state),
    ):
        with pytest.raises(eqopt.ArgumentTypeError, match="`learning_rate`"):
            call()


def test_wrong_shape_in_a_schedule_set_after_construction_is_refused():
    schedule = eqopt.cosine_decay_schedule(1e-3, 10)
    opt = eqx.tree_at(
        lambda o: o.scale_by_learning_rate.learning_rate.init_value,
        eqopt.adamw(schedule),
        jnp.ones(3),
    )
    params = {"w": jnp.ones(3)}
    with pytest.raises(eqopt.ArgumentTypeError, match="`init_value`.*vmap"):
        opt.init(params)


def test_hyperparameters_checked_once_per_optimiser_when_eager(monkeypatch):
    opt, params = eqopt.adamw(1e-3), {"w": jnp.ones(3)}
    state = opt.init(params)
    calls = []
    monkeypatch.setattr(_hyper, "check_fields", lambda m, values=True: calls.append(m))
    for _ in range(3):
        _, state = opt.update(params, state, params)
    assert calls == []  # checked already, at `init`
    changed = eqx.tree_at(lambda o: o.scale_by_learning_rate.learning_rate, opt, 0.5)
    changed.update(params, state, params)
    checked_once = len(calls)
    changed.update(params, state, params)
    assert checked_once > 0 and len(calls) == checked_once
