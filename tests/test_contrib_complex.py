"""`eqopt.contrib.split_real_and_imaginary`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from helpers import Case, make_model, random_grads
from jaxtyping import Array, Complex

import eqopt

ALL_DTYPES = ("float32", "bfloat16", "complex64")

TRANSFORM_CASES = [
    Case(
        "contrib.split_real_and_imaginary-adam",
        lambda: eqopt.contrib.split_real_and_imaginary(eqopt.adam(0.1)),
        lambda: optax.contrib.split_real_and_imaginary(optax.adam(0.1)),
        ALL_DTYPES,
    ),
    Case(
        "contrib.split_real_and_imaginary-lamb-like",
        lambda: eqopt.contrib.split_real_and_imaginary(
            eqopt.chain(eqopt.scale_by_rms(), eqopt.add_decayed_weights(0.1))
        ),
        lambda: optax.contrib.split_real_and_imaginary(
            optax.chain(optax.scale_by_rms(), optax.add_decayed_weights(0.1))
        ),
        ALL_DTYPES,
    ),
]


def test_parts_are_optimised_as_separate_real_leaves():
    model = make_model(jnp.complex64)
    grads = random_grads(model, 0)
    tx = eqopt.contrib.split_real_and_imaginary(eqopt.scale_by_rms())
    updates, state = tx.update(grads, tx.init(model), model)
    inner = eqopt.scale_by_rms()
    real_updates, _ = inner.update(
        {"w": jnp.real(grads.w)}, inner.init({"w": jnp.real(model.w)})
    )
    imaginary_updates, _ = inner.update(
        {"w": jnp.imag(grads.w)}, inner.init({"w": jnp.imag(model.w)})
    )
    np.testing.assert_allclose(jnp.real(updates.w), real_updates["w"], rtol=1e-6)
    np.testing.assert_allclose(jnp.imag(updates.w), imaginary_updates["w"], rtol=1e-6)
    # The inner state holds the two parts as real arrays.
    nu = state.inner_state.nu.w
    assert nu.real.dtype == jnp.float32 and nu.imaginary.dtype == jnp.float32
    # Unlike a complex-aware RMS (|g|^2), the split one scales the parts separately.
    complex_aware, _ = eqopt.scale_by_rms().update(
        grads, eqopt.scale_by_rms().init(model)
    )
    assert not np.allclose(updates.w, complex_aware.w)


class ComplexLinear(eqx.Module):
    weight: Complex[Array, "3 2"]
    activation: object = jnp.tanh

    def __call__(self, x):
        return x @ self.weight


def test_trains_a_complex_model():
    key_x, key_w = jax.random.split(jax.random.key(0))
    x = jax.random.normal(key_x, (32, 3)) + 1j * jax.random.normal(key_w, (32, 3))
    true_weight = jnp.array([[1 + 2j, -1j], [0.5, 2 - 1j], [-1 + 1j, 0.3j]])
    y = x @ true_weight
    model = ComplexLinear(jnp.zeros((3, 2), jnp.complex64))
    opt = eqopt.contrib.split_real_and_imaginary(eqopt.adam(0.05))
    state = opt.init(model)

    def loss(model):
        return jnp.mean(jnp.abs(model(x) - y) ** 2)

    @eqx.filter_jit
    def step(model, state):
        value, grads = eqx.filter_value_and_grad(loss)(model)
        # jax.grad of a real loss gives the conjugate of the descent direction.
        grads = jax.tree.map(jnp.conj, grads)
        updates, state = opt.update(grads, state, model)
        return eqopt.apply_updates(model, updates), state, value

    first = float(loss(model))
    for _ in range(150):
        model, state, _ = step(model, state)
    assert float(loss(model)) < 0.01 * first
    assert model.activation is jnp.tanh
