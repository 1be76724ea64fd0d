"""Every rejection of the convolution family, with its message pinned.

Each case runs twice: through the C++ op (torch.ops.fuel.*, real CPU tensors) and through the
Python fake kernel (the same call under FakeTensorMode, what torch.compile traces with). Both must
raise, with the same text; that text is pinned with expecttest (EXPECTTEST_ACCEPT=1 rewrites it).
A last test checks that every clause the messages quote is written in contracts/convolution.fkc.md.
The checks themselves come from contracts/convolution.geometry.yaml; tests/test_geometry_table.py
derives one refused call per check from that table and removes checks from it.
"""
from __future__ import annotations

import re

import expecttest
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fuel_torch
from fuel_torch import geometry

BIG = 2**62


def _call(op: str, args: tuple, kwargs: dict):
    overload = getattr(torch.ops.fuel, op)
    return overload.out(*args, **kwargs) if "out" in kwargs else overload.default(*args, **kwargs)


def _error(fn) -> str:
    with pytest.raises(RuntimeError) as info:
        fn()
    return str(info.value)


def reject(op: str, *args, **kwargs) -> str:
    """The message of the C++ op, asserted identical to the fake kernel's; physical memory masked."""
    eager = _error(lambda: _call(op, args, kwargs))
    mode = FakeTensorMode()
    memo: dict[int, torch.Tensor] = {}

    def fake(value):
        if isinstance(value, torch.Tensor):
            return memo.setdefault(id(value), mode.from_tensor(value))
        return value

    fake_args, fake_kwargs = tuple(fake(a) for a in args), {k: fake(v) for k, v in kwargs.items()}
    with mode:
        traced = _error(lambda: _call(op, fake_args, fake_kwargs))
    assert traced == eager, f"C++ and fake kernel disagree:\n  C++:  {eager}\n  fake: {traced}"
    return re.sub(r"physical memory \d+ bytes", "physical memory <N> bytes", eager)


def x_(*shape, dtype=torch.float32):
    return torch.randn(shape, dtype=dtype)


X = (1, 4, 8, 8)


class TestGroupsAndChannels(expecttest.TestCase):
    def test_groups_zero(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), groups=0), """\
fuel::conv2d [conv2d_f32]: argument 'groups' breaks `op_params.groups: groups >= 1`: saw groups 0. Fix: use groups of at least 1.""")

    def test_groups_negative_transpose(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(*X), x_(4, 2, 3, 3), groups=-2), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'groups' breaks `op_params.groups: groups >= 1`: saw groups -2. Fix: use groups of at least 1.""")

    def test_input_channels_not_divisible(self):
        self.assertExpectedInline(reject("conv2d", x_(1, 3, 8, 8), x_(4, 1, 3, 3), groups=2), """\
