"""The weight gradient of a depthwise conv2d read in place (csrc/convolution/depthwise_weight_grad.h).

autograd computes a conv2d weight gradient as a conv2d over transposed copies of x and the output
gradient (the wide-kernel problem). For a depthwise conv (groups = input channels = output channels)
with at least two images, column stride 1, output rows of at least 64 bytes of accumulator lanes and
at most 16 kernel columns, that conv2d runs on the wide-kernel path; the depthwise weight-gradient
path computes the same sums from x and the gradient where they lie, along the channels when both are
channels_last and along the rows otherwise. The others it computes in the chassis's order, along the
channels. Here, against the conv2d route itself (taken when the
backward records a graph, create_graph=True, and under torch.compile, which traces fake tensors):

- the same bits, over geometries that reach each part of the path (3x3, 5x5 and 7x7 kernels and any
  other width, strides, dilations, asymmetric padding, channel counts that leave a partial vector,
  rows that leave a partial lane group, both layouts and mixed ones), with infinities, NaNs, -0 and
  subnormals among the operands;
- the others (one image, column strides, narrow rows, wide kernels), which the conv2d route computes on
  the chassis, in its order (blocks of 32 products, chunks of 256), NCHW operands turned first;
- that those calls are the ones the path served (fuel_torch._C.path_counts()), and that others are not;
- the same bits for every thread count (the path splits the channels by the thread count);
- exact sums for integer-valued operands, against float64;
- a compiled training step's weight gradient equal to eager's.

test_isa_levels runs this file at every other supported instruction-set level.
"""
from __future__ import annotations

import pytest
import torch

import fuel_torch
from fuel_torch import reference

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
NCHW, NHWC = torch.contiguous_format, torch.channels_last

# (images, channels, (H, W), (Kh, Kw), geometry, x's layout, the gradient's layout)
SERVED = [
    (3, 37, (9, 40), (3, 3), dict(padding=1), NHWC, NHWC),  # 37: a partial channel vector
    (2, 24, (11, 23), (5, 5), dict(padding=(2, 1), stride=(2, 1), dilation=(2, 1)), NHWC, NHWC),
    (2, 16, (10, 30), (7, 7), dict(padding=3), NHWC, NHWC),
    (2, 5, (8, 35), (3, 2), dict(padding=(0, 3), dilation=(1, 2)), NHWC, NHWC),  # a width compiled for none
    (4, 3, (7, 32), (3, 3), dict(padding=1), NCHW, NCHW),  # rows of whole lane groups
    (2, 6, (12, 37), (5, 5), dict(padding=(0, 2), stride=(3, 1), dilation=(1, 2)), NCHW, NCHW),
    (3, 4, (9, 21), (4, 1), dict(padding=(2, 0)), NCHW, NCHW),
    (2, 18, (8, 34), (3, 3), dict(padding=1), NHWC, NCHW),  # mixed layouts: along the rows
    # Rows so wide that, with 8-lane vectors (AVX2), fewer of a run's channel vectors are staged at once
    # than it has (one or three of six), the last partial.
    (2, 44, (6, 620), (3, 3), dict(padding=1), NHWC, NHWC),
]
IDS = [f"{c[0]}x{c[1]}-{c[2][0]}x{c[2][1]}-k{c[3][0]}x{c[3][1]}-{'cl' if c[5] == NHWC else 'nchw'}"
       f"{'' if c[5] == c[6] else '-mixed'}" for c in SERVED]


def path_calls() -> int:
    return fuel_torch._C.path_counts()["depthwise_weight_grad_calls"]


