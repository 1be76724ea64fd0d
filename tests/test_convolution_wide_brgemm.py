"""The wide-kernel problem on torch's brgemm (csrc/convolution/wide_brgemm.h): weight gradients.

autograd computes a conv2d weight gradient as a conv2d whose images are the input channels, whose
kernel is the output gradient (long rows) and whose few outputs are the kernel's taps. Where
fuel_torch.float_brgemm() is on, float32 calls of that shape (ungrouped, dilation 1, >= 16 images
and output channels) run as one brgemm per output position; bfloat16 ones run on the unit
fuel_torch.bfloat16_brgemm() names (AMX tiles or AVX512_BF16 dot products) where the whole call's
exponents keep every partial sum normal (the rule of tap_brgemm.h). Here:

- values against the float64 reference with the contract's claims (test_convolution's
  check_values), over geometries that reach each part of the path: a stride, asymmetric padding,
  image and channel counts past one 64-wide block and not a multiple of 16, rows not a multiple
  of 16, a bias, channels_last operands; float32 also within 2x torch's error on long reductions
  with a non-zero mean;
- that those calls are the ones the path served (fuel_torch._C.path_counts()), and that operands
  the bfloat16 unit would flush are not (their results keep their value);
- a weight gradient through autograd within the contract's bound;
- determinism across calls and thread counts;
- the switch (FUEL_BRGEMM, torch.backends.mkldnn) and the whole file again with FUEL_BRGEMM=0 and
  FUEL_BF16_BRGEMM=0 (the portable wide-kernel path) in a child process.

On a CPU or level without the path every test checks the same claims on the portable path.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fuel_torch
from fuel_torch import convolution, reference

from test_convolution import (assert_file_passes_in_child, assert_same_bits_for_every_thread_count, check_values,
                              operands)

TESTS = Path(__file__).parent
DTYPES = [torch.float32, torch.bfloat16]

# (images, channels, output channels, kernel, spatial, geometry, bias)
CASES = [
    (32, 3, 24, (14, 16), (16, 18), {"padding": 1}, False),
    (17, 2, 70, (12, 18), (15, 20), {"padding": (1, 2), "stride": (2, 1)}, True),
    (80, 2, 16, (9, 16), (10, 19), {}, False),
    (16, 3, 33, (20, 17), (22, 18), {"padding": (0, 1)}, True),
]
FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def path_serves(dtype) -> bool:
    """Whether calls of the path's shape with ordinary operands take it here."""
    return fuel_torch.float_brgemm() if dtype == torch.float32 else fuel_torch.bfloat16_brgemm() is not None


def served_calls() -> int:
    return fuel_torch._C.path_counts()["wide_brgemm_calls"]


@pytest.mark.parametrize("memory_format", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}-{c[3]}-{c[5]}")
def test_values_within_the_contract(case, dtype, memory_format):
    n, cin, cout, kernel, spatial, geometry, bias = case
    generator = torch.Generator().manual_seed(n * cout)
    x, w, b = operands("conv2d", n, cin, cout, 1, kernel, spatial, bias, dtype, generator)
    x = x.contiguous(memory_format=FORMATS[memory_format])
    w = w.contiguous(memory_format=FORMATS[memory_format])
    before = served_calls()
    ours = fuel_torch.conv2d(x, w, b, **geometry)
    assert served_calls() - before == int(path_serves(dtype))
    assert ours.is_contiguous(memory_format=FORMATS[memory_format])
    check_values("conv2d", ours.contiguous(), x.contiguous(), w.contiguous(), b, geometry)


def test_float32_long_reductions_beat_twice_torchs_error():
    """K = 2 * 40 * 40 = 3200 taps per output, operands with a non-zero mean (the partial sums
    grow): a single running float32 sum would fall behind torch's blocked sums."""
    generator = torch.Generator().manual_seed(5)
    for shift in (0.0, 1.0):
        x, w, b = operands("conv2d", 24, 2, 20, 1, (40, 40), (42, 42), True, torch.float32, generator)
        x, w = x + shift, w + shift / 10
        before = served_calls()
        ours = fuel_torch.conv2d(x, w, b, padding=1)
        assert served_calls() - before == int(path_serves(torch.float32))
        check_values("conv2d", ours, x, w, b, {"padding": 1}, versus_torch=True)


