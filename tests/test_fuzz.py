"""Property-based fuzzing (hypothesis): every op on arbitrary input either computes its defined result
or raises a contract error, never anything else.

- Elementwise: arbitrary bit patterns (random bits, NaNs with payloads, subnormals, +-0, infinities,
  extremes), shapes of rank 0..6 with 0-sized dimensions, every op and dtype, plus mismatched shapes
  and dtypes. The oracle is the parity suite's (tests/test_elementwise_parity.py).
- Convolution: a parameter strategy over valid and invalid shapes, stride, padding, dilation, groups,
  output_padding and bias. fuel raises exactly when the call is invalid by torch's definition (and by
  ours where the README says we differ: H = 0, Cin = 0 and Cout = 0 are computed), and otherwise
  matches a float64 evaluation within the contract's bound.

Seeds are fixed (derandomize) and example counts bounded for CI; a longer run:
    FUEL_FUZZ_EXAMPLES=5000 pytest -q tests/test_fuzz.py
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuel_torch import convolution
from fuel_torch.reference import INT_VIEW, bit_equal, bits

from elementwise_cases import DTYPES, OPS, specials
from test_elementwise_parity import check_against_oracle

EXAMPLES = int(os.environ.get("FUEL_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CONV_OPS = ("conv2d", "conv_transpose2d")


def contract_error(op: str):
    """What every refusal must look like: the op's contract message, nothing else."""
    return pytest.raises(RuntimeError, match=rf"^fuel::{op} \[")


# ---------------------------------------------------------------------------------------------
# Elementwise


