"""Autograd of every functional fuel op against torch's autograd of the matching torch op.

Oracle: torch 2.13's autograd on the torch op, same inputs, same dtype, same incoming gradient. Bit-identical
for add/sub/mul/div/maximum/minimum/rem (the formulas are torch's, in torch's order, on kernels that are
bit-identical to torch's); pow within assert_close's dtype tolerance on random data (our pow and torch's are
each within 1 ulp of the correctly rounded power, not bit-equal). On the special-value grid pow's gradients are
compared bit for bit with torch's backward formulas evaluated on our pow's values: torch's own values differ
there (its float64 0.5 ** 0.5 is 1 ulp below the correctly rounded 0.7071067811865476, which ours gives).
"""
import pytest
import torch
import torch.autograd.forward_ad as forward_ad
import torch.nn.functional as TF
from torch.autograd import gradcheck, gradgradcheck
from torch.library import opcheck
from torch.utils._python_dispatch import TorchDispatchMode

import fuel_torch
from fuel_torch import elementwise, reference

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
SPECIALS = (0.0, -0.0, 1.0, -1.0, 2.0, 0.5, -2.5, 3.0, 1e-3, float("inf"), float("-inf"), float("nan"))


def fuel_op(op):
    return getattr(torch.ops.fuel, op)


def grads(fn, inputs, grad):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return out, torch.autograd.grad(out, leaves, grad, allow_unused=True)


def assert_same_bits(ours, theirs, what):
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, what
    nan = torch.isnan(ours)
    assert torch.equal(nan, torch.isnan(theirs)), f"{what}: NaN positions differ"
    a, b = ours.masked_fill(nan, 0), theirs.masked_fill(nan, 0)
    assert reference.bit_equal(a, b), (
        f"{what}: {(reference.bits(a) != reference.bits(b)).sum()} elements differ")


def special_grid(dtype):
    values = torch.tensor(SPECIALS, dtype=torch.float64)
    lhs, rhs = torch.meshgrid(values, values, indexing="ij")
    return lhs.reshape(-1).to(dtype).contiguous(), rhs.reshape(-1).to(dtype).contiguous()


