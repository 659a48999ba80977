"""Functions on pytrees, spelled as `optax.tree`, that understand whole Equinox models.

Only array leaves (`eqx.is_array`) are computed on. Other leaves (activation
functions, ints, strings, Python floats such as `Dropout.p`) pass through
unchanged and are ignored by reductions, and `None` leaves (as produced by
`eqx.filter_grad`) mark absent values. Functions of several pytrees raise one
`ValueError` naming the path of the first leaf at which their structures or
shapes disagree.
"""

from .._numerics import (
    bias_correction as bias_correction,
    update_infinity_moment as update_infinity_moment,
    update_moment as update_moment,
    update_moment_per_elem_norm as update_moment_per_elem_norm,
)
from ._casting import cast as cast, cast_like as cast_like, dtype as dtype
from ._creation import (
    full_like as full_like,
    ones_like as ones_like,
    random_like as random_like,
    split_key_like as split_key_like,
    unwrap_random_key_data as unwrap_random_key_data,
    zeros_like as zeros_like,
)
from ._math import (
    add as add,
    add_scale as add_scale,
    allclose as allclose,
    batch_shape as batch_shape,
    clip as clip,
    conj as conj,
    div as div,
    max as max,
    min as min,
    mul as mul,
    norm as norm,
    real as real,
    scale as scale,
    size as size,
    sub as sub,
    sum as sum,
    vdot as vdot,
    where as where,
)
from ._state import (
    get as get,
    get_all_with_path as get_all_with_path,
    map_params as map_params,
    set as set,
)
