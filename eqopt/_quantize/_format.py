"""The storage format of quantised moments: `eqopt.Quantized`, and the test for it."""

import dataclasses
from typing import Any, Literal, no_type_check

from jax.typing import DTypeLike


@dataclasses.dataclass(frozen=True)
class Quantized:
    """A storage format for optimiser moments: 8-bit or 4-bit codes with scales.

    Pass it wherever a moment dtype is accepted (`mu_dtype`, `nu_dtype` of
    `eqopt.adam`, `eqopt.adamw`, `eqopt.lion`, `eqopt.rmsprop`,
    `eqopt.contrib.ademamix`, `eqopt.contrib.muon`...). Each moment leaf
    of at least `min_size` elements is then stored as a
    `eqopt.QuantizedArray`: one code per element and float32 scales, one
    per block of `block_size` elements (the block's absolute maximum) or, with
    rank-1 normalisation, one per row and per column. Smaller leaves (biases,
    norms' scales) stay in float32, as bitsandbytes keeps them: they cost
    little memory and are the most sensitive to rounding.

    First moments use the signed dynamic map of Dettmers et al. (or a signed
    linear map); second moments store $\\sqrt v$ on a linear map without a zero
    point, the zero-safe scheme that Li et al.'s analysis calls for:

    $$
    \\hat x = s \\cdot q[c], \\qquad
    s = \\max_{i \\in B} |x_i| \\ \\text{(block } B\\text{)} \\quad \\text{or} \\quad
    s_{ij} = \\min\\big(\\max_k |x_{ik}|, \\max_k |x_{kj}|\\big) \\ \\text{(rank-1)},
    $$

    with $c$ the nearest code to $x / s$, or with stochastic rounding one of
    the two codes around it, chosen so that $\\hat x$ is $x$ on average.

    Moments are rounded stochastically by default, at 8 bits as at 4. A
    moment is requantised every step after being multiplied by $\\beta$, and
    rounded to nearest, $\\beta x$ rounds back to the code of $x$ wherever the
    map's step there is more than twice $(1 - \\beta) x$: for the second
    moment ($\\beta_2 = 0.999$, $\\sqrt v$ on a linear map) that is every code
    below the block's maximum, at 8 bits as at 4; for the first moment
    ($\\beta_1 = 0.9$, the dynamic map) the lower codes of each decade
    below a tenth of the block's maximum. Such a moment stops
    decaying and then follows its block's maximum: after a gradient of 0.1 and
    1000 steps without one, next to an element whose gradient stays 1, an
    8-bit second moment rounded to nearest holds 6.2e-4 where float32's is
    3.7e-6 (rounded stochastically it reaches the map's lowest value, 9.7e-6).
    On the digits MLP of `examples/low_memory.py`, 4-bit Adam rounded to
    nearest ends training 8.9% above float32 AdamW's loss (stochastically:
    1.3%); on its teacher-student regression (`--regression 5`), 8-bit Adam
    rounded to nearest ends 0.31% below float32's training loss and 0.15%
    above its held-out loss on every seed, rounded stochastically +0.02% and
    -0.02%. The rounding draws
    from a hash of each element's position, the step and the block's stored
    scale (no key is stored), so a ZeRO-1 plan stores the unsharded codes
    bit for bit; a transform that gives no step hashes the value's float
    bits instead.
    `rounding="nearest"` gives bitsandbytes' rounding (and a slightly less
    noisy step). Li et al. prescribe rank-1 normalisation
    for 4-bit second moments (`Quantized(4, normalization="rank1")` as the
    `nu_dtype`); it is not the default because on the small matrices of the
    examples it did not measurably help, and on a CPU it makes a 4-bit Adam
    step about 1.6 times slower (the row and column maxima are two more
    reductions over each second moment).

    State bytes per parameter for Adam (two moments, scales included):
    8-bit with blocks of 256: 2.03; 4-bit with blocks of 128: 1.06, 1.04 with
    rank-1 second moments of 1024×1024 matrices (float32: 8).

    Quantised moments are exact at zero and at each block's maximum (with
    rank-1 scales, at each row's and each column's maximum). Rounded to
    nearest, the relative error of the dynamic map is at most half a step of
    its decade ($0.45 / 2^i$ of $10^{i-b+2}$); stochastic rounding errs by less
    than a whole step and by nothing on average. See the tests for the bounds.

    On a packed model (`eqopt.pack`, `eqopt.bucketed`) a moment is by
    default quantised as one array per buffer (`packed_blocks="buffer"`): the
    step runs on the buffers as they are, as float32 Adam's does, where
    cutting the model into leaves and gluing the update back made a packed
    8-bit Adam step 1.2 (H100) to 2 (CPU) times the per-leaf one
    (`benchmarks/lowbit_bench.py`). Blocks then run across the boundaries
    between leaves, and leaves under `min_size` are quantised with their
    neighbours (a buffer under `min_size` stays in float32), so the numbers
    are those of the transform on the buffers taken as leaves, not the
    per-leaf ones; training is as close to float32 Adam either way (the
    tests compare both). `packed_blocks="leaf"` unpacks the
    model for the transform instead and gives the per-leaf numbers and state;
    so does rank-1 normalisation, which needs the leaves' matrices.

    **Arguments:**

    - `bits`: 8 or 4.
    - `block_size`: elements per block (default 256 for 8 bits, 128 for 4 bits,
      the papers' choices). A multiple of 2.
    - `min_size`: leaves with fewer elements stay in float32 (default 4096, as
      bitsandbytes).
    - `first_moment_map`: `"dynamic"` (default) or `"linear"`.
    - `normalization`: `"block"` (default: a scale per block of `block_size`
      elements) or `"rank1"` (a scale per row and per column, per index of
      every axis: fewer scales than blocks for a large matrix, more for a
      small one), for leaves with two axes longer than one; vectors keep
      blocks, as in Li et al.
    - `rounding`: `"nearest"` or `"stochastic"`. Default `None`: stochastic
      (at 4 and 8 bits: rounded to nearest, a moment stops decaying).
    - `packed_blocks`: on a packed model, `"buffer"` (default: each buffer's
      moment is one quantised array, blocks across leaves) or `"leaf"` (the
      model is unpacked for the transform: blocks within leaves, small leaves
      in float32, the per-leaf numbers).

    !!! example

        ```python
        opt = eqopt.adamw(1e-3, mu_dtype=eqopt.Quantized(8), nu_dtype=eqopt.Quantized(8))
        state = opt.init(model)
        mu = eqopt.tree.get(state, "mu")   # model-shaped float32 arrays
        ```

    **References:** Dettmers et al., *8-bit Optimizers via Block-wise
    Quantization*, ICLR 2022; Li et al., *Memory Efficient Optimizers with 4-bit
    States*, NeurIPS 2023 (rank-1 normalisation, the zero-free second moment);
    Gupta et al., *Deep Learning with Limited Numerical Precision*, ICML 2015
    (stochastic rounding).
    """

    bits: int = 8
    block_size: int | None = None
    min_size: int = 4096
    first_moment_map: Literal["dynamic", "linear"] = "dynamic"
    normalization: Literal["block", "rank1"] = "block"
    rounding: Literal["nearest", "stochastic"] | None = None
    packed_blocks: Literal["buffer", "leaf"] = "buffer"

    def __post_init__(self):
        if self.bits not in (4, 8):
            raise ValueError(f"Quantized: `bits` must be 4 or 8, got {self.bits}.")
        if self.block_size is not None and (self.block_size < 2 or self.block_size % 2):
            raise ValueError(
                f"Quantized: `block_size` must be a positive even number, got {self.block_size}."
            )
        if self.first_moment_map not in ("dynamic", "linear"):
            raise ValueError(
                "Quantized: `first_moment_map` must be 'dynamic' or 'linear', got "
                f"{self.first_moment_map!r}."
            )
        if self.normalization not in ("block", "rank1"):
            raise ValueError(
                "Quantized: `normalization` must be 'block' or 'rank1', got "
                f"{self.normalization!r}."
            )
        if self.packed_blocks not in ("buffer", "leaf"):
            raise ValueError(
                "Quantized: `packed_blocks` must be 'buffer' or 'leaf', got "
                f"{self.packed_blocks!r}."
            )
        if self.rounding not in (None, "nearest", "stochastic"):
            raise ValueError(
                "Quantized: `rounding` must be 'nearest', 'stochastic' or None, got "
                f"{self.rounding!r}."
            )

    @property
    def block(self) -> int:
        """The block size in use."""
        if self.block_size is not None:
            return self.block_size
        return 256 if self.bits == 8 else 128

    def normalization_of(self, shape: tuple[int, ...]) -> str:
        """The normalisation of a moment of `shape`: `"rank1"` where asked for and
        the leaf has two axes longer than one (vectors keep blocks, as in Li et
        al.), `"block"` otherwise."""
        matrix = sum(length > 1 for length in shape) >= 2
        return "rank1" if self.normalization == "rank1" and matrix else "block"

    @property
    def rounding_in_use(self) -> str:
        """The rounding in use: as given, or by default stochastic (rounded to
        nearest, a moment stops decaying: see `eqopt.Quantized`)."""
        if self.rounding is not None:
            return self.rounding
        return "stochastic"


#: A moment's storage: a dtype, `None` (the params'), or a `eqopt.Quantized` format.
MomentDType = DTypeLike | Quantized | None


@no_type_check  # called once per leaf at trace time
def is_quantized_format(dtype: Any) -> bool:
    """Whether a moment dtype is a `eqopt.Quantized` format."""
    return isinstance(dtype, Quantized)
