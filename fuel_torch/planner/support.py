"""The support table: which ATen nodes a fuel kernel can serve, read from the contracts.

A node is matched against the contract of its fuel op from the fake values torch recorded on the graph
(`node.meta["val"]`: dtype, shape, strides, storage offset, device). The answer is either a Match (the
fuel op, and for each operand whether the plan must materialize it, and why) or a reason it cannot be
routed, in one line. Which layouts need a copy is the contract's `accept` clause; that a copy is allowed
at all is its `caps.awkward_layout_strategy` (`requires_contiguous`: the planner's Contiguize step).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..contracts import FKC_DTYPES, installed
from ..enforce import broken_layout_clause

aten = torch.ops.aten

# aten target -> fuel op. The Scalar overloads take a Python number, which the plan materializes.
ELEMENTWISE = {
    aten.add.Tensor: "add", aten.add.Scalar: "add",
    aten.sub.Tensor: "sub", aten.sub.Scalar: "sub",
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul",
    aten.div.Tensor: "div", aten.div.Scalar: "div",
    aten.maximum.default: "maximum", aten.minimum.default: "minimum",
    aten.pow.Tensor_Tensor: "pow", aten.pow.Tensor_Scalar: "pow", aten.pow.Scalar: "pow",
    aten.remainder.Tensor: "rem", aten.remainder.Scalar: "rem", aten.remainder.Scalar_Tensor: "rem",
}
# Near misses: listed in the plan (so a user sees why they stayed on torch), never routed.
NEAR_MISSES = {
    aten.div.Tensor_mode: ("div", "rounding_mode is set: fuel::div is true division only"),
    aten.div.Scalar_mode: ("div", "rounding_mode is set: fuel::div is true division only"),
}
CONVOLUTION = aten.convolution.default
CONVOLUTION_BACKWARD = aten.convolution_backward.default
FUEL_OPS = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "rem", "conv2d", "conv_transpose2d")


def is_candidate(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and (
        node.target in ELEMENTWISE or node.target in NEAR_MISSES or node.target in (CONVOLUTION, CONVOLUTION_BACKWARD))


def fuel_ops_of(node: torch.fx.Node) -> tuple[str, ...]:
    """The fuel ops a node would run on (a convolution backward runs on both convolutions)."""
    if node.target in ELEMENTWISE:
        return (ELEMENTWISE[node.target],)
    if node.target in NEAR_MISSES:
        return (NEAR_MISSES[node.target][0],)
    if node.target == CONVOLUTION:
        return ("conv_transpose2d" if node.args[6] else "conv2d",)
    return ("conv_transpose2d", "conv2d")


class Unsupported(Exception):
    """A node the contracts do not let a fuel kernel serve; str() is the one-line reason."""


@dataclasses.dataclass
class Operand:
    """One operand of a routed call: the graph value (a Node or a Python number) and what the plan does to it."""

    name: str               # the contract's argument name (lhs, rhs, x, weight, bias, grad)
    value: Any              # torch.fx.Node or a Python number
    copy: str | None = None  # None, or why it is materialized: the broken clause, "broadcast", "python scalar"
    numel: Any = 0           # elements the materialization writes (a SymInt under dynamic shapes)

    @property
    def label(self) -> str:
        return self.value.name if isinstance(self.value, torch.fx.Node) else repr(self.value)


@dataclasses.dataclass
class Match:
    op: str                     # the fuel op (for a convolution backward: "convolution_backward")
    dtype: torch.dtype
    operands: list[Operand]
    params: dict[str, Any]      # the op's non-tensor arguments
    out: Any                    # the node's fake value (a tensor; for the backward, grad_input's)


def val(value: Any) -> Any:
    return value.meta.get("val") if isinstance(value, torch.fx.Node) else value


def _dtype_names(op: str) -> str:
    return ", ".join(str(c.dtype).replace("torch.", "") for c in installed().for_op(op))


def contract_for(op: str, dtype: torch.dtype):
    try:
        return installed().get(op, dtype)
    except KeyError:
        kind = "integer/bool operands" if not (dtype.is_floating_point or dtype.is_complex) else f"dtype {dtype}"
        raise Unsupported(f"{kind}: not in the contracts of fuel::{op} ({_dtype_names(op)})") from None


def _layout_copy(t: torch.Tensor, clause, contract) -> str | None:
    """The clause a tensor operand breaks, if the contract's strategy allows materializing it."""
    broken = broken_layout_clause(t, dict(clause.layout))
    if broken and contract.caps.get("awkward_layout_strategy") != "requires_contiguous":
        raise Unsupported(f"'{clause.name}' breaks `{broken}` and the contract names no materialization strategy")
    return broken


