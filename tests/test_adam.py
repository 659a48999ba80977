"""Adam, AMSGrad and AdaMax (`eqopt/_transform/adam.py`): registry cases and behaviour
beyond parity."""

import jax.numpy as jnp
import jaxtyping
import numpy as np
import optax
import pytest
from helpers import ALL_DTYPES, Case

import eqopt

TRANSFORM_CASES = [
    Case(
        "scale_by_adam",
        eqopt.scale_by_adam,
        optax.scale_by_adam,
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_adam-nesterov",
        lambda: eqopt.scale_by_adam(b1=0.8, eps_root=1e-8, nesterov=True),
        lambda: optax.scale_by_adam(b1=0.8, eps_root=1e-8, nesterov=True),
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_adam-mu_dtype",
        lambda: eqopt.scale_by_adam(mu_dtype=jnp.bfloat16),
        lambda: optax.scale_by_adam(mu_dtype=jnp.bfloat16),
        ("float32",),
        needs_params=False,
        rtol=1e-2,
        atol=1e-2,
    ),
    Case(
        "scale_by_amsgrad",
        eqopt.scale_by_amsgrad,
        optax.scale_by_amsgrad,
        ALL_DTYPES,
        needs_params=False,
    ),
    Case(
        "scale_by_adamax",
        eqopt.scale_by_adamax,
        optax.scale_by_adamax,
        needs_params=False,
    ),
]


def test_adam_second_moment_is_real_for_complex_params():
    """Optax stores Adam's `nu` as complex with a zero imaginary part; eqopt stores it real.

    The updates are the same (the parity tests compare them on complex64).
    """
    params = {"w": jnp.array([1.0 + 2.0j, -0.5j])}
    for tx in (eqopt.scale_by_adam(), eqopt.scale_by_amsgrad()):
        state = tx.init(params)
        assert (
            state.nu["w"].dtype == jnp.float32 and state.mu["w"].dtype == jnp.complex64
        )
        _, state = tx.update({"w": jnp.array([0.3 - 0.1j, 2.0 + 0.0j])}, state)
        assert state.nu["w"].dtype == jnp.float32
    state = eqopt.scale_by_adam(nu_dtype=jnp.bfloat16).init({"w": jnp.ones(2)})
    assert state.nu["w"].dtype == jnp.bfloat16


def test_adam_complement_rounding():
    """The one documented numerical difference from Optax, and when it vanishes.

    eqopt stores `b2` as a float32 leaf, so `1 - b2` is rounded in float32; Optax
    subtracts in Python floats first. For a decay exactly representable in
    float32 (0.75) the two agree to the last bit.
    """
    b2 = eqopt.scale_by_adam().b2
    assert float(1 - b2) != float(jnp.float32(1 - 0.999))
    np.testing.assert_allclose(float(1 - b2), 1 - 0.999, rtol=2e-5)
    params = {"w": jnp.linspace(-1.0, 1.0, 7)}
    grads = {"w": jnp.linspace(0.3, -2.0, 7)}
    tx, reference = (
        eqopt.scale_by_adam(b1=0.5, b2=0.75),
        optax.scale_by_adam(b1=0.5, b2=0.75),
    )
    state, reference_state = tx.init(params), reference.init(params)
    for _ in range(3):
        updates, state = tx.update(grads, state)
        reference_updates, reference_state = reference.update(grads, reference_state)
        np.testing.assert_array_equal(updates["w"], reference_updates["w"])


@pytest.mark.parametrize("b1", [-0.1, 1.0, 1.5])
def test_decay_out_of_range(b1):
    with pytest.raises(ValueError, match="b1"):
        eqopt.scale_by_adam(b1=b1)


def test_state_field_types_are_checked():
    with pytest.raises(jaxtyping.TypeCheckError):
        eqopt.ScaleByAdamState(count=jnp.zeros(()), mu=None, nu=None)  # float count