def pow_grads_on_our_power(lhs, rhs, grad):
    """torch's pow backward (pow_backward_self / pow_backward_exponent in FunctionsManual.cpp), torch ops
    throughout except the power itself, which is ours."""
    power = torch.ops.fuel.pow
    grad_lhs = torch.where(rhs == 0, 0.0, grad * (rhs * power(lhs, rhs - 1)))
    grad_rhs = grad * torch.where((lhs == 0) & (rhs >= 0), 0.0, power(lhs, rhs) * lhs.log())
    return grad_lhs, grad_rhs


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", elementwise.OPS)
def test_elementwise_grads_match_torch_on_specials(op, dtype):
    # Every pair of special values (ties, signed zeros, infinities, NaN, pow(0, y), negative bases).
    lhs, rhs = special_grid(dtype)
    grad = torch.randn(lhs.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    ours, (our_l, our_r) = grads(fuel_op(op), (lhs, rhs), grad)
    if op == "pow":
        their_l, their_r = pow_grads_on_our_power(lhs, rhs, grad)
    else:
        theirs, (their_l, their_r) = grads(elementwise.TORCH_EQUIVALENT[op], (lhs, rhs), grad)
    assert_same_bits(our_l, their_l, f"{op} grad lhs")
    assert_same_bits(our_r, their_r, f"{op} grad rhs")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", elementwise.OPS)
def test_elementwise_grads_match_torch_on_random_data(op, dtype):
    g = torch.Generator().manual_seed(2)
    shape = (3, 37, 5)  # odd sizes: vector bodies and tails
    lhs, rhs, grad = (torch.randn(shape, generator=g, dtype=torch.float64) * 3 for _ in range(3))
    if op == "pow":
        lhs = lhs.abs() + 0.1  # keep the exponent gradient (log of the base) real
    if op in ("maximum", "minimum"):
        rhs[0] = lhs[0]  # a slab of exact ties
    lhs, rhs, grad = lhs.to(dtype), rhs.to(dtype), grad.to(dtype)
    _, ours = grads(fuel_op(op), (lhs, rhs), grad)
    _, theirs = grads(elementwise.TORCH_EQUIVALENT[op], (lhs, rhs), grad)
    for name, a, b in zip(("lhs", "rhs"), ours, theirs):
        if op == "pow":
            torch.testing.assert_close(a, b, msg=f"pow grad {name}")
        else:
            assert_same_bits(a, b, f"{op} grad {name}")


@pytest.mark.parametrize("op, expected_lhs, expected_rhs", [
    # lhs = [1, 0, -0, 2, nan, 1], rhs = [1, -0, 0, 3, 1, nan]: ties split in half (+0 vs -0 is a tie);
    # with a NaN no comparison holds and torch hands both operands the whole gradient.
    ("maximum", [0.5, 0.5, 0.5, 0.0, 1.0, 1.0], [0.5, 0.5, 0.5, 1.0, 1.0, 1.0]),
    ("minimum", [0.5, 0.5, 0.5, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.0, 1.0, 1.0]),
])
def test_maximum_minimum_split_ties_like_torch(op, expected_lhs, expected_rhs):
    nan = float("nan")
    lhs = torch.tensor([1.0, 0.0, -0.0, 2.0, nan, 1.0])
    rhs = torch.tensor([1.0, -0.0, 0.0, 3.0, 1.0, nan])
    _, (gl, gr) = grads(fuel_op(op), (lhs, rhs), torch.ones(6))
    _, (tl, tr) = grads(elementwise.TORCH_EQUIVALENT[op], (lhs, rhs), torch.ones(6))
    assert gl.tolist() == expected_lhs == tl.tolist()
    assert gr.tolist() == expected_rhs == tr.tolist()


def test_pow_gradients_at_zero_base_and_negative_base():
    inf, nan = float("inf"), float("nan")
    base = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -2.0, -2.0, -0.0], dtype=torch.float64)
    exponent = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 2.0, 0.5, 3.0], dtype=torch.float64)
    _, (gb, ge) = grads(fuel_op("pow"), (base, exponent), torch.ones(9, dtype=torch.float64))
    _, (tb, te) = grads(torch.pow, (base, exponent), torch.ones(9, dtype=torch.float64))
    assert_same_bits(gb, tb, "pow grad base")
    assert_same_bits(ge, te, "pow grad exponent")
    # d/da a^b at a = 0: b * 0^(b-1), but exactly 0 for b == 0.
    assert gb[:6].tolist() == [-inf, -inf, 0.0, inf, 1.0, 0.0]
    # d/db a^b = a^b log a: masked to 0 at a == 0 for b >= 0 only; a negative base gives NaN (torch does not mask).
    assert ge[:6].tolist() == [-inf, -inf, 0.0, 0.0, 0.0, 0.0]  # b < 0: 0^b log 0 = inf * -inf
    assert torch.isnan(ge[6:8]).all() and ge[8].item() == 0.0


class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))  # e.g. "aten.mul.Tensor", "fuel.mul.default"
        return func(*args, **(kwargs or {}))


# torch's own versions of our ops: a backward must not fall back on them. (Floor division, aten.div.Tensor_mode, has
# no fuel kernel and is allowed.)
TORCH_TWINS = {"aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor", "aten.maximum.default",
               "aten.minimum.default", "aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar", "aten.remainder.Tensor",
               "aten.convolution.default", "aten.convolution_backward.default"}


@pytest.mark.parametrize("op", elementwise.OPS)
def test_elementwise_backward_runs_on_fuel_kernels(op):
    lhs = (torch.rand(16, dtype=torch.float64) + 0.5).requires_grad_()
    rhs = (torch.rand(16, dtype=torch.float64) + 0.5).requires_grad_()
    out = fuel_op(op)(lhs, rhs)
    with OpLog() as log:
        out.backward(torch.ones_like(out))
    used = set(log.ops)
    assert not used & TORCH_TWINS, f"fuel::{op} backward used torch's {sorted(used & TORCH_TWINS)}"
    if op not in ("add", "sub"):  # their gradients are the incoming one, up to a sign
        assert any(name.startswith("fuel.") for name in used), used


