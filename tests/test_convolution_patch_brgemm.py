"""One brgemm per block of output positions over whole patches (csrc/convolution/patch_brgemm.h).

Where the per-tap brgemm path (tap_brgemm.h) would run, and for the few-channel calls it does not
take (a 3-channel stem), bfloat16 (on AMX or AVX512_BF16) and float32 (oneDNN's kernel, at the AVX2
and AVX512 levels) convolutions with at least 16 output channels per group (bfloat16 on AMX: any)
and a kernel larger than 1x1 (bfloat16: any kernel) stage the input once with the channels innermost and reduce each
output over its whole patch: in place on the staged rows where every tap steps by 1 (a stride-1
conv2d, a transposed conv's phases), through a copied patch elsewhere (strides, dilation). Here:

- values against the float64 reference with the contract's claim of each dtype (test_convolution's
  check_values; float32 also against twice torch's error), over geometries that reach both modes
  and every part of them: strides, dilation, groups, a 3-channel stem, odd channel counts (the
  bfloat16 pad channel), output channels past one 64-channel block, float32 runs past one
  256-term chunk, conv_transpose2d phases with output_padding, channels_last operands, no bias;
  and that the path served them (fuel_torch._C.path_counts());
- the exponent rule of the bfloat16 units: operands they would flush keep their values, image by
  image;
- determinism: the same bits on every call, for every thread count, and per image as if alone;
- FUEL_PATCH=0 (read per call) and a staging copy past its budget hand the call to the other paths.

On a CPU without a bfloat16 unit (or at the DEFAULT level for float32) the same tests check the same claims on
whichever path serves the call.
"""
from __future__ import annotations

import pytest
import torch

import fuel_torch
from fuel_torch import reference

from brgemm_cases import (FLUSH_CASES, FORMATS, brgemm_serves, check_a_failing_image_is_computed_alone, check_case,
                          check_deterministic, check_flushed_operands_keep_their_value, scaled_operands)
from test_convolution import API, check_values, operands

# (op, n, cin, cout, groups, kernel, spatial, geometry, bias)
CASES = [
    ("conv2d", 2, 3, 64, 1, (7, 7), (23, 22), {"stride": 2, "padding": 3}, True),  # stem: copied patches
    ("conv2d", 2, 64, 64, 1, (3, 3), (14, 15), {"padding": 1}, True),  # in place, runs of 3 taps
    # In place, each row's right padding is the next row's left (PatchStaging::pitch): 2 columns
    # shared, so no computed column is dropped; then 1 of 2 shared, asymmetric taps.
    ("conv2d", 2, 32, 48, 1, (3, 3), (9, 9), {"padding": 2}, True),
    ("conv2d", 1, 16, 32, 1, (3, 5), (7, 12), {"padding": (1, 1)}, False),
    ("conv2d", 1, 24, 40, 1, (3, 3), (12, 11), {"padding": 2, "dilation": 2}, False),  # copied, tap by tap
    ("conv2d", 2, 64, 64, 4, (3, 3), (10, 9), {"padding": 1, "groups": 4}, True),  # 16 channels per group
    ("conv2d", 2, 17, 20, 1, (3, 2), (9, 8), {"padding": (1, 0)}, True),  # odd channels: the pad channel
    # Staged by two 16-channel tiles, then channel 32 alone (and bfloat16's pad channel); 18 columns: a row's
    # last tile overlaps the one before it.
    ("conv2d", 2, 33, 24, 1, (3, 3), (5, 18), {"padding": 1}, True),
    ("conv2d", 1, 64, 32, 2, (3, 3), (6, 17), {"padding": 1, "groups": 2}, False),  # each group's two tile blocks
    ("conv2d", 1, 300, 24, 1, (3, 3), (6, 7), {"padding": 1}, True),  # float32: runs of 900 terms, chunked
    ("conv2d", 1, 20, 40, 1, (3, 3), (13, 21), {"padding": 1}, True),  # 48-channel C: blocks of 80 positions
    ("conv2d", 1, 32, 130, 1, (5, 5), (11, 10), {"stride": (2, 1), "padding": 2}, True),  # 3 channel blocks
    ("conv2d", 2, 5, 16, 1, (3, 4), (9, 13), {"stride": (1, 3), "dilation": (2, 1), "padding": (2, 1)}, True),
    ("conv_transpose2d", 2, 32, 24, 1, (4, 4), (7, 6), {"stride": 2, "padding": 1}, True),
    ("conv_transpose2d", 1, 48, 32, 1, (3, 3), (9, 8), {"padding": 1}, False),
    ("conv_transpose2d", 1, 32, 36, 2, (3, 3), (6, 7), {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2},
     True),
    ("conv_transpose2d", 2, 64, 16, 1, (7, 7), (9, 10), {"stride": 2, "padding": 3, "output_padding": 1}, True),
    # Column padding past the kernel's reach: sharing every zero column between rows would leave a
    # grid row fewer positions than output columns (PatchStaging::pitch); such calls read garbage and
    # wrote past their block (found in session 7, with the 1x1 kernels).
    ("conv2d", 2, 32, 32, 1, (3, 3), (7, 8), {"padding": 3}, True),
    ("conv2d", 1, 32, 24, 1, (3, 1), (7, 8), {"padding": (1, 2)}, True),
    ("conv2d", 2, 17, 32, 1, (2, 2), (6, 7), {"padding": 2}, False),
    ("conv2d", 1, 32, 16, 1, (5, 5), (6, 9), {"padding": (0, 7)}, True),
]
def patch_images() -> int:
    return fuel_torch._C.path_counts()["patch_brgemm_images"]


