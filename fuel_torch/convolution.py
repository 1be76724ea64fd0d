"""The convolution family: fuel::conv2d and fuel::conv_transpose2d.

One place per concern, as in elementwise.py: the contract check (shared by the API and the fake
kernels), the fake kernels torch.compile traces with, and the Python API that applies the layout
policy. The geometry checks are not written here: they come from contracts/convolution.geometry.yaml
through fuel_torch/geometry.py, which runs the very programs the C++ kernels run (its docstring says
how symbolic sizes are decided). So does the allocation rule (the table's `returns`): on symbolic
sizes it never becomes a guard.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from . import enforce, geometry, layout, reference
from .contracts import Contract, installed

OPS = ("conv2d", "conv_transpose2d")

# The torch op each fuel op is measured against.
TORCH_EQUIVALENT = {
    "conv2d": F.conv2d,
    "conv_transpose2d": F.conv_transpose2d,
}


def output_shape(rule: Contract, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 stride: Sequence, padding: Sequence, dilation: Sequence, output_padding: Sequence | None,
                 groups, allocates: bool = True) -> list:
    """Check the geometry with the installed table (contracts/convolution.geometry.yaml, the one C++
    checks with) and return the output shape. allocates: the output is to be allocated (no out=), so
    the table's allocation rule applies too."""
    return geometry.check(rule.op, rule.kernel, x, weight, bias, stride, padding, dilation, output_padding, groups,
                          allocates=allocates)


def check(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: Sequence,
          padding: Sequence, dilation: Sequence, groups, output_padding: Sequence | None = None,
          out: torch.Tensor | None = None) -> tuple[Contract, list]:
    """Everything the C++ op checks, in its order; returns the contract and the output shape."""
    operands = [("x", x), ("weight", weight), ("bias", bias)]
    rule = enforce.check_inputs(installed(), op, operands)
    shape = output_shape(rule, x, weight, bias, stride, padding, dilation,
                         output_padding if op == "conv_transpose2d" else None, groups, allocates=out is None)
    if out is not None:
        enforce.check_out(rule, out, x.dtype, shape, operands)
    return rule, shape


def output_memory_format(x: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """The layout of a convolution's result, as torch's CPU convolutions choose it: channels_last when the
    input or the weight suggests channels_last (their strides order), else contiguous. Twin of the C++
    kernels' choice (csrc/convolution)."""
    from torch._prims_common import suggest_memory_format
    if x.dim() == 4 and weight.dim() == 4 and torch.channels_last in (suggest_memory_format(x),
                                                                     suggest_memory_format(weight)):
        return torch.channels_last
    return torch.contiguous_format


def _register_fakes() -> None:
    def conv2d_fake(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
        _, shape = check("conv2d", x, weight, bias, stride, padding, dilation, groups)
        return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=output_memory_format(x, weight))

    def conv2d_out_fake(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, *, out):
        check("conv2d", x, weight, bias, stride, padding, dilation, groups, out=out)
        return out

    def transpose_fake(x, weight, bias=None, stride=(1, 1), padding=(0, 0), output_padding=(0, 0), groups=1,
                       dilation=(1, 1)):
        _, shape = check("conv_transpose2d", x, weight, bias, stride, padding, dilation, groups, output_padding)
        return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=output_memory_format(x, weight))

    def transpose_out_fake(x, weight, bias=None, stride=(1, 1), padding=(0, 0), output_padding=(0, 0), groups=1,
                           dilation=(1, 1), *, out):
        check("conv_transpose2d", x, weight, bias, stride, padding, dilation, groups, output_padding, out=out)
        return out

    torch.library.register_fake("fuel::conv2d", conv2d_fake)
    torch.library.register_fake("fuel::conv2d.out", conv2d_out_fake)
    torch.library.register_fake("fuel::conv_transpose2d", transpose_fake)
    torch.library.register_fake("fuel::conv_transpose2d.out", transpose_out_fake)

    def bias_grad_fake(grad):
        # The kernel's own checks (csrc/convolution/bias_grad.cpp), so a trace fails as eager does.
        op = "fuel_backward::conv_bias_grad"
        torch._check(grad.dim() == 4, lambda: f"{op}: argument 'grad' must be 4-d [N, C, H, W] (a convolution's "
                     f"output gradient); got {grad.dim()}-d. Fix: pass the gradient of a conv2d or conv_transpose2d "
                     "output.")
        torch._check(grad.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16),
                     lambda: f"{op}: argument 'grad' must be float32, float64, bfloat16 or float16; got "
                     f"{grad.dtype}. Fix: convert it to one of those.")
        return grad.new_empty(grad.shape[1])

    torch.library.register_fake("fuel_backward::conv_bias_grad", bias_grad_fake)


_register_fakes()


def _refuse_string_padding(x, weight, bias=None, stride=(1, 1), padding="valid", dilation=(1, 1), groups=1):
    raise TypeError(
        f"fuel::conv2d: argument 'padding' is the string {padding!r}, but the raw op takes int[2] padding (its strict "
        f"schema). Fix: call fuel_torch.conv2d(x, weight, bias, stride, padding={padding!r}, ...), which takes "
        f"torch.nn.functional.conv2d's arguments and turns 'valid' / 'same' into numbers, or pass the padding as ints.")