def _check_device(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.device.type != "cpu":
            raise Unsupported(f"device {t.device}: fuel kernels run on the CPU")


def match_elementwise(node: torch.fx.Node) -> Match:
    if node.target in NEAR_MISSES:
        raise Unsupported(NEAR_MISSES[node.target][1])
    op = ELEMENTWISE[node.target]
    if node.kwargs.get("alpha", 1) != 1 or (len(node.args) > 2 and node.args[2] != 1):
        raise Unsupported("alpha != 1: fuel::add/sub have no scale")
    out = val(node)
    if not isinstance(out, torch.Tensor):
        raise Unsupported("no fake value recorded for the node")
    contract = contract_for(op, out.dtype)
    _check_device(out)
    operands = []
    for value, clause in zip(node.args[:2], contract.inputs):
        v = val(value)
        if isinstance(v, torch.Tensor):
            _check_device(v)
            if v.dtype != out.dtype:
                raise Unsupported(f"mixed dtypes: torch promotes {v.dtype} to {out.dtype}; a fuel kernel takes one dtype")
            if tuple(v.shape) != tuple(out.shape):
                operands.append(Operand(clause.name, value, "broadcast", out.numel()))
            else:
                broken = _layout_copy(v, clause, contract)
                operands.append(Operand(clause.name, value, broken, out.numel() if broken else 0))
        elif isinstance(v, (bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise Unsupported(f"operand {v!r} is a {type(v).__name__}, not a number fuel can materialize")
        elif isinstance(v, (int, float)):
            # Torch casts the number to a float32/float64 operand's dtype, as the materialized tensor does; a
            # half operand's kernels use it unrounded in float32 (opmath). There only numbers the half dtype
            # holds exactly give equal results.
            half = out.dtype in (torch.bfloat16, torch.float16)
            if half and float(torch.tensor(v, dtype=out.dtype)) != v:
                raise Unsupported(f"Python scalar {v!r} is not exact in {out.dtype}: torch computes with it "
                                  f"unrounded, a {out.dtype} operand would round it first")
            operands.append(Operand(clause.name, value, "python scalar", out.numel()))
        else:
            raise Unsupported(f"operand of type {type(v).__name__}")
    return Match(op, out.dtype, operands, {}, out)


def _ints(values, what: str) -> list[int]:
    if any(not isinstance(v, int) for v in values):
        raise Unsupported(f"symbolic {what} {list(values)}")
    return [int(v) for v in values]


def match_convolution(node: torch.fx.Node) -> Match:
    x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = node.args
    xv, wv, bv = val(x), val(weight), val(bias)
    if xv.dim() != 4:
        raise Unsupported(f"{xv.dim() - 2}-D convolution: fuel serves 2-D (NCHW) only")
    op = "conv_transpose2d" if transposed else "conv2d"
    contract = contract_for(op, xv.dtype)
    tensors = [("x", x, xv), ("weight", weight, wv)] + ([("bias", bias, bv)] if bias is not None else [])
    _check_device(*(t for _, _, t in tensors))
    operands = []
    for name, value, v in tensors:
        if v.dtype != xv.dtype:
            raise Unsupported(f"mixed dtypes: '{name}' is {v.dtype}, x is {xv.dtype}")
        broken = _layout_copy(v, contract.input(name), contract)
        operands.append(Operand(name, value, broken, v.numel() if broken else 0))
    if bias is None:
        operands.append(Operand("bias", None))
    params = {"stride": _ints(stride, "stride"), "padding": _ints(padding, "padding"),
              "dilation": _ints(dilation, "dilation"), "groups": groups}
    if not isinstance(groups, int):
        raise Unsupported("symbolic groups")
    if transposed:
        params["output_padding"] = _ints(output_padding, "output_padding")
    return Match(op, xv.dtype, operands, params, val(node))


def match_convolution_backward(node: torch.fx.Node) -> Match:
    grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask = node.args
    gv, xv, wv = val(grad), val(x), val(weight)
    if xv.dim() != 4:
        raise Unsupported(f"{xv.dim() - 2}-D convolution: fuel serves 2-D (NCHW) only")
    for op in ("conv2d", "conv_transpose2d"):
        contract_for(op, xv.dtype)
    _check_device(gv, xv, wv)
    if len({gv.dtype, xv.dtype, wv.dtype}) != 1:
        raise Unsupported(f"mixed dtypes {gv.dtype}, {xv.dtype}, {wv.dtype}")
    _ints([xv.shape[1], gv.shape[1]], "channel counts")
    contract = contract_for("conv2d", xv.dtype)
    operands = []
    for name, value, v in (("grad", grad, gv), ("x", x, xv), ("weight", weight, wv)):
        broken = _layout_copy(v, contract.input("x" if name == "grad" else name), contract)
        operands.append(Operand(name, value, broken, v.numel() if broken else 0))
    params = {"stride": _ints(stride, "stride"), "padding": _ints(padding, "padding"),
              "dilation": _ints(dilation, "dilation"), "groups": groups, "transposed": bool(transposed),
              "output_padding": _ints(output_padding, "output_padding"), "mask": list(mask)}
    if not isinstance(groups, int):
        raise Unsupported("symbolic groups")
    if not transposed:
        # The input gradient is conv_transpose2d; its output_padding restores the rows the forward's floor
        # division dropped. Under dynamic shapes it must not depend on the size (it does not for stride 1).
        params["grad_output_padding"] = []
        for d in range(2):
            extra = xv.shape[2 + d] - transposed_size(gv.shape[2 + d], wv.shape[2 + d], params["stride"][d],
                                                      params["padding"][d], params["dilation"][d])
            extra = extra.node.maybe_as_int() if isinstance(extra, torch.SymInt) else int(extra)
            if extra is None:
                raise Unsupported("the input gradient's output_padding depends on the (symbolic) spatial size")
            params["grad_output_padding"].append(extra)
    return Match("convolution_backward", xv.dtype, operands, params, xv)


def transposed_size(size, k: int, stride: int, padding: int, dilation: int):
    """conv_transpose2d's output length without output_padding, for input length `size`."""
    return (size - 1) * stride - 2 * padding + dilation * (k - 1) + 1


def match(node: torch.fx.Node) -> Match:
    """The fuel call that can serve `node`, or Unsupported with the reason."""
    if node.target in ELEMENTWISE or node.target in NEAR_MISSES:
        return match_elementwise(node)
    if node.target == CONVOLUTION:
        return match_convolution(node)
    return match_convolution_backward(node)


__all__ = ["ELEMENTWISE", "FKC_DTYPES", "FUEL_OPS", "Match", "Operand", "Unsupported", "is_candidate", "match"]
