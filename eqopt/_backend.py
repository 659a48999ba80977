"""The backend-dependent choices of eqopt, each with the measurement that made it.

Everything else runs the same program on every backend. A choice made here is
read at trace time (`jax.default_backend()`), so a program compiled for one
backend never runs the other's code.
"""

from typing import no_type_check

import jax


@no_type_check
def decodes_by_lookup(bits: int) -> bool:
    """Whether stored 8-bit dynamic-map codes of a quantised moment are decoded
    by a lookup in the map rather than arithmetically.

    On CPU, at 8 bits: XLA runs the gather as a pass of its own that writes the
    values once, where the arithmetic was repeated in each of the three kernels
    that read a moment (its block maxima, the update, the new codes): an 8-bit
    Adam step takes 0.7-0.8 of the time (`benchmarks/lowbit_bench.py`). Not at
    4 bits (the lookup made the step 1.7-2.4 times as long). Off CPU,
    arithmetic: fused into each kernel, it costs no memory traffic (on an H100
    the lookup was no faster). Both give the map's values to float32's last
    bit (the arithmetic's differs for 66 of the 256 8-bit codes). A moment of a
    leaf cut from a packed buffer never looks up (`QuantizedArray.lookup`).
    """
    return bits == 8 and jax.default_backend() == "cpu"


@no_type_check
def decomposes_one_slice_at_a_time() -> bool:
    """Whether a vmapped matrix decomposition (`eigh`, `qr`, an SVD, a triangular
    solve: `eqopt/_linalg.py`) calls LAPACK once per slice instead of once batched.

    On CPU: jaxlib splits a batched LAPACK call over the thread pool that runs
    the program and blocks its thread until the parts finish, so two such calls
    at once can leave no worker to run a part and the step hangs (Shampoo's
    bucketed roots: 5 of 8 runs of the zoo on 2 cores; SOAP on 24 scanned
    blocks at its first refresh, two QRs at once). One at a time (`lax.map`) it
    never hung, and gives the batched call's numbers bit for bit. Off CPU the
    batched call is kept.
    """
    return jax.default_backend() == "cpu"


@no_type_check
def lacks_host_memory() -> str | None:
    """Why the default backend cannot hold state in host memory
    (`eqopt.offload`), or `None` where it can.

    It can where its devices have a `pinned_host` memory space and JAX moves
    arrays between memory spaces inside `jit` (`jax.memory.Space`): GPUs,
    TPUs, and the CPU (whose host and device memories are the same RAM, so
    there the transfers compile to nothing).
    """
    if not hasattr(jax, "memory"):
        return f"JAX {jax.__version__} has no `jax.memory` (memory spaces)"
    kinds = {memory.kind for memory in jax.devices()[0].addressable_memories()}
    if "pinned_host" not in kinds:
        return (
            f"the {jax.default_backend()} backend's devices have no 'pinned_host' "
            f"memory (they have {sorted(kinds)})"
        )
    return None
