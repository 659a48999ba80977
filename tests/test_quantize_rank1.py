"""Rank-1 normalisation of quantised moments against Li et al.'s definition: the
scales, the error bound, more axes, which leaves, and ZeRO."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqopt
from eqopt._quantize import (
    QuantizedArray,
    _rank1_scales,
)

# ---------------------------------------------------------------------------
# Rank-1 normalisation (Li et al.)
# ---------------------------------------------------------------------------


def _rows_times_columns(shape, key=7):
    """Positive values whose size is mostly a row's times a column's, each spread
    over decades (the outlier pattern Li et al. find in second moments)."""
    keys = jax.random.split(jax.random.key(key), 3)
    rows = 1.5 * jax.random.normal(keys[0], (shape[0], 1))
    columns = 1.5 * jax.random.normal(keys[1], (1, shape[1]))
    return jnp.exp(rows + columns + 0.5 * jax.random.normal(keys[2], shape))


@pytest.mark.parametrize("kind", ["sqrt", "dynamic", "linear"])
def test_rank1_scale_is_the_smaller_of_row_and_column_maxima(kind):
    """Li et al.: element (i, j) is normalised by min(max_k |x_ik|, max_k |x_kj|);
    the scales are the row maxima then the column maxima (of sqrt(v) for a
    second moment), and every row's and column's maximum is exact."""
    v = _rows_times_columns((96, 160))
    x = v if kind == "sqrt" else v * jnp.sign(jnp.sin(jnp.arange(160.0) * 3))[None, :]
    q = QuantizedArray.quantize(x, 4, kind, 128, normalization="rank1")
    magnitude = np.sqrt(np.asarray(v)) if kind == "sqrt" else np.abs(np.asarray(x))
    rows, columns = magnitude.max(axis=1), magnitude.max(axis=0)
    np.testing.assert_allclose(q.scales, np.concatenate([rows, columns]), rtol=1e-6)
    scale = np.minimum(rows[:, None], columns[None, :])
    np.testing.assert_allclose(_rank1_scales(q.scales, (96, 160)), scale, rtol=1e-6)
    assert q.scales.shape == (96 + 160,) and q.normalization == "rank1"
    assert q.codes.shape == (96 * 160 // 128, 64) and q.dequantize().shape == (96, 160)
    deq = np.asarray(q.dequantize())
    for axis in (0, 1):
        top = np.argmax(magnitude, axis=axis)
        index = (top, np.arange(160)) if axis == 0 else (np.arange(96), top)
        # The dynamic map has no -1 (as bitsandbytes'): positive maxima are exact.
        exact = np.asarray(x)[index] >= 0 if kind == "dynamic" else slice(None)
        np.testing.assert_allclose(
            deq[index][exact], np.asarray(x)[index][exact], rtol=1e-5
        )


def test_rank1_error_is_half_a_step_of_the_elements_scale():
    """Rounded to nearest, sqrt(v) errs by at most half a level of min(r_i, c_j)
    (the block bound, with the element's own scale); where sizes go by rows and
    columns, the update's typical error is well below the block-wise one."""
    v = _rows_times_columns((128, 256))
    rank1 = QuantizedArray.quantize(v, 4, "sqrt", 128, normalization="rank1")
    block = QuantizedArray.quantize(v, 4, "sqrt", 128)
    root = np.sqrt(np.asarray(v))
    scale = np.minimum(root.max(axis=1, keepdims=True), root.max(axis=0, keepdims=True))
    error = np.abs(np.sqrt(np.asarray(rank1.dequantize())) - root)
    above = root >= scale / 16
    assert np.all(error[above] <= (scale / 32 * (1 + 1e-5))[above])
    assert np.all(np.asarray(rank1.dequantize()) > 0)

    def update_error(q):  # of 1 / sqrt(v), the factor Adam's step takes
        return np.median(
            np.abs(np.sqrt(np.asarray(v) / np.asarray(q.dequantize())) - 1)
        )

    assert update_error(rank1) < 0.75 * update_error(block)


def test_rank1_with_more_axes_takes_the_least_of_every_axis_maximum():
    x = (
        _rows_times_columns((12, 40))[:, :, None]
        * jnp.linspace(1.0, 3.0, 30)[None, None]
    )
    q = QuantizedArray.quantize(x, 4, "dynamic", 128, normalization="rank1")
    magnitude = np.abs(np.asarray(x))
    maxima = [
        magnitude.max(axis=(1, 2)),
        magnitude.max(axis=(0, 2)),
        magnitude.max(axis=(0, 1)),
    ]
    np.testing.assert_allclose(q.scales, np.concatenate(maxima), rtol=1e-6)
    scale = np.minimum(
        np.minimum(maxima[0][:, None, None], maxima[1][None, :, None]),
        maxima[2][None, None, :],
    )
    np.testing.assert_allclose(_rank1_scales(q.scales, x.shape), scale, rtol=1e-6)
    assert np.all(np.abs(np.asarray(q.dequantize()) - magnitude) <= 0.12 * scale)


def test_which_leaves_are_rank1():
    """Asked for, rank-1 applies to every leaf with two axes longer than one;
    vectors keep blocks (Li et al.). Blocks and stochastic rounding (at 8 bits
    as at 4) are the defaults."""
    rank1 = eqopt.Quantized(4, normalization="rank1")
    assert rank1.normalization_of((128, 64)) == "rank1"
    assert rank1.normalization_of((8, 16, 16)) == "rank1"
    assert rank1.normalization_of((4096, 1)) == "block"
    assert rank1.normalization_of((1 << 20,)) == "block"
    four, eight = eqopt.Quantized(4), eqopt.Quantized(8)
    assert four.normalization_of((1024, 512)) == "block"
    assert four.rounding_in_use == eight.rounding_in_use == "stochastic"
    assert eqopt.Quantized(8, rounding="nearest").rounding_in_use == "nearest"
    params = {"w": jnp.ones((128, 64)), "v": jnp.ones(8192)}
    state = eqopt.adam(1e-3, mu_dtype=four, nu_dtype=rank1).init(params)
    nu, mu = state[0].nu, state[0].mu
    assert nu["w"].normalization == "rank1" and nu["w"].scales.shape == (192,)
    assert nu["v"].normalization == "block" and mu["w"].normalization == "block"
    assert nu["w"].rounding == mu["w"].rounding == "stochastic"
    np.testing.assert_array_equal(nu["w"].dequantize(), 0.0)


def test_rank1_scales_stay_whole_under_zero():
    """ZeRO-1 splits a rank-1 moment's codes over their blocks; its scales (a
    maximum per row and per column) are not per block and stay whole."""
    mesh = jax.sharding.AbstractMesh(
        (4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,)
    )
    opt = eqopt.adam(
        1e-3,
        mu_dtype=eqopt.Quantized(4),
        nu_dtype=eqopt.Quantized(4, normalization="rank1"),
    )
    state = eqx.filter_eval_shape(opt.init, {"w": jnp.ones((1000, 257))})
    shardings = eqopt.zero_shardings(state, mesh, min_size=0)
    P = jax.sharding.PartitionSpec
    assert shardings[0].nu["w"].codes.spec == P("data", None)
    assert shardings[0].nu["w"].scales.spec == P(None)
    assert shardings[0].mu["w"].scales.spec == P("data")
    assert not any("nu" in path for path in eqopt.zero_unsplit(state, mesh, min_size=0))
