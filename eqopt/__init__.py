"""eqopt: gradient processing and optimisation for JAX, the Equinox way."""

import importlib.metadata

import jaxtyping as _jaxtyping

# Every public function, method and Module of eqopt carries jaxtyping annotations.
# Importing its modules under this hook checks them with beartype (at trace time
# under jit). Setting JAXTYPING_DISABLE=1 turns the checks off.
with _jaxtyping.install_import_hook("eqopt", "beartype.beartype"):
    from ._numerics import (
        bias_correction as bias_correction,
        global_norm as global_norm,
        safe_increment as safe_increment,
        safe_int32_increment as safe_int32_increment,
        safe_norm as safe_norm,
        safe_root_mean_squares as safe_root_mean_squares,
        update_infinity_moment as update_infinity_moment,
        update_moment as update_moment,
        update_moment_per_elem_norm as update_moment_per_elem_norm,
    )

try:
    __version__ = importlib.metadata.version("eqopt")
except importlib.metadata.PackageNotFoundError:  # running from a checkout
    __version__ = "0.1.0"