fuel::conv2d [conv2d_f32]: argument 'x' breaks `shape_constraint: x.dim[1] % groups == 0`: saw x shape [1, 3, 8, 8], groups 2. Fix: use a groups value that divides the input channels x.dim[1].""")

    def test_input_channels_not_divisible_transpose(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(1, 3, 8, 8), x_(3, 2, 3, 3), groups=2), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'x' breaks `shape_constraint: x.dim[1] % groups == 0`: saw x shape [1, 3, 8, 8], groups 2. Fix: use a groups value that divides the input channels x.dim[1].""")

    def test_output_channels_not_divisible(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(5, 2, 3, 3), groups=2), """\
fuel::conv2d [conv2d_f32]: argument 'weight' breaks `shape_constraint: weight.dim[0] % groups == 0`: saw weight shape [5, 2, 3, 3], groups 2. Fix: give weight a number of output channels weight.dim[0] divisible by groups.""")

    def test_weight_channel_slot(self):
        self.assertExpectedInline(reject("conv2d", x_(1, 6, 8, 8), x_(4, 3, 3, 3)), """\
fuel::conv2d [conv2d_f32]: argument 'weight' breaks `shape_constraint: weight.dim[1] == x.dim[1] / groups`: saw weight shape [4, 3, 3, 3], x shape [1, 6, 8, 8], groups 1. Fix: give weight x.dim[1] / groups = 6 input channels in dimension 1 (conv2d weights are [Cout, Cin / groups, Kh, Kw]).""")

    def test_weight_channel_slot_grouped(self):
        self.assertExpectedInline(reject("conv2d", x_(1, 6, 8, 8), x_(4, 6, 3, 3), groups=2), """\
fuel::conv2d [conv2d_f32]: argument 'weight' breaks `shape_constraint: weight.dim[1] == x.dim[1] / groups`: saw weight shape [4, 6, 3, 3], x shape [1, 6, 8, 8], groups 2. Fix: give weight x.dim[1] / groups = 3 input channels in dimension 1 (conv2d weights are [Cout, Cin / groups, Kh, Kw]).""")

    def test_transpose_weight_rows(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(1, 6, 8, 8), x_(4, 2, 3, 3)), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'weight' breaks `shape_constraint: weight.dim[0] == x.dim[1]`: saw weight shape [4, 2, 3, 3], x shape [1, 6, 8, 8]. Fix: give weight x.dim[1] = 6 input channels in dimension 0 (conv_transpose2d weights are [Cin, Cout / groups, Kh, Kw]).""")

    def test_kernel_size_zero(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 0, 3)), """\
fuel::conv2d [conv2d_f32]: argument 'weight' breaks `shape_constraint: weight.dim[2 + i] >= 1`: saw weight shape [4, 4, 0, 3]. Fix: use a kernel of at least 1x1.""")

    def test_kernel_size_zero_transpose(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(*X), x_(4, 4, 3, 0)), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'weight' breaks `shape_constraint: weight.dim[2 + i] >= 1`: saw weight shape [4, 4, 3, 0]. Fix: use a kernel of at least 1x1.""")


class TestBias(expecttest.TestCase):
    def test_bias_length(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), x_(5)), """\
fuel::conv2d [conv2d_f32]: argument 'bias' breaks `shape_constraint: bias.dim[0] == weight.dim[0]`: saw bias shape [5], weight shape [4, 4, 3, 3]. Fix: pass a bias with one value per output channel (4).""")

    def test_bias_length_transpose(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(*X), x_(4, 3, 3, 3), x_(3), groups=2), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'bias' breaks `shape_constraint: bias.dim[0] == weight.dim[1] * groups`: saw bias shape [3], weight shape [4, 3, 3, 3], groups 2. Fix: pass a bias with one value per output channel (6).""")

    def test_bias_rank(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), x_(1, 4)), """\
fuel::conv2d [conv2d_f32]: argument 'bias' breaks `rank: 1`: saw rank 2 (shape [1, 4]). Fix: pass a 1-d tensor.""")

    def test_bias_dtype(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), x_(4, dtype=torch.float16)), """\
fuel::conv2d [conv2d_f32]: argument 'bias' breaks `dtypes: [F32]`: saw torch.float16. Fix: convert 'bias' to torch.float32 (every tensor of one call has one dtype).""")


class TestRankDtypeDevice(expecttest.TestCase):
    def test_x_rank(self):
        self.assertExpectedInline(reject("conv2d", x_(4, 8, 8), x_(4, 4, 3, 3)), """\