@pytest.mark.parametrize("x_format", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}x{c[3]}-g{c[4]}-{c[5]}-{c[7]}")
def test_values_within_the_contract(case, dtype, x_format):
    check_case(case, dtype, x_format, patch_images, seed=case[2] * case[3] + 1)


def test_an_odd_copied_bfloat16_patch_ends_with_a_zero_term():
    """Copied patches are staged without bfloat16's pad channel, so a 3-channel 7x7 patch is 147 terms
    and the unit's pairs need one zero term at its end. Copying a run spills the staged elements after
    it: here an infinity one column past some patches' last run. It must reach only the outputs whose
    patches hold it (the spill left in the zero term's place made the others NaN)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 3, 20, 21, generator=g).bfloat16()
    w = torch.randn(16, 3, 7, 7, generator=g).bfloat16()
    x[0, 0, 9, 12] = float("inf")
    before = patch_images()
    ours = fuel_torch.conv2d(x, w, stride=2, padding=3)
    assert patch_images() - before == (1 if brgemm_serves(torch.bfloat16) else 0)
    exact = torch.nn.functional.conv2d(x.double(), w.double(), stride=2, padding=3)
    assert torch.equal(ours.isfinite(), exact.isfinite())
    assert not exact.isfinite().all() and exact.isfinite().any()


# Fewer than 16 output channels per group: bfloat16 on the tile unit takes the path; float32 and
# bfloat16 on AVX512_BF16 dot products (1.7x slower than the chassis on a 3-channel stem transpose
# on a Zen 5) take the chassis.
FEW_CHANNEL_CASES = [
    ("conv_transpose2d", 2, 64, 3, 1, (7, 7), (9, 8), {"stride": 2, "padding": 3, "output_padding": 1}, True),
    ("conv2d", 2, 16, 5, 1, (3, 3), (11, 10), {"padding": 1}, True),
    ("conv2d", 1, 3, 8, 1, (7, 7), (17, 16), {"stride": 2, "padding": 3}, False),
    ("conv2d", 2, 12, 6, 3, (3, 3), (9, 9), {"padding": 1, "groups": 3}, True),
]


@pytest.mark.parametrize("x_format", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("case", FEW_CHANNEL_CASES, ids=lambda c: f"{c[0]}-{c[2]}x{c[3]}-g{c[4]}-{c[5]}")
def test_few_output_channels_take_the_path_on_the_tile_unit_only(case, dtype, x_format):
    op, n, cin, cout, groups, kernel, spatial, geometry, bias = case
    x, w, b = operands(op, n, cin, cout, groups, kernel, spatial, bias, dtype, torch.Generator().manual_seed(cout))
    x = x.contiguous(memory_format=FORMATS[x_format])
    before = patch_images()
    ours = API[op](x, w, b, **geometry)
    served = dtype == torch.bfloat16 and fuel_torch.bfloat16_brgemm() == "AMX"
    assert patch_images() - before == (n if served else 0)
    check_values(op, ours.contiguous(), x.contiguous(), w, b, geometry)


# 1x1 kernels: bfloat16 takes the path (in place at stride 1, copied patches at stride 2); float32
# stays on the per-tap path. Either way both layouts give the same bits.
POINTWISE_CASES = [
    ("conv2d", 2, 96, 40, 1, (1, 1), (9, 11), {}, True),
    ("conv2d", 2, 48, 32, 1, (1, 1), (9, 10), {"stride": 2}, False),
    ("conv2d", 1, 64, 64, 2, (1, 1), (7, 9), {"groups": 2}, True),
    ("conv_transpose2d", 1, 48, 32, 1, (1, 1), (7, 6), {}, True),
    ("conv2d", 1, 33, 16, 1, (1, 1), (7, 7), {"padding": 1}, True),  # padding past a 1x1's reach
    ("conv2d", 2, 32, 16, 1, (1, 1), (6, 5), {"padding": (0, 2), "stride": 2}, False),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("case", POINTWISE_CASES, ids=lambda c: f"{c[0]}-{c[2]}x{c[3]}-g{c[4]}-{c[7]}")
def test_1x1_kernels_take_the_path_in_bfloat16(case, dtype):
    op, n, cin, cout, groups, kernel, spatial, geometry, bias = case
    x, w, b = operands(op, n, cin, cout, groups, kernel, spatial, bias, dtype, torch.Generator().manual_seed(cin))
    before = patch_images()
    nchw = API[op](x, w, b, **geometry)
    nhwc = API[op](x.contiguous(memory_format=torch.channels_last), w, b, **geometry)
    served = dtype == torch.bfloat16 and brgemm_serves(dtype)
    assert patch_images() - before == (2 * n if served else 0)
    assert nhwc.is_contiguous(memory_format=torch.channels_last)
    assert reference.bit_equal(nchw, nhwc.contiguous())
    check_values(op, nchw, x, w, b, geometry)


def x_in_place_images() -> int:
    return fuel_torch._C.path_counts()["patch_x_in_place_images"]


# channels_last inputs that staging would copy unchanged (one group, every staged row one of x's
# whole rows: no padding read) are read in place; the others are staged as before.
X_IN_PLACE_CASES = [
    (("conv2d", 2, 256, 64, 1, (1, 1), (7, 9), {}, True), True),  # bfloat16 only: float32 1x1s are pointwise
    (("conv2d", 2, 64, 48, 1, (3, 3), (9, 10), {}, True), True),
    (("conv2d", 1, 32, 40, 1, (3, 2), (8, 9), {"padding": (1, 0)}, False), False),  # rows padded
    (("conv2d", 1, 32, 40, 1, (3, 3), (8, 9), {"padding": (0, 1)}, True), False),  # columns padded
    (("conv2d", 1, 64, 64, 2, (3, 3), (8, 9), {"groups": 2}, True), False),  # a group's channels are not a position's
    (("conv2d", 2, 17, 32, 1, (3, 3), (7, 8), {}, True), "float32"),  # bfloat16: the pad channel
    (("conv_transpose2d", 2, 32, 24, 1, (3, 3), (6, 7), {"padding": 2}, True), True),  # a conv2d of padding 0
    (("conv_transpose2d", 2, 32, 24, 1, (2, 2), (6, 7), {"stride": 2}, False), True),  # four phases of one tap each
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("case,in_place", X_IN_PLACE_CASES, ids=lambda c: str(c[2:8]) if isinstance(c, tuple) else None)
def test_channels_last_inputs_staging_would_copy_unchanged_are_read_in_place(case, in_place, dtype):
    op, n, cin, cout, groups, kernel, spatial, geometry, bias = case
    x, w, b = operands(op, n, cin, cout, groups, kernel, spatial, bias, dtype, torch.Generator().manual_seed(cin + cout))
    nchw = API[op](x, w, b, **geometry)
    before, before_patch = x_in_place_images(), patch_images()
    nhwc = API[op](x.contiguous(memory_format=torch.channels_last), w, b, **geometry)
    served = brgemm_serves(dtype) and (dtype == torch.bfloat16 or kernel != (1, 1))
    expected = in_place is True or in_place == str(dtype).removeprefix("torch.")
    assert patch_images() - before_patch == (n if served else 0)
    assert x_in_place_images() - before == (n if served and expected else 0)
    assert nhwc.is_contiguous(memory_format=torch.channels_last)
    assert reference.bit_equal(nhwc.contiguous(), nchw)
    check_values(op, nchw, x, w, b, geometry)


def test_an_image_read_in_place_that_fails_the_rule_is_computed_again():
    """Read in place, an image's exponents are seen by the tasks that read it, after its outputs are
    computed; one that fails is computed again elsewhere, over them."""
    x, w, b = scaled_operands((3, 64, 5, 6), (32, 64, 1, 1), 1.0, 2.0**8, None, seed=4)
    x[1] = x[1] * 2.0**-130  # subnormal in bfloat16; its products with the weights are normal
    before, before_patch = x_in_place_images(), patch_images()
    whole = fuel_torch.conv2d(x.contiguous(memory_format=torch.channels_last), w, b)
    assert x_in_place_images() - before == patch_images() - before_patch == (2 if brgemm_serves(torch.bfloat16) else 0)
    assert reference.bit_equal(whole.contiguous(), fuel_torch.conv2d(x, w, b))  # staged: the same decisions
    check_a_failing_image_is_computed_alone(x, w, b, {})


# Where one element of image 1 sits: first and last lanes of each of the exponent scan's four
# 32-lane minima and of its tail, as an image of 2240 elements is cut into runs (staged: rows of 7
# positions, 448 elements, 3 bodies of 128 and a 64-element tail; read in place: each block's span).
# Leaving one of the four minima out of the result failed this test.
@pytest.mark.parametrize("x_format", FORMATS)
@pytest.mark.parametrize("at", [0, 31, 32, 95, 96, 127, 128, 2175, 2176, 2207, 2239])
def test_the_exponent_rule_sees_every_element(at, x_format):
    """All ones against weights of one (biased exponent 127), so the rule (tap_brgemm.h) turns on one
    element of image 1: 2^-112 passes (exponents 15 + 127 = 142), 2^-113 fails (141), and so does a
    subnormal. An image that fails is computed elsewhere; either way the outputs are correctly rounded."""
    w = torch.ones(16, 64, 1, 1, dtype=torch.bfloat16)
    for value, passes in ((2.0**-112, True), (2.0**-113, False), (2.0**-130, False)):
        x = torch.ones(2, 5, 7, 64, dtype=torch.bfloat16)  # positions then channels: channels_last order
        x.view(2, -1)[1, at] = value
        x = x.permute(0, 3, 1, 2).contiguous(memory_format=FORMATS[x_format])
        before = patch_images()
        ours = fuel_torch.conv2d(x, w)
        served = brgemm_serves(torch.bfloat16)
        assert patch_images() - before == (0 if not served else 2 if passes else 1), value
        exact = torch.nn.functional.conv2d(x.double(), w.double()).bfloat16()  # 64, or 63 + value: 63
        assert reference.bit_equal(ours.contiguous(), exact)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_channels_last_weight_gives_the_same_bits(dtype):
    generator = torch.Generator().manual_seed(3)
    x, w, b = operands("conv2d", 2, 32, 32, 1, (3, 3), (9, 9), True, dtype, generator)
    ours = fuel_torch.conv2d(x, w.contiguous(memory_format=torch.channels_last), b, padding=1)
    assert reference.bit_equal(ours.contiguous(), fuel_torch.conv2d(x, w, b, padding=1))


# NCHW outputs at unit column steps are turned round and rounded 16 x 16 in registers; channels_last
# ones round C's rows as they are. Pieces of rows (23 and 11 columns), channel tiles cut short (40
# output channels), rows back to back (the stem) and a NaN's rounding must agree.
UNIT_STEP_CASES = [
    ("conv2d", 2, 32, 40, 1, (3, 3), (9, 23), {"padding": 1}, True),  # in place
    ("conv2d", 2, 3, 32, 1, (7, 7), (22, 22), {"stride": 2, "padding": 3}, True),  # copied, rows back to back
    ("conv2d", 1, 24, 48, 1, (3, 3), (12, 11), {"padding": 2, "dilation": 2}, False),  # copied, 11-column rows
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("case", UNIT_STEP_CASES, ids=lambda c: f"{c[2]}x{c[3]}-{c[5]}-{c[6]}-{c[7]}")
def test_nchw_outputs_have_the_bits_of_channels_last_ones(case, dtype):
    op, n, cin, cout, groups, kernel, spatial, geometry, bias = case
    x, w, b = operands(op, n, cin, cout, groups, kernel, spatial, bias, dtype, torch.Generator().manual_seed(cout))
    x[0, 0, 1, 2] = float("nan")
    before = patch_images()
    nchw = API[op](x, w, b, **geometry)
    nhwc = API[op](x.contiguous(memory_format=torch.channels_last), w, b, **geometry)
    assert patch_images() - before == (2 * n if brgemm_serves(dtype) else 0)
    assert nchw.is_contiguous() and nhwc.is_contiguous(memory_format=torch.channels_last)
    assert nchw.isnan().any()
    assert reference.bit_equal(nchw, nhwc.contiguous())


# Transposed convs of stride 2 along the rows: NCHW outputs store the two column phases together
# (C's rows interleaved, 8 positions of an output row at a time: whole pieces straight into the
# output, a row's short end under a mask; the last block of phases of different lengths phase by
# phase).
COLUMN_PAIR_CASES = [
    ("conv_transpose2d", 2, 32, 24, 1, (4, 4), (5, 20), {"stride": 2, "padding": 1}, True),  # 40 columns
    ("conv_transpose2d", 1, 16, 40, 1, (3, 3), (6, 19), {"stride": 2, "padding": 1}, True),  # phases of 19, 18
    ("conv_transpose2d", 1, 32, 80, 2, (4, 4), (4, 35), {"stride": 2, "padding": 1, "groups": 2}, False),
    ("conv_transpose2d", 1, 24, 72, 1, (2, 2), (3, 40), {"stride": (1, 2)}, True),  # one row phase, 72 channels
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("case", COLUMN_PAIR_CASES, ids=lambda c: f"{c[2]}x{c[3]}-g{c[4]}-{c[5]}-{c[6]}")
def test_column_phases_stored_together_give_the_bits_stored_apart(case, dtype):
    """A channels_last output takes C's rows as they are, phase by phase; an NCHW one interleaves
    the two column phases. Both store the same C, so the bits are equal."""
    op, n, cin, cout, groups, kernel, spatial, geometry, bias = case
    x, w, b = operands(op, n, cin, cout, groups, kernel, spatial, bias, dtype, torch.Generator().manual_seed(cin))
    before = patch_images()
    nchw = API[op](x, w, b, **geometry)
    nhwc = API[op](x.contiguous(memory_format=torch.channels_last), w, b, **geometry)
    assert patch_images() - before == (2 * n if brgemm_serves(dtype) else 0)
    assert nhwc.is_contiguous(memory_format=torch.channels_last)
    assert reference.bit_equal(nchw, nhwc.contiguous())
    check_values(op, nchw, x, w, b, geometry)


STEM = {"stride": 2, "padding": 3}


def scaled_stem(x_scale: float, w_scale: float, bias_value: float | None):
    """A 7x7/2 stem of 3 -> 32 channels (brgemm_cases.scaled_operands): copied patches."""
    return scaled_operands((2, 3, 12, 12), (32, 3, 7, 7), x_scale, w_scale, bias_value, seed=19)


@pytest.mark.parametrize("x_scale,w_scale,bias_value", FLUSH_CASES)
def test_operands_the_bfloat16_unit_would_flush_keep_their_value(x_scale, w_scale, bias_value):
    before = patch_images()
    check_flushed_operands_keep_their_value(*scaled_stem(x_scale, w_scale, bias_value), STEM)
    assert patch_images() == before  # no image passes the rule


def test_an_image_that_fails_the_rule_leaves_the_others_on_the_path():
    x, w, b = scaled_stem(1.0, 2.0**8, None)
    x[1] = x[1] * 2.0**-130  # subnormal in bfloat16; its products with the weights are normal
    before = patch_images()
    fuel_torch.conv2d(x, w, b, **STEM)
    assert patch_images() - before == (1 if brgemm_serves(torch.bfloat16) else 0)
    check_a_failing_image_is_computed_alone(x, w, b, STEM)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("op,geometry", [
    ("conv2d", {"padding": 1}),  # in place
    ("conv2d", {"padding": 3, "stride": 2}),  # copied patches
    ("conv_transpose2d", {"padding": 1, "stride": 2, "output_padding": 1}),
], ids=["in-place", "copied", "transposed"])
def test_deterministic_across_calls_threads_and_batches(op, geometry, dtype):
    generator = torch.Generator().manual_seed(23)
    kernel = (7, 7) if geometry.get("stride") == 2 and op == "conv2d" else (3, 3)
    check_deterministic(op, *operands(op, 3, 48, 80, 1, kernel, (17, 19), True, dtype, generator), geometry)


@pytest.mark.parametrize("x_format", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_small_call_cut_finer_for_more_threads_keeps_its_bits(dtype, x_format):
    """One image of a 32-channel 16 x 16 conv is 3 blocks of 128 positions at 1 thread; with more
    threads its blocks get fewer positions (patch_block: 6 of 48 at 2 threads, 9 of 32 at 3 and 4), so that
    every thread has work. The blocks only choose which outputs each brgemm computes: the bits are the
    1-thread call's, and the path serves every thread count."""
    x, w, b = operands("conv2d", 1, 32, 32, 1, (3, 3), (16, 16), True, dtype, torch.Generator().manual_seed(32))
    x = x.contiguous(memory_format=FORMATS[x_format])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        before = patch_images()
        alone = fuel_torch.conv2d(x, w, b, padding=1)
        for count in (2, 3, 4):
            torch.set_num_threads(count)
            assert reference.bit_equal(fuel_torch.conv2d(x, w, b, padding=1), alone), count
    finally:
        torch.set_num_threads(threads)
    assert patch_images() - before == (4 if brgemm_serves(dtype) else 0)
    check_values("conv2d", alone.contiguous(), x.contiguous(), w, b, {"padding": 1})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("cout", [3, 20])