def smooth_inputs(op):
    g = torch.Generator().manual_seed(3)
    lhs = torch.rand(4, 3, generator=g, dtype=torch.float64) + 0.5
    rhs = torch.rand(4, 3, generator=g, dtype=torch.float64) + 0.5
    if op in ("maximum", "minimum"):
        rhs = rhs + torch.tensor([0.3, -0.3, 0.25], dtype=torch.float64)  # well separated: no ties
    if op == "rem":
        lhs = lhs * 5 + 0.05  # away from rem's jumps at multiples of rhs
        rhs = torch.full_like(rhs, 0.7)
    return lhs.requires_grad_(), rhs.requires_grad_()


@pytest.mark.parametrize("op", elementwise.OPS)
def test_elementwise_gradcheck_and_gradgradcheck(op):
    inputs = smooth_inputs(op)
    assert gradcheck(fuel_op(op), inputs)
    assert gradgradcheck(fuel_op(op), inputs)


def test_incoming_gradient_may_be_expanded_or_strided():
    lhs = torch.rand(4, 6, dtype=torch.float64, requires_grad=True)
    rhs = torch.rand(4, 6, dtype=torch.float64, requires_grad=True)
    fuel_op("mul")(lhs, rhs).sum().backward()  # sum's backward hands in a stride-0 expanded gradient
    assert torch.equal(lhs.grad, rhs.detach()) and torch.equal(rhs.grad, lhs.detach())
    lhs.grad = rhs.grad = None
    weight = torch.rand(6, 4, dtype=torch.float64)
    (fuel_op("div")(lhs, rhs).t() * weight).sum().backward()  # a transposed gradient
    _, expected = grads(torch.div, (lhs, rhs), weight.t())
    assert torch.equal(lhs.grad, expected[0]) and torch.equal(rhs.grad, expected[1])


@pytest.mark.parametrize("op", elementwise.OPS)
def test_forward_mode_ad_is_refused_naming_the_op(op):
    lhs, rhs = (t.detach() for t in smooth_inputs(op))
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(lhs, torch.ones_like(lhs))
        with pytest.raises(RuntimeError, match=rf"fuel::{op}: forward-mode AD"):
            fuel_op(op)(dual, rhs)
        # Without tangents the op runs as usual inside a dual level.
        assert torch.equal(fuel_op(op)(lhs, rhs), elementwise.API[op](lhs, rhs))
    with pytest.raises(RuntimeError, match=rf"fuel::{op}: forward-mode AD"):
        torch.func.jvp(lambda x: fuel_op(op)(x, rhs), (lhs,), (torch.ones_like(lhs),))


@pytest.mark.parametrize("op", elementwise.OPS)
def test_out_overload_refuses_grad_but_works_without_it(op):
    lhs, rhs = smooth_inputs(op)
    out = torch.empty_like(lhs.detach())
    with pytest.raises(RuntimeError, match=rf"fuel::{op}\.out: out= does not support automatic differentiation"):
        fuel_op(op).out(lhs, rhs, out=out)
    with torch.no_grad():
        fuel_op(op).out(lhs, rhs, out=out)
    assert torch.equal(out, fuel_op(op)(lhs.detach(), rhs.detach()))
    assert fuel_op(op).out(lhs.detach(), rhs.detach(), out=torch.empty_like(out)).requires_grad is False


def test_contract_violation_in_forward_is_the_same_with_requires_grad():
    lhs = torch.rand(4, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"fuel::add \[add_f32\]: argument 'rhs' breaks `layout.strided"):
        torch.ops.fuel.add(lhs, torch.rand(4, 4).t())


OVERLOADS = [f"{op}{suffix}" for op in (*elementwise.OPS, "conv2d", "conv_transpose2d") for suffix in ("", ".out")]


