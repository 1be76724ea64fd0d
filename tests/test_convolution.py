"""fuel::conv2d and fuel::conv_transpose2d against torch: values, precision, shapes, determinism, layout.

Convolution results are not bit-defined (they depend on the summation order), so the oracles are:

- float32: torch's float64 result from the same rounded operands is the reference. It is exact to
  within K * 2^-53 * S (a product of two floats of 24 bits is exact in float64; K = taps per output,
  S = conv(|x|, |w|) + |bias|). Every output must be within the contract's bound (K + 2) * 2^-24 * S,
  and our error must be at most 2x torch's own: pooled over the whole grid
  (test_float32_error_pooled_against_torch: root mean square and maximum, each output's error in units
  of 2^-24 * S), and per case for long reductions. Per case with few outputs the largest error is a
  matter of chance (both sides round about once per tap), so it is not compared there.
- bfloat16 / float16: the contract's claim, convolution.half_result_check: with g = (K + 2) * 2^-24 * S,
  every output with g <= ulp(exact) / 2 is within 1 ulp of the correctly rounded value, and every
  output satisfies |out - exact| <= ulp(out) / 2 + g. torch's own half results are never compared
  tightly (its float16 conv_transpose2d does not accumulate in float32).
- float64: the rigorous |out - exact| <= (K + 2) * 2^-53 * S against an exactly rounded reference
  (math.fsum of error-free split products) in test_float64_rigorous_bound; elsewhere ours and torch's
  float64 results must lie within twice that bound of each other (each is within it of the exact value).
- integer-valued operands (randint(-3, 4)): every partial sum is exact, so the result is bit-identical
  to the correctly rounded exact value, and to torch in float32/float64.
"""
from __future__ import annotations

import itertools
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fuel_torch
from fuel_torch import convolution, reference

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
OPS = ("conv2d", "conv_transpose2d")
TORCH = {"conv2d": F.conv2d, "conv_transpose2d": F.conv_transpose2d}
API = {"conv2d": fuel_torch.conv2d, "conv_transpose2d": fuel_torch.conv_transpose2d}