@pytest.mark.parametrize("op", ("conv2d", "conv_transpose2d"))
def test_no_input_channels_give_the_bias_elsewhere(op, cout, dtype):
    """Zero input channels leave nothing to stage (a division by zero in the staging grain, found by
    test_fuzz): the call goes to the chassis, which writes the bias."""
    generator = torch.Generator().manual_seed(cout)
    x, w, b = operands(op, 2, 0, cout, 1, (3, 3), (5, 6), True, dtype, generator)
    geometry = {"padding": 1, "stride": 2} if op == "conv_transpose2d" else {"padding": 1}
    before = patch_images()
    ours = API[op](x, w, b, **geometry)
    assert patch_images() == before
    assert reference.bit_equal(ours, b.view(1, -1, 1, 1).expand_as(ours).contiguous())


def test_fuel_patch_0_hands_the_call_to_the_other_paths(monkeypatch):
    generator = torch.Generator().manual_seed(5)
    x, w, b = operands("conv2d", 2, 32, 32, 1, (3, 3), (9, 9), True, torch.float32, generator)
    monkeypatch.delenv("FUEL_PATCH", raising=False)  # a suite run with FUEL_PATCH=0 set still tests the switch
    assert fuel_torch.patch_brgemm()
    monkeypatch.setenv("FUEL_PATCH", "0")
    assert not fuel_torch.patch_brgemm()
    before = patch_images()
    ours = fuel_torch.conv2d(x, w, b, padding=1)
    assert patch_images() == before
    check_values("conv2d", ours, x, w, b, {"padding": 1})
    monkeypatch.delenv("FUEL_PATCH")
    fuel_torch.conv2d(x, w, b, padding=1)
    assert patch_images() - before == (2 if brgemm_serves(torch.float32) else 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_staging_copy_past_its_budget_goes_elsewhere(dtype):
    """Padding and dilation that cancel in the output but make the staged copy 10^4 x 10^4
    positions wide: the call is computed elsewhere, exactly as the reference says."""
    generator = torch.Generator().manual_seed(7)
    geometry = {"padding": 5000, "dilation": 5000}
    x, w, b = operands("conv2d", 1, 16, 16, 1, (3, 3), (4, 4), True, dtype, generator)
    before = patch_images()
    ours = fuel_torch.conv2d(x, w, b, **geometry)
    assert patch_images() == before and ours.shape == (1, 16, 4, 4)
    check_values("conv2d", ours, x, w, b, geometry)


@pytest.mark.parametrize("geometry", [{}, {"stride": 2}], ids=["in-place", "copied"])
def test_float32_chunks_are_summed_from_zero_and_then_added(geometry):
    """The contract's float32 order: the bias, then chunks of at most 64 terms, each summed from zero
    and added. With a bias of 2^24 and 576 terms of 1 in chunks of 64, every chunk's sum and every
    addition is exact; a sum run on from the bias would lose every term (2^24 + 1 rounds to 2^24).
    Where the path does not serve, the chassis's order holds: its first block of 32 taps runs on
    from the bias and loses its terms, the other blocks start at zero."""
    x, w = torch.ones(2, 64, 9, 9), torch.ones(64, 64, 3, 3)
    bias = torch.full((64,), 2.0**24)
    before = patch_images()
    ours = fuel_torch.conv2d(x, w, bias, **geometry)
    served = brgemm_serves(torch.float32)
    assert patch_images() - before == (2 if served else 0)
    assert torch.equal(ours, torch.full_like(ours, 2.0**24 + 64 * 9 - (0 if served else 32)))
