"""Applying updates to parameters: `apply_updates`, and target-network updates."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import ArrayLike, Integer

from ._base import Params, Updates
from ._checks import check_updates
from ._leaves import drop_float0, is_none, is_trainable
from ._typecheck import checked


@checked
def apply_updates(params: Params, updates: Updates) -> Params:
    r"""Adds the updates to the parameters.

    $$ \theta \leftarrow \theta + u $$

    Where an update is `None` the parameter is returned untouched, so a whole
    Equinox model and the updates made from `eqx.filter_grad` gradients can be
    passed directly. Each result is cast to its parameter's dtype (a `bfloat16`
    parameter stays `bfloat16` even if its update is `float32`).

    **Arguments:**

    - `params`: the parameters, any pytree.
    - `updates`: shaped like `params`, `None` where a leaf is not updated.

    **Returns:** the new parameters, with the same structure and dtypes.

    **Raises:** `ValueError` naming the first path where `updates` does not
    match `params` in structure or shape.
    """
    updates = drop_float0(updates)
    check_updates(updates, params)

    def add(update, param):
        if update is None:
            return param
        return (param + update).astype(param.dtype)

    return jax.tree.map(add, updates, params, is_leaf=is_none)


@checked
def incremental_update(
    new_tensors: Params, old_tensors: Params, step_size: ArrayLike
) -> Params:
    r"""Moves a copy of the parameters towards new values (Polyak averaging).

    $$ \theta_{\text{old}} \leftarrow \tau\,\theta_{\text{new}} + (1 - \tau)\,\theta_{\text{old}} $$

    Used for target networks (Mnih et al., 2015; Lillicrap et al., 2016).
    Non-array leaves are taken from `new_tensors`.

    **Arguments:**

    - `new_tensors`: the latest parameters.
    - `old_tensors`: the running copy, same structure.
    - `step_size`: $\tau$, in $[0, 1]$.

    **Returns:** the updated copy.
    """
    check_updates(
        eqx.filter(new_tensors, is_trainable),
        old_tensors,
        name="new_tensors",
        reference_name="old_tensors",
    )

    def mix(new, old):
        if not is_trainable(new):
            return new
        return (step_size * new + (1.0 - step_size) * old).astype(old.dtype)

    return jax.tree.map(mix, new_tensors, old_tensors, is_leaf=is_none)


@checked
def periodic_update(
    new_tensors: Params,
    old_tensors: Params,
    steps: ArrayLike,
    update_period: int | Integer[ArrayLike, ""],
) -> Params:
    """Replaces the copy with the new parameters every `update_period` steps.

    Used for the target networks of DQN (Mnih et al., 2015).

    **Arguments:**

    - `new_tensors`: the latest parameters.
    - `old_tensors`: the copy, same structure.
    - `steps`: the current step.
    - `update_period`: how often to copy (a number, or an integer array: it
      may be traced).

    **Returns:** `new_tensors` when `steps % update_period == 0`, else `old_tensors`.
    """
    check_updates(
        eqx.filter(new_tensors, is_trainable),
        old_tensors,
        name="new_tensors",
        reference_name="old_tensors",
    )
    copy = jnp.mod(steps, update_period) == 0
    return jax.tree.map(
        lambda new, old: jnp.where(copy, new, old) if eqx.is_array(new) else new,
        new_tensors,
        old_tensors,
        is_leaf=is_none,
    )