def scaled_case(x_scale: float, w_scale: float):
    """A wide-kernel call on values of magnitudes 1..2 times the scales (powers of two, so every
    operand and product is exact in bfloat16 and float64)."""
    generator = torch.Generator().manual_seed(29)
    x = (torch.rand(16, 2, 18, 18, generator=generator, dtype=torch.float64) + 1) * x_scale
    w = (torch.rand(16, 2, 16, 16, generator=generator, dtype=torch.float64) + 1) * w_scale
    return x.bfloat16(), w.bfloat16()


@pytest.mark.parametrize("x_scale,w_scale,served", [
    pytest.param(1.0, 1.0, True, id="ordinary operands"),
    pytest.param(2.0**-130, 2.0**8, False, id="subnormal inputs"),
    pytest.param(2.0**4, 2.0**-132, False, id="subnormal weights"),
    pytest.param(2.0**-70, 2.0**-62, False, id="products below float32's normal range"),
])
def test_operands_the_bfloat16_unit_would_flush_leave_the_path(x_scale, w_scale, served):
    """The tile unit and vdpbf16ps would return zero for the last three; the contract's sums do not."""
    x, w = scaled_case(x_scale, w_scale)
    before = served_calls()
    ours = fuel_torch.conv2d(x, w, None, padding=1)
    assert served_calls() - before == int(served and fuel_torch.bfloat16_brgemm() is not None)
    exact, _ = convolution.float64_reference("conv2d", x, w, None, padding=1)
    assert (exact.abs() > 0).all() and (ours.double().abs() > 0).all()
    check_values("conv2d", ours, x, w, None, {"padding": 1})


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_autograd_weight_gradient_within_the_bound(dtype):
    """A real conv's weight gradient (32 -> 24 channels, 3x3, 4 images of 20x20): the wide-kernel
    conv2d autograd builds, within the contract's bound of its exact value."""
    generator = torch.Generator().manual_seed(31)
    x = torch.randn(4, 32, 20, 20, generator=generator).to(dtype)
    w = torch.randn(24, 32, 3, 3, generator=generator).to(dtype).requires_grad_()
    g = torch.randn(4, 24, 20, 20, generator=generator).to(dtype)
    before = served_calls()
    fuel_torch.conv2d(x, w, None, padding=1).backward(g)
    assert served_calls() - before == int(path_serves(dtype))
    # The weight gradient is conv2d(x as [Cin, N, H, W], g as [Cout, N, Ho, Wo]), transposed.
    xs, gs = x.transpose(0, 1).contiguous(), g.transpose(0, 1).contiguous()
    exact, scale = convolution.float64_reference("conv2d", xs, gs, None, padding=1)
    exact, scale = exact.transpose(0, 1), scale.transpose(0, 1)
    taps = 4 * 20 * 20
    if dtype == torch.float32:
        assert ((w.grad.double() - exact).abs() <= (taps + 2) * 2.0**-24 * scale + (taps + 1) * 2.0**-53 * scale).all()
    else:
        found = convolution.half_result_check(w.grad.contiguous(), exact.contiguous(), scale.contiguous(), taps)
        assert found["max_ulp"] <= 1 and found["bound_ok"], found


