"""What the brgemm path suites (test_convolution_tap_brgemm.py, test_convolution_patch_brgemm.py)
share: the case runner, the tile unit's flush cases and the determinism check."""
from __future__ import annotations

import pytest
import torch

import fuel_torch
from fuel_torch import reference

from test_convolution import API, assert_same_bits_for_every_thread_count, check_values, operands

FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def brgemm_serves(dtype) -> bool:
    """Whether the brgemm paths take calls of this dtype here (bfloat16: images whose operands pass
    the exponent rule)."""
    if dtype == torch.bfloat16:
        return fuel_torch.bfloat16_brgemm() is not None
    return fuel_torch.float_brgemm() and fuel_torch.cpu_capability() in ("AVX2", "AVX512")


def check_case(case, dtype, x_format, served_images, seed):
    """One case (op, n, cin, cout, groups, kernel, spatial, geometry, bias): the path served its n
    images where it serves the dtype (served_images() counts them), the output keeps x's memory
    format, and the values hold the contract's claim (float32: and at most twice torch's error)."""
    op, n, cin, cout, groups, kernel, spatial, geometry, bias = case
    x, w, b = operands(op, n, cin, cout, groups, kernel, spatial, bias, dtype, torch.Generator().manual_seed(seed))
    x = x.contiguous(memory_format=FORMATS[x_format])
    before = served_images()
    ours = API[op](x, w, b, **geometry)
    assert served_images() - before == (n if brgemm_serves(dtype) else 0)
    assert ours.is_contiguous(memory_format=FORMATS[x_format])
    check_values(op, ours.contiguous(), x.contiguous(), w, b, geometry, versus_torch=dtype == torch.float32)


def scaled_operands(x_shape, w_shape, x_scale: float, w_scale: float, bias_value: float | None, seed: int):
    """bfloat16 operands of magnitudes 1..2 times the scales (powers of two, so every operand and
    product is exact), a bias of bias_value (None: no bias)."""
    generator = torch.Generator().manual_seed(seed)
    x = (torch.rand(x_shape, generator=generator, dtype=torch.float64) + 1) * x_scale
    w = (torch.rand(w_shape, generator=generator, dtype=torch.float64) + 1) * w_scale
    b = None if bias_value is None else torch.full((w_shape[0],), bias_value, dtype=torch.float64)
    return x.bfloat16(), w.bfloat16(), None if b is None else b.bfloat16()


# Operands the bfloat16 units (AMX tiles, vdpbf16ps) would flush to zero (x_scale, w_scale, bias_value).
FLUSH_CASES = [
    pytest.param(2.0**-130, 2.0**8, None, id="subnormal inputs"),
    pytest.param(2.0**4, 2.0**-132, None, id="subnormal weights"),
    pytest.param(2.0**-70, 2.0**-62, None, id="products below float32's normal range"),
    pytest.param(0.0, 1.0, 2.0**-127, id="a subnormal bias and no input: the outputs are the bias"),
]


def check_flushed_operands_keep_their_value(x, w, b, geometry):
    """The bfloat16 units would return zero for these; the contract's sums do not."""
    ours = fuel_torch.conv2d(x, w, b, **geometry)
    exact, _ = fuel_torch.convolution.float64_reference("conv2d", x, w, b, **geometry)
    assert (exact.abs() > 0).all() and (ours.double().abs() > 0).all()
    check_values("conv2d", ours, x, w, b, geometry)


def check_a_failing_image_is_computed_alone(x, w, b, geometry):
    """x[1] fails the exponent rule: every image gets the bits it gets convolved alone."""
    whole = fuel_torch.conv2d(x, w, b, **geometry)
    for i in range(x.shape[0]):
        assert reference.bit_equal(whole[i:i + 1], fuel_torch.conv2d(x[i:i + 1].clone(), w, b, **geometry)), i
    check_values("conv2d", whole, x, w, b, geometry)
    assert (whole[1].double().abs() > 0).all()  # the bfloat16 unit would have read image 1 as zeros


def check_deterministic(op, x, w, b, geometry):
    """The same bits on every call, for every thread count, and per image as if alone."""
    first = API[op](x, w, b, **geometry)
    assert all(reference.bit_equal(API[op](x, w, b, **geometry), first) for _ in range(5))
    assert_same_bits_for_every_thread_count(op, x, w, b, geometry, first)
    for i in range(x.shape[0]):
        assert reference.bit_equal(first[i:i + 1], API[op](x[i:i + 1].clone(), w, b, **geometry)), i
