"""The stateless blocks and scalings (`eqopt/_transform/basic.py`)."""

import equinox as eqx
import jax
import numpy as np
import optax
from helpers import as_dict, make_model, random_grads

import eqopt


def test_stateless_on_a_whole_model_with_non_array_leaves():
    """An Optax-style function mapping over updates and params works on a whole model.

    The function sees the params with `None` where the update is `None` (the
    activation function, the integer leaves), so the two trees have the same
    structure for `jax.tree.map`.
    """
    model = make_model()

    def double_plus_params(updates, params):
        return jax.tree.map(lambda g, p: 2 * g + p, updates, params)

    tx = eqopt.stateless(double_plus_params)
    reference = optax.stateless(double_plus_params)
    grads = random_grads(model, 0)
    updates, _ = tx.update(grads, tx.init(model), model)
    reference_updates, _ = reference.update(
        as_dict(grads), reference.init(as_dict(model)), as_dict(model)
    )
    assert updates.activation is None and updates.indices is None
    for name, expected in reference_updates.items():
        np.testing.assert_allclose(getattr(updates, name), expected, rtol=1e-6)
    # Without params the function gets None, as in Optax.
    seen = []
    tx = eqopt.stateless(lambda updates, params: seen.append(params) or updates)
    tx.update(grads, tx.init(model))
    assert seen == [None]
    # In a chain under filter_jit, with the model as params.
    chained = eqopt.chain(tx, eqopt.stateless(double_plus_params))
    step = eqx.filter_jit(chained.update)
    updates, _ = step(grads, chained.init(model), model)
    np.testing.assert_allclose(updates.w, 2 * grads.w + model.w, rtol=1e-6)
