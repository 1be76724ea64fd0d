"""One brgemm per spatial tap (csrc/convolution/tap_brgemm.h): bfloat16 on AMX or AVX512_BF16,
float32 on oneDNN.

Where the CPU has AMX-BF16 (and torch's brgemm can use it) or AVX512_BF16, bfloat16 convolutions
with at least 16 input and 16 output channels per group run on that unit (fuel_torch.bfloat16_brgemm()).
Both units treat subnormal inputs as zero and flush subnormal results, so the path is taken only for images whose operands keep
every partial sum normal (the exponent rule in tap_brgemm.h); the others go to the chassis. float32
convolutions of the same channel counts run on oneDNN's kernel where fuel_torch.float_brgemm() is on
(at the AVX2 and AVX512 levels). Here:

- values against the float64 reference with the contract's claim of each dtype (test_convolution's
  check_values), over geometries that reach every part of the path: stride and dilation (residue
  planes), conv_transpose2d (phases), groups, odd channel counts (a half-empty channel pair),
  output channels past one 64-channel task, channels past one 256-channel chunk, a 1x1 conv read
  in place, channels_last operands, no bias; and that the path served them
  (fuel_torch._C.path_counts());
- the exponent rule: operands the unit would flush (subnormal inputs, weights or biases, and
  products or sums below float32's normal range) give the chassis's exact results, image by image;
- determinism: the same bits on every call, for every thread count, and per image as if alone;
- the same suite with FUEL_BF16_BRGEMM=0 and FUEL_BRGEMM=0 (the chassis) in a child process, the
  switch itself, torch's mkldnn switch turned off (the chassis, read per call) and oneDNN held
  below AVX-512 (the chassis: torch's brgemm then refuses the paired layout).

Every test here runs with FUEL_PATCH=0: most of these calls would otherwise take the patch path
(test_convolution_patch_brgemm.py), which is tested on the same claims there.

On a CPU without either unit (or a level without the float32 path) those tests run on the chassis and check
the same claims.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fuel_torch
from fuel_torch import reference

from brgemm_cases import (FLUSH_CASES, FORMATS, brgemm_serves, check_a_failing_image_is_computed_alone, check_case,
                          check_deterministic, check_flushed_operands_keep_their_value, scaled_operands)
from test_convolution import assert_file_passes_in_child, check_values, operands

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def per_tap_path(monkeypatch):
    monkeypatch.setenv("FUEL_PATCH", "0")  # read per call


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def bfloat16_unit_of_this_cpu() -> str | None:
    """The unit the CPU offers torch's bfloat16 brgemm at the AVX512 level: the tile unit first (on
    every CPU with AMX torch's brgemm can use it), else AVX512_BF16 dot products."""
    if fuel_torch.cpu_capability() != "AVX512":
        return None
    if {"amx_bf16", "amx_tile"} <= cpu_flags():
        return "AMX"
    return "AVX512_BF16" if "avx512_bf16" in cpu_flags() else None