@pytest.mark.parametrize("name", OVERLOADS)
def test_autograd_kernels_are_cpp(name):
    # Every overload's autograd kernel is the C++ one (csrc/autograd.cpp): no call, even under no_grad, runs
    # Python on its way to the kernel.
    table = torch._C._dispatch_dump_table(f"fuel::{name}")
    autograd_cpu = next(line for line in table.splitlines() if line.startswith("AutogradCPU:"))
    assert "csrc/autograd.cpp" in autograd_cpu, autograd_cpu
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"fuel::{name}", "Autograd")


def none_calls():
    x, w = torch.rand(1, 2, 4, 4), torch.rand(2, 2, 3, 3)
    a = torch.rand(5)
    return [
        ("add", "lhs", lambda t: torch.ops.fuel.add(None, t), a),
        ("add", "rhs", lambda t: torch.ops.fuel.add(t, None), a),
        ("pow", "lhs", lambda t: torch.ops.fuel.pow(None, t), a),
        ("conv2d", "x", lambda t: torch.ops.fuel.conv2d(None, t), w),
        ("conv2d", "weight", lambda t: torch.ops.fuel.conv2d(t, None), x),
        ("conv_transpose2d", "x", lambda t: torch.ops.fuel.conv_transpose2d(None, t), w),
    ]


@pytest.mark.parametrize("mode", ("plain", "requires_grad", "no_grad", "inference_mode"))
@pytest.mark.parametrize("index", range(len(none_calls())))
def test_none_for_a_tensor_argument_names_the_op_and_the_argument(index, mode):
    op, arg, call, other = none_calls()[index]
    kernel = f"{op}_f32"
    expected = rf"^fuel::{op} \[{kernel}\]: argument '{arg}' breaks `optional: false`: saw None\. Fix: pass a tensor\.$"
    if mode == "requires_grad":
        other.requires_grad_()
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, torch.enable_grad)
    with context(), pytest.raises(RuntimeError, match=expected):
        call(other)


def test_none_for_out_or_an_input_of_an_out_overload_is_named():
    a = torch.rand(5)
    with pytest.raises(RuntimeError, match=r"^fuel::add \[add_f32\]: argument 'out' breaks `optional: false`"):
        torch.ops.fuel.add.out(a, a, out=None)
    with pytest.raises(RuntimeError, match=r"^fuel::pow \[pow_f32\]: argument 'lhs' breaks `optional: false`"):
        torch.ops.fuel.pow.out(None, a, out=torch.empty(5))


# ---------------------------------------------------------------------------------------------------
# Convolution: conv2d and conv_transpose2d.

def conv_cases():
    """(transpose, N, groups, cin_g, cout_g, H, W, kernel, stride, padding, dilation, output_padding, bias)"""
    grid = []
    for groups, cin_g, cout_g in ((1, 2, 3), (2, 1, 2), (3, 1, 1)):  # plain, grouped with multiplier, depthwise
        for stride, padding, dilation in (((1, 1), (0, 0), (1, 1)), ((2, 1), (1, 0), (1, 2)),
                                          ((1, 2), (2, 1), (2, 1)), ((3, 2), (1, 1), (1, 1))):
            grid.append((False, 2, groups, cin_g, cout_g, 6, 5, (3, 2), stride, padding, dilation, (0, 0), True))
            output_padding = tuple(max(s, d) - 1 for s, d in zip(stride, dilation))
            grid.append((True, 2, groups, cin_g, cout_g, 4, 3, (2, 3), stride, padding, dilation, output_padding,
                         groups != 2))
    # output_padding beyond stride (allowed up to dilation): the adjoint reaches past the input grid.
    grid.append((True, 1, 1, 2, 2, 4, 4, (3, 3), (1, 1), (0, 0), (2, 2), (1, 1), True))
    grid.append((False, 1, 1, 1, 1, 1, 1, (1, 1), (1, 1), (0, 0), (1, 1), (0, 0), False))  # 1x1 everything
    return grid


def conv_inputs(case, dtype=torch.float64, seed=0):
    transpose, n, groups, cin_g, cout_g, h, w, kernel, *_, bias = case
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, groups * cin_g, h, w, generator=g, dtype=dtype)
    shape = (groups * cin_g, cout_g, *kernel) if transpose else (groups * cout_g, cin_g, *kernel)
    weight = torch.randn(shape, generator=g, dtype=dtype)
    b = torch.randn(groups * cout_g, generator=g, dtype=dtype) if bias else None
    return x, weight, b


