"""float32 convolutions of the input's size at stride 1, on brgemm with x and the output read and
written in place (csrc/convolution/plane_brgemm.h).

Of the calls the patch path serves (test_convolution_patch_brgemm.py), float32 ones whose x and
output are both NCHW or both channels_last with dense rows, whose output keeps the input's height
and width (stride 1, a padding of half the dilated kernel's reach), and whose groups hold whole
64-channel chunks multiply x in place by each tap's weights, straight into the output. A tap's
positions run on across rows, so the columns it reads past a row's end hold the neighbouring row's
elements: the path puts those outputs back after the tap. Here:

- values against the float64 reference with float32's claim and twice torch's error, in both
  layouts, over kernels, dilation, groups, several chunks of input and output channels, rows that
  one block of positions crosses, taps that reach past a whole row, images of one position,
  conv_transpose2d at stride 1, and that the path served them
  (fuel_torch._C.path_counts()["plane_brgemm_images"]);
- the same bits in both layouts as the patch path's own sums (the call with an NCHW x and a
  channels_last weight, whose channels_last output this path does not take), with large values in
  each row's first and last columns, which a tap that added the neighbouring row's elements would move;
- NCHW planes whose rows crowd into a few of L1's sets (16x16, 32x32) staged per block of
  positions (fuel_torch._C.path_counts()["plane_staged_images"]), with the same values and bits;
- determinism over calls, thread counts and images;
- what the path leaves to the others: mixed layouts, a channel count that is not a whole number of
  chunks, stride 2, an output larger or smaller than x, a 1x1 kernel, bfloat16, FUEL_PATCH=0 (read
  per call).

Below the AVX2 level (or where torch's brgemm is off) the same tests check the values on whichever
path serves the call, and that this one does not.
"""
from __future__ import annotations

import pytest
import torch

import fuel_torch
from fuel_torch import reference

from brgemm_cases import FORMATS, brgemm_serves, check_case, check_deterministic
from test_convolution import API, check_values, operands

# (op, n, cin, cout, groups, kernel, spatial, geometry, bias)
CASES = [
    ("conv2d", 2, 64, 64, 1, (3, 3), (14, 15), {"padding": 1}, True),
    ("conv2d", 1, 64, 32, 1, (3, 3), (40, 37), {"padding": 1}, True),  # blocks that start and end mid-row
    ("conv2d", 1, 128, 40, 1, (3, 3), (9, 7), {"padding": 1}, True),  # two channel chunks per tap
    ("conv2d", 2, 64, 48, 1, (3, 3), (12, 11), {"padding": 2, "dilation": 2}, False),
    ("conv2d", 1, 64, 32, 1, (5, 3), (6, 3), {"padding": (2, 1)}, True),
    ("conv2d", 1, 64, 32, 1, (3, 3), (3, 2), {"padding": 2, "dilation": 2}, True),  # taps past a whole row
    ("conv2d", 4, 64, 64, 1, (3, 3), (1, 1), {"padding": 1}, True),  # one position an image
    ("conv2d", 2, 128, 64, 2, (3, 3), (10, 11), {"padding": 1, "groups": 2}, True),
    ("conv2d", 1, 64, 200, 1, (3, 3), (8, 8), {"padding": 1}, True),  # output channels in four brgemms
    ("conv2d", 1, 192, 16, 1, (3, 1), (7, 9), {"padding": (1, 0)}, True),  # taps along the columns only
    ("conv_transpose2d", 2, 64, 48, 1, (3, 3), (9, 8), {"padding": 1}, True),
    ("conv_transpose2d", 1, 128, 32, 1, (5, 5), (6, 7), {"padding": 2}, False),
    # NCHW 7x7 and 5x5 weights, each element's taps in one window: packed as 16 x 16 tiles of runs of
    # 16 taps and tap by tap for the rest (copy_windows_taps, packing.h)
    ("conv2d", 1, 64, 48, 1, (7, 7), (9, 10), {"padding": 3}, True),
    ("conv2d", 2, 64, 80, 1, (5, 5), (6, 6), {"padding": 2}, False),
    # NCHW planes 1 and 4 KiB apart, whose rows crowd into a few of L1's sets: x staged per block
    ("conv2d", 1, 64, 40, 1, (3, 3), (16, 16), {"padding": 1}, True),
    ("conv2d", 1, 64, 24, 1, (3, 3), (32, 32), {"padding": 2, "dilation": 2}, False),
    ("conv_transpose2d", 2, 128, 32, 2, (3, 3), (16, 16), {"padding": 1, "groups": 2}, True),
]
CROWDED = CASES[-3:]


def plane_images() -> int:
    return fuel_torch._C.path_counts()["plane_brgemm_images"]


def case_id(case) -> str:
    return f"{case[0]}-{case[2]}x{case[3]}-g{case[4]}-{case[5]}-{case[6]}-{case[7]}"