fuel::conv2d [conv2d_f32]: argument 'x' breaks `rank: 4`: saw rank 3 (shape [4, 8, 8]). Fix: pass a 4-d tensor.""")

    def test_weight_rank_transpose(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(*X), x_(4, 4, 3)), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'weight' breaks `rank: 4`: saw rank 3 (shape [4, 4, 3]). Fix: pass a 4-d tensor.""")

    def test_mixed_dtypes(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3, dtype=torch.float64)), """\
fuel::conv2d [conv2d_f32]: argument 'weight' breaks `dtypes: [F32]`: saw torch.float64. Fix: convert 'weight' to torch.float32 (every tensor of one call has one dtype).""")

    def test_mixed_dtypes_halves(self):
        self.assertExpectedInline(
            reject("conv_transpose2d", x_(*X, dtype=torch.bfloat16), x_(4, 4, 3, 3, dtype=torch.float16)), """\
fuel::conv_transpose2d [conv_transpose2d_bf16]: argument 'weight' breaks `dtypes: [BF16]`: saw torch.float16. Fix: convert 'weight' to torch.bfloat16 (every tensor of one call has one dtype).""")

    def test_unsupported_dtype(self):
        x = torch.ones(X, dtype=torch.int32)
        self.assertExpectedInline(reject("conv2d", x, torch.ones(4, 4, 3, 3, dtype=torch.int32)), """\
fuel::conv2d [conv2d_f32|conv2d_f64|conv2d_bf16|conv2d_f16]: argument 'x' breaks `dtypes: [F32, F64, BF16, F16]`: saw torch.int32. Fix: convert the tensors to one of torch.float32, torch.float64, torch.bfloat16, torch.float16.""")

    def test_meta_mixed_with_cpu(self):
        # Only the fake kernel can see this call (the dispatcher sends it to Meta).
        message = _error(lambda: torch.ops.fuel.conv2d(x_(*X), torch.empty(4, 4, 3, 3, device="meta")))
        self.assertExpectedInline(message, """\
fuel::conv2d [conv2d_f32]: argument 'weight' breaks `backend: Cpu`: saw device meta ('x' is on cpu). Fix: move every tensor of the call to the CPU (meta tensors only for shape inference, all of them meta).""")


class TestLayout(expecttest.TestCase):
    def test_non_contiguous_x(self):
        self.assertExpectedInline(reject("conv2d", x_(1, 4, 9, 8).transpose(2, 3), x_(4, 4, 3, 3)), """fuel::conv2d [conv2d_f32]: argument 'x' breaks `layout.strided: rejected`: saw shape [1, 4, 8, 9], strides [288, 72, 1, 8], storage offset 0. Fix: pass a contiguous or channels_last copy (.contiguous(), .contiguous(memory_format=torch.channels_last) or .clone()), or call through the fuel_torch API or a fuel_torch.nn module under layout_policy('contiguize').""")

    def test_channels_last_with_offset_x(self):
        # channels_last is accepted (test_convolution.py), an offset view of it is not.
        x = x_(2, 4, 8, 8).contiguous(memory_format=torch.channels_last)[1:]
        self.assertExpectedInline(reject("conv_transpose2d", x, x_(4, 4, 3, 3)), """fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'x' breaks `layout.start_offset: rejected`: saw shape [1, 4, 8, 8], strides [256, 1, 32, 4], storage offset 256. Fix: pass a zero-offset copy (.clone()), or call through the fuel_torch API or a fuel_torch.nn module under layout_policy('contiguize').""")

    def test_strided_channels_last_weight(self):
        w = x_(4, 4, 3, 6).contiguous(memory_format=torch.channels_last)[:, :, :, ::2]
        self.assertExpectedInline(reject("conv2d", x_(*X), w), """fuel::conv2d [conv2d_f32]: argument 'weight' breaks `layout.strided: rejected`: saw shape [4, 4, 3, 3], strides [72, 1, 24, 8], storage offset 0. Fix: pass a contiguous or channels_last copy (.contiguous(), .contiguous(memory_format=torch.channels_last) or .clone()), or call through the fuel_torch API or a fuel_torch.nn module under layout_policy('contiguize').""")

    def test_offset_x(self):
        self.assertExpectedInline(reject("conv2d", x_(2, 4, 8, 8)[1:], x_(4, 4, 3, 3)), """fuel::conv2d [conv2d_f32]: argument 'x' breaks `layout.start_offset: rejected`: saw shape [1, 4, 8, 8], strides [256, 64, 8, 1], storage offset 256. Fix: pass a zero-offset copy (.clone()), or call through the fuel_torch API or a fuel_torch.nn module under layout_policy('contiguize').""")

    def test_expanded_weight(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(1, 4, 3, 3).expand(4, 4, 3, 3)), """fuel::conv2d [conv2d_f32]: argument 'weight' breaks `layout.broadcast_stride0: rejected`: saw shape [4, 4, 3, 3], strides [0, 9, 3, 1], storage offset 0. Fix: pass a contiguous or channels_last copy (.contiguous(), .contiguous(memory_format=torch.channels_last) or .clone()), or call through the fuel_torch API or a fuel_torch.nn module under layout_policy('contiguize').""")

    def test_expanded_bias(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), x_(1).expand(4)), """fuel::conv2d [conv2d_f32]: argument 'bias' breaks `layout.broadcast_stride0: rejected`: saw shape [4], strides [0], storage offset 0. Fix: pass a contiguous or channels_last copy (.contiguous(), .contiguous(memory_format=torch.channels_last) or .clone()), or call through the fuel_torch API or a fuel_torch.nn module under layout_policy('contiguize').""")


