r"""Quantised optimiser moments: 8-bit and 4-bit codes with block-wise or rank-1 scales.

A moment tree normally holds one array per trainable leaf. Given a
`eqopt.Quantized` format as its dtype (`mu_dtype=eqopt.Quantized(8)`), it
holds a `eqopt.QuantizedArray` instead: one small integer code per element
and a few float32 scales (one per block of elements, or one per row and per
column of a matrix). `dequantize()` gives the moment back;
`eqopt.tree.get` dequantises what it returns.

Per-leaf code (`eqopt._base.leafwise`) dequantises a quantised input before the
transform's arithmetic runs and quantises the matching output with the same
format afterwards, so a transform supports quantised moments by creating them
in `init` (`eqopt._quantize.moment_like`) and nothing else.

Two maps, after the papers:

- **First moments** (signed): the *dynamic* map of Dettmers et al. (default),
  whose $2^{b-1}-1$ positive values cover $b-1$ decades below the block's
  absolute maximum with $2^i$ linearly spaced values in the $i$-th decade, plus
  zero and $1$; or a signed *linear* map $c / (2^{b-1} - 1)$.
- **Second moments** (non-negative): Li et al. show that the zero code of the
  second moment is what breaks 4-bit Adam (a small $v$ rounded to zero makes
  $m / \sqrt{v}$ explode). The format stores $\sqrt v$ (halving the dynamic
  range in decades) on a linear map *without a zero point*,
  $(c + 1) / 2^b$, so a code never decodes to zero unless the whole block is
  zero (its scale is zero).

Two normalisations: a block of consecutive elements shares one scale, its
absolute maximum (Dettmers et al.); or, for a matrix, element $(i, j)$ is
divided by $\min(r_i, c_j)$, the smaller of its row's and its column's absolute
maxima (Li et al.'s *rank-1 normalisation*, which they prescribe for 4-bit
second moments: their outliers run along whole rows and columns). With more
axes, the least of the maxima of the slices through the element along each
axis. Blocks are the default; rank-1 is asked for with
`normalization="rank1"`.

Two roundings: to the nearest code, or *stochastic* (Gupta et al.), the code
just above with the probability that makes the decoded value right on
average. A moment is re-quantised every step after being multiplied by
$\beta$: at 4 bits, $\beta x$ (0.9 or 0.999 of $x$) usually rounds back to
the code of $x$, so with rounding to nearest a moment stops decaying and small
gradients stop reaching it; stochastic rounding keeps both on average. The
random number is a hash of the element's position, the optimiser's step
and the block's stored scale (`_codec._dither`; of the value's float bits
for a transform that gives no step), so no key is stored, a state rounds the
same way every time, and a layout that splits or pads the rows (ZeRO-1)
draws the same numbers.

The nearest code is computed arithmetically (comparisons for the decade,
one floor for the grid cell), never searched: a search over the map cost
several whole float32 Adam steps.
The block maxima of all the quantised moments of a leaf are one reduction
(`requantize_all`), which fuses with the moment update.
Zeros and constants are built directly as codes and scales, never quantised
inside `jit` (quantising a large constant stalled XLA's constant folding for
seconds).

The package, lowest first: `_format` (the `eqopt.Quantized` format),
`_codec` (the maps, rounding, 4-bit packing, and whether codes are decoded by a
lookup: the backend's part of that choice is `eqopt._backend`), `_array` (the
`eqopt.QuantizedArray` type, quantising and requantising), `_tree` (moment
trees: `moment_like`, `cast_moment`, `dequantize_all`), `_call` (the per-leaf
call `call_dequantized` and its kernels in rows of blocks).
Measurements behind these choices, dated, are in `benchmarks/README.md`
("History: quantised moments").

**References:** Dettmers, Lewis, Shleifer & Zettlemoyer, *8-bit Optimizers via
Block-wise Quantization*, ICLR 2022; Li, Chen & Zhu, *Memory Efficient Optimizers
with 4-bit States*, NeurIPS 2023; Gupta, Agrawal, Gopalakrishnan & Narayanan,
*Deep Learning with Limited Numerical Precision*, ICML 2015 (stochastic
rounding).
"""

from ._array import (
    QuantizedArray as QuantizedArray,
    _block_maxima as _block_maxima,
    _cut_rows as _cut_rows,
    _flatten as _flatten,
    _inverse as _inverse,
    _joined as _joined,
    _quantize_rank1 as _quantize_rank1,
    _quantized_rows as _quantized_rows,
    _rank1_scales as _rank1_scales,
    _rows as _rows,
    _unflatten as _unflatten,
    is_quantized as is_quantized,
    requantize_all as requantize_all,
)
from ._call import (
    _block_rows as _block_rows,
    _call_in_rows as _call_in_rows,
    call_dequantized as call_dequantized,
)
from ._codec import (
    _decode as _decode,
    _decode_dynamic as _decode_dynamic,
    _decode_dynamic_arithmetic as _decode_dynamic_arithmetic,
    _dither as _dither,
    _encode as _encode,
    _encode_dynamic as _encode_dynamic,
    _encode_stochastic as _encode_stochastic,
    _looks_up as _looks_up,
    _pack_nibbles as _pack_nibbles,
    _unpack_nibbles as _unpack_nibbles,
    decoding_table as decoding_table,
    dynamic_map as dynamic_map,
)
from ._format import (
    MomentDType as MomentDType,
    Quantized as Quantized,
    is_quantized_format as is_quantized_format,
)
from ._tree import (
    any_quantized as any_quantized,
    cast_moment as cast_moment,
    dequantize_all as dequantize_all,
    moment_like as moment_like,
    quantized_on_buffers as quantized_on_buffers,
    with_lookup as with_lookup,
)
