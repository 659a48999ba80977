"""Registry cases for `eqopt.from_optax`: an Optax transform run by eqopt on the
standard model must give Optax's numbers (its behaviour tests are in test_interop.py)."""

import optax
from helpers import Case

import eqopt

TRANSFORM_CASES = [
    Case(
        "from_optax-adam",
        lambda: eqopt.from_optax(optax.adam(1e-2)),
        lambda: optax.adam(1e-2),
        ("float32", "bfloat16", "complex64"),
    ),
    Case(
        "from_optax-chain",
        lambda: eqopt.from_optax(
            optax.chain(optax.clip_by_global_norm(1.0), optax.add_decayed_weights(1e-2))
        ),
        lambda: optax.chain(
            optax.clip_by_global_norm(1.0), optax.add_decayed_weights(1e-2)
        ),
    ),
]
