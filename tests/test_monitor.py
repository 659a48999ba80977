"""`snapshot`, `monitor` and `measure_with_ema`, beyond the registry."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from helpers import Case, make_model, random_grads

import eqopt


def _is_large(updates):
    return eqopt.tree.norm(updates) > 1.0


def _optax_is_large(updates):
    return optax.tree.norm(updates) > 1.0


TRANSFORM_CASES = [
    Case(
        "snapshot-norm",
        lambda: eqopt.chain(
            eqopt.sgd(0.1, momentum=0.9),
            eqopt.snapshot("norm_before_clip", eqopt.tree.norm),
            eqopt.clip_by_global_norm(0.5),
        ),
        lambda: optax.chain(
            optax.sgd(0.1, momentum=0.9),
            optax.snapshot("norm_before_clip", optax.tree.norm),
            optax.clip_by_global_norm(0.5),
        ),
    ),
    Case(
        "monitor-norm_and_ema",
        lambda: eqopt.chain(
            eqopt.monitor(
                {
                    "norm": eqopt.tree.norm,
                    "large": eqopt.measure_with_ema(_is_large, decay=0.9),
                }
            ),
            eqopt.adam(1e-2),
        ),
        lambda: optax.chain(
            optax.monitor(
                {
                    "norm": optax.tree.norm,
                    "large": optax.measure_with_ema(_optax_is_large, decay=0.9),
                }
            ),
            optax.adam(1e-2),
        ),
        ("float32", "bfloat16", "complex64"),
        needs_params=False,
    ),
]


def _run_both(tx, reference, names, steps=3):
    model = make_model()
    params = {"w": model.w, "b": model.b, "s": model.s}
    state, reference_state = tx.init(model), reference.init(params)
    for step in range(steps):
        grads = random_grads(model, step)
        updates, state = tx.update(grads, state, model)
        dict_grads = {"w": grads.w, "b": grads.b, "s": grads.s}
        _, reference_state = reference.update(dict_grads, reference_state, params)
        for name in names:
            np.testing.assert_allclose(
                eqopt.tree.get(state, name),
                optax.tree.get(reference_state, name),
                rtol=1e-5,
            )
    return state


def test_snapshot_values_match_optax():
    tx, reference = (
        lib.chain(lib.sgd(0.1, momentum=0.9), lib.snapshot("n", lib.tree.norm))
        for lib in (eqopt, optax)
    )
    state = _run_both(tx, reference, ["n"])
    assert isinstance(state[1], eqopt.SnapshotState)


def test_monitor_values_match_optax():
    tx = eqopt.monitor(
        {
            "norm": eqopt.tree.norm,
            "large": eqopt.measure_with_ema(_is_large, decay=0.9),
            "ema_norm": eqopt.measure_with_ema(eqopt.tree.norm, 0.5, debias=False),
        }
    )
    reference = optax.monitor(
        {
            "norm": optax.tree.norm,
            "large": optax.measure_with_ema(_optax_is_large, decay=0.9),
            "ema_norm": optax.measure_with_ema(optax.tree.norm, 0.5, debias=False),
        }
    )
    state = _run_both(tx, reference, ["norm", "large", "ema_norm"])
    assert isinstance(state.measure_states[1], eqopt.MeasureWithEmaState)
    # An indicator is averaged as a float: its average is a frequency.
    assert jnp.issubdtype(state.measurements["large"].dtype, jnp.floating)


def test_state_structure_is_fixed_from_init():
    """Optax's monitor starts with no measurement; here the state can go through scan."""
    model = make_model()
    tx = eqopt.monitor({"norm": eqopt.tree.norm, "max": eqopt.tree.max})
    state = tx.init(model)
    assert float(state.measurements["norm"]) == 0.0
    grads = random_grads(model, 0)
    arrays = jax.tree.map(
        lambda *xs: None if xs[0] is None else jnp.stack(xs),
        *[random_grads(model, i) for i in range(3)],
        is_leaf=lambda x: x is None,
    )

    def body(state, grads):
        updates, state = tx.update(grads, state, model)
        return state, updates.w

    final, seen = jax.lax.scan(body, state, arrays)
    np.testing.assert_allclose(
        final.measurements["norm"],
        eqopt.tree.norm(jax.tree.map(lambda x: x[-1], arrays)),
        rtol=1e-6,
    )
    assert seen.shape == (3, 4, 3)
    updates, _ = tx.update(grads, state, model)
    assert updates is grads


def test_monitor_accepts_optax_transforms_as_measures():
    tx = eqopt.monitor({"ema": optax.measure_with_ema(optax.tree.norm, 0.9)})
    params = {"w": jnp.ones(3)}
    state = tx.init(params)
    _, state = tx.update(params, state)
    np.testing.assert_allclose(state.measurements["ema"], jnp.sqrt(3.0), rtol=1e-6)


def test_measure_with_ema_jit_no_retrace_on_decay():
    measure = eqopt.measure_with_ema(eqopt.tree.norm, decay=0.9)
    params = {"w": jnp.ones(3)}
    traces = []

    @eqx.filter_jit
    def step(measure, state):
        traces.append(None)
        return measure.update(params, state)

    value, state = step(measure, measure.init(params))
    step(eqx.tree_at(lambda m: m.decay, measure, eqopt.as_scalar(0.5)), state)
    assert len(traces) == 1
    np.testing.assert_allclose(value, jnp.sqrt(3.0), rtol=1e-6)