@pytest.mark.parametrize("cout, size", [(24, 20), (40, 16), (16, 37)], ids=lambda v: str(v))
@pytest.mark.parametrize("memory_format", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_autograd_reads_x_and_the_gradient_in_place_with_the_conv2d_bits(dtype, memory_format, cout, size):
    """Without double backward, the weight gradient runs the wide brgemm path on x and grad_out with
    their images and channels swapped through the strides (register.cpp, weight_grad_on_brgemm):
    the same bits as the conv2d of the swapped copies, which double backward (and any call the path
    does not serve) computes; one served call each. channels_last, the gradient's rows are turned
    16 x 16 (20 columns: a tile and one overlapping it; 16: one; 37: two and one), 16 output
    channels at a time (24 and 40: the rows past the last 16 row by row)."""
    generator = torch.Generator().manual_seed(53)
    fmt = FORMATS[memory_format]
    x = torch.randn(4, 32, size, size, generator=generator).to(dtype).contiguous(memory_format=fmt)
    w = torch.randn(cout, 32, 3, 3, generator=generator).to(dtype).requires_grad_()
    g = torch.randn(4, cout, size, size, generator=generator).to(dtype).contiguous(memory_format=fmt)
    before = served_calls()
    fuel_torch.conv2d(x, w, None, padding=1).backward(g)
    assert served_calls() - before == int(path_serves(dtype))
    swapped = fuel_torch.conv2d(x.transpose(0, 1).contiguous(), g.transpose(0, 1).contiguous(), None, padding=1)
    assert reference.bit_equal(w.grad.contiguous(), swapped[:, :, :3, :3].transpose(0, 1).contiguous())
    # With a graph to record, the differentiable route gives the same bits too.
    w2 = w.detach().clone().requires_grad_()
    (grad,) = torch.autograd.grad(fuel_torch.conv2d(x, w2, None, padding=1), w2, g, create_graph=True)
    assert reference.bit_equal(grad.detach().contiguous(), w.grad.contiguous())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_deterministic_across_calls_and_threads(dtype):
    generator = torch.Generator().manual_seed(37)
    x, w, b = operands("conv2d", 70, 3, 40, 1, (16, 16), (18, 18), True, dtype, generator)
    geometry = {"padding": 1}
    first = fuel_torch.conv2d(x, w, b, **geometry)
    assert all(reference.bit_equal(fuel_torch.conv2d(x, w, b, **geometry), first) for _ in range(5))
    assert_same_bits_for_every_thread_count("conv2d", x, w, b, geometry, first)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_output_channel_blocks_change_no_bits(dtype):
    """A 3x3 weight gradient's 9 taps give 64 output channels one block per tap at 1 and 3 threads,
    and half-height blocks at 2 (9 whole ones would go 5 and 4); its 16-channel slices, computed
    alone, are the same bits as each."""
    generator = torch.Generator().manual_seed(31)
    x = torch.randn(64, 4, 30, 30, generator=generator).to(dtype)
    w = torch.randn(64, 4, 28, 28, generator=generator).to(dtype)
    before = fuel_torch._C.path_counts()["wide_brgemm_calls"]
    slices = torch.cat([fuel_torch.conv2d(x, w[i:i + 16].clone()) for i in range(0, 64, 16)], 1)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            assert reference.bit_equal(fuel_torch.conv2d(x, w), slices), count
    finally:
        torch.set_num_threads(threads)
    assert fuel_torch._C.path_counts()["wide_brgemm_calls"] - before == (7 if path_serves(dtype) else 0)


def test_the_switch_follows_the_level_mkldnn_and_fuel_brgemm():
    expected = fuel_torch.cpu_capability() != "DEFAULT" and os.environ.get("FUEL_BRGEMM") != "0"
    assert fuel_torch.float_brgemm() is expected
    with torch.backends.mkldnn.flags(enabled=False):
        assert fuel_torch.float_brgemm() is False
        generator = torch.Generator().manual_seed(41)
        x, w, b = operands("conv2d", 32, 3, 24, 1, (14, 16), (16, 18), False, torch.float32, generator)
        before = served_calls()
        check_values("conv2d", fuel_torch.conv2d(x, w, b, padding=1), x, w, b, {"padding": 1})
        assert served_calls() == before
    assert fuel_torch.float_brgemm() is expected
    code = "import fuel_torch; print(fuel_torch.float_brgemm())"
    env = {**os.environ, "FUEL_BRGEMM": "0"}
    # From tests/: the repository root would import the source folder, not the installed package.
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=TESTS, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]


def test_the_suite_passes_on_the_portable_path_too():
    assert_file_passes_in_child(TESTS / "test_convolution_wide_brgemm.py", "the_suite_passes_on_the_portable_path",
                                FUEL_BF16_BRGEMM="0", FUEL_BRGEMM="0")


def test_each_chunk_is_summed_from_zero_and_then_added():
    """The contract's order: the accumulator starts at the bias and each chunk's sum, from zero, is
    added to it. With a bias of 2^24 and terms of 1, unpadded (each chunk of the laid-out kernel
    holds an even count of ones), every chunk's sum and every addition is exact; a sum run on from
    the bias would lose every term (2^24 + 1 rounds to 2^24)."""
    x = torch.ones(16, 2, 18, 18)
    w = torch.ones(16, 2, 16, 16)
    bias = torch.full((16,), 2.0**24)
    before = served_calls()
    ours = fuel_torch.conv2d(x, w, bias)
    assert served_calls() - before == int(fuel_torch.float_brgemm())
    assert torch.equal(ours, torch.full_like(ours, 2.0**24 + 2 * 16 * 16))