def _awkward(t: torch.Tensor, how: str) -> torch.Tensor:
    """t's values in a layout the kernels reject: every stride doubled, or a storage offset."""
    if how == "strided":
        return torch.stack([t, t], -1)[..., 0]
    return torch.cat([t.reshape(-1), t.reshape(-1)])[t.numel():].view(t.shape)


@pytest.mark.parametrize("how", ["strided", "offset"])
@pytest.mark.parametrize("argument", ["x", "weight", "bias"])
@pytest.mark.parametrize("op", ["conv2d", "conv_transpose2d"])
def test_every_fix_the_layout_message_names_works(op, argument, how):
    """The message names four fixes: .contiguous(), .contiguous(memory_format=torch.channels_last) (4-d),
    .clone(), and the layout policy through the API or an nn module. Each one, done as written, runs."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 7, 6, generator=generator)
    w = torch.randn(4, 2, 3, 3, generator=generator)
    b = torch.randn(4, generator=generator)
    kwargs = {"padding": 1, "groups": 2}  # both ops: 4 -> 4 channels, weight [4, 2, 3, 3]
    expected = getattr(fuel_torch, op)(x, w, b, **kwargs)
    operands = {"x": x, "weight": w, "bias": b}
    bad = dict(operands, **{argument: _awkward(operands[argument], how)})
    raw = getattr(torch.ops.fuel, op)
    message = _error(lambda: raw(bad["x"], bad["weight"], bad["bias"], **kwargs))
    fix_text = message.split("Fix: ", 1)[1]
    named = {name: fix for name, fix in [
        (".contiguous()", lambda t: t.contiguous()), (".clone()", lambda t: t.clone()),
        (".contiguous(memory_format=torch.channels_last)", lambda t: t.contiguous(memory_format=torch.channels_last)),
    ] if name in fix_text}
    assert ".clone()" in named and "layout_policy('contiguize')" in fix_text
    for name, fix in named.items():
        if "channels_last" in name and bad[argument].dim() != 4:
            continue  # a 4-d layout: named for x and weight
        fixed = dict(bad, **{argument: fix(bad[argument])})
        assert torch.equal(raw(fixed["x"], fixed["weight"], fixed["bias"], **kwargs).contiguous(), expected), name
    with fuel_torch.layout_policy("contiguize"):
        assert torch.equal(getattr(fuel_torch, op)(bad["x"], bad["weight"], bad["bias"], **kwargs).contiguous(),
                           expected)
        module_type = fuel_torch.nn.Conv2d if op == "conv2d" else fuel_torch.nn.ConvTranspose2d
        module = module_type(4, 4, 3, padding=1, groups=2)
        with torch.no_grad():
            module.weight = torch.nn.Parameter(bad["weight"], requires_grad=False)
            module.bias = torch.nn.Parameter(bad["bias"], requires_grad=False)
        assert torch.equal(module(bad["x"]).contiguous(), expected)


class TestParameters(expecttest.TestCase):
    def test_stride_zero(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), stride=[1, 0]), """\
