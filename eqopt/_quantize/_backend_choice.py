"""The one backend-dependent choice of quantised moments: whether stored 8-bit
dynamic-map codes are decoded by a lookup in the map (CPU) or arithmetically.

Read by `QuantizedArray._decoded` (`_array.py`) and by `_block_rows` (`_call.py`,
which runs an elementwise update in the moments' rows where a lookup decodes
them). A moment of a leaf cut from a packed buffer never looks up: its
`QuantizedArray.lookup` is `False` (`_tree.without_lookup`, applied by the
packed adapter of `init` in `eqopt/_entry.py`).
"""

from typing import no_type_check

import jax


@no_type_check
def _looks_up(bits, lookup=True):
    """Whether a stored moment's dynamic-map codes are decoded by a lookup.

    On CPU, at 8 bits: XLA runs the gather as a pass of its own that writes
    the values once, where the arithmetic was repeated in each of the three
    kernels that read a moment (its block maxima, the update, the new codes):
    an 8-bit Adam step takes 0.7-0.8 of the time (`benchmarks/lowbit_bench.py`).
    Not at 4 bits, nor on the leaves cut from a packed buffer (`lookup` is
    `False` there): there the lookup makes the step 1.7-2.4 times as long.
    Off CPU, arithmetic: fused into each kernel, it costs no memory traffic
    (on an H100 the lookup is no faster). Both give the map's values to
    float32's last bit (the arithmetic's differs for 66 of the 256 8-bit
    codes).
    """
    return lookup and bits == 8 and jax.default_backend() == "cpu"
