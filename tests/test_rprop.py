"""Rprop: registry cases and behaviour (eqopt's updates do not lag as Optax 0.2.8's do)."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _training import train
from helpers import Case, as_dict, assert_tree_allclose, make_model, random_grads

import eqopt

LAG = (
    "Optax 0.2.8 returns the previous step's update (optax PR #1725); "
    "test_rprop_matches_optax_state_without_the_lag compares the numbers"
)

TRANSFORM_CASES = [
    Case("rprop", lambda: eqopt.rprop(1e-2), None, no_parity_reason=LAG),
    Case(
        "scale_by_rprop",
        lambda: eqopt.scale_by_rprop(
            0.1, eta_minus=0.25, eta_plus=2.0, min_step_size=0.01, max_step_size=0.5
        ),
        None,
        no_parity_reason=LAG,
    ),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rprop_matches_optax_state_without_the_lag(dtype):
    model = make_model(jnp.dtype(dtype))
    params = as_dict(model)
    arguments = dict(eta_minus=0.25, eta_plus=2.0, min_step_size=0.01)
    tx, reference = eqopt.rprop(0.1, **arguments), optax.rprop(0.1, **arguments)
    state, reference_state = tx.init(model), reference.init(params)
    for step in range(6):
        grads = random_grads(model, step % 3)  # repeats, so signs agree sometimes
        updates, state = tx.update(grads, state, model)
        reference_updates, reference_state = reference.update(
            as_dict(grads), reference_state, params
        )
        # Same state; our update is the one Optax stores and returns a step later.
        assert_tree_allclose(
            as_dict(state[0].step_sizes), reference_state[0].step_sizes, rtol=0
        )
        assert_tree_allclose(
            as_dict(updates),
            optax.tree.scale(-1.0, reference_state[0].prev_updates),
            rtol=0,
        )
        if step == 0:
            assert np.all(np.asarray(reference_updates["w"]) == 0)
            assert np.all(np.asarray(updates.w) != 0)
        model = eqopt.apply_updates(model, updates)
        params = as_dict(model)


def test_rprop_step_sizes_grow_and_shrink_with_sign_agreement():
    tx = eqopt.scale_by_rprop(
        1.0, eta_minus=0.5, eta_plus=2.0, min_step_size=0.2, max_step_size=5.0
    )
    params = {"w": jnp.zeros(2)}
    state = tx.init(params)
    # Element 0 keeps its sign; element 1 alternates.
    signs = [(1.0, 1.0), (2.0, -1.0), (0.5, 1.0), (3.0, -1.0), (1.0, 1.0)]
    sizes, steps = [], []
    for g in signs:
        updates, state = tx.update({"w": jnp.array(g)}, state)
        sizes.append(np.asarray(state.step_sizes["w"]))
        steps.append(np.asarray(updates["w"]))
    # Agreement doubles the step up to the maximum; the magnitude of g is ignored.
    np.testing.assert_allclose([s[0] for s in sizes], [1.0, 2.0, 4.0, 5.0, 5.0])
    np.testing.assert_allclose([u[0] for u in steps], [1.0, 2.0, 4.0, 5.0, 5.0])
    # A sign change halves the step (down to the minimum) and pauses the element;
    # after the pause there is no previous sign, so the step is kept.
    np.testing.assert_allclose([s[1] for s in sizes], [1.0, 0.5, 0.5, 0.25, 0.25])
    np.testing.assert_allclose([u[1] for u in steps], [1.0, 0.0, 0.5, 0.0, 0.25])
    for _ in range(3):
        _, state = tx.update({"w": jnp.array([1.0, -1.0])}, state)
        _, state = tx.update({"w": jnp.array([1.0, 1.0])}, state)
    np.testing.assert_allclose(state.step_sizes["w"][1], 0.2)


def test_rprop_rejects_complex_params():
    with pytest.raises(ValueError, match=r"complex.*\.w"):
        eqopt.rprop(0.1).init(make_model(jnp.complex64))


def test_rprop_trains():
    first, last, _, _ = train(eqopt.rprop(1e-2), problem="mlp-2-1")
    assert last < 0.1 * first
