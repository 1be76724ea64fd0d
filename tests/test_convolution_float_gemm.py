"""The float32 brgemm paths' product (csrc/convolution/float_brgemm.h) computes the contract's sums.

At AVX2 every float32 brgemm call is C = C + (one fused multiply-add chain over its terms in order,
from zero): fuel's own register tile computes it (oneDNN's kernel, on the channels_last plane
calls, the same). The other tests compare the paths with one another, which a kernel of another
order would pass as well; here each output is checked bit for bit against that order emulated in
float64, independently of either kernel:

- a 1x1 conv2d (channels_last: the pointwise path; NCHW: the per-tap path) of 300 channels, two
  chunks of 256 and 44 terms, the first added to the bias, the second to that;
- a 3x3 conv2d of 64 channels that keeps the image's size (the plane path, both layouts): per tap
  (rows, then columns), its 64 channels summed from zero and added in turn, a tap in the padding
  adding nothing;
- a 3x3 conv2d at stride 2 (the per-tap path on padded planes, both layouts) of 64 and of 300
  channels, the latter two chunks per tap;

with output-channel counts that end in a partial column panel (19, 24, 40) and pixel counts that end
in a partial row tile (35, 27 an image, 54), and 16x16 images, whose NCHW planes crowd into a few of
L1's sets (B's panels copied, x staged); each call checked to run on the path named. Where the
float32 brgemm paths are off (the DEFAULT level, FUEL_BRGEMM=0) the chassis serves these calls in
its own order: there the test checks that, and the values against the contract's bound. At AVX512
the paths run on oneDNN's kernel, whose order within a chunk the contract leaves to oneDNN: there
the test checks that they served the calls, and the values against the bound. test_isa_levels.py
runs this file at every level the CPU has.
"""
from __future__ import annotations

import pytest
import torch

import fuel_torch

from brgemm_cases import brgemm_serves
from test_convolution import check_values


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 a * b + c rounded once, from float64 tensors holding float32 values.

    The product is exact in float64; the float64 sum rounds, and rounding that again to float32
    can differ from rounding the exact value once only where the float64 sum lands exactly halfway
    between two float32 values: there the sum's error (TwoSum) says which way the exact value lies.
    """
    p = a * b
    s = p + c
    bv = s - p
    err = (p - (s - bv)) + (c - bv)
    r = s.to(torch.float32).to(torch.float64)
    up = torch.nextafter(r.float(), torch.tensor(float("inf"))).double()
    down = torch.nextafter(r.float(), torch.tensor(float("-inf"))).double()
    halfway_up = (s - r) * 2 == (up - r)
    halfway_down = (r - s) * 2 == (r - down)
    r = torch.where(halfway_up & (err > 0), up, r)
    r = torch.where(halfway_down & (err < 0), down, r)
    return r


def add32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a + b).to(torch.float32).to(torch.float64)  # a sum of two floats rounds right this way


def chunked_sums(terms, bias: torch.Tensor, chunk_ends) -> torch.Tensor:
    """bias, then for each chunk its fused chain over (x_term, w_term) pairs from zero, added in turn.

    terms: a list of (x, w) float64 tensors broadcasting to the output's shape, in the sums' order;
    chunk_ends: the index after each chunk's last term.
    """
    out, start = bias, 0
    for end in chunk_ends:
        acc = torch.zeros_like(out)
        for x_term, w_term in terms[start:end]:
            acc = fma32(x_term, w_term, acc)
        out, start = add32(out, acc), end
    return out


def reference(x, w, b, stride, padding):
    """The contract's sums: bias, then per tap (rows, then columns) its channels in chunks of 256,
    each chunk one fused chain from zero, added in turn. A tap in the padding reads zeros: its chain
    is +0 and adding it keeps every sum's bits."""
    n, cin, h, wdt = x.shape
    k = w.shape[2]
    ho, wo = (h + 2 * padding - k) // stride + 1, (wdt + 2 * padding - k) // stride + 1
    padded = torch.nn.functional.pad(x.double(), (padding,) * 4)
    wd = w.double()
    terms, chunk_ends = [], []
    for kh in range(k):
        for kw in range(k):
            window = padded[:, :, kh:kh + stride * (ho - 1) + 1:stride, kw:kw + stride * (wo - 1) + 1:stride]
            chunk_ends += [len(terms) + min(c0 + 256, cin) for c0 in range(0, cin, 256)]
            terms += [(window[:, ci, None], wd[None, :, ci, kh, kw, None, None]) for ci in range(cin)]
    bias = b.double()[None, :, None, None].expand(n, w.shape[0], ho, wo)
    return chunked_sums(terms, bias, chunk_ends)


