"""`TrainState`: a model, its optimiser, the optimiser state and the step, in one Module."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int

from ._apply import apply_updates
from ._base import (
    AbstractGradientTransformation,
    OptState,
    Params,
    Updates,
)
from ._interop import as_transform
from ._numerics import safe_int32_increment
from ._typecheck import checked


@checked
class TrainState(eqx.Module):
    """Holds everything a training step changes: the model, the optimiser and its state.

    Flax's `TrainState`, the Equinox way: `model` is the whole model (non-array
    leaves included), and the optimiser `tx` is a field like any other, so its
    numeric hyperparameters are dynamic leaves. A `TrainState` passed to an
    `eqx.filter_jit`-ed step does not retrace when the learning rate changes
    (change it with `eqx.tree_at`, keeping its dtype).

    **Fields:**

    - `model`: the parameters, typically a whole Equinox model.
    - `tx`: the optimiser, any eqopt transform.
    - `opt_state`: the optimiser state.
    - `step`: the number of `apply_gradients` calls so far, an `int32` scalar.

    Build it with `eqopt.TrainState.create`.

    !!! example "A jitted step"

        ```python
        state = eqopt.TrainState.create(model=model, tx=eqopt.adam(1e-3))

        @eqx.filter_jit
        def train_step(state, x, y):
            loss, grads = eqx.filter_value_and_grad(loss_fn)(state.model, x, y)
            return state.apply_gradients(grads), loss

        state, loss = train_step(state, x, y)
        ```

    !!! example "Many steps in one `jax.lax.scan`"

        A scan carry holds arrays only, while a model and an optimiser also
        have non-array leaves (activation functions, static settings).
        Partition the state once with `eqx.partition`: the arrays travel as
        the carry, the rest is closed over and recombined inside the body.
        `apply_gradients` never changes the non-array part, so it is the same
        at every step.

        ```python
        @eqx.filter_jit
        def train(state, xs, ys):
            dynamic, static = eqx.partition(state, eqx.is_array)

            def body(dynamic, batch):
                state = eqx.combine(dynamic, static)
                loss, grads = eqx.filter_value_and_grad(loss_fn)(state.model, *batch)
                state = state.apply_gradients(grads)
                return eqx.filter(state, eqx.is_array), loss

            dynamic, losses = jax.lax.scan(body, dynamic, (xs, ys))
            return eqx.combine(dynamic, static), losses
        ```
    """

    model: Params
    tx: AbstractGradientTransformation
    opt_state: OptState
    step: Int[Array, ""]

    @classmethod
    def create(cls, *, model: Params, tx: Any) -> "TrainState":
        """Builds a `TrainState` at step 0, initialising the optimiser state from the model.

        **Arguments:**

        - `model`: the parameters, any pytree; a whole Equinox model needs no
          filtering.
        - `tx`: the optimiser, an eqopt transform (or an object with `init` and
          `update`, such as an Optax transformation, which is wrapped).

        **Returns:** the `TrainState`.
        """
        tx = as_transform(tx)
        return cls(
            model=model, tx=tx, opt_state=tx.init(model), step=jnp.zeros([], jnp.int32)
        )

    def apply_gradients(self, grads: Updates, **extra_args: Any) -> "TrainState":
        """Takes one optimiser step.

        Computes the updates with `tx.update(grads, opt_state, model,
        **extra_args)`, adds them to the model with `eqopt.apply_updates`
        and increments `step`.

        **Arguments:**

        - `grads`: the gradients, shaped like the model with `None` where a leaf
          is not differentiated (as `eqx.filter_grad` gives them).
        - `**extra_args`: forwarded to `tx.update` (`value=loss` for
          optimisers that use the loss, for example).

        **Returns:** the new `TrainState`.
        """
        updates, opt_state = self.tx.update(
            grads, self.opt_state, self.model, **extra_args
        )
        return TrainState(
            model=apply_updates(self.model, updates),
            tx=self.tx,
            opt_state=opt_state,
            step=safe_int32_increment(self.step),
        )