@pytest.mark.parametrize("x_format", FORMATS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_values_within_the_contract(case, x_format):
    check_case(case, torch.float32, x_format, plane_images, seed=case[2] * case[3] + 3)


def edge_heavy_operands(case, seed):
    """The case's operands with every row's first and last input columns a thousand times larger."""
    op, n, cin, cout, groups, kernel, spatial, geometry, bias = case
    x, w, b = operands(op, n, cin, cout, groups, kernel, spatial, bias, torch.float32,
                       torch.Generator().manual_seed(seed))
    x[..., 0] *= 1000
    x[..., -1] *= 1000
    return x, w, b


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_bits_of_the_patch_path(case):
    op, n, geometry = case[0], case[1], case[7]
    x, w, b = edge_heavy_operands(case, seed=case[3])
    x[0, 0, 0, 0] = float("nan")
    served = n if brgemm_serves(torch.float32) else 0
    before = plane_images()
    nchw = API[op](x, w, b, **geometry)
    assert plane_images() - before == served
    nhwc = API[op](x.contiguous(memory_format=torch.channels_last), w, b, **geometry)
    assert plane_images() - before == 2 * served
    # An NCHW x and a channels_last weight make a channels_last output: the patch path's.
    patch = API[op](x, w.contiguous(memory_format=torch.channels_last), b, **geometry)
    assert plane_images() - before == 2 * served
    assert nchw.isnan().any() and not nchw.isnan().all()
    assert reference.bit_equal(nchw, patch.contiguous()) and reference.bit_equal(nhwc, patch)


def staged_images() -> int:
    return fuel_torch._C.path_counts()["plane_staged_images"]


@pytest.mark.parametrize("case", CROWDED, ids=case_id)
def test_crowded_nchw_planes_are_staged(case):
    # The cases above check these calls' values and bits; here, that they took the staged reads
    # (NCHW only: a channels_last call's rows are pixels) and that a plane that does not crowd
    # (CASES[0], 14x15) is read in place.
    op, n, geometry = case[0], case[1], case[7]
    x, w, b = edge_heavy_operands(case, seed=2)
    served = n if brgemm_serves(torch.float32) else 0
    before = staged_images()
    API[op](x, w, b, **geometry)
    assert staged_images() - before == served
    API[op](x.contiguous(memory_format=torch.channels_last), w, b, **geometry)
    uncrowded = CASES[0]
    x, w, b = edge_heavy_operands(uncrowded, seed=2)
    API[uncrowded[0]](x, w, b, **uncrowded[7])
    assert staged_images() - before == served


@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[7], CASES[10], CROWDED[0]], ids=case_id)
def test_deterministic(case):
    x, w, b = edge_heavy_operands(case, seed=5)
    check_deterministic(case[0], x, w, b, case[7])


# Calls the path leaves to the others (op, cin, cout, kernel, spatial, geometry, dtype, layout).
DECLINED = [
    ("conv2d", 32, 32, (3, 3), (9, 8), {"padding": 1}, torch.float32, torch.contiguous_format),
    ("conv2d", 96, 32, (3, 3), (9, 8), {"padding": 1}, torch.float32, torch.contiguous_format),
    ("conv2d", 64, 32, (3, 3), (9, 8), {"padding": 1, "stride": 2}, torch.float32, torch.contiguous_format),
    ("conv2d", 64, 32, (3, 3), (9, 8), {"padding": 2}, torch.float32, torch.channels_last),
    ("conv2d", 64, 32, (3, 3), (9, 8), {"padding": (1, 0)}, torch.float32, torch.contiguous_format),
    ("conv2d", 64, 32, (3, 3), (9, 8), {"padding": 0}, torch.float32, torch.channels_last),
    ("conv2d", 32, 32, (3, 3), (9, 8), {"padding": 1}, torch.float32, torch.channels_last),
    ("conv2d", 64, 32, (1, 1), (9, 8), {}, torch.float32, torch.contiguous_format),
    ("conv2d", 64, 32, (3, 3), (9, 8), {"padding": 1}, torch.bfloat16, torch.contiguous_format),
    ("conv_transpose2d", 64, 32, (4, 4), (5, 6), {"padding": 1, "stride": 2}, torch.float32,
     torch.contiguous_format),
]


@pytest.mark.parametrize("case", DECLINED, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}-{c[5]}-{c[6]}-{c[7]}")
def test_calls_left_to_the_other_paths(case):
    op, cin, cout, kernel, spatial, geometry, dtype, layout = case
    x, w, b = operands(op, 1, cin, cout, 1, kernel, spatial, True, dtype, torch.Generator().manual_seed(cin))
    before = plane_images()
    ours = API[op](x.contiguous(memory_format=layout), w, b, **geometry)
    assert plane_images() == before
    check_values(op, ours.contiguous(), x, w, b, geometry)


def test_fuel_patch_0_hands_the_call_on(monkeypatch):
    case = CASES[0]
    x, w, b = edge_heavy_operands(case, seed=11)
    before = plane_images()
    served = fuel_torch.conv2d(x, w, b, padding=1)
    assert plane_images() - before == (case[1] if brgemm_serves(torch.float32) else 0)
    monkeypatch.setenv("FUEL_PATCH", "0")
    other = fuel_torch.conv2d(x, w, b, padding=1)
    assert plane_images() - before == (case[1] if brgemm_serves(torch.float32) else 0)
    for ours in (served, other):
        check_values("conv2d", ours, x, w, b, {"padding": 1})