CASES = [  # (path, x shape, weight shape, stride, padding)
    ("pointwise", (1, 300, 5, 7), (19, 300, 1, 1), 1, 0),
    ("pointwise", (2, 300, 3, 9), (24, 300, 1, 1), 1, 0),
    ("plane", (1, 64, 6, 9), (19, 64, 3, 3), 1, 1),
    ("plane", (1, 64, 5, 7), (40, 64, 3, 3), 1, 1),
    # 16x16 NCHW planes, 1 KiB apart, crowd into a few of L1's sets: the per-tap path's B panels
    # copied by float_brgemm, the plane path's x staged per block
    ("pointwise", (1, 300, 16, 16), (24, 300, 1, 1), 1, 0),
    ("plane", (1, 64, 16, 16), (19, 64, 3, 3), 1, 1),
    # Stride 2: the per-tap path on padded planes, its blocks of positions a whole number of register
    # tiles wide (a 7x7 output's 56 grid positions as 64), 300 channels two chunks per tap
    ("strided", (1, 64, 14, 14), (19, 64, 3, 3), 2, 1),
    ("strided", (2, 300, 9, 11), (24, 300, 3, 3), 2, 1),
]
# The path counter each case moves, by x's layout (an NCHW 1x1 runs one brgemm per tap).
COUNTERS = {("pointwise", "nchw"): "float_brgemm_images", ("pointwise", "nhwc"): "pointwise_brgemm_images",
            ("plane", "nchw"): "plane_brgemm_images", ("plane", "nhwc"): "plane_brgemm_images",
            ("strided", "nchw"): "float_brgemm_images", ("strided", "nhwc"): "float_brgemm_images"}
FORMATS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}


@pytest.mark.parametrize("layout", FORMATS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2][0]}")
def test_float32_sums_follow_the_contract_bit_for_bit(case, layout):
    path, x_shape, w_shape, stride, padding = case
    g = torch.Generator().manual_seed(sum(x_shape) + w_shape[0])
    x = torch.randn(x_shape, generator=g).contiguous(memory_format=FORMATS[layout])
    w = torch.randn(w_shape, generator=g).contiguous(memory_format=FORMATS[layout])
    b = torch.randn(w_shape[0], generator=g)
    counter = COUNTERS[path, layout]
    before = fuel_torch._C.path_counts()[counter]
    ours = fuel_torch.conv2d(x, w, b, stride=stride, padding=padding)
    served = fuel_torch._C.path_counts()[counter] - before
    if not brgemm_serves(torch.float32):
        assert served == 0
        check_values("conv2d", ours.contiguous(), x.contiguous(), w, b, dict(stride=stride, padding=padding))
        return
    assert served == x_shape[0]
    if fuel_torch.cpu_capability() != "AVX2":
        check_values("conv2d", ours.contiguous(), x.contiguous(), w, b, dict(stride=stride, padding=padding))
        return
    expected = reference(x, w, b, stride, padding).float().contiguous(memory_format=FORMATS[layout])
    mismatch = ours.view(torch.int32) != expected.view(torch.int32)
    assert not mismatch.any(), f"{int(mismatch.sum())} of {ours.numel()} outputs differ from the contract's order"


def test_the_reference_tells_a_fused_chain_from_a_rounded_one():
    # The test above can fail: the same chain with each product rounded first (no fused
    # multiply-add) differs from the reference, and so would a kernel that did that.
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(300, 64, generator=g).double(), torch.randn(300, 64, generator=g).double()
    fused, unfused = torch.zeros(64, dtype=torch.float64), torch.zeros(64, dtype=torch.float64)
    for k in range(300):
        fused = fma32(x[k], w[k], fused)
        unfused = add32((x[k] * w[k]).float().double(), unfused)
    assert not torch.equal(fused, unfused)