def operands(case, dtype, specials: bool, seed: int = 0):
    """x, weight (requiring grad) and an output gradient for a case; magnitudes 2^-8..2^8 so that a
    sum's bits, even rounded to a half, depend on its order; with `specials`, some inf, NaN, -0 and
    subnormal elements in x and the gradient."""
    n, c, (h, w), (kh, kw), geometry, x_format, g_format = case
    generator = torch.Generator().manual_seed(seed)

    def values(*shape):
        t = torch.randn(shape, generator=generator, dtype=torch.float64)
        t *= 2.0 ** torch.randint(-8, 9, shape, generator=generator)
        if specials:
            u = torch.rand(shape, generator=generator)
            t[u < 0.01] = float("inf")
            t[(u >= 0.01) & (u < 0.02)] = float("nan")
            t[(u >= 0.02) & (u < 0.06)] = -0.0
            t[(u >= 0.06) & (u < 0.1)] = torch.finfo(dtype).tiny / 4  # subnormal
        return t.to(dtype)

    x = values(n, c, h, w).contiguous(memory_format=x_format).requires_grad_()
    weight = values(c, 1, kh, kw).requires_grad_()
    y = fuel_torch.conv2d(x, weight, None, groups=c, **geometry)
    g = values(*y.shape).contiguous(memory_format=g_format)
    return x, weight, y, g


def weight_grad(y, weight, g, record_graph: bool):
    """The weight gradient: on the in-place path (no graph to record) or the conv2d route."""
    (dw,) = torch.autograd.grad(y, weight, g, retain_graph=True, create_graph=record_graph)
    return dw.detach()


def assert_same_bits(ours, route):
    """Bit for bit, NaN payloads aside: which of two NaN operands a fused multiply-add propagates
    depends on the instruction form the compiler picks (at the DEFAULT level it differs between
    the conv2d route's own calls; the chassis-order kernel and the chassis pick differently at
    every level), and no contract promises a convolution's NaN payloads. Every NaN is a NaN in both."""
    assert ours.is_contiguous() and ours.shape == route.shape and ours.dtype == route.dtype
    nan = torch.isnan(ours)
    assert torch.equal(nan, torch.isnan(route))
    assert torch.equal(reference.bits(ours)[~nan], reference.bits(route)[~nan])