fuel::conv2d [conv2d_f32]: argument 'stride' breaks `op_params.stride: stride[i] >= 1`: saw stride [1, 0]. Fix: use a stride of at least 1 in each dimension.""")

    def test_stride_negative_transpose(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(*X), x_(4, 4, 3, 3), stride=-1), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'stride' breaks `op_params.stride: stride[i] >= 1`: saw stride [-1, -1]. Fix: use a stride of at least 1 in each dimension.""")

    def test_stride_length(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), stride=[1, 1, 1]), """\
fuel::conv2d [conv2d_f32]: argument 'stride' breaks `op_params.stride: int[2]`: saw 3 values [1, 1, 1]. Fix: pass one int or a list of two ints.""")

    def test_padding_negative(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), padding=[0, -1]), """\
fuel::conv2d [conv2d_f32]: argument 'padding' breaks `op_params.padding: padding[i] >= 0`: saw padding [0, -1]. Fix: use a padding of at least 0 in each dimension.""")

    def test_padding_negative_transpose(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(*X), x_(4, 4, 3, 3), padding=-3), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'padding' breaks `op_params.padding: padding[i] >= 0`: saw padding [-3, -3]. Fix: use a padding of at least 0 in each dimension.""")

    def test_dilation_zero(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), dilation=0), """\
fuel::conv2d [conv2d_f32]: argument 'dilation' breaks `op_params.dilation: dilation[i] >= 1`: saw dilation [0, 0]. Fix: use a dilation of at least 1 in each dimension.""")

    def test_dilation_length_transpose(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(*X), x_(4, 4, 3, 3), dilation=[2]), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'dilation' breaks `op_params.dilation: int[2]`: saw 1 values [2]. Fix: pass one int or a list of two ints.""")

    def test_output_padding_not_below_stride_or_dilation(self):
        self.assertExpectedInline(
            reject("conv_transpose2d", x_(*X), x_(4, 4, 3, 3), stride=2, output_padding=[1, 2]), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'output_padding' breaks `op_params.output_padding: 0 <= output_padding[i] < max(stride[i], dilation[i])`: saw output_padding [1, 2], stride [2, 2], dilation [1, 1]. Fix: use an output_padding of at least 0 and smaller than the stride or the dilation in each dimension.""")

    def test_output_padding_stride_one(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(*X), x_(4, 4, 3, 3), output_padding=1), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'output_padding' breaks `op_params.output_padding: 0 <= output_padding[i] < max(stride[i], dilation[i])`: saw output_padding [1, 1], stride [1, 1], dilation [1, 1]. Fix: use an output_padding of at least 0 and smaller than the stride or the dilation in each dimension.""")

    def test_output_padding_negative(self):
        self.assertExpectedInline(
            reject("conv_transpose2d", x_(*X), x_(4, 4, 3, 3), stride=2, output_padding=[0, -1]), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'output_padding' breaks `op_params.output_padding: 0 <= output_padding[i] < max(stride[i], dilation[i])`: saw output_padding [0, -1], stride [2, 2], dilation [1, 1]. Fix: use an output_padding of at least 0 and smaller than the stride or the dilation in each dimension.""")

    def test_output_padding_length(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(*X), x_(4, 4, 3, 3), output_padding=[]), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'output_padding' breaks `op_params.output_padding: int[2]`: saw 0 values []. Fix: pass one int or a list of two ints.""")


