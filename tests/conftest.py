import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_checks", False)

# eqopt installs jaxtyping's beartype import hook over its own modules when it is
# imported (DESIGN §7), so importing it here is enough to test with checking on.
import jaxtyping  # noqa: E402

import eqopt  # noqa: E402,F401

assert not jaxtyping.config.jaxtyping_disable, "tests must run with type checking on"