@pytest.mark.parametrize("specials", [False, True], ids=["finite", "specials"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", SERVED, ids=IDS)
def test_bits_match_the_conv2d_route(case, dtype, specials):
    x, weight, y, g = operands(case, dtype, specials)
    before = path_calls()
    ours = weight_grad(y, weight, g, record_graph=False)
    assert path_calls() == before + 1
    route = weight_grad(y, weight, g, record_graph=True)
    assert path_calls() == before + 1
    if specials:
        assert_same_bits(ours, route)
    else:
        assert reference.bit_equal(ours, route) and ours.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", [SERVED[0], SERVED[4]], ids=[IDS[0], IDS[4]])
def test_same_bits_for_every_thread_count(case, dtype):
    x, weight, y, g = operands(case, dtype, specials=False, seed=1)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            results.append(weight_grad(y, weight, g, record_graph=False))
    finally:
        torch.set_num_threads(threads)
    assert all(reference.bit_equal(r, results[0]) for r in results[1:])


# Depthwise calls whose weight gradient the conv2d route computes on the chassis (one image: on the
# depthwise kernel, in the same order), which the path computes in that order (NCHW operands turned to
# channels_last first): products in blocks of 32, chunks of 256.
BLOCKED = {
    "one image": (1, 37, (6, 40), (3, 3), dict(padding=1), NHWC, NHWC),
    "column stride 2": (2, 20, (11, 30), (5, 5), dict(padding=2, stride=(1, 2)), NHWC, NHWC),
    "rows under 16 columns": (3, 8, (7, 12), (3, 3), dict(padding=(0, 1), dilation=(2, 1)), NHWC, NHWC),
    "17 kernel columns": (2, 8, (6, 40), (3, 17), dict(padding=(1, 8)), NHWC, NHWC),
    "7x7 at stride 2": (2, 18, (14, 14), (7, 7), dict(padding=3, stride=2), NHWC, NHWC),
    "one block": (2, 3, (4, 4), (3, 3), dict(padding=1), NHWC, NHWC),  # 32 products
    "one chunk": (1, 5, (16, 16), (3, 3), dict(padding=1), NHWC, NHWC),  # 256 products
    # NCHW operands are turned 16 channels x 16 columns at a time where the level has the transposes
    # (the last columns of a row as an overlapping tile), the rest element by element.
    "NCHW at stride 2": (3, 20, (15, 20), (3, 3), dict(padding=1, stride=2), NCHW, NCHW),
    "NCHW gradient, one image": (1, 33, (5, 40), (3, 3), dict(padding=1), NHWC, NCHW),
    "NCHW, one image": (1, 4, (9, 33), (5, 3), dict(padding=(2, 1), dilation=(1, 2)), NCHW, NCHW),
    "mixed, narrow rows": (2, 17, (8, 9), (3, 3), dict(padding=1), NCHW, NHWC),
}


def blocked_served(case, dtype) -> bool:
    """bfloat16 calls of several images are left to the conv2d route where the AMX tile unit serves
    them (its patch path takes one output channel per group, in its own order)."""
    return not (dtype == torch.bfloat16 and case[0] >= 2 and fuel_torch.bfloat16_brgemm() == "AMX")


@pytest.mark.parametrize("specials", [False, True], ids=["finite", "specials"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BLOCKED)
def test_other_depthwise_gradients_match_the_chassis_order(name, dtype, specials):
    x, weight, y, g = operands(BLOCKED[name], dtype, specials)
    before = path_calls()
    ours = weight_grad(y, weight, g, record_graph=False)
    assert path_calls() == before + int(blocked_served(BLOCKED[name], dtype))
    route = weight_grad(y, weight, g, record_graph=True)
    if specials:
        assert_same_bits(ours, route)
    else:
        assert reference.bit_equal(ours, route) and ours.is_contiguous()


def test_a_channel_multiplier_takes_the_conv2d_route():
    x = torch.randn(2, 4, 6, 40).contiguous(memory_format=NHWC)
    weight = torch.randn(8, 1, 3, 3, requires_grad=True)  # two output channels per input channel
    y = fuel_torch.conv2d(x, weight, None, padding=1, groups=4)
    before = path_calls()
    torch.autograd.grad(y, weight, torch.randn(y.shape))
    assert path_calls() == before


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", [SERVED[1], SERVED[5]], ids=[IDS[1], IDS[5]])
def test_integer_operands_give_exact_gradients(case, dtype):
    """Small integers: every product and partial sum is exact in the accumulator, so the gradient is
    float64's whatever the order."""
    n, c, (h, w), (kh, kw), geometry, x_format, g_format = case
    generator = torch.Generator().manual_seed(2)
    x = torch.randint(-3, 4, (n, c, h, w), generator=generator).to(dtype).contiguous(memory_format=x_format)
    weight = torch.randint(-3, 4, (c, 1, kh, kw), generator=generator).to(dtype).requires_grad_()
    y = fuel_torch.conv2d(x, weight, None, groups=c, **geometry)
    g = torch.randint(-2, 3, y.shape, generator=generator).to(dtype).contiguous(memory_format=g_format)
    before = path_calls()
    ours = weight_grad(y, weight, g, record_graph=False)
    assert path_calls() == before + 1
    w64 = weight.detach().double().requires_grad_()
    y64 = torch.nn.functional.conv2d(x.double(), w64, None, groups=c, **geometry)
    (exact,) = torch.autograd.grad(y64, w64, g.double())
    assert ours.dtype == dtype and torch.equal(ours.double(), exact)


@pytest.mark.parametrize("memory_format", [NCHW, NHWC], ids=str)
def test_compiled_training_step_has_the_eager_weight_gradient(memory_format):
    """torch.compile traces the backward with fake tensors, so the compiled step computes the weight
    gradient by the conv2d route; eager computes it on this path: the same bits."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = fuel_torch.nn.Conv2d(12, 12, 3, padding=1, groups=12).to(memory_format=memory_format)
    x = torch.randn(2, 12, 5, 20).contiguous(memory_format=memory_format)
    grads = []
    for model in (conv, torch.compile(conv, backend="aot_eager", fullgraph=True)):
        before = path_calls()
        model(x).square().sum().backward()
        grads.append((conv.weight.grad.clone(), path_calls() - before))
        conv.zero_grad(set_to_none=True)
    (eager, eager_calls), (compiled, compiled_calls) = grads
    assert (eager_calls, compiled_calls) == (1, 0)
    assert reference.bit_equal(eager, compiled)