def conv_fns(case):
    transpose, *_, stride, padding, dilation, output_padding, _bias = case
    if transpose:
        return (lambda x, w, b: torch.ops.fuel.conv_transpose2d(x, w, b, stride, padding, output_padding,
                                                                 case[2], dilation),
                lambda x, w, b: TF.conv_transpose2d(x, w, b, stride, padding, output_padding, case[2], dilation))
    return (lambda x, w, b: torch.ops.fuel.conv2d(x, w, b, stride, padding, dilation, case[2]),
            lambda x, w, b: TF.conv2d(x, w, b, stride, padding, dilation, case[2]))


def case_id(case):
    t, n, g, ci, co, h, w, k, s, p, d, op, b = case
    return (f"{'T' if t else 'C'}-n{n}-g{g}-{ci}x{co}-{h}x{w}-k{k[0]}{k[1]}-s{s[0]}{s[1]}-p{p[0]}{p[1]}-d{d[0]}{d[1]}"
            f"-op{op[0]}{op[1]}-{'b' if b else 'nob'}")


CONV_CASES = conv_cases()


@pytest.mark.parametrize("case", CONV_CASES, ids=case_id)
def test_conv_gradcheck_and_grads_match_torch(case):
    ours, theirs = conv_fns(case)
    x, weight, bias = conv_inputs(case)
    inputs = [t.requires_grad_() for t in (x, weight, bias) if t is not None]
    fn = (lambda x, w, b=None: ours(x, w, b))
    assert gradcheck(fn, tuple(inputs))
    out = ours(*(t.detach() for t in (x, weight)), bias)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
    _, our_grads = grads(fn, inputs, grad)
    _, their_grads = grads(lambda x, w, b=None: theirs(x, w, b), inputs, grad)
    for name, a, b in zip(("x", "weight", "bias"), our_grads, their_grads):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=f"grad {name}")


GRADGRAD_CASES = [  # small: gradgradcheck differentiates numerically through every output of the backward
    (False, 1, 2, 1, 2, 4, 4, (2, 2), (2, 1), (1, 0), (1, 2), (0, 0), True),
    (True, 1, 2, 1, 1, 3, 3, (2, 2), (2, 1), (1, 0), (1, 2), (1, 1), True),
]


@pytest.mark.parametrize("case", GRADGRAD_CASES, ids=case_id)
def test_conv_gradgradcheck(case):
    ours, _ = conv_fns(case)
    x, weight, bias = conv_inputs(case)
    inputs = tuple(t.requires_grad_() for t in (x, weight, bias) if t is not None)
    assert gradgradcheck(lambda x, w, b=None: ours(x, w, b), inputs)


@pytest.mark.parametrize("transpose", (False, True), ids=("conv2d", "conv_transpose2d"))
def test_conv_backward_runs_on_fuel_kernels(transpose):
    case = next(c for c in CONV_CASES if c[0] == transpose and c[2] == 2)
    ours, _ = conv_fns(case)
    x, weight, bias = (t.requires_grad_() if t is not None else None for t in conv_inputs(case))
    out = ours(x, weight, bias)
    with OpLog() as log:
        out.backward(torch.ones_like(out))
    used = set(log.ops)
    assert not used & TORCH_TWINS, f"backward used torch's {sorted(used & TORCH_TWINS)}"
    # conv2d: input grad by conv_transpose2d, weight grad by conv2d; conv_transpose2d: both by conv2d.
    expected = {"fuel.conv2d.default"} | (set() if transpose else {"fuel.conv_transpose2d.default"})
    assert {name for name in used if name.startswith("fuel.")} == expected, used


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("transpose", (False, True), ids=("conv2d", "conv_transpose2d"))
def test_conv_grads_in_low_precision_dtypes(transpose, dtype):
    # Integer-valued operands: every gradient is an exact integer sum, independent of accumulation order.
    case = next(c for c in CONV_CASES if c[0] == transpose and c[2] == 2 and c[8] != (1, 1))
    ours, theirs = conv_fns(case)
    g = torch.Generator().manual_seed(7)
    x, weight, bias = (torch.randint(-3, 4, t.shape, generator=g).to(dtype) if t is not None else None
                       for t in conv_inputs(case))
    out = ours(x, weight, bias)
    grad = torch.randint(-2, 3, out.shape, generator=g).to(dtype)
    inputs = [t for t in (x, weight, bias) if t is not None]
    _, our_grads = grads(lambda x, w, b=None: ours(x, w, b), inputs, grad)
    _, exact = grads(lambda x, w, b=None: theirs(x, w, b), [t.double() for t in inputs], grad.double())
    for a, b in zip(our_grads, exact):
        assert a.dtype == dtype and torch.equal(a.double(), b)