def operands(op, n, cin, cout, groups, kernel, spatial, bias, dtype, generator, integer=False):
    def draw(*shape):
        if integer:
            return torch.randint(-3, 4, shape, generator=generator).to(dtype)
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)

    x = draw(n, cin, *spatial)
    w = draw(cout, cin // groups, *kernel) if op == "conv2d" else draw(cin, cout // groups, *kernel)
    return x, w, draw(cout) if bias else None


def check_values(op, ours, x, w, b, geometry, versus_torch=False):
    """ours against the oracle of its dtype (module docstring); versus_torch: also the float32 largest
    error at most 2x torch's, for cases with enough outputs and taps for that to be a fair contest."""
    exact, scale = convolution.float64_reference(op, x, w, b, **geometry)
    assert ours.shape == exact.shape and ours.dtype == x.dtype and ours.is_contiguous()
    if ours.numel() == 0:
        return
    taps = convolution.taps_per_output(op, x, w, geometry.get("groups", 1))
    reference_error = (taps + 1) * 2.0**-53 * scale
    if x.dtype == torch.float32:
        ours_err = (ours.double() - exact).abs()
        assert (ours_err <= (taps + 2) * 2.0**-24 * scale + reference_error).all()
        if versus_torch:
            theirs_err = (TORCH[op](x, w, b, **geometry).double() - exact).abs()
            assert ours_err.max() <= 2 * theirs_err.max(), (ours_err.max().item(), theirs_err.max().item())
    elif x.dtype == torch.float64:
        theirs = TORCH[op](x, w, b, **geometry)
        assert ((ours - theirs).abs() <= 2 * (taps + 2) * 2.0**-53 * scale).all()
    else:
        found = convolution.half_result_check(ours, exact, scale, taps)
        assert found["max_ulp"] <= 1 and found["bound_ok"], found


# ---------------------------------------------------------------------------------------------
# Parity grid: every pair of factor values appears in at least one case (greedy pairwise cover),
# far fewer cases than the full product. A case torch refuses is taken only when no accepted one
# covers the pair (e.g. a 1x1 input with a 7x7 kernel and padding <= 2 in conv2d); there both must
# refuse. Empty batches are covered by test_empty_batch.

FACTORS = {
    "op": list(OPS),
    "batch": [1, 3],
    "channels": [(3, 5, 1), (8, 16, 1), (10, 7, 1), (6, 4, 2), (12, 18, 3), (7, 7, 7), (4, 12, 4), (1, 1, 1)],
    "kernel": [(1, 1), (3, 3), (5, 5), (7, 7), (1, 3), (3, 1)],
    "stride": [1, 2, 3, (2, 1), (1, 3)],
    "padding": [0, 1, 2, (1, 0), (0, 2)],
    "dilation": [1, 2, (2, 1)],
    "bias": [True, False],
    "spatial": [(1, 1), (5, 7), (16, 16), (64, 64)],
    "dtype": DTYPES,
    "output_padding": ["none", "largest"],  # conv_transpose2d: 0, or max(stride, dilation) - 1
}


def _pair(v):
    return v if isinstance(v, tuple) else (v, v)


def geometry_of(case: dict) -> dict:
    cin, cout, groups = case["channels"]
    geometry = {"stride": case["stride"], "padding": case["padding"], "dilation": case["dilation"], "groups": groups}
    if case["op"] == "conv_transpose2d":
        s, d = _pair(case["stride"]), _pair(case["dilation"])
        geometry["output_padding"] = tuple(max(s[i], d[i]) - 1 if case["output_padding"] == "largest" else 0
                                           for i in range(2))
    return geometry


def torch_accepts(case: dict) -> bool:
    op, (cin, cout, groups) = case["op"], case["channels"]
    x = torch.empty(case["batch"], cin, *case["spatial"], device="meta")
    w_shape = (cout, cin // groups) if op == "conv2d" else (cin, cout // groups)
    try:
        out = TORCH[op](x, torch.empty(*w_shape, *case["kernel"], device="meta"), None, **geometry_of(case))
    except RuntimeError:
        return False
    return min(out.shape[2:]) >= 1  # torch's meta kernels skip the CPU kernels' "output size too small" check


def pairwise_cases(factors: dict, seed: int = 0, candidates: int = 30, attempts: int = 300) -> list[dict]:
    names = list(factors)
    uncovered = {(a, i, b, j) for x, a in enumerate(names) for b in names[x + 1:]
                 for i in range(len(factors[a])) for j in range(len(factors[b]))}
    rng, cases = random.Random(seed), []
    while uncovered:
        a, i, b, j = min(uncovered)
        best, best_gain, fallback = None, -1, None
        for attempt in range(attempts):
            pick = {name: rng.randrange(len(values)) for name, values in factors.items()}
            pick[a], pick[b] = i, j
            if not torch_accepts({name: factors[name][k] for name, k in pick.items()}):
                fallback = fallback or pick
                continue
            gain = sum((p, pick[p], q, pick[q]) in uncovered for x, p in enumerate(names) for q in names[x + 1:])
            if gain > best_gain:
                best, best_gain = pick, gain
            if attempt >= candidates and best is not None:
                break
        best = best or fallback
        uncovered -= {(p, best[p], q, best[q]) for x, p in enumerate(names) for q in names[x + 1:]}
        cases.append({name: factors[name][index] for name, index in best.items()})
    return cases


GRID = pairwise_cases(FACTORS)
# Small inputs where the kernel still fits, so 1x1 inputs are computed and not only rejected.
GRID += [
    dict(op="conv2d", batch=2, channels=(5, 6, 1), kernel=(3, 3), stride=1, padding=1, dilation=1, bias=True,
         spatial=(1, 1), dtype=dtype, output_padding="none") for dtype in DTYPES
] + [
    dict(op="conv_transpose2d", batch=2, channels=(6, 9, 3), kernel=(3, 2), stride=(2, 3), padding=0,
         dilation=(1, 2), bias=True, spatial=(1, 1), dtype=dtype, output_padding="largest") for dtype in DTYPES
]


def test_grid_covers_every_pair():
    assert 40 <= len(GRID) <= 120
    for a in FACTORS:
        for value in FACTORS[a]:
            assert any(case[a] == value for case in GRID), (a, value)
    assert sum(map(torch_accepts, GRID)) >= 0.85 * len(GRID)  # mostly computed, not refused


@pytest.mark.parametrize("number", range(len(GRID)))
def test_parity_grid(number):
    case = GRID[number]
    op, (cin, cout, groups) = case["op"], case["channels"]
    generator = torch.Generator().manual_seed(number)
    x, w, b = operands(op, case["batch"], cin, cout, groups, case["kernel"], case["spatial"], case["bias"],
                       case["dtype"], generator)
    geometry = geometry_of(case)
    if not torch_accepts(case):  # torch refuses the geometry: ours refuses it too, with a contract message
        with pytest.raises(RuntimeError, match=f"^fuel::{op} \\[{op}_"):
            API[op](x, w, b, **geometry)
        return
    check_values(op, API[op](x, w, b, **geometry), x, w, b, geometry)


def test_float32_error_pooled_against_torch():
    """Every grid geometry, in float32: each output's error against the float64 reference in units of
    2^-24 * (conv(|x|, |w|) + |bias|), pooled over the grid, for ours and for torch. Ours must be at
    most 2x torch's in root mean square and in maximum."""
    ours_all, theirs_all = [], []
    for number, case in enumerate(GRID):
        if not torch_accepts(case):
            continue
        op, (cin, cout, groups) = case["op"], case["channels"]
        x, w, b = operands(op, case["batch"], cin, cout, groups, case["kernel"], case["spatial"], case["bias"],
                           torch.float32, torch.Generator().manual_seed(1000 + number))
        geometry = geometry_of(case)
        exact, scale = convolution.float64_reference(op, x, w, b, **geometry)
        unit = 2.0**-24 * scale.clamp_min(1e-300)
        ours_all.append(((API[op](x, w, b, **geometry).double() - exact).abs() / unit).flatten())
        theirs_all.append(((TORCH[op](x, w, b, **geometry).double() - exact).abs() / unit).flatten())
    ours, theirs = torch.cat(ours_all), torch.cat(theirs_all)
    assert ours.numel() > 100_000
    rms = ours.pow(2).mean().sqrt().item(), theirs.pow(2).mean().sqrt().item()
    worst = ours.max().item(), theirs.max().item()
    assert rms[0] <= 2 * rms[1] and worst[0] <= 2 * worst[1], f"rms {rms}, max {worst} (ours, torch)"


# ---------------------------------------------------------------------------------------------
# torch's OpInfo samples


@pytest.fixture(scope="module")
def opinfo_samples():
    from torch.testing._internal.common_methods_invocations import op_db

    samples = []
    for op in OPS:
        info = next(o for o in op_db if o.name == f"nn.functional.{op}" and not o.variant_test_name)
        for sample in info.sample_inputs("cpu", torch.float64):
            if sample.input.dim() != 4 or isinstance(sample.kwargs.get("padding"), str):
                continue
            bias = sample.args[1] if len(sample.args) > 1 else sample.kwargs.get("bias")
            kwargs = {k: v for k, v in sample.kwargs.items() if k != "bias"}
            samples.append((op, sample.input.detach(), sample.args[0].detach(),
                            None if bias is None else bias.detach(), kwargs))
    return samples


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opinfo_samples(opinfo_samples, dtype):
    assert sum(op == "conv_transpose2d" for op, *_ in opinfo_samples) >= 4 and len(opinfo_samples) >= 15
    for op, x, w, b, kwargs in opinfo_samples:
        x, w = x.to(dtype), w.to(dtype)
        b = None if b is None else b.to(dtype)
        check_values(op, API[op](x, w, b, **kwargs), x, w, b, kwargs)


# ---------------------------------------------------------------------------------------------
# Precision


def _split(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Veltkamp: t = hi + lo exactly, each with at most 26 significant bits (products then exact)."""
    c = t * (2.0**27 + 1)
    hi = c - (c - t)
    return hi, t - hi


def _as_conv2d(op, x, w, geometry):
    """(input, weight, conv2d geometry) of an equivalent conv2d: conv_transpose2d is conv2d of the
    zero-stuffed input, padded by dilation * (k - 1) - padding (cropped where negative), with each
    group's weight transposed and flipped."""
    geometry = dict(geometry)
    if op == "conv2d":
        return x, w, geometry
    s, p, d = (_pair(geometry.pop(k, default)) for k, default in (("stride", 1), ("padding", 0), ("dilation", 1)))
    out_pad = _pair(geometry.pop("output_padding", 0))
    groups = geometry.get("groups", 1)
    n, cin, h, wd = x.shape
    stuffed = x.new_zeros(n, cin, (h - 1) * s[0] + 1, (wd - 1) * s[1] + 1)
    stuffed[:, :, ::s[0], ::s[1]] = x
    q = [d[i] * (w.shape[2 + i] - 1) - p[i] for i in range(2)]
    stuffed = F.pad(stuffed, (q[1], q[1] + out_pad[1], q[0], q[0] + out_pad[0]))
    cin_g, cout_g = cin // groups, w.shape[1]
    flipped = w.flip(2, 3).reshape(groups, cin_g, cout_g, *w.shape[2:]).transpose(1, 2)
    return stuffed, flipped.reshape(groups * cout_g, cin_g, *w.shape[2:]), {"dilation": d, "groups": groups}


def exact_float64(op, x, w, b, geometry) -> torch.Tensor:
    """The exact result rounded once to float64: math.fsum over error-free products."""
    xi, wi, g = _as_conv2d(op, x, w, geometry)
    groups = g.get("groups", 1)
    kernel = wi.shape[2:]
    cols = F.unfold(xi, kernel, dilation=g.get("dilation", 1), padding=g.get("padding", 0), stride=g.get("stride", 1))
    n, _, length = cols.shape
    cout, cin_g = wi.shape[0], wi.shape[1]
    cols = cols.reshape(n, groups, cin_g * kernel[0] * kernel[1], length)
    rows = wi.reshape(groups, cout // groups, -1)
    terms = []
    for xs in _split(cols):
        for ws in _split(rows):
            # [n, groups, cout_g, length, taps]: each entry an exact product
            terms.append(ws[None, :, :, None, :] * xs.transpose(2, 3)[:, :, None, :, :])
    products = torch.cat(terms, dim=-1).reshape(n, cout, length, -1)
    if b is not None:
        products = torch.cat([products, b.double().reshape(1, cout, 1, 1).expand(n, cout, length, 1)], dim=-1)
    sums = [math.fsum(row) for row in products.reshape(-1, products.shape[-1]).tolist()]
    out_h = (xi.shape[2] + 2 * _pair(g.get("padding", 0))[0] - _pair(g.get("dilation", 1))[0] * (kernel[0] - 1) - 1) \
        // _pair(g.get("stride", 1))[0] + 1
    return torch.tensor(sums, dtype=torch.float64).reshape(n, cout, out_h, -1)


F64_CASES = [
    ("conv2d", (2, 6, 9, 8), (4, 3, 3, 3), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)),
    ("conv2d", (1, 64, 6, 6), (3, 64, 3, 3), dict(padding=1)),
    ("conv2d", (2, 4, 7, 7), (8, 1, 5, 5), dict(padding=2, groups=4)),
    ("conv_transpose2d", (2, 6, 5, 4), (6, 2, 3, 4), dict(stride=(2, 3), padding=(1, 2), output_padding=(1, 0),
                                                          dilation=(1, 2), groups=3)),
    ("conv_transpose2d", (1, 48, 4, 4), (48, 3, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    # long kernel rows, few outputs (a weight gradient's shape): the wide-kernel path
    ("conv2d", (2, 3, 20, 24), (4, 3, 18, 21), dict(padding=1, stride=(1, 2))),
]


@pytest.mark.parametrize("op,x_shape,w_shape,geometry", F64_CASES)
def test_float64_rigorous_bound(op, x_shape, w_shape, geometry):
    """|out - exact| <= (K + 2) * 2^-53 * (conv(|x|, |w|) + |bias|), exact = correctly rounded fsum;
    the scale is itself computed in float64, so it gets a (K + 2) * 2^-52 relative margin, and the
    reference its own half ulp."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(x_shape, generator=generator, dtype=torch.float64) * 3
    w = torch.randn(w_shape, generator=generator, dtype=torch.float64)
    cout = w_shape[0] if op == "conv2d" else w_shape[1] * geometry.get("groups", 1)
    b = torch.randn(cout, generator=generator, dtype=torch.float64)
    exact = exact_float64(op, x, w, b, geometry)
    torch_result, scale = convolution.float64_reference(op, x, w, b, **geometry)
    assert exact.shape == torch_result.shape
    assert ((exact - torch_result).abs() <= 1e-12 * scale).all()  # the reference is the right convolution
    ours = API[op](x, w, b, **geometry)
    taps = convolution.taps_per_output(op, x, w, geometry.get("groups", 1))
    bound = (taps + 2) * 2.0**-53 * scale * (1 + (taps + 2) * 2.0**-52) + 2.0**-53 * exact.abs()
    assert ((ours - exact).abs() <= bound).all()
    assert ((ours - exact).abs() > 0).any()  # the data is not trivially exact


@pytest.mark.parametrize("op", OPS)
def test_float32_long_reductions_beat_twice_torchs_error(op):
    """Long reductions (K up to 4608) where a plain sequential float32 sum would fall behind torch."""
    generator = torch.Generator().manual_seed(3)
    cases = [((2, 512, 8, 8), 32, (3, 3), {"padding": 1}), ((2, 2048, 5, 5), 16, (1, 1), {})]
    if op == "conv2d":  # a weight gradient's shape (K = 11552, long kernel rows): the wide-kernel path
        cases.append(((3, 8, 40, 40), 6, (38, 38), {"padding": 1}))
    for x_shape, cout, kernel, geometry in cases:
        for shift in (0.0, 1.0):  # a non-zero mean makes the partial sums grow
            x, w, b = operands(op, x_shape[0], x_shape[1], cout, 1, kernel, x_shape[2:], True, torch.float32,
                               generator)
            x, w = x + shift, w + shift / 10
            check_values(op, API[op](x, w, b, **geometry), x, w, b, geometry, versus_torch=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_integer_valued_inputs_are_exact(op, dtype):
    generator = torch.Generator().manual_seed(11)
    geometries = [({"padding": 1}, (3, 3), 1), ({"stride": (2, 1), "dilation": (1, 2), "groups": 2}, (3, 2), 2),
                  ({"groups": 6}, (5, 5), 6)]
    for geometry, kernel, groups in geometries:
        if op == "conv_transpose2d" and geometry.get("stride", 1) != 1:
            geometry = dict(geometry, output_padding=(1, 0))
        x, w, b = operands(op, 2, 6, 12, groups, kernel, (9, 10), True, dtype, generator, integer=True)
        exact, _ = convolution.float64_reference(op, x, w, b, **geometry)
        ours = API[op](x, w, b, **geometry)
        assert reference.bit_equal(ours, reference.round_to(exact, dtype))
        if dtype in (torch.float32, torch.float64):
            assert reference.bit_equal(ours, TORCH[op](x, w, b, **geometry))


@pytest.mark.parametrize("dtype,big", [(torch.bfloat16, 256.0), (torch.float16, 2048.0)], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_halves_accumulate_in_float32(op, dtype, big):
    """At `big` an accumulator of `dtype` no longer moves when 1 is added (bfloat16 has 8 significant
    bits, float16 11). The exact results below are representable; a `dtype` accumulator would return
    `big` for the first and 0 for the second."""
    ones = torch.ones(1, 64, 1, 1, dtype=dtype)
    weight = torch.ones(64, 1, 1, 1, dtype=dtype) if op == "conv_transpose2d" else torch.ones(1, 64, 1, 1, dtype=dtype)
    with_bias = API[op](ones, weight, torch.tensor([big], dtype=dtype))
    assert with_bias.item() == big + 64

    x = torch.ones(1, 66, 1, 1, dtype=dtype)
    values = torch.tensor([big] + [1.0] * 64 + [-big], dtype=dtype)
    weight = values.reshape(66, 1, 1, 1) if op == "conv_transpose2d" else values.reshape(1, 66, 1, 1)
    assert API[op](x, weight).item() == 64

    narrow = torch.tensor(big, dtype=dtype)  # what a `dtype` accumulator would do
    for _ in range(64):
        narrow = narrow + torch.tensor(1.0, dtype=dtype)
    assert narrow.item() == big


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("cout,groups", [(4, 1), (8, 1), (16, 1), (20, 1), (64, 1), (64, 4), (258, 1), (260, 1)],
                         ids=str)
def test_every_channel_blocking(cout, groups, dtype):
    """Output channel counts for each register blocking of the micro-kernel: 6-channel blocks with a
    shorter last one (20 = 3 x 6 + 2), 4-channel blocks (multiples of 4, not of 6: 4, 8, 16, 64, and
    16 per group), and tasks split at 252 channels (258 = 252 + 6, 260 = 252 + 8 in 4-channel blocks).
    Image widths 7, 10 and 11 give tasks whose last position block is three, two and one vectors. Against the
    float64 reference of the dtype (module docstring)."""
    generator = torch.Generator().manual_seed(cout + groups)
    for width in (7, 10, 11):
        x, w, b = operands("conv2d", 2, 8, cout, groups, (3, 3), (5, width), True, dtype, generator)
        check_values("conv2d", fuel_torch.conv2d(x, w, b, padding=1, groups=groups), x, w, b,
                     {"padding": 1, "groups": groups})


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tasks_with_weights_past_a_mebibyte(dtype, memory_format):
    """Where one task's packed weights pass 1 MiB (252 channels x 1152 taps: 1.1 MiB in float32, 2.2 in
    float64) the planar path gives its tasks more grid rows. The rows per task choose only which
    sums are computed together: the outputs hold the dtype's oracle, the same bits on 1, 2 and 3
    threads, and (float64, float16: always the planar path) the first 8 channels are the bits of a
    call with only those 8 (the default rows per task). float32 and bfloat16 take a brgemm path
    where the CPU has one, and which one can depend on the channel count."""
    generator = torch.Generator().manual_seed(11)
    geometry = {"padding": 1}
    x, w, b = operands("conv2d", 2, 128, 260, 1, (3, 3), (9, 23), True, dtype, generator)
    x = x.contiguous(memory_format=memory_format)
    everything = fuel_torch.conv2d(x, w, b, **geometry)
    check_values("conv2d", everything.contiguous(), x.contiguous(), w, b, geometry)
    if dtype in (torch.float64, torch.float16):
        few = fuel_torch.conv2d(x, w[:8].contiguous(), b[:8], **geometry)
        assert reference.bit_equal(few, everything[:, :8])
    assert_same_bits_for_every_thread_count("conv2d", x, w, b, geometry, everything)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op,geometry", [("conv2d", {"padding": 1}), ("conv_transpose2d", {"stride": 2, "padding": 1})],
                         ids=["conv2d", "transpose_s2"])
def test_few_channel_blocks_give_the_same_sums(op, geometry, dtype):
    """Tasks of 1-3 output channels take wider position blocks than the 6- and 4-channel blocks (on
    AVX-512: 1 x 8, 2 x 8 and 3 x 6 vectors); a block's shape only chooses how many sums run side by
    side, so each output must be the same bits as when its channel is one of twelve (6-channel
    blocks). Widths 13, 40 and 70 end their tasks in wide blocks and in the narrower ones after."""
    generator = torch.Generator().manual_seed(7)
    for width in (13, 40, 70):
        x, w, b = operands(op, 2, 5, 12, 1, (3, 3), (9, width), True, dtype, generator)
        everything = API[op](x, w, b, **geometry)
        for cout in (1, 2, 3):
            weight = (w[:cout] if op == "conv2d" else w[:, :cout]).contiguous()
            few = API[op](x, weight, b[:cout], **geometry)
            assert reference.bit_equal(few, everything[:, :cout]), (width, cout)


@pytest.mark.parametrize("cin", [30, 100], ids=str)
def test_taps_sharing_rows_give_the_same_sums(cin):
    """A kernel's columns read one plane row, shifted, so a 1 x 3 kernel takes its taps in longer
    pieces than a 3 x 1 one, whose taps each read a row of their own (micro_kernel.h, taps_per_piece).
    A piece only chooses how long the running sums stay in registers: the 1 x 3 convolution of x must
    be the same bits as the 3 x 1 convolution of x and the weights transposed, whose taps are the same
    products in the same order. 100 channels: 300 taps, two chunks and pieces of several lengths.
    float64, the one dtype that takes the chassis on every CPU."""
    generator = torch.Generator().manual_seed(cin)
    x, w, b = operands("conv2d", 2, cin, 12, 1, (1, 3), (9, 37), True, torch.float64, generator)
    rows = fuel_torch.conv2d(x, w, b, padding=(0, 1))
    columns = fuel_torch.conv2d(x.transpose(2, 3).contiguous(), w.transpose(2, 3).contiguous(), b, padding=(1, 0))
    assert reference.bit_equal(rows, columns.transpose(2, 3))


# (images, channels, (Kh, Kw), output channels, geometry): each has one output column (x as wide as
# the kernel reaches); 25 and 50 images leave a partial 24-image block and a partial triple, 19 and 20
# kernel rows a partial 8-row chunk, 70 output channels a partial 64-channel chunk and an odd count.
ONE_COLUMN_CASES = [
    (1, 3, (9, 40), 5, {}),
    (4, 2, (19, 37), 3, {"padding": (2, 0)}),
    (25, 3, (20, 18), 12, {"padding": (1, 1), "stride": (2, 3)}),
    (50, 2, (7, 33), 70, {"groups": 2, "dilation": (2, 1)}),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ONE_COLUMN_CASES, ids=lambda c: f"{c[0]}img-k{c[2][0]}x{c[2][1]}-co{c[3]}")
def test_one_column_wide_kernel_gives_each_output_the_column_paths_bits(case, dtype):
    """The wide-kernel path (a weight gradient's shape) takes output rows of one column (a 1x1 conv's
    weight gradient) images three at a time and kernel rows eight at a time (wide_kernel.h); its rows
    of more columns, one image at a time and every kernel row at once. Blocking only chooses which
    sums run side by side: x widened by 2 * stride columns (the first `padding` of them zero, what the
    narrow call read as padding) gives three output columns, the first of which must be the narrow
    call's bits. With an infinity, a NaN and -0 in one image; the same bits for 1, 2 and 3 threads."""
    images, channels, (kh, kw), cout, geometry = case
    generator = torch.Generator().manual_seed(images + kh)
    groups, (ph, pw), (sh, sw) = geometry.get("groups", 1), _pair(geometry.get("padding", 0)), _pair(
        geometry.get("stride", 1))
    height = (kh - 1) * _pair(geometry.get("dilation", 1))[0] + 1 + 2 * sh - 2 * ph
    x, w, b = operands("conv2d", images, channels * groups, cout, groups, (kh, kw), (height, kw - 2 * pw), True,
                       dtype, generator)
    # Specials in the first image's first channel only: every other image's sums stay finite.
    x[0, 0, 0, 0], x[0, 0, -1, 1], x[0, 0, 1, -1] = float("inf"), float("nan"), -0.0
    narrow = fuel_torch.conv2d(x, w, b, **geometry)
    assert narrow.shape[3] == 1 and narrow.shape[2] > 1
    assert narrow[1:].isfinite().all() and not narrow[:1].isfinite().all()
    extra = torch.randn(images, channels * groups, height, 2 * sw, generator=generator).to(dtype)
    extra[..., :pw] = 0
    wide = fuel_torch.conv2d(torch.cat([x, extra], 3), w, b, **geometry)
    assert wide.shape[3] == 3
    assert reference.bit_equal(narrow, wide[..., :1].contiguous())
    assert_same_bits_for_every_thread_count("conv2d", x, w, b, geometry, narrow)


# ---------------------------------------------------------------------------------------------
# Determinism


def assert_file_passes_in_child(test_file, deselect: str, **env: str):
    """Runs the test file (but the tests whose names contain `deselect`) in a child process with
    `env` added to the environment (switches read once, at import), and asserts that it passes."""
    args = ["-q", "-x", "-p", "no:cacheprovider", str(test_file), "-k", f"not {deselect}"]
    # From tests/: the repository root would import the source folder, not the installed package.
    result = subprocess.run([sys.executable, "-c", f"import sys, pytest; sys.exit(pytest.main({args!r}))"],
                            env={**os.environ, **env}, cwd=Path(__file__).parent, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-500:]


def assert_same_bits_for_every_thread_count(op, x, w, b, geometry, expected):
    """The op gives `expected`, bit for bit, with 1, 2 and 3 threads (the thread count is restored)."""
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            assert reference.bit_equal(API[op](x, w, b, **geometry), expected), count
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_deterministic_across_calls_and_threads(op, dtype):
    """16 calls byte-identical, and the same bytes for 1, 2 and 3 threads. The shape has more than one
    tap chunk (288 taps > 256), a channel count (70) that is not a whole number of register blocks, and
    enough tasks to be split."""
    generator = torch.Generator().manual_seed(5)
    geometry = {"padding": 1, "stride": 2} if op == "conv2d" else {"padding": 1, "stride": 2, "output_padding": 1}
    x, w, b = operands(op, 3, 32, 70, 1, (3, 3), (23, 21), True, dtype, generator)
    first = API[op](x, w, b, **geometry)
    for _ in range(15):
        assert reference.bit_equal(API[op](x, w, b, **geometry), first)
    assert_same_bits_for_every_thread_count(op, x, w, b, geometry, first)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 5, 4, 4), (2, 3, 7, 9), (4, 2, 1, 1), (2, 1, 3, 1)], ids=str)
def test_each_image_is_computed_as_if_alone(shape, dtype):
    """An image's output does not depend on the batch around it, bit for bit. Unpadded stride-1
    float inputs (1x1 convolutions) are read in place for every image but the last, which is
    copied, so this compares the two ways of reading; the shapes include images too small for a
    vector block's over-read to stay inside the batch (those are copied)."""
    generator = torch.Generator().manual_seed(11)
    n, cin, h, w = shape
    x = torch.randn(shape, generator=generator).to(dtype)
    weight = torch.randn(6, cin, 1, 1, generator=generator).to(dtype)
    bias = torch.randn(6, generator=generator).to(dtype)
    whole = fuel_torch.conv2d(x, weight, bias)
    for i in range(n):
        assert reference.bit_equal(whole[i:i + 1], fuel_torch.conv2d(x[i:i + 1].clone(), weight, bias)), i


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", [16, 21, 40, 70], ids=["whole-vectors", "partial-vector", "odd-vectors",
                                                        "past-a-chunk"])