class TestOutputSize(expecttest.TestCase):
    def test_kernel_larger_than_input(self):
        self.assertExpectedInline(reject("conv2d", x_(1, 4, 4, 9), x_(4, 4, 5, 5)), """\
fuel::conv2d [conv2d_f32]: argument 'weight' breaks `shape_constraint: dilation[i] * (weight.dim[2 + i] - 1) + 1 <= x.dim[2 + i] + 2 * padding[i]`: saw i = 0: 1 * (5 - 1) + 1 > 4 + 2 * 0. Fix: use a smaller kernel or dilation, or more padding.""")

    def test_dilated_kernel_larger_than_padded_input(self):
        self.assertExpectedInline(reject("conv2d", x_(1, 4, 9, 5), x_(4, 4, 3, 3), padding=1, dilation=[1, 4]), """\
fuel::conv2d [conv2d_f32]: argument 'weight' breaks `shape_constraint: dilation[i] * (weight.dim[2 + i] - 1) + 1 <= x.dim[2 + i] + 2 * padding[i]`: saw i = 1: 4 * (3 - 1) + 1 > 5 + 2 * 1. Fix: use a smaller kernel or dilation, or more padding.""")

    def test_transpose_output_too_small(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(1, 4, 1, 1), x_(4, 4, 1, 1), padding=1), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'x' breaks `shape_constraint: (x.dim[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.dim[2 + i] - 1) + output_padding[i] + 1 >= 1`: saw i = 0: (1 - 1) * 1 - 2 * 1 + 1 * (1 - 1) + 0 + 1 = -1. Fix: use less padding, or a larger input, kernel, stride or dilation.""")

    def test_transpose_output_size_zero_with_empty_batch(self):
        # torch returns a [0, 4, 0, 1] tensor here; our geometry rule has no exception for N = 0.
        self.assertExpectedInline(reject("conv_transpose2d", x_(0, 2, 2, 3), x_(2, 4, 3, 3), padding=2), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'x' breaks `shape_constraint: (x.dim[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.dim[2 + i] - 1) + output_padding[i] + 1 >= 1`: saw i = 0: (2 - 1) * 1 - 2 * 2 + 1 * (3 - 1) + 0 + 1 = 0. Fix: use less padding, or a larger input, kernel, stride or dilation.""")