# The kernel of fuel::conv2d.padding (csrc/schemas.cpp), an overload that exists only to give this refusal:
# registered for every backend at once, so eager calls, fake tensors and tracing see the same error.
_REFUSALS = torch.library.Library("fuel", "IMPL")
_REFUSALS.impl("conv2d.padding", _refuse_string_padding, "CompositeImplicitAutograd")


def _pair(value, name: str, api: str) -> list:
    """An int[2] argument as the schema takes it: one int means both dimensions."""
    if isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):
        return [value, value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise TypeError(f"fuel_torch.{api}: {name} must be an int or a sequence of two ints, got {value!r}")


def _conv2d_padding(padding, weight: torch.Tensor, stride: list, dilation: list) -> list:
    """torch.nn.functional.conv2d's padding: ints, or 'valid' / 'same' where symmetric padding gives them."""
    if not isinstance(padding, str):
        return _pair(padding, "padding", "conv2d")
    if padding == "valid":
        return [0, 0]
    if padding != "same":
        raise ValueError(f"fuel_torch.conv2d: padding must be an int, a pair of ints, 'valid' or 'same', got {padding!r}")
    if any(s != 1 for s in stride):
        raise ValueError("fuel_torch.conv2d: padding='same' is not supported for strided convolutions (as in torch)")
    totals = [dilation[i] * (weight.shape[2 + i] - 1) for i in range(2)]
    if any(total % 2 for total in totals):
        raise ValueError(f"fuel_torch.conv2d: padding='same' here needs uneven padding {totals} (total per dimension), "
                         "which the kernel's symmetric padding cannot express; pad the input with "
                         "torch.nn.functional.pad and pass padding=0")
    return [total // 2 for total in totals]


def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1, padding=0,
           dilation=1, groups: int = 1, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """fuel::conv2d with torch.nn.functional.conv2d's signature (plus out=): 2D cross-correlation of an
    NCHW input with weight [Cout, Cin / groups, Kh, Kw] and optional bias [Cout], in float32, float64,
    bfloat16 or float16 (halves accumulate in float32). The contract of torch.ops.fuel.conv2d is
    enforced and the layout policy applied."""
    stride, dilation = _pair(stride, "stride", "conv2d"), _pair(dilation, "dilation", "conv2d")
    padding = _conv2d_padding(padding, weight, stride, dilation)
    # The op itself is checked, by the C++ kernel or the fake one, with the contract's messages.
    input, weight, bias = layout.prepare((input, weight, bias), keep_channels_last=True)
    if out is None:
        return torch.ops.fuel.conv2d.default(input, weight, bias, stride, padding, dilation, groups)
    return torch.ops.fuel.conv2d.out(input, weight, bias, stride, padding, dilation, groups, out=out)


def conv_transpose2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1,
                     padding=0, output_padding=0, groups: int = 1, dilation=1, *,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """fuel::conv_transpose2d with torch.nn.functional.conv_transpose2d's signature (plus out=): the
    adjoint of conv2d for an NCHW input, weight [Cin, Cout / groups, Kh, Kw] and optional bias [Cout].
    The contract of torch.ops.fuel.conv_transpose2d is enforced and the layout policy applied."""
    api = "conv_transpose2d"
    stride, padding = _pair(stride, "stride", api), _pair(padding, "padding", api)
    output_padding, dilation = _pair(output_padding, "output_padding", api), _pair(dilation, "dilation", api)
    input, weight, bias = layout.prepare((input, weight, bias), keep_channels_last=True)
    args = (input, weight, bias, stride, padding, output_padding, groups, dilation)
    if out is None:
        return torch.ops.fuel.conv_transpose2d.default(*args)
    return torch.ops.fuel.conv_transpose2d.out(*args, out=out)


API = {"conv2d": conv2d, "conv_transpose2d": conv_transpose2d}


def float64_reference(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      **geometry) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's float64 result from the same (rounded) operands, and conv(|x|, |weight|) + |bias|, the
    scale of the rounding-error bounds. A product of two floats of at most 24 significant bits is exact
    in float64, so for float32 and the halves the first is the exact result to within K * 2^-53 of the
    scale (K = taps per output)."""
    fn = TORCH_EQUIVALENT[op]
    wide = [t.double() if t is not None else None for t in (x, weight, bias)]
    scale = fn(wide[0].abs(), wide[1].abs(), None if bias is None else wide[2].abs(), **geometry)
    return fn(*wide, **geometry), scale


def taps_per_output(op: str, x: torch.Tensor, weight: torch.Tensor, groups: int = 1) -> int:
    """K of the error bounds: the taps each output sums (conv_transpose2d: an upper bound)."""
    if op == "conv2d":
        return weight.shape[1] * weight.shape[2] * weight.shape[3]
    return x.shape[1] // groups * weight.shape[2] * weight.shape[3]


_HALF_FORMAT = {torch.bfloat16: (8, -126), torch.float16: (11, -14)}  # significant bits, minimum exponent


def half_spacing(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The gap between adjacent `dtype` numbers in the binade of each value (float64 in and out)."""
    bits, min_exponent = _HALF_FORMAT[dtype]
    _, exponent = torch.frexp(values.double())
    exponent = torch.clamp(exponent - 1, min=min_exponent)
    return torch.ldexp(torch.ones_like(values, dtype=torch.float64), exponent - (bits - 1))


def half_result_check(ours: torch.Tensor, exact: torch.Tensor, scale: torch.Tensor, taps: int) -> dict:
    """The bfloat16/float16 precision claim of contracts/convolution.fkc.md, checked element by element.

    With g = (K + 2) * 2^-24 * scale (the float32 accumulation bound, plus the float64 reference's own
    K * 2^-53 * scale): wherever g <= ulp(exact) / 2, ours is within 1 ulp of the correctly rounded result;
    everywhere, |ours - exact| <= ulp(ours) / 2 + g."""
    dtype = ours.dtype
    g = (taps + 2) * 2.0**-24 * scale + (taps + 1) * 2.0**-53 * scale
    tight = g <= half_spacing(exact, dtype) / 2
    distance = reference.ulp_distance(ours, reference.round_to(exact, dtype))
    near = torch.where(tight, distance, torch.zeros_like(distance))
    error = (ours.double() - exact).abs()
    loose = error <= half_spacing(ours, dtype) / 2 + g
    return {"max_ulp": int(near.max()) if near.numel() else 0, "excused": int((~tight).sum()),
            "bound_ok": bool(loose.all()), "elements": ours.numel()}


def parity(contract: Contract, seed: int = 0) -> tuple[bool, str]:
    """A live check of one kernel against torch on random data, for `python -m fuel_torch`."""
    op, dtype = contract.op, contract.dtype
    generator = torch.Generator().manual_seed(seed)
    geometry = {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2), "groups": 2}
    weight_shape = [8, 3, 3, 5] if op == "conv2d" else [6, 4, 3, 5]
    if op == "conv_transpose2d":
        geometry["output_padding"] = (1, 0)
    x, weight, bias = (torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
                       for shape in ([3, 6, 17, 19], weight_shape, [8]))
    exact, scale = float64_reference(op, x, weight, bias, **geometry)
    taps = taps_per_output(op, x, weight, geometry["groups"])
    ours = API[op](x, weight, bias, **geometry)
    name = f"torch.nn.functional.{op}"
    if dtype == torch.float32:
        # The contract's bound for every output, and an error no larger than 2x torch's (root mean square:
        # the maximum over one small output is a matter of chance).
        theirs = TORCH_EQUIVALENT[op](x, weight, bias, **geometry)
        ours_err, theirs_err = (ours.double() - exact).abs(), (theirs.double() - exact).abs()
        bounded = bool((ours_err <= (taps + 2) * 2.0**-24 * scale + (taps + 1) * 2.0**-53 * scale).all())
        ours_rms, theirs_rms = (e.pow(2).mean().sqrt().item() for e in (ours_err, theirs_err))
        return bounded and ours_rms <= 2 * theirs_rms, (
            f"rms error {ours_rms:.2e}, {name}'s {theirs_rms:.2e}; max {ours_err.max().item():.2e}, "
            f"{theirs_err.max().item():.2e} (float64 reference)")
    if dtype == torch.float64:
        # Both are within (K + 2) u scale of the exact result, so within twice that of each other.
        theirs = TORCH_EQUIVALENT[op](x, weight, bias, **geometry)
        ok = bool(((ours - theirs).abs() <= 2 * (taps + 2) * 2.0**-53 * scale).all())
        return ok, f"within 2 (K + 2) u conv(|x|, |w|) of {name}"
    found = half_result_check(ours, exact, scale, taps)
    ok = found["max_ulp"] <= 1 and found["bound_ok"]
    return ok, (f"within {found['max_ulp']} ulp of the correctly rounded result "
                f"({found['excused']} of {found['elements']} outputs cancellation-bound)")


def example_call(op: str, dtype: torch.dtype) -> tuple[tuple, dict]:
    """A small valid call of fuel::`op` in `dtype` (any dtype: used to probe what a kernel accepts)."""
    x = torch.linspace(-1.0, 1.0, 2 * 4 * 5 * 5, dtype=torch.float64).reshape(2, 4, 5, 5).to(dtype)
    weight_shape = (6, 2, 3, 3) if op == "conv2d" else (4, 3, 3, 3)
    weight = torch.linspace(-1.0, 1.0, 108, dtype=torch.float64).reshape(weight_shape).to(dtype)
    bias = torch.linspace(-1.0, 1.0, 6, dtype=torch.float64).to(dtype)
    if op == "conv2d":
        return (x, weight, bias, [1, 1], [1, 1], [1, 1], 2), {}
    return (x, weight, bias, [2, 2], [1, 1], [1, 1], 2, [1, 1]), {}