def test_the_switch_follows_the_cpu_and_fuel_bf16_brgemm():
    available = bfloat16_unit_of_this_cpu()
    assert fuel_torch.bfloat16_brgemm() == (available if os.environ.get("FUEL_BF16_BRGEMM") != "0" else None)
    assert fuel_torch.amx_convolution() is (fuel_torch.bfloat16_brgemm() == "AMX")
    code = "import fuel_torch; print(fuel_torch.bfloat16_brgemm())"
    for setting, want in (("0", None), ("1", available)):
        env = {**os.environ, "FUEL_BF16_BRGEMM": setting}
        # From tests/: the repository root would import the source folder, not the installed package.
        result = subprocess.run([sys.executable, "-c", code], env=env, cwd=TESTS, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [str(want)]


def test_onednn_held_below_avx512_leaves_bfloat16_to_the_chassis():
    # With oneDNN held at AVX2 torch's brgemm refuses the paired bfloat16 layout on any CPU: the switch
    # finds that out once, and the calls take the chassis instead of raising.
    code = ("import torch, fuel_torch; x = torch.randn(2, 32, 9, 9).bfloat16(); w = torch.randn(32, 32, 3, 3).bfloat16(); "
            "y = fuel_torch.conv2d(x, w, None, padding=1); print(fuel_torch.bfloat16_brgemm(), "
            "fuel_torch._C.path_counts()['bfloat16_brgemm_images'], bool(y.isfinite().all()))")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=TESTS, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["None", "0", "True"]


def test_mkldnn_off_leaves_bfloat16_to_the_chassis():
    # torch's bfloat16 brgemm raises in the paired layout while mkldnn is off: the switch is read per
    # call, and the call gets the chassis's bits, as with FUEL_BF16_BRGEMM=0.
    x, w, b = operands("conv2d", 2, 32, 32, 1, (3, 3), (9, 9), True, torch.bfloat16, torch.Generator().manual_seed(5))
    before = served_images()
    with torch.backends.mkldnn.flags(enabled=False):
        assert fuel_torch.bfloat16_brgemm() is None
        off = fuel_torch.conv2d(x, w, b, padding=1)
    assert served_images() == before
    check_values("conv2d", off, x, w, b, {"padding": 1})


# (op, n, cin, cout, groups, kernel, spatial, geometry, bias)
CASES = [
    ("conv2d", 2, 96, 40, 1, (1, 1), (9, 11), {}, True),
    ("conv2d", 1, 300, 24, 1, (3, 3), (6, 7), {"padding": 1}, True),
    ("conv2d", 2, 64, 64, 1, (3, 3), (14, 15), {"padding": 1}, True),
    ("conv2d", 2, 32, 48, 1, (3, 3), (13, 12), {"stride": 2, "padding": 1}, True),
    ("conv2d", 1, 24, 40, 1, (3, 3), (12, 11), {"padding": 2, "dilation": 2}, False),
    ("conv2d", 2, 17, 20, 1, (3, 2), (9, 8), {"padding": (1, 0)}, True),
    ("conv2d", 2, 64, 32, 2, (3, 3), (10, 9), {"padding": 1, "groups": 2}, True),
    ("conv2d", 1, 256, 70, 1, (1, 1), (7, 9), {}, True),
    ("conv2d", 1, 32, 130, 1, (5, 5), (11, 10), {"stride": (2, 1), "padding": 2}, True),
    ("conv_transpose2d", 2, 32, 24, 1, (4, 4), (7, 6), {"stride": 2, "padding": 1}, True),
    ("conv_transpose2d", 1, 48, 32, 1, (3, 3), (9, 8), {"padding": 1}, False),
    ("conv_transpose2d", 1, 32, 36, 2, (3, 3), (6, 7), {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2},
     True),
    # kernels narrower than the stride: the residue planes no tap reads are left unfilled
    ("conv2d", 2, 48, 40, 1, (1, 1), (13, 12), {"stride": 2}, True),
    ("conv2d", 1, 32, 24, 1, (2, 2), (14, 11), {"stride": (3, 2)}, False),
]
def served_images() -> int:
    counts = fuel_torch._C.path_counts()
    return counts["bfloat16_brgemm_images"] + counts["float_brgemm_images"]


@pytest.mark.parametrize("x_format", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}x{c[3]}-g{c[4]}-{c[5]}-{c[7]}")
def test_values_within_the_contract(case, dtype, x_format):
    check_case(case, dtype, x_format, served_images, seed=case[2] * case[3])


# float32 1x1 conv2d of channels_last operands, unpadded, reads x in place as brgemm's A
# (pointwise_brgemm.h) where the per-tap path would turn it into NCHW planes: the same sums, so the
# bits of the NCHW call. Flat images (stride 1), row by row (strides), groups, channels past one
# 256-term chunk (300, 600), the weight in either layout; padding keeps the planes.
POINTWISE_CASES = [
    (2, 64, 48, 1, (9, 11), {}),
    (2, 64, 128, 1, (9, 11), {"stride": 2}),
    (1, 300, 24, 1, (6, 7), {}),
    (2, 600, 40, 1, (5, 5), {"stride": (1, 2)}),
    (1, 64, 64, 2, (7, 9), {}),
    (1, 32, 48, 1, (10, 10), {"stride": (2, 1)}),
    (3, 64, 48, 1, (1, 1), {}),  # a pooled feature map (squeeze-and-excitation): one pixel, either layout
]


@pytest.mark.parametrize("w_format", FORMATS)
@pytest.mark.parametrize("case", POINTWISE_CASES, ids=lambda c: f"{c[1]}x{c[2]}-g{c[3]}-{c[5]}")
def test_float32_1x1_channels_last_reads_x_in_place(case, w_format):
    n, cin, cout, groups, spatial, geometry = case
    x, w, b = operands("conv2d", n, cin, cout, groups, (1, 1), spatial, True, torch.float32,
                       torch.Generator().manual_seed(cin))
    expected = fuel_torch.conv2d(x, w, b, groups=groups, **geometry)
    before = fuel_torch._C.path_counts()["pointwise_brgemm_images"]
    ours = fuel_torch.conv2d(x.contiguous(memory_format=torch.channels_last),
                             w.contiguous(memory_format=FORMATS[w_format]), b, groups=groups, **geometry)
    served = fuel_torch._C.path_counts()["pointwise_brgemm_images"] - before
    assert served == (n if brgemm_serves(torch.float32) else 0)
    assert ours.is_contiguous(memory_format=torch.channels_last)
    assert reference.bit_equal(ours.contiguous(), expected)
    check_values("conv2d", expected, x, w, b, dict(groups=groups, **geometry))
    before = fuel_torch._C.path_counts()["pointwise_brgemm_images"]
    padded = fuel_torch.conv2d(x.contiguous(memory_format=torch.channels_last), w, b, padding=1, groups=groups)
    assert fuel_torch._C.path_counts()["pointwise_brgemm_images"] == before
    assert reference.bit_equal(padded.contiguous(), fuel_torch.conv2d(x, w, b, padding=1, groups=groups))


@pytest.mark.parametrize("spatial,cout", [((7, 7), 80), ((7, 7), 24), ((14, 14), 40), ((3, 5), 24)])
def test_float32_1x1_channels_last_of_few_blocks_keeps_the_bits_for_every_split(spatial, cout):
    # One 7x7 image is one block of pixels: with more threads than blocks its output channels are
    # split among the threads, in whole column panels (80: five of 16; 24: 16 and 8). A few blocks
    # are made equal (196 pixels: 4 x 49) and, where one more makes whole rounds of the threads,
    # one more (15 pixels: 8 + 7 at 2 threads).
    x, w, b = operands("conv2d", 1, 300, cout, 1, (1, 1), spatial, True, torch.float32,
                       torch.Generator().manual_seed(cout))
    x = x.contiguous(memory_format=torch.channels_last)
    before = fuel_torch._C.path_counts()["pointwise_brgemm_images"]
    check_deterministic("conv2d", x, w, b, {})
    assert fuel_torch._C.path_counts()["pointwise_brgemm_images"] > before or not brgemm_serves(torch.float32)
    check_values("conv2d", fuel_torch.conv2d(x, w, b).contiguous(), x, w, b, {})


# A 1x1 conv_transpose2d at stride 1, uncropped (a pointwise conv's input gradient), is the same
# product with the weight's channel axes swapped: channels_last operands read in place as well, with
# the NCHW call's bits. Groups, more than one 256-term chunk, and an odd output count per group;
# a stride of 2 or cropping padding keeps the per-tap path.
TRANSPOSED_POINTWISE_CASES = [
    (2, 48, 64, 1, (9, 11)),
    (1, 300, 24, 1, (6, 7)),
    (2, 64, 34, 2, (5, 8)),
    (3, 64, 48, 1, (1, 1)),
]


@pytest.mark.parametrize("w_format", FORMATS)
@pytest.mark.parametrize("case", TRANSPOSED_POINTWISE_CASES, ids=lambda c: f"{c[1]}x{c[2]}-g{c[3]}-{c[4]}")
def test_float32_1x1_transpose_channels_last_reads_x_in_place(case, w_format):
    n, cin, cout, groups, spatial = case
    x, w, b = operands("conv_transpose2d", n, cin, cout, groups, (1, 1), spatial, True, torch.float32,
                       torch.Generator().manual_seed(cin + cout))
    x.view(-1)[x.numel() // 3] = float("nan")
    expected = fuel_torch.conv_transpose2d(x, w, b, groups=groups)
    assert expected.isnan().any()
    xl, wl = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=FORMATS[w_format])
    before = fuel_torch._C.path_counts()["pointwise_brgemm_images"]
    ours = fuel_torch.conv_transpose2d(xl, wl, b, groups=groups)
    served = fuel_torch._C.path_counts()["pointwise_brgemm_images"] - before
    assert served == (n if brgemm_serves(torch.float32) else 0)
    assert ours.is_contiguous(memory_format=torch.channels_last)
    assert reference.bit_equal(ours.contiguous(), expected)
    for geometry in (dict(stride=2), dict(padding=(0, 1))):
        if spatial[1] < 3:
            continue
        before = fuel_torch._C.path_counts()["pointwise_brgemm_images"]
        other = fuel_torch.conv_transpose2d(xl, wl, b, groups=groups, **geometry)
        assert fuel_torch._C.path_counts()["pointwise_brgemm_images"] == before
        assert reference.bit_equal(other.contiguous(), fuel_torch.conv_transpose2d(x, w, b, groups=groups, **geometry))
    x.view(-1)[x.numel() // 3] = 0.0
    finite = fuel_torch.conv_transpose2d(x.contiguous(memory_format=torch.channels_last), wl, b, groups=groups)
    check_values("conv_transpose2d", finite.contiguous(), x, w, b, dict(groups=groups))


@pytest.mark.parametrize("case", TRANSPOSED_POINTWISE_CASES, ids=lambda c: f"{c[1]}x{c[2]}-g{c[3]}-{c[4]}")
def test_float32_1x1_transpose_nchw_is_the_conv2d_of_the_swapped_weight(case):
    """An NCHW 1x1 conv_transpose2d at stride 1, uncropped, reads x's planes in place as the 1x1
    conv2d does (tap_brgemm.h): it must give the bits of the conv2d whose weight has the two channel
    axes swapped, group by group. Output padding (allowed with dilation 2) keeps the copied planes."""
    n, cin, cout, groups, spatial = case
    x, w, b = operands("conv_transpose2d", n, cin, cout, groups, (1, 1), spatial, True, torch.float32,
                       torch.Generator().manual_seed(cin + cout + 1))
    x.view(-1)[x.numel() // 3] = float("nan")
    swapped = w.view(groups, cin // groups, cout // groups).transpose(1, 2).reshape(cout, cin // groups, 1, 1)
    ours = fuel_torch.conv_transpose2d(x, w, b, groups=groups)
    assert ours.isnan().any() and not ours.isnan().all()
    assert reference.bit_equal(ours, fuel_torch.conv2d(x, swapped.contiguous(), b, groups=groups))
    x.view(-1)[x.numel() // 3] = 0.0
    check_values("conv_transpose2d", fuel_torch.conv_transpose2d(x, w, b, groups=groups), x, w, b, dict(groups=groups))
    extended = dict(groups=groups, output_padding=1, dilation=2)
    check_values("conv_transpose2d", fuel_torch.conv_transpose2d(x, w, b, **extended), x, w, b, extended)


def test_channels_last_weight():
    generator = torch.Generator().manual_seed(3)
    x, w, b = operands("conv2d", 2, 32, 32, 1, (3, 3), (9, 9), True, torch.bfloat16, generator)
    ours = fuel_torch.conv2d(x, w.contiguous(memory_format=torch.channels_last), b, padding=1)
    assert reference.bit_equal(ours.contiguous(), fuel_torch.conv2d(x, w, b, padding=1))


def scaled_case(x_scale: float, w_scale: float, bias_value: float | None):
    """A 3x3 conv of 32 -> 32 channels (scaled_operands)."""
    return scaled_operands((2, 32, 6, 6), (32, 32, 3, 3), x_scale, w_scale, bias_value, seed=17)


@pytest.mark.parametrize("x_scale,w_scale,bias_value", FLUSH_CASES)
def test_operands_the_bfloat16_unit_would_flush_keep_their_value(x_scale, w_scale, bias_value):
    check_flushed_operands_keep_their_value(*scaled_case(x_scale, w_scale, bias_value), {"padding": 1})


def test_an_image_that_fails_the_rule_leaves_the_others_on_the_path():
    x, w, b = scaled_case(1.0, 2.0**8, None)
    x[1] = x[1] * 2.0**-130  # subnormal in bfloat16; its products with the weights are normal
    check_a_failing_image_is_computed_alone(x, w, b, {"padding": 1})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("op", ("conv2d", "conv_transpose2d"))
def test_deterministic_across_calls_threads_and_batches(op, dtype):
    generator = torch.Generator().manual_seed(23)
    geometry = {"padding": 1, "stride": 2} if op == "conv2d" else {"padding": 1, "stride": 2, "output_padding": 1}
    check_deterministic(op, *operands(op, 3, 64, 80, 1, (3, 3), (17, 19), True, dtype, generator), geometry)


def test_the_suite_passes_on_the_chassis_too():
    assert_file_passes_in_child(TESTS / "test_convolution_tap_brgemm.py", "the_suite_passes_on_the_chassis",
                                FUEL_BF16_BRGEMM="0", FUEL_BRGEMM="0")