@st.composite
def bit_tensor(draw, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of `dtype` whose elements are arbitrary bit patterns, special values half the time."""
    int_dtype = INT_VIEW[dtype]
    info = torch.iinfo(int_dtype)
    special_bits = bits(specials(dtype)).tolist()
    numel = 1
    for size in shape:
        numel *= size
    element = st.one_of(st.integers(info.min, info.max), st.sampled_from(special_bits))
    values = draw(st.lists(element, min_size=numel, max_size=numel))
    return torch.tensor(values, dtype=int_dtype).view(dtype).reshape(shape)


shapes = st.lists(st.integers(0, 4), min_size=0, max_size=6).map(tuple).filter(
    lambda s: torch.Size(s).numel() <= 256)


@FUZZ
@given(op=st.sampled_from(OPS), dtype=st.sampled_from(DTYPES), shape=shapes, data=st.data())
def test_elementwise_equals_its_definition_on_arbitrary_bits(op, dtype, shape, data):
    lhs = data.draw(bit_tensor(dtype, shape), label="lhs")
    rhs = data.draw(bit_tensor(dtype, shape), label="rhs")
    ours = getattr(torch.ops.fuel, op)(lhs, rhs)
    assert ours.shape == lhs.shape and ours.dtype == dtype and ours.is_contiguous()
    flat = check_against_oracle(op, lhs.reshape(-1), rhs.reshape(-1))
    assert bit_equal(ours.reshape(-1), flat)  # the shape never changes a bit
    out = torch.full_like(lhs, float("nan"))
    assert getattr(torch.ops.fuel, op).out(lhs, rhs, out=out) is out and bit_equal(out, ours)


@FUZZ
@given(op=st.sampled_from(OPS), dtypes=st.tuples(st.sampled_from(DTYPES), st.sampled_from(DTYPES)),
       shapes=st.tuples(shapes, shapes), data=st.data())
def test_elementwise_mismatches_raise_a_contract_error(op, dtypes, shapes, data):
    """Any pair of shapes and dtypes: the result when they match, else the contract error."""
    lhs = data.draw(bit_tensor(dtypes[0], shapes[0]), label="lhs")
    rhs = data.draw(bit_tensor(dtypes[1], shapes[1]), label="rhs")
    if dtypes[0] == dtypes[1] and shapes[0] == shapes[1]:
        assert getattr(torch.ops.fuel, op)(lhs, rhs).shape == lhs.shape
        return
    with contract_error(op):
        getattr(torch.ops.fuel, op)(lhs, rhs)


# ---------------------------------------------------------------------------------------------
# Convolution

HALF_BOUND_DTYPES = (torch.bfloat16, torch.float16)


CORRUPTIONS = ("groups", "groups_divide", "stride", "padding", "dilation", "output_padding", "kernel", "slot",
               "bias", "x_rank", "weight_rank", "too_small")


@st.composite
def conv_calls(draw):
    """(op, x, weight, bias, geometry): a valid call, then, half the time, one parameter broken."""
    op = draw(st.sampled_from(CONV_OPS))
    dtype = draw(st.sampled_from(DTYPES))
    groups = draw(st.integers(1, 3))
    n = draw(st.sampled_from([1, 1, 2, 0]))
    cin = groups * draw(st.sampled_from([1, 2, 3, 1, 2, 0]))
    cout = groups * draw(st.sampled_from([1, 2, 3, 1, 2, 0]))
    kernel, stride, padding, dilation, output_padding, spatial = [], [], [], [], [], []
    for _ in range(2):
        k, s, d = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
        p = draw(st.integers(0, 2))
        if op == "conv2d":
            size = max(0, d * (k - 1) + 1 - 2 * p) + draw(st.integers(0, 4))
            op_pad = 0
        else:
            op_pad = draw(st.integers(0, max(s, d) - 1))
            size = draw(st.integers(0, 5))
            if size == 0 and d * (k - 1) + op_pad < s + 2 * p:
                size = 1
            p = min(p, max(0, ((size - 1) * s + d * (k - 1) + op_pad) // 2))
        kernel.append(k), stride.append(s), padding.append(p), dilation.append(d), output_padding.append(op_pad)
        spatial.append(size)
    geometry = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    if op == "conv_transpose2d":
        geometry["output_padding"] = output_padding
    x_shape = [n, cin, *spatial]
    w_shape = [cout, cin // groups, *kernel] if op == "conv2d" else [cin, cout // groups, *kernel]
    bias_shape = draw(st.sampled_from([None, [cout]]))
    broken = draw(st.sampled_from(("none",) * len(CORRUPTIONS) + CORRUPTIONS))
    i = draw(st.integers(0, 1))
    if broken == "groups":
        geometry["groups"] = draw(st.sampled_from([0, -1, -(2**63)]))
    elif broken == "groups_divide":
        geometry["groups"] = groups + 1
    elif broken in ("stride", "dilation"):
        geometry[broken][i] = draw(st.sampled_from([0, -1]))
    elif broken == "padding":
        geometry["padding"][i] = -1
    elif broken == "output_padding" and op == "conv_transpose2d":
        geometry["output_padding"][i] = draw(st.sampled_from([-1, max(stride[i], dilation[i])]))
    elif broken == "kernel":
        w_shape[2 + i] = 0
    elif broken == "slot":
        w_shape[1 if op == "conv2d" else 0] += 1
    elif broken == "bias":
        bias_shape = [cout + 1]
    elif broken == "x_rank":
        x_shape = x_shape[1:] if draw(st.booleans()) else x_shape + [1]
    elif broken == "weight_rank":
        w_shape = w_shape[:3]
    elif broken == "too_small":
        if op == "conv2d":
            geometry["padding"][i] = 0
            x_shape[2 + i] = dilation[i] * (kernel[i] - 1)
        else:
            geometry["padding"][i] = padding[i] + 50
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    make = lambda shape: torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)  # noqa: E731
    return op, make(x_shape), make(w_shape), None if bias_shape is None else make(bias_shape), geometry


def _valid_output_size(op, size_in, kernel, s, p, d, op_pad):
    if op == "conv2d":
        reach = d * (kernel - 1) + 1
        return None if reach > size_in + 2 * p else (size_in + 2 * p - reach) // s + 1
    size = (size_in - 1) * s - 2 * p + d * (kernel - 1) + op_pad + 1
    return size if size >= 1 else None


def output_shape_if_valid(op, x, w, bias, geometry):
    """The output shape torch's definition gives, or None where the call is invalid. Our definition
    where the README says we differ: H = 0, Cin = 0 and Cout = 0 are computed like any other size."""
    if x.dim() != 4 or w.dim() != 4 or (bias is not None and bias.dim() != 1):
        return None
    s, p, d, groups = geometry["stride"], geometry["padding"], geometry["dilation"], geometry["groups"]
    op_pad = geometry.get("output_padding", (0, 0))
    if min(s) < 1 or min(p) < 0 or min(d) < 1 or groups < 1 or min(op_pad) < 0:
        return None
    if any(op_pad[i] >= s[i] and op_pad[i] >= d[i] for i in range(2)):
        return None
    n, cin = x.shape[:2]
    if cin % groups or min(w.shape[2:]) < 1:
        return None
    if op == "conv2d":
        if w.shape[0] % groups or w.shape[1] != cin // groups:
            return None
        cout = w.shape[0]
    else:
        if w.shape[0] != cin:
            return None
        cout = w.shape[1] * groups
    if bias is not None and bias.shape[0] != cout:
        return None
    sizes = [_valid_output_size(op, x.shape[2 + i], w.shape[2 + i], s[i], p[i], d[i], op_pad[i]) for i in range(2)]
    return None if None in sizes else (n, cout, *sizes)


def torch_output_shape(op, x, w, bias, geometry):
    """torch's own answer (float64, CPU), or None where it refuses."""
    try:
        wide = [t.double() if t is not None else None for t in (x, w, bias)]
        return tuple(getattr(F, op)(*wide, **geometry).shape)
    except RuntimeError:
        return None


def float64_convolution(op, x, w, bias, geometry, magnitude=False):
    """conv2d / conv_transpose2d in float64 by their definition, one tap at a time (works for every size
    our definition computes, empty ones included). magnitude: conv(|x|, |w|) + |bias|, the bound's scale."""
    x, w = x.double(), w.double()
    b = None if bias is None else bias.double()
    if magnitude:
        x, w, b = x.abs(), w.abs(), None if b is None else b.abs()
    (sh, sw), (ph, pw), (dh, dw), groups = (geometry[k] for k in ("stride", "padding", "dilation", "groups"))
    n, cin, h, wd = x.shape
    kh, kw = w.shape[2:]
    cin_g = cin // groups
    if op == "conv2d":
        cout = w.shape[0]
        ho, wo = ((size + 2 * pad - dil * (k - 1) - 1) // st_ + 1
                  for size, pad, dil, k, st_ in ((h, ph, dh, kh, sh), (wd, pw, dw, kw, sw)))
        padded = F.pad(x, (pw, pw, ph, ph))
        out = x.new_zeros(n, groups, cout // groups, ho, wo)
        for i in range(kh):
            for j in range(kw):
                window = padded[:, :, i * dh: i * dh + (ho - 1) * sh + 1: sh, j * dw: j * dw + (wo - 1) * sw + 1: sw]
                out += torch.einsum("ngchw,goc->ngohw", window.reshape(n, groups, cin_g, ho, wo),
                                    w[:, :, i, j].reshape(groups, cout // groups, cin_g))
        out = out.reshape(n, cout, ho, wo)
    else:
        cout_g = w.shape[1]
        cout = cout_g * groups
        op_h, op_w = geometry["output_padding"]
        ho, wo = (h - 1) * sh - 2 * ph + dh * (kh - 1) + op_h + 1, (wd - 1) * sw - 2 * pw + dw * (kw - 1) + op_w + 1
        full = x.new_zeros(n, groups, cout_g, ho + 2 * ph + max(sh, 1), wo + 2 * pw + max(sw, 1))
        for i in range(kh if h and wd else 0):  # an empty input contributes nothing
            for j in range(kw):
                contribution = torch.einsum("ngchw,gco->ngohw", x.reshape(n, groups, cin_g, h, wd),
                                            w[:, :, i, j].reshape(groups, cin_g, cout_g))
                full[..., i * dh: i * dh + (h - 1) * sh + 1: sh, j * dw: j * dw + (wd - 1) * sw + 1: sw] += contribution
        out = full[..., ph: ph + ho, pw: pw + wo].reshape(n, cout, ho, wo)
    return out if b is None else out + b.reshape(1, cout, 1, 1)


def assert_within_contract(op, ours, x, w, bias, geometry):
    """The contract's precision claim (the tolerances of tests/test_convolution.py's check_values)."""
    exact = float64_convolution(op, x, w, bias, geometry)
    scale = float64_convolution(op, x, w, bias, geometry, magnitude=True)
    assert ours.shape == exact.shape
    if ours.numel() == 0:
        return
    taps = convolution.taps_per_output(op, x, w, geometry["groups"])
    reference_error = (taps + 1) * 2.0**-53 * scale
    if x.dtype == torch.float32:
        assert ((ours.double() - exact).abs() <= (taps + 2) * 2.0**-24 * scale + reference_error).all()
    elif x.dtype == torch.float64:
        assert ((ours - exact).abs() <= (taps + 2) * 2.0**-53 * scale + reference_error).all()
    else:
        found = convolution.half_result_check(ours, exact, scale, taps)
        assert found["max_ulp"] <= 1 and found["bound_ok"], found


def deliberate_difference(x, w, op):
    """Where torch's answer is not the definition: the sizes where our definition computes and torch
    refuses (README, "Where we differ from torch"), and empty batches, for which torch's CPU kernels
    skip some parameter checks (conv_transpose2d with dilation 0 runs); ours check every call. And
    3-d inputs: torch takes them as one unbatched sample, the contract takes rank 4 only."""
    if x.dim() == 3:
        return True
    if x.dim() != 4 or w.dim() != 4:
        return False
    cout_is_zero = w.shape[0] == 0 if op == "conv2d" else w.shape[1] == 0
    return x.shape[0] == 0 or x.shape[1] == 0 or x.shape[2] == 0 or x.shape[3] == 0 or cout_is_zero


@FUZZ
@given(call=conv_calls())
def test_convolution_raises_exactly_when_invalid_and_matches_float64_otherwise(call):
    op, x, w, bias, geometry = call
    expected = output_shape_if_valid(op, x, w, bias, geometry)
    if not deliberate_difference(x, w, op):
        assert torch_output_shape(op, x, w, bias, geometry) == expected, "the validity rule is not torch's"
    if expected is None:
        with contract_error(op):
            getattr(torch.ops.fuel, op)(x, w, bias, **geometry)
        return
    ours = getattr(torch.ops.fuel, op)(x, w, bias, **geometry)
    assert tuple(ours.shape) == expected and ours.dtype == x.dtype and ours.is_contiguous()
    assert_within_contract(op, ours, x, w, bias, geometry)


@st.composite
def brgemm_calls(draw):
    """(op, x, weight, bias, geometry): valid calls with the channel counts the brgemm and patch paths
    take (16 and more per group), paddings up to past the kernel's reach, channels_last operands half
    the time. conv_calls' 0-3 channels per group never leave the chassis: a padding past the reach on
    the patch path computed garbage and corrupted the heap, unseen by it."""
    op = draw(st.sampled_from(CONV_OPS))
    dtype = draw(st.sampled_from(DTYPES))
    groups = draw(st.integers(1, 2))
    cin, cout = groups * draw(st.sampled_from([16, 17, 32])), groups * draw(st.sampled_from([16, 24, 33]))
    kernel, stride, padding, dilation, output_padding, spatial = [], [], [], [], [], []
    for _ in range(2):
        k, s, d = draw(st.integers(1, 5)), draw(st.sampled_from([1, 1, 2, 3])), draw(st.integers(1, 2))
        if op == "conv2d":
            p, op_pad = draw(st.integers(0, d * (k - 1) + 3)), 0
            size = max(1, d * (k - 1) + 1 - 2 * p) + draw(st.integers(0, 6))
        else:
            op_pad, size = draw(st.integers(0, max(s, d) - 1)), draw(st.integers(1, 7))
            p = draw(st.integers(0, ((size - 1) * s + d * (k - 1) + op_pad) // 2))
        kernel.append(k), stride.append(s), padding.append(p), dilation.append(d), output_padding.append(op_pad)
        spatial.append(size)
    geometry = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    if op == "conv_transpose2d":
        geometry["output_padding"] = output_padding
    w_shape = [cout, cin // groups, *kernel] if op == "conv2d" else [cin, cout // groups, *kernel]
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    make = lambda shape: torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)  # noqa: E731
    x = make([draw(st.integers(1, 2)), cin, *spatial])
    if draw(st.booleans()):
        x = x.contiguous(memory_format=torch.channels_last)
    return op, x, make(w_shape), draw(st.sampled_from([None, make([cout])])), geometry


@settings(FUZZ, max_examples=2 * EXAMPLES)  # quick calls: more of them, to reach the rarer geometries
@given(call=brgemm_calls())
def test_brgemm_channel_counts_match_float64_over_any_padding(call):
    op, x, w, bias, geometry = call
    expected = output_shape_if_valid(op, x, w, bias, geometry)
    assert expected is not None and torch_output_shape(op, x, w, bias, geometry) == expected
    ours = getattr(torch.ops.fuel, op)(x, w, bias, **geometry)
    assert tuple(ours.shape) == expected and ours.dtype == x.dtype
    assert_within_contract(op, ours.contiguous(), x.contiguous(), w, bias, geometry)


def test_the_float64_oracle_is_torchs_convolution():
    """The oracle above agrees with torch's float64 convolution wherever torch computes."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 7, 5, generator=generator, dtype=torch.float64)
    geometry = {"stride": (2, 1), "padding": (1, 2), "dilation": (2, 1), "groups": 3}
    w = torch.randn(9, 2, 3, 2, generator=generator, dtype=torch.float64)
    b = torch.randn(9, generator=generator, dtype=torch.float64)
    assert torch.allclose(float64_convolution("conv2d", x, w, b, geometry), F.conv2d(x, w, b, **geometry),
                          rtol=1e-12, atol=1e-12)
    wt = torch.randn(6, 4, 3, 2, generator=generator, dtype=torch.float64)
    bt = torch.randn(12, generator=generator, dtype=torch.float64)
    geometry["output_padding"] = (1, 0)
    assert torch.allclose(float64_convolution("conv_transpose2d", x, wt, bt, geometry),
                          F.conv_transpose2d(x, wt, bt, **geometry), rtol=1e-12, atol=1e-12)