class TestOverflow(expecttest.TestCase):
    """torch 2.13 itself computes a conv2d with dilation 2**62 and truncates a transpose stride of 2**62."""

    def test_dilation_product(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), dilation=BIG), """\
fuel::conv2d [conv2d_f32]: argument 'dilation' breaks `op_params.overflow: every intermediate size and product fits in int64`: saw dilation[0] * (weight.dim[2] - 1) overflows int64 (weight shape [4, 4, 3, 3], dilation [4611686018427387904, 4611686018427387904]). Fix: use a smaller dilation.""")

    def test_dilation_too_large_for_input(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 2, 1), dilation=BIG), """\
fuel::conv2d [conv2d_f32]: argument 'weight' breaks `shape_constraint: dilation[i] * (weight.dim[2 + i] - 1) + 1 <= x.dim[2 + i] + 2 * padding[i]`: saw i = 0: 4611686018427387904 * (2 - 1) + 1 > 8 + 2 * 0. Fix: use a smaller kernel or dilation, or more padding.""")

    def test_padding_product(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), padding=[1, BIG]), """\
fuel::conv2d [conv2d_f32]: argument 'padding' breaks `op_params.overflow: every intermediate size and product fits in int64`: saw 2 * padding[1] overflows int64 (padding [1, 4611686018427387904]). Fix: use a smaller padding.""")

    def test_padded_input(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), padding=BIG - 1), """\
fuel::conv2d [conv2d_f32]: argument 'padding' breaks `op_params.overflow: every intermediate size and product fits in int64`: saw x.dim[2] + 2 * padding[0] overflows int64 (x shape [1, 4, 8, 8], padding [4611686018427387903, 4611686018427387903]). Fix: use a smaller padding.""")

    def test_transpose_stride_product(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(*X), x_(4, 4, 3, 3), stride=BIG), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'stride' breaks `op_params.overflow: every intermediate size and product fits in int64`: saw (x.dim[2] - 1) * stride[0] overflows int64 (x shape [1, 4, 8, 8], stride [4611686018427387904, 4611686018427387904]). Fix: use a smaller stride.""")

    def test_transpose_output_size_sum(self):
        self.assertExpectedInline(
            reject("conv_transpose2d", x_(1, 4, 2, 2), x_(4, 4, 2, 2), stride=[BIG, 1], dilation=[BIG, 1]), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'x' breaks `op_params.overflow: every intermediate size and product fits in int64`: saw (x.dim[2] - 1) * stride[0] - 2 * padding[0] + dilation[0] * (weight.dim[2] - 1) + output_padding[0] + 1 overflows int64 (x shape [1, 4, 2, 2], weight shape [4, 4, 2, 2], stride [4611686018427387904, 1], padding [0, 0], dilation [4611686018427387904, 1], output_padding [0, 0]). Fix: use a smaller x.""")

    def test_transpose_output_channels(self):
        self.assertExpectedInline(reject("conv_transpose2d", x_(1, 0, 4, 4), x_(0, 4, 3, 3), groups=BIG), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'groups' breaks `op_params.overflow: every intermediate size and product fits in int64`: saw weight.dim[1] * groups overflows int64 (weight shape [0, 4, 3, 3], groups 4611686018427387904). Fix: use a smaller groups.""")


class TestAllocation(expecttest.TestCase):
    def test_output_beyond_physical_memory(self):
        self.assertExpectedInline(reject("conv2d", x_(1, 1, 1, 1), x_(1, 1, 1, 1), padding=2**20), """\
fuel::conv2d [conv2d_f32]: argument 'out' breaks `return.allocation: out.numel * dtype_bytes <= physical memory; strides and byte size within int64`: saw out shape [1, 1, 2097153, 2097153] of torch.float32: 17592202821636 bytes, physical memory <N> bytes. Fix: use smaller sizes, or split the batch.""")

    def test_output_beyond_int64_bytes(self):
        self.assertExpectedInline(reject("conv2d", x_(1, 1, 1, 1), x_(1, 1, 1, 1), padding=2**40), """\
fuel::conv2d [conv2d_f32]: argument 'out' breaks `return.allocation: out.numel * dtype_bytes <= physical memory; strides and byte size within int64`: saw out shape [1, 1, 2199023255553, 2199023255553] of torch.float32: strides or byte size beyond int64. Fix: use smaller sizes, or split the batch.""")

    def test_empty_batch_with_strides_beyond_int64(self):
        # Zero bytes, but the strides of a contiguous [0, 1, 2**41 + 1, 2**41 + 1] tensor overflow.
        self.assertExpectedInline(reject("conv2d", x_(0, 1, 1, 1), x_(1, 1, 1, 1), padding=2**40), """\
fuel::conv2d [conv2d_f32]: argument 'out' breaks `return.allocation: out.numel * dtype_bytes <= physical memory; strides and byte size within int64`: saw out shape [0, 1, 2199023255553, 2199023255553] of torch.float32: strides or byte size beyond int64. Fix: use smaller sizes, or split the batch.""")

    def test_transpose_output_beyond_physical_memory(self):
        x, w = x_(1, 2, 1, 1, dtype=torch.float16), x_(2, 1, 2, 2, dtype=torch.float16)
        self.assertExpectedInline(reject("conv_transpose2d", x, w, dilation=2**21), """\
fuel::conv_transpose2d [conv_transpose2d_f16]: argument 'out' breaks `return.allocation: out.numel * dtype_bytes <= physical memory; strides and byte size within int64`: saw out shape [1, 1, 2097153, 2097153] of torch.float16: 8796101410818 bytes, physical memory <N> bytes. Fix: use smaller sizes, or split the batch.""")


class TestOut(expecttest.TestCase):
    def test_out_wrong_shape(self):
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), out=torch.empty(1, 4, 8, 8)), """\
fuel::conv2d [conv2d_f32]: argument 'out' breaks `return.shape_rule: [x.dim[0], weight.dim[0], out.dim[2], out.dim[3]], out.dim[2 + i] = (x.dim[2 + i] + 2 * padding[i] - dilation[i] * (weight.dim[2 + i] - 1) - 1) / stride[i] + 1`: saw shape [1, 4, 8, 8], expected [1, 4, 6, 6]. Fix: allocate out with shape [1, 4, 6, 6] (.out never resizes).""")

    def test_out_wrong_shape_transpose(self):
        self.assertExpectedInline(
            reject("conv_transpose2d", x_(*X), x_(4, 2, 3, 3), stride=2, out=torch.empty(1, 2, 16, 16)), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'out' breaks `return.shape_rule: [x.dim[0], weight.dim[1] * groups, out.dim[2], out.dim[3]], out.dim[2 + i] = (x.dim[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.dim[2 + i] - 1) + output_padding[i] + 1`: saw shape [1, 2, 16, 16], expected [1, 2, 17, 17]. Fix: allocate out with shape [1, 2, 17, 17] (.out never resizes).""")

    def test_out_wrong_dtype(self):
        out = torch.empty(1, 4, 6, 6, dtype=torch.float64)
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), out=out), """\
fuel::conv2d [conv2d_f32]: argument 'out' breaks `return.dtype_rule: passthrough(x)`: saw torch.float64. Fix: allocate out with dtype torch.float32 (.out never casts).""")

    def test_out_not_contiguous(self):
        out = torch.empty(1, 4, 6, 6).transpose(2, 3)
        self.assertExpectedInline(reject("conv2d", x_(*X), x_(4, 4, 3, 3), out=out), """fuel::conv2d [conv2d_f32]: argument 'out' breaks `return.layout_guarantee: contiguous_or_channels_last`: saw shape [1, 4, 6, 6], strides [144, 36, 1, 6], storage offset 0. Fix: pass a fresh contiguous zero-offset tensor as out.""")

    def test_out_overlaps_input(self):
        x = x_(*X)
        self.assertExpectedInline(reject("conv2d", x, x_(4, 4, 1, 1), out=x), """\
fuel::conv2d [conv2d_f32]: argument 'out' breaks `return.aliasing: none`: saw out shares memory with 'x'. Fix: write into a tensor that no input uses.""")

    def test_out_overlaps_weight_transpose(self):
        w = x_(1, 1, 1, 1)
        self.assertExpectedInline(reject("conv_transpose2d", x_(1, 1, 1, 1), w, out=w), """\
fuel::conv_transpose2d [conv_transpose2d_f32]: argument 'out' breaks `return.aliasing: none`: saw out shares memory with 'weight'. Fix: write into a tensor that no input uses.""")