def test_conv_forward_mode_ad_and_out_are_refused():
    x, weight, bias = conv_inputs(CONV_CASES[0])
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, torch.ones_like(x))
        with pytest.raises(RuntimeError, match=r"fuel::conv2d: forward-mode AD"):
            torch.ops.fuel.conv2d(dual, weight)
        with pytest.raises(RuntimeError, match=r"fuel::conv_transpose2d: forward-mode AD"):
            torch.ops.fuel.conv_transpose2d(dual, weight.transpose(0, 1).contiguous())
    out = torch.empty_like(torch.ops.fuel.conv2d(x, weight))
    with pytest.raises(RuntimeError, match=r"fuel::conv2d\.out: out= does not support automatic differentiation"):
        torch.ops.fuel.conv2d.out(x, weight.requires_grad_(), out=out)


def test_conv_empty_batch_has_zero_weight_grad():
    x = torch.randn(0, 4, 5, 5, dtype=torch.float64)
    weight = torch.randn(6, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(6, dtype=torch.float64, requires_grad=True)
    torch.ops.fuel.conv2d(x, weight, bias, 1, 1, 1, 2).sum().backward()
    assert torch.equal(weight.grad, torch.zeros_like(weight)) and torch.equal(bias.grad, torch.zeros_like(bias))


class FirstOperandLayouts(TorchDispatchMode):
    """Each op's name, and whether its first operand (a 4-d tensor) is channels_last."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() == 4:
            self.calls.append((str(func), args[0].is_contiguous(memory_format=torch.channels_last)))
        return func(*args, **(kwargs or {}))


LAYOUT_CASES = [
    ("conv2d", (8, 6, 3, 3), dict(padding=1)),
    ("conv2d", (8, 3, 3, 3), dict(padding=1, stride=2, groups=2)),
    ("conv_transpose2d", (6, 4, 4, 4), dict(stride=2, padding=1)),
]


@pytest.mark.parametrize("op,w_shape,geometry", LAYOUT_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_channels_last_gradients_keep_their_layout_and_bits(op, w_shape, geometry, dtype):
    """A channels_last call's incoming gradient is used as it arrives, not copied into NCHW (the
    input gradient's convolution reads it channels_last), the input gradient comes back
    channels_last, as torch's does, and every gradient has the bits the NCHW call gets (the bias's
    too: fuel_backward::conv_bias_grad sums in the same order from either layout)."""
    adjoint = "fuel.conv_transpose2d.default" if op == "conv2d" else "fuel.conv2d.default"
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 9, 11, generator=generator).to(dtype)
    w = torch.randn(w_shape, generator=generator).to(dtype)
    cout = w_shape[0] if op == "conv2d" else w_shape[1] * geometry.get("groups", 1)
    b = torch.randn(cout, generator=generator).to(dtype)
    grads = {}
    for memory_format in (torch.contiguous_format, torch.channels_last):
        xs, ws, bs = (t.detach().clone().contiguous(memory_format=memory_format if t.dim() == 4 else
                                                    torch.contiguous_format).requires_grad_() for t in (x, w, b))
        y = getattr(fuel_torch, op)(xs, ws, bs, **geometry)
        # Magnitudes 2^-8..2^8, so that a sum's bits, even rounded to a half, depend on its order.
        g_gen = torch.Generator().manual_seed(5)
        g = (torch.randn(y.shape, generator=g_gen) * 2.0 ** torch.randint(-8, 9, y.shape, generator=g_gen)).to(dtype)
        with FirstOperandLayouts() as log:
            y.backward(g.contiguous(memory_format=memory_format))
        grads[memory_format] = (xs.grad, ws.grad, bs.grad)
        assert (adjoint, memory_format == torch.channels_last) in log.calls
    x_cl = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    getattr(TF, op)(x_cl, w.contiguous(memory_format=torch.channels_last), b, **geometry).backward(
        torch.ones(y.shape, dtype=dtype).contiguous(memory_format=torch.channels_last))
    assert x_cl.grad.is_contiguous(memory_format=torch.channels_last)
    assert grads[torch.channels_last][0].stride() == x_cl.grad.stride()
    for name, nchw, nhwc in zip(("input", "weight", "bias"), grads[torch.contiguous_format], grads[torch.channels_last]):
        assert reference.bit_equal(nchw, nhwc), name


def lane_order_case(dtype, memory_format):
    """(x, w, g, expected): a 1x1 conv of ones whose bias gradient is `expected` only when summed in
    fuel_backward::conv_bias_grad's order: lane (position mod 16) sums its positions in order in the
    accumulator (float64 for float64, float32 otherwise), then the lanes are added in order.

    Per channel, lanes 0-13 each hold `big` (position l) and -big (position l + 16); lane 14 holds 1
    (position 14) and, for a half, half the dtype's ulp at 1 (position 30); lane 15 holds 2^-20
    (position 15). Summed in lanes, 2^-20 survives: 1 + 2^-20, and for a half the float32 sum sits
    2^-20 above the rounding midpoint between 1 and the next half and rounds up once. Summed in one
    running sum, or in lanes of another width, 2^-20 meets some `big` (below its ulp in the
    accumulator) and is lost."""
    half = dtype in (torch.bfloat16, torch.float16)
    half_ulp = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}.get(dtype, 0.0)
    big = 2.0**40 if dtype == torch.float64 else 2.0**10
    values = {14: 1.0, 30: half_ulp, 15: 2.0**-20}
    for lane in range(14):
        values[lane], values[lane + 16] = big, -big
    g = torch.zeros(1, 16, 4, 8, dtype=torch.float64)
    for position, value in values.items():
        g[:, :, position // 8, position % 8] = value
    g = g.to(dtype).contiguous(memory_format=memory_format)
    x = torch.ones(1, 3, 4, 8, dtype=dtype).contiguous(memory_format=memory_format)
    w = torch.ones(16, 3, 1, 1, dtype=dtype).contiguous(memory_format=memory_format)
    expected = torch.full((16,), 1 + 2 * half_ulp if half else 1 + 2.0**-20, dtype=dtype)
    return x, w, g, expected


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bias_gradient_sums_position_lanes_in_order(dtype, memory_format):
    """The bias gradient's order, in either layout (see lane_order_case)."""
    x, w, g, expected = lane_order_case(dtype, memory_format)
    b = torch.zeros(16, dtype=dtype, requires_grad=True)
    fuel_torch.conv2d(x, w, b).backward(g)
    assert torch.equal(b.grad, expected)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bias_gradient_is_one_sum_rounded_once(dtype, memory_format):
    """A conv's bias gradient sums the incoming gradient over images and positions in the
    accumulator (float32, float64 for float64) and a half rounds once: within half an ulp (halves)
    of the exact sum plus the accumulator's summation bound, and the same bits for every thread
    count."""
    generator = torch.Generator().manual_seed(47)
    x = torch.randn(3, 20, 13, 17, generator=generator).to(dtype)
    w = torch.randn(24, 20, 3, 3, generator=generator).to(dtype)
    g = (torch.randn(3, 24, 13, 17, generator=generator) + 0.5).to(dtype).contiguous(memory_format=memory_format)
    grads = []
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            b = torch.zeros(24, dtype=dtype, requires_grad=True)
            fuel_torch.conv2d(x, w, b, padding=1).backward(g)
            grads.append(b.grad)
    finally:
        torch.set_num_threads(previous)
    assert all(reference.bit_equal(grad, grads[0]) for grad in grads)
    exact = g.double().sum((0, 2, 3))
    terms = 3 * 13 * 17
    digits = {torch.bfloat16: 8, torch.float16: 11}.get(dtype)
    rounding = 2.0 ** (torch.floor(torch.log2(grads[0].double().abs())) - (digits - 1)) / 2 if digits else 0.0
    epsilon = 2.0**-53 if dtype == torch.float64 else 2.0**-24
    bound = rounding + terms * epsilon * g.double().abs().sum((0, 2, 3))
    assert ((grads[0].double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bias_gradient_op_takes_any_layout_and_refuses_bad_calls(dtype):
    """fuel_backward::conv_bias_grad called directly: dense rows in either layout are read in place,
    other layouts (strided, expanded, offset) give the same sums as their dense copy, empty
    dimensions give zeros, and a wrong rank, dtype or device is an error naming the op, never a
    crash."""
    op = torch.ops.fuel_backward.conv_bias_grad
    generator = torch.Generator().manual_seed(11)
    g = torch.randn(2, 5, 6, 7, generator=generator).to(dtype)
    expected = op(g)
    assert expected.dtype == dtype and expected.shape == (5,)
    for other in (g.contiguous(memory_format=torch.channels_last),
                  torch.randn(2, 5, 6, 14, generator=generator).to(dtype)[..., ::2].copy_(g),
                  torch.empty(3, 5, 6, 7, dtype=dtype)[1:].copy_(g)):
        assert reference.bit_equal(op(other), expected)
    expanded = torch.randn(1, 5, 1, 1, generator=generator).to(dtype).expand(2, 5, 6, 7)
    assert reference.bit_equal(op(expanded), op(expanded.contiguous()))
    assert torch.equal(op(torch.empty(0, 5, 6, 7, dtype=dtype)), torch.zeros(5, dtype=dtype))
    assert op(torch.empty(2, 0, 6, 7, dtype=dtype)).shape == (0,)
    with pytest.raises(RuntimeError, match=r"^fuel_backward::conv_bias_grad: argument 'grad' must be 4-d .* got 3-d"):
        op(g[0])
    with pytest.raises(RuntimeError, match=r"^fuel_backward::conv_bias_grad: argument 'grad' must be float32.* got "
                                           r"torch.int64"):
        op(torch.ones(2, 5, 6, 7, dtype=torch.long))


def test_bias_gradient_op_opcheck_and_double_backward():
    """The op's fake kernel, autograd kernel (its gradient spreads each channel's value over the
    positions, as sum's does) and AOT dispatch, checked by opcheck; gradgradcheck through a biased
    conv takes this path."""
    generator = torch.Generator().manual_seed(13)
    for dtype in DTYPES:
        for memory_format in (torch.contiguous_format, torch.channels_last):
            for requires_grad in (False, True):
                g = torch.randn(2, 5, 3, 4, generator=generator).to(dtype).contiguous(memory_format=memory_format)
                result = opcheck(torch.ops.fuel_backward.conv_bias_grad.default, (g.requires_grad_(requires_grad),),
                                 test_utils="ALL")
                assert set(result.values()) == {"SUCCESS"}, result
    g = torch.randn(2, 3, 4, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    assert gradcheck(torch.ops.fuel_backward.conv_bias_grad, (g,))
    gg = torch.randn(3, generator=generator, dtype=torch.float64)
    (spread,) = torch.autograd.grad(torch.ops.fuel_backward.conv_bias_grad(g), g, gg)
    assert torch.equal(spread, gg.view(1, 3, 1, 1).expand(2, 3, 4, 5))
    with pytest.raises(RuntimeError, match=r"^fuel_backward::conv_bias_grad: forward-mode AD"):
        with forward_ad.dual_level():
            torch.ops.fuel_backward.conv_bias_grad(forward_ad.make_dual(g.detach(), torch.ones_like(g)))