@pytest.mark.parametrize("kernel", [3, 5])
def test_depthwise_rows_in_pairs_match_single_rows(kernel, width, dtype):
    """The depthwise kernel computes output rows in pairs where each steps one input row (3x3 and 5x5,
    stride and dilation 1 down the columns), an odd last row alone; a pair runs each row's taps in
    the single row's order, so a row has the same bits in either place. Dropping the input's first
    row (no padding) moves every output row to the other place in its pair, and the last one out of
    any pair. float32 and float64 rows are written in place, a partial last vector (width 21) under
    a mask that must leave the next row alone. Half rows of a pair are rounded in registers where
    the CPU has AVX-512, two vectors at a time (an odd one alone: width 40 is three float vectors,
    70 four and one more), a single row's through a buffer: the two must round alike."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 13, width, generator=generator).to(dtype)
    weight = torch.randn(6, 1, kernel, kernel, generator=generator).to(dtype)
    bias = torch.randn(6, generator=generator).to(dtype)
    whole = fuel_torch.conv2d(x, weight, bias, padding=(0, 1), groups=3)
    shifted = fuel_torch.conv2d(x[:, :, 1:].contiguous(), weight, bias, padding=(0, 1), groups=3)
    assert whole.shape[2] % 2 == 1 and shifted.shape[2] % 2 == 0
    assert reference.bit_equal(whole[:, :, 1:], shifted)
    check_values("conv2d", whole, x, weight, bias, dict(padding=(0, 1), groups=3))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width,column_padding", [(5, 1), (16, 0), (16, 17), (33, 20), (8, 9), (1, 3), (40, 2)],
                         ids=lambda v: str(v))
def test_depthwise_lines_with_padding_past_a_vector(width, column_padding, dtype):
    """The NCHW depthwise kernel widens each input row into a zero-padded line a vector at a time
    (AVX-512, and AVX2 for float32 and float64: one masked load per vector, the padding's lanes masked
    off, a plain load where no lane is masked; the vectors before and after the row's are zeros; at
    column stride 2, both phases' lines from the same two loads, every other lane). Rows narrower than a vector, rows of whole vectors, and column paddings of more than a
    float32 or float64 vector each side; a 1x3 and a 3x1 kernel besides the 3x3 (the first and last
    line vectors then hold all or none of the row). Same bits as the channels_last kernel, which
    widens its own way, and within the oracle's bound."""
    generator = torch.Generator().manual_seed(width * 31 + column_padding)
    for kernel, column_stride in itertools.product([(3, 3), (1, 3), (3, 1)], [1, 2]):
        x, w, b = operands("conv2d", 2, 5, 5, 5, kernel, (6, width), True, dtype, generator)
        geometry = dict(groups=5, padding=(1, column_padding), stride=(1, column_stride))
        ours = fuel_torch.conv2d(x, w, b, **geometry)
        check_values("conv2d", ours, x, w, b, geometry)
        along_channels = fuel_torch.conv2d(x.contiguous(memory_format=torch.channels_last), w, b, **geometry)
        assert reference.bit_equal(along_channels.contiguous(), ours), kernel


# (kernel, (height, width), row padding): widths of one vector and of one more, odd, and the
# benchmark's 56; planes shorter than the kernel; row paddings of none and past the kernel's reach;
# a plane of more rows than a task takes.
IN_PLACE_DEPTHWISE_CASES = [
    (3, (7, 16), 1), (3, (5, 17), 0), (3, (1, 23), 1), (3, (2, 56), 3), (3, (9, 33), 2),
    (5, (6, 16), 2), (5, (3, 40), 4), (5, (11, 21), 0),
    (3, (2500, 16), 1),  # an image split into three row blocks (tasks)
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", IN_PLACE_DEPTHWISE_CASES, ids=str)
def test_depthwise_reading_x_in_place_gives_the_lines_bits(case, dtype):
    """At AVX-512, an NCHW float32 or float64 depthwise 3x3 of stride 1 whose column padding keeps
    the row width reads x in place (a 5x5 keeps the lines): positions go a vector at a time across row ends, and taps
    that fall in the padding are masked to +0. Same bits as the channels_last kernel (its own lines)
    with -0 and NaN among the operands, for 1, 2 and 3 threads; a depth multiplier of 2 gives the
    bits of the same sums over the input with each channel repeated; within the oracle's bound."""
    kernel, spatial, row_padding = case
    generator = torch.Generator().manual_seed(kernel * 100 + spatial[1])
    x, w, b = operands("conv2d", 2, 6, 6, 6, (kernel, kernel), spatial, True, dtype, generator)
    x.view(-1)[:7] = -0.0
    x.view(-1)[x.numel() // 2] = float("nan")
    b[0] = -0.0
    geometry = dict(groups=6, padding=(row_padding, kernel // 2))
    before = fuel_torch._C.path_counts()["depthwise_in_place_calls"]
    ours = fuel_torch.conv2d(x, w, b, **geometry)
    in_place = fuel_torch._C.path_counts()["depthwise_in_place_calls"] - before
    assert in_place == (1 if fuel_torch.cpu_capability() == "AVX512" and kernel == 3 else 0)
    along_channels = fuel_torch.conv2d(x.contiguous(memory_format=torch.channels_last), w, b, **geometry)
    assert reference.bit_equal(along_channels.contiguous(), ours)
    assert_same_bits_for_every_thread_count("conv2d", x, w, b, geometry, ours)
    x.view(-1)[x.numel() // 2] = 1.0
    check_values("conv2d", fuel_torch.conv2d(x, w, b, **geometry), x, w, b, geometry)
    w2 = torch.randn(12, 1, kernel, kernel, generator=generator).to(dtype)
    b2 = torch.randn(12, generator=generator).to(dtype)
    doubled = fuel_torch.conv2d(x, w2, b2, **geometry)
    repeated = fuel_torch.conv2d(x.repeat_interleave(2, dim=1), w2, b2, groups=12, padding=geometry["padding"])
    assert reference.bit_equal(doubled, repeated)
    # A padding that changes the row width keeps the lines.
    before = fuel_torch._C.path_counts()["depthwise_in_place_calls"]
    wider = fuel_torch.conv2d(x, w, b, groups=6, padding=(row_padding, kernel // 2 + 1))
    assert fuel_torch._C.path_counts()["depthwise_in_place_calls"] == before
    assert reference.bit_equal(wider.contiguous(), fuel_torch.conv2d(
        x.contiguous(memory_format=torch.channels_last), w, b, groups=6, padding=(row_padding, kernel // 2 + 1)).contiguous())


def test_depthwise_rows_wider_than_the_in_place_table_keep_the_lines():
    """Reading in place keeps a table of masks per column of a row (times the kernel's columns): rows
    past 4096 columns keep the lines, with the same bits."""
    generator = torch.Generator().manual_seed(4097)
    for width, in_place in [(4096, fuel_torch.cpu_capability() == "AVX512"), (4097, False)]:
        x, w, b = operands("conv2d", 1, 2, 2, 2, (3, 3), (3, width), True, torch.float32, generator)
        before = fuel_torch._C.path_counts()["depthwise_in_place_calls"]
        ours = fuel_torch.conv2d(x, w, b, groups=2, padding=1)
        assert fuel_torch._C.path_counts()["depthwise_in_place_calls"] == before + int(in_place)
        along_channels = fuel_torch.conv2d(x.contiguous(memory_format=torch.channels_last), w, b, groups=2, padding=1)
        assert reference.bit_equal(along_channels.contiguous(), ours)


# ---------------------------------------------------------------------------------------------
# Shapes, out=, layout policy, meta and symbolic shapes


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_empty_batch(op, dtype):
    x = torch.empty(0, 4, 7, 6, dtype=dtype)
    w = torch.randn(6, 2, 3, 3).to(dtype) if op == "conv2d" else torch.randn(4, 3, 3, 3).to(dtype)
    geometry = {"groups": 2, "stride": 2}
    expected = TORCH[op](x.double(), w.double(), None, **geometry).shape
    ours = API[op](x, w, torch.zeros(6, dtype=dtype), **geometry)
    assert ours.shape == expected and ours.dtype == dtype and ours.numel() == 0
    out = torch.empty(expected, dtype=dtype)
    assert API[op](x, w, None, **geometry, out=out) is out


@pytest.mark.parametrize("op", OPS)
def test_no_input_channels_give_the_bias(op):
    """Cin = 0: every sum is empty, so out is the bias (torch returns a 0-channel tensor here)."""
    x = torch.empty(2, 0, 5, 5)
    w = torch.empty(3, 0, 3, 3) if op == "conv2d" else torch.empty(0, 3, 3, 3)
    b = torch.tensor([1.5, -2.0, 0.25])
    ours = API[op](x, w, b)
    size = 3 if op == "conv2d" else 7
    assert reference.bit_equal(ours, b.reshape(1, 3, 1, 1).expand(2, 3, size, size).contiguous())


@pytest.mark.parametrize("op", OPS)
def test_no_output_channels(op):
    x = torch.randn(2, 4, 6, 5)
    w = torch.empty(0, 4, 3, 3) if op == "conv2d" else torch.empty(4, 0, 3, 3)
    expected = (2, 0, 4, 3) if op == "conv2d" else (2, 0, 8, 7)
    assert API[op](x, w, torch.empty(0)).shape == expected


@pytest.mark.parametrize("op", OPS)
def test_empty_input_rows_read_only_padding(op):
    """H = 0: every tap falls outside the input, so every output is the bias (torch refuses the call;
    the formulas still give these shapes)."""
    x = torch.randn(1, 2, 0, 5)
    if op == "conv2d":
        w, geometry, shape = torch.randn(3, 2, 1, 1), {"padding": 1}, (1, 3, 2, 7)
    else:
        w, geometry, shape = torch.randn(2, 3, 4, 1), {"dilation": 2}, (1, 3, 6, 5)
    b = torch.tensor([0.5, -1.0, 2.0])
    assert reference.bit_equal(API[op](x, w, b, **geometry), b.reshape(1, 3, 1, 1).expand(shape).contiguous())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("groups", [1, 3], ids=["dense", "depthwise"])
@pytest.mark.parametrize("stride", [1, 2, 3])
def test_empty_input_columns_read_only_padding(stride, groups, dtype):
    """W = 0 with padding: the outputs are the bias. Column strides beyond the padding once let the
    depthwise path read column 0 of an empty row (found by test_fuzz at 3000 examples)."""
    x = torch.randn(1, 3, 2, 0).to(dtype)
    w = torch.randn(3, 3 // groups, 1, 1).to(dtype)
    b = torch.tensor([0.5, -1.0, 2.0]).to(dtype)
    geometry = {"stride": (1, stride), "padding": 1, "dilation": (3, 1), "groups": groups}
    ours = fuel_torch.conv2d(x, w, b, **geometry)
    assert reference.bit_equal(ours, b.reshape(1, 3, 1, 1).expand(ours.shape).contiguous())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_out_overload_overwrites_every_element(op, dtype):
    generator = torch.Generator().manual_seed(2)
    geometry = {"stride": (1, 2), "padding": (2, 1), "groups": 3}
    if op == "conv_transpose2d":
        geometry["output_padding"] = (0, 1)
    x, w, b = operands(op, 2, 6, 9, 3, (3, 4), (8, 9), True, dtype, generator)
    expected = API[op](x, w, b, **geometry)
    out = torch.full_like(expected, float("nan"))
    result = getattr(torch.ops.fuel, op).out(x, w, b, **geometry, out=out)
    assert result is out and reference.bit_equal(out, expected)
    out.fill_(float("nan"))
    assert API[op](x, w, b, **geometry, out=out) is out and reference.bit_equal(out, expected)


def test_keyword_arguments_match_torch():
    generator = torch.Generator().manual_seed(4)
    x, w, b = operands("conv2d", 1, 4, 6, 2, (3, 3), (9, 9), True, torch.float64, generator)
    kwargs = dict(input=x, weight=w, bias=b, stride=2, padding=1, dilation=1, groups=2)
    assert torch.allclose(fuel_torch.conv2d(**kwargs), F.conv2d(**kwargs))
    xt, wt, bt = operands("conv_transpose2d", 1, 4, 6, 2, (3, 3), (9, 9), True, torch.float64, generator)
    kwargs = dict(input=xt, weight=wt, bias=bt, stride=2, padding=1, output_padding=1, groups=2, dilation=1)
    assert torch.allclose(fuel_torch.conv_transpose2d(**kwargs), F.conv_transpose2d(**kwargs))
    # positional order as torch.nn.functional
    args = (xt, wt, bt, 2, 1, 1, 2, 1)
    assert torch.allclose(fuel_torch.conv_transpose2d(*args), F.conv_transpose2d(*args))


@pytest.mark.parametrize("padding", ["valid", "same"])
def test_string_padding(padding):
    generator = torch.Generator().manual_seed(6)
    x, w, b = operands("conv2d", 2, 3, 4, 1, (3, 5), (8, 9), True, torch.float64, generator)
    ours = fuel_torch.conv2d(x, w, b, padding=padding, dilation=(2, 1))
    theirs = F.conv2d(x, w, b, padding=padding, dilation=(2, 1))
    assert ours.shape == theirs.shape and torch.allclose(ours, theirs)


@pytest.mark.parametrize("op", OPS)
def test_contiguize_policy(op):
    generator = torch.Generator().manual_seed(8)
    x, w, b = operands(op, 2, 4, 6, 2, (3, 3), (8, 9), True, torch.float32, generator)
    awkward_x = x.transpose(2, 3).contiguous().transpose(2, 3)  # same values, strided
    awkward_w = torch.cat([w, w])[w.shape[0]:]  # same values, storage offset
    awkward_b = torch.stack([b, b], 1)[:, 0]  # same values, stride 2
    geometry = {"groups": 2, "padding": 1}
    expected = API[op](x, w, b, **geometry)
    with pytest.raises(RuntimeError, match="layout.strided: rejected"):
        API[op](awkward_x, w, b, **geometry)
    with fuel_torch.layout_policy("contiguize"):
        assert reference.bit_equal(API[op](awkward_x, awkward_w, awkward_b, **geometry), expected)
        with pytest.raises(RuntimeError, match="layout.strided: rejected"):
            getattr(torch.ops.fuel, op)(awkward_x, w, b, **geometry)  # the raw op stays strict
    expanded = torch.full((1,), 0.5).expand(6)
    with fuel_torch.layout_policy("contiguize"):
        assert reference.bit_equal(API[op](x, w, expanded, **geometry), API[op](x, w, torch.full((6,), 0.5),
                                                                                 **geometry))


# ---------------------------------------------------------------------------------------------
# channels_last: accepted natively (contract flag `channels_last: accepted`); the result has the
# layout torch's convolution returns for the same call and the bits of the contiguous call, a NaN's
# included (c10's scalar bfloat16 conversion and ATen's vectors give a NaN different bits).

FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}
LAYOUT_CASES = [
    ("conv2d", 2, 6, 8, 2, (3, 5), (9, 11), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)),
    ("conv2d", 2, 8, 8, 8, (3, 3), (10, 9), dict(padding=1, groups=8)),  # depthwise
    ("conv2d", 1, 3, 5, 1, (20, 17), (22, 21), dict(padding=1)),  # long kernel rows (weight-gradient shape)
    ("conv_transpose2d", 2, 6, 4, 2, (4, 3), (7, 6), dict(stride=(2, 3), padding=1, output_padding=(1, 0), groups=2)),
    # More channels than a vector and rows wider than one (a partial group of each; a channels_last
    # input is turned into planes a vector of channels and a vector of columns at a time).
    ("conv2d", 2, 21, 4, 1, (3, 3), (13, 37), dict(stride=2, padding=2)),
    ("conv2d", 1, 20, 6, 2, (1, 1), (7, 19), dict(groups=2)),
]


@pytest.mark.parametrize("w_format", FORMATS)
@pytest.mark.parametrize("x_format", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=lambda c: f"{c[0]}-{c[5]}")
def test_channels_last_operands(case, dtype, x_format, w_format):
    op, n, cin, cout, groups, kernel, spatial, geometry = case
    generator = torch.Generator().manual_seed(12)
    x, w, b = operands(op, n, cin, cout, groups, kernel, spatial, True, dtype, generator)
    x.view(-1)[x.numel() // 3] = float("nan")
    expected = API[op](x, w, b, **geometry)
    assert expected.isnan().any()
    xl, wl = x.contiguous(memory_format=FORMATS[x_format]), w.contiguous(memory_format=FORMATS[w_format])
    for call in (getattr(torch.ops.fuel, op), API[op]):
        ours = call(xl, wl, b, **geometry)
        assert reference.bit_equal(ours.contiguous(), expected)
        assert ours.stride() == TORCH[op](xl, wl, b, **geometry).stride(), (ours.stride(), x_format, w_format)
    out = torch.full_like(expected, float("nan"), memory_format=torch.channels_last)
    getattr(torch.ops.fuel, op).out(xl, wl, b, **geometry, out=out)
    assert reference.bit_equal(out.contiguous(), expected)


# Depthwise convolutions of channels_last operands (one output channel per input channel) run
# along the channels: each lane's sum in the NCHW kernel's order, a padding tap's +0 included, so the
# bits of the NCHW call. Channel counts of a partial vector (21), of more than one 128-channel block
# and a partial one (300), and of one lane short of a vector (15); strides, dilation, geometry fixed
# at compile time (3x3 and 5x5 at column stride 1 and 2, any row stride and dilation) and not (3x5,
# 7x7, a column dilation); widths of a partial pixel group, and wide enough for pixel groups whose
# taps all lie inside the image (read in place) beside groups that reach into the padding; row strides
# past the kernel's reach and paddings past it (rows skipped, rows all padding); tall images; a depth
# multiplier of 2 (the NCHW kernel's gathers, not this path). A 3x3 at stride 1 computes two output
# rows at a time at AVX2 where both rows' windows lie inside x: 136 channels (a whole block and 8
# more) over 8 rows, pairs beside single rows.
DEPTHWISE_LAYOUT_CASES = [
    (1, 136, (3, 3), (8, 21), dict(padding=1)),
    (2, 21, (3, 3), (9, 13), dict(padding=1)),
    # Width a multiple of the pixel group: row pairs take the groups at both edges.
    (2, 24, (3, 3), (10, 16), dict(padding=1)),
    (1, 300, (3, 3), (5, 6), dict(padding=(0, 1))),
    (2, 15, (3, 3), (13, 12), dict(stride=2, padding=1)),
    (1, 40, (5, 5), (11, 10), dict(padding=2)),
    (1, 16, (3, 5), (8, 9), dict(padding=(1, 2), dilation=(2, 1))),
    (1, 24, (7, 7), (9, 30), dict(padding=3, stride=(1, 2))),
    (1, 64, (5, 5), (23, 17), dict(stride=2, padding=2)),
    (1, 32, (3, 3), (30, 11), dict(stride=(4, 1), padding=(4, 1))),
    (2, 48, (3, 3), (21, 19), dict(padding=1, dilation=(3, 1))),
    (1, 20, (3, 3), (12, 14), dict(padding=(1, 1), dilation=(1, 2))),
    (1, 32, (5, 5), (7, 24), dict(padding=2)),
    (1, 48, (3, 3), (9, 40), dict(stride=2, padding=1)),
    # No padding: a row's last pixels (after a whole group) take the padding-aware body anyway.
    (1, 40, (3, 3), (6, 13), dict()),
    (2, 24, (5, 5), (7, 14), dict()),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", DEPTHWISE_LAYOUT_CASES, ids=lambda c: f"{c[1]}-{c[2]}-{c[4]}")
def test_channels_last_depthwise_runs_along_the_channels(case, dtype):
    n, channels, kernel, spatial, geometry = case
    generator = torch.Generator().manual_seed(channels)
    x, w, b = operands("conv2d", n, channels, channels, channels, kernel, spatial, True, dtype, generator)
    check_values("conv2d", fuel_torch.conv2d(x.contiguous(memory_format=torch.channels_last), w, b, groups=channels,
                                             **geometry).contiguous(), x, w, b, dict(groups=channels, **geometry))
    x.view(-1)[x.numel() // 3] = float("nan")
    expected = fuel_torch.conv2d(x, w, b, groups=channels, **geometry)
    assert expected.isnan().any()
    for w_format in FORMATS.values():
        before = fuel_torch._C.path_counts()["depthwise_channels_last_calls"]
        ours = fuel_torch.conv2d(x.contiguous(memory_format=torch.channels_last),
                                 w.contiguous(memory_format=w_format), b, groups=channels, **geometry)
        assert fuel_torch._C.path_counts()["depthwise_channels_last_calls"] == before + 1
        assert ours.is_contiguous(memory_format=torch.channels_last)
        assert reference.bit_equal(ours.contiguous(), expected)
    # A depth multiplier of 2 keeps the NCHW kernel, in either layout.
    x2, w2, b2 = operands("conv2d", n, channels, 2 * channels, channels, kernel, spatial, True, dtype, generator)
    before = fuel_torch._C.path_counts()["depthwise_channels_last_calls"]
    doubled = fuel_torch.conv2d(x2.contiguous(memory_format=torch.channels_last), w2, b2, groups=channels, **geometry)
    assert fuel_torch._C.path_counts()["depthwise_channels_last_calls"] == before
    assert reference.bit_equal(doubled.contiguous(), fuel_torch.conv2d(x2, w2, b2, groups=channels, **geometry))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", [1, 3])
def test_channels_last_depthwise_bits_do_not_depend_on_the_thread_count(batch, dtype):
    """The channels_last depthwise kernel splits an image's rows into runs by the thread count (a
    run widens the input rows its first output row shares with the run before again): 1, 2 and 3
    threads give the same bits, which are the NCHW kernel's."""
    generator = torch.Generator().manual_seed(batch)
    x, w, b = operands("conv2d", batch, 40, 40, 40, (3, 3), (37, 23), True, dtype, generator)
    geometry = dict(groups=40, padding=1)
    expected = fuel_torch.conv2d(x, w, b, **geometry)
    assert_same_bits_for_every_thread_count("conv2d", x.contiguous(memory_format=torch.channels_last), w, b,
                                            geometry, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_channels_last_depthwise_with_a_tall_reach_runs_along_the_channels(dtype):
    """The channels_last kernel reads x where it lies, so a tall dilated kernel needs no buffer of
    input rows: a 3x3 at dilation 90 (a reach of 181 rows and columns, padding 90) runs along the
    channels, with the NCHW call's bits."""
    generator = torch.Generator().manual_seed(8)
    x, w, b = operands("conv2d", 1, 16, 16, 16, (3, 3), (200, 200), True, dtype, generator)
    geometry = dict(groups=16, padding=90, dilation=90)
    before = fuel_torch._C.path_counts()["depthwise_channels_last_calls"]
    ours = fuel_torch.conv2d(x.contiguous(memory_format=torch.channels_last), w, b, **geometry)
    assert fuel_torch._C.path_counts()["depthwise_channels_last_calls"] == before + 1
    assert reference.bit_equal(ours.contiguous(), fuel_torch.conv2d(x, w, b, **geometry))


# (channels, kernel, spatial, padding, dilation, bias): 3x3 as a depthwise input gradient, a 7x7
# (49 taps: two blocks of the sum), dilation, asymmetric and zero padding, one channel.
DEPTHWISE_TRANSPOSE_CASES = [
    (24, (3, 3), (9, 13), (1, 1), (1, 1), True),
    (16, (7, 7), (12, 10), (3, 3), (1, 1), False),
    (40, (3, 5), (11, 8), (2, 1), (2, 1), True),
    (17, (5, 3), (6, 9), (0, 2), (1, 2), True),
    (1, (3, 3), (5, 7), (1, 0), (1, 1), True),
]


@pytest.mark.parametrize("x_format", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", DEPTHWISE_TRANSPOSE_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}-{c[4]}")
def test_depthwise_transpose_is_the_turned_kernels_depthwise_conv2d(case, dtype, x_format):
    """A depthwise conv_transpose2d at stride 1 runs as the depthwise conv2d with the kernel turned by
    180 degrees and padded by dilation * (kernel - 1) - padding (contracts/convolution.fkc.md,
    Arithmetic): the same bits in both layouts and for a channels_last weight, within the contract
    against the float64 reference. With a stride or an output padding it stays on its own path."""
    channels, kernel, spatial, padding, dilation, bias = case
    generator = torch.Generator().manual_seed(channels + kernel[0])
    x, w, b = operands("conv_transpose2d", 2, channels, channels, channels, kernel, spatial, bias, dtype, generator)
    geometry = dict(padding=padding, dilation=dilation, groups=channels)
    turned_padding = tuple(d * (k - 1) - p for d, k, p in zip(dilation, kernel, padding))
    expected = fuel_torch.conv2d(x, w.flip(2, 3).contiguous(), b, padding=turned_padding, dilation=dilation,
                                 groups=channels)
    check_values("conv_transpose2d", fuel_torch.conv_transpose2d(x, w, b, **geometry).contiguous(), x, w, b, geometry)
    for w_format in FORMATS.values():
        ours = fuel_torch.conv_transpose2d(x.contiguous(memory_format=FORMATS[x_format]),
                                           w.contiguous(memory_format=w_format), b, **geometry)
        assert reference.bit_equal(ours.contiguous(), expected)
    strided = dict(geometry, stride=2, output_padding=1)
    check_values("conv_transpose2d", fuel_torch.conv_transpose2d(x, w, b, **strided).contiguous(), x, w, b, strided)


@pytest.mark.parametrize("op", OPS)
def test_channels_last_fake_kernel_layout(op):
    case = next(c for c in LAYOUT_CASES if c[0] == op)
    _, n, cin, cout, groups, kernel, spatial, geometry = case
    x, w, b = operands(op, n, cin, cout, groups, kernel, spatial, True, torch.float32, torch.Generator())
    for xf, wf in [(torch.channels_last, torch.contiguous_format), (torch.contiguous_format, torch.channels_last),
                   (torch.contiguous_format, torch.contiguous_format)]:
        xl, wl = x.contiguous(memory_format=xf), w.contiguous(memory_format=wf)
        meta = getattr(torch.ops.fuel, op)(xl.to("meta"), wl.to("meta"), b.to("meta"), **geometry)
        assert meta.stride() == TORCH[op](xl, wl, b, **geometry).stride()


def test_channels_last_model_trains():
    """The issue's case: model.to(memory_format=torch.channels_last), then fuel convs forward and backward."""
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                 torch.nn.Conv2d(8, 8, 3, padding=1, groups=8),
                                 torch.nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)).double()
    ours = torch.nn.Sequential(fuel_torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                               fuel_torch.nn.Conv2d(8, 8, 3, padding=1, groups=8),
                               fuel_torch.nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)).double()
    ours.load_state_dict(theirs.state_dict())
    theirs, ours = (m.to(memory_format=torch.channels_last) for m in (theirs, ours))
    x = torch.randn(2, 3, 12, 10, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    expected, result = theirs(x), ours(x)
    assert result.is_contiguous(memory_format=torch.channels_last) and result.stride() == expected.stride()
    assert torch.allclose(result, expected, rtol=1e-12, atol=1e-12)
    expected.square().sum().backward()
    result.square().sum().backward()
    for (name, p_theirs), p_ours in zip(theirs.named_parameters(), ours.parameters()):
        assert torch.allclose(p_ours.grad, p_theirs.grad, rtol=1e-10, atol=1e-10), name


GEOMETRIES = [
    ("conv2d", (2, 6, 11, 13), (4, 3, 3, 5), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)),
    ("conv2d", (0, 4, 5, 5), (8, 1, 5, 5), dict(groups=4)),
    ("conv_transpose2d", (3, 6, 5, 7), (6, 2, 4, 3), dict(stride=(3, 2), padding=(1, 0), output_padding=(2, 1),
                                                          dilation=(1, 2), groups=3)),
]


@pytest.mark.parametrize("op,x_shape,w_shape,geometry", GEOMETRIES)
def test_meta_tensors_infer_shapes(op, x_shape, w_shape, geometry):
    x, w = torch.empty(x_shape, device="meta"), torch.empty(w_shape, device="meta")
    ours = getattr(torch.ops.fuel, op)(x, w, None, **geometry)
    theirs = TORCH[op](torch.zeros(x_shape), torch.zeros(w_shape), None, **geometry)
    assert ours.device.type == "meta" and ours.shape == theirs.shape and ours.stride() == theirs.contiguous().stride()


@pytest.mark.parametrize("op", OPS)
def test_fake_kernel_works_on_symbolic_shapes(op):
    from torch.fx.experimental.proxy_tensor import make_fx

    geometry = {"stride": 2, "padding": 1}
    if op == "conv_transpose2d":
        geometry["output_padding"] = 1

    def model(x, w, b):
        return API[op](x, w, b, **geometry)

    generator = torch.Generator().manual_seed(9)
    x, w, b = operands(op, 2, 4, 6, 1, (3, 3), (9, 10), True, torch.float32, generator)
    graph = make_fx(model, tracing_mode="symbolic")(x, w, b)
    assert any("fuel" in str(node.target) for node in graph.graph.nodes)
    for shape in [(3, 4, 12, 7), (1, 4, 5, 16)]:
        other = torch.randn(shape)
        assert reference.bit_equal(graph(other, w, b), model(other, w, b))


# ---------------------------------------------------------------------------------------------
# Registration


def test_every_registered_op_and_dtype_has_exactly_one_contract():
    """The bijection over all families: 10 ops x 4 dtypes, each registered, each with one contract."""
    contracts = fuel_torch.installed()
    pairs = [(c.op, c.dtype) for c in contracts.registrable]
    assert len(pairs) == len(set(pairs))
    for op in contracts.ops():
        assert hasattr(torch.ops.fuel, op) and hasattr(getattr(torch.ops.fuel, op), "out")
        assert sorted(str(c.dtype) for c in contracts.for_op(op)) == sorted(str(d) for d in DTYPES)
    assert {"conv2d", "conv_transpose2d"} <= set(contracts.ops())
    assert str(torch.ops.fuel.conv2d.default._schema) == (
        "fuel::conv2d(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
        "int[2] dilation=1, int groups=1) -> Tensor")
    assert str(torch.ops.fuel.conv_transpose2d.out._schema) == (
        "fuel::conv_transpose2d.out(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
        "int[2] output_padding=0, int groups=1, int[2] dilation=1, *, Tensor(a!) out) -> Tensor(a!)")
    assert torch.Tag.out in torch.ops.fuel.conv2d.out.tags and torch.Tag.out in torch.ops.fuel.conv_transpose2d.out.tags


@pytest.mark.parametrize("kernel", ["conv2d_f32", "conv2d_f64", "conv2d_bf16", "conv2d_f16", "conv_transpose2d_f32",
                                    "conv_transpose2d_f64", "conv_transpose2d_bf16", "conv_transpose2d_f16"])
def test_cli_parity_check(kernel):
    contract = fuel_torch.installed().by_kernel[kernel]
    ok, detail = convolution.parity(contract)
    assert ok, detail