class TestPythonApi(expecttest.TestCase):
    def test_api_raises_the_contract_message(self):
        with pytest.raises(RuntimeError) as info:
            fuel_torch.conv2d(x_(*X), x_(4, 4, 3, 3), groups=0)
        self.assertExpectedInline(str(info.value), """\
fuel::conv2d [conv2d_f32]: argument 'groups' breaks `op_params.groups: groups >= 1`: saw groups 0. Fix: use groups of at least 1.""")

    def test_api_same_padding_uneven(self):
        with pytest.raises(ValueError) as info:
            fuel_torch.conv2d(x_(*X), x_(4, 4, 2, 3), padding="same")
        self.assertExpectedInline(str(info.value), """\
fuel_torch.conv2d: padding='same' here needs uneven padding [1, 2] (total per dimension), which the kernel's symmetric padding cannot express; pad the input with torch.nn.functional.pad and pass padding=0""")

    def test_api_unknown_padding_string(self):
        with pytest.raises(ValueError) as info:
            fuel_torch.conv2d(x_(*X), x_(4, 4, 3, 3), padding="full")
        self.assertExpectedInline(str(info.value), """\
fuel_torch.conv2d: padding must be an int, a pair of ints, 'valid' or 'same', got 'full'""")


def test_every_quoted_clause_is_in_the_contract():
    """The geometry messages quote contracts/convolution.geometry.yaml, whose clauses are the contracts' own
    (checked at load; tests/test_geometry_table.py); the overflow and allocation clauses are read here from
    the contracts, not retyped."""
    contracts, table = fuel_torch.installed(), geometry.installed()
    for op in geometry.OPS:
        for contract in contracts.for_op(op):
            overflow = f"op_params.overflow: {contract.op_params['overflow']}"
            assert {step.clause for step in table.steps[op] if step.kind != "rule"} == {overflow}
            allocation = f"return.allocation: {contract.raw['return']['outputs'][0]['allocation']}"
            assert allocation in {step.clause for step in table.steps[op] if step.needs_allocation}
        assert table.clauses(op) == geometry.contract_clauses(contracts, op)
