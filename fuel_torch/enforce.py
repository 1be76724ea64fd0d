"""Contract enforcement for the Python paths: the fuel_torch API and the fake (meta) kernels.

This is the Python twin of csrc/contract_rules.cpp, which checks direct torch.ops.fuel.* calls
against the same clauses (installed from the same parsed contracts). Both build the message with
the same template, so a violation reads the same in eager mode and at trace time; the tests
assert that both reject the same inputs with the same text.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .contracts import FKC_NAME, Contract, ContractSet

LAYOUT_FIX = ("pass a contiguous zero-offset copy (.contiguous() or .clone()), or call through "
              "fuel_torch under layout_policy('contiguize')")
# The fixes where the kernels also read channels_last: the convolutions, whose nn modules apply the
# policy to their parameters too. Each names only what works for the clause broken: .contiguous()
# returns an offset tensor unchanged, so an offset needs .clone().
LAYOUT_FIX_CHANNELS_LAST = ("pass a contiguous or channels_last copy (.contiguous(), "
                            ".contiguous(memory_format=torch.channels_last) or .clone()), or call through the "
                            "fuel_torch API or a fuel_torch.nn module under layout_policy('contiguize')")
OFFSET_FIX_CHANNELS_LAST = ("pass a zero-offset copy (.clone()), or call through the fuel_torch API or a "
                            "fuel_torch.nn module under layout_policy('contiguize')")


def _layout_fix(op: str, clause: str) -> str:
    if op not in READS_CHANNELS_LAST:
        return LAYOUT_FIX
    return OFFSET_FIX_CHANNELS_LAST if clause == "layout.start_offset: rejected" else LAYOUT_FIX_CHANNELS_LAST
# The ops whose kernels read a 4-d channels_last (NHWC) operand in place; twin of
# reads_channels_last() in csrc/contract_rules.cpp. A contract elsewhere that claimed
# `channels_last: accepted` still gets the tensor refused: the other kernels read memory order.
READS_CHANNELS_LAST = frozenset({"conv2d", "conv_transpose2d"})


class ContractViolation(RuntimeError):
    """A call that a kernel contract rejects. The C++ kernels raise the same text as RuntimeError."""


def violation(op: str, kernel: str, arg: str, clause: str, seen: str, fix: str) -> ContractViolation:
    return ContractViolation(f"fuel::{op} [{kernel}]: argument '{arg}' breaks `{clause}`: saw {seen}. Fix: {fix}.")


def shape_str(sizes: Sequence) -> str:
    return "[" + ", ".join(str(s) for s in sizes) + "]"


def dtype_str(dtype: torch.dtype) -> str:
    return str(dtype)


def _fkc_name(dtype: torch.dtype) -> str:
    return FKC_NAME.get(dtype, dtype_str(dtype))


def layout_seen(t: torch.Tensor) -> str:
    return f"shape {shape_str(t.shape)}, strides {shape_str(t.stride())}, storage offset {t.storage_offset()}"


def is_channels_last(t: torch.Tensor) -> bool:
    """A 4-d tensor laid out as torch.channels_last (NHWC in memory) and not plain contiguous."""
    return t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


def broken_layout_clause(t: torch.Tensor, layout: dict) -> str | None:
    """The first layout clause `t` breaks, most specific first, as the C++ twin orders them.

    A tensor with no elements has no memory to read, so no layout can be wrong for it."""
    if t.numel() == 0:
        return None
    strides, sizes = t.stride(), t.shape
    if layout["reverse_strides"] == "rejected" and any(s < 0 for s in strides):
        return "layout.reverse_strides: rejected"
    if layout["broadcast_stride0"] == "rejected" and any(s == 0 and n > 1 for s, n in zip(strides, sizes)):
        return "layout.broadcast_stride0: rejected"
    if layout["start_offset"] == "rejected" and t.storage_offset() != 0:
        return "layout.start_offset: rejected"
    if not t.is_contiguous():
        if layout.get("channels_last") == "accepted" and is_channels_last(t):
            return None
        if layout["strided"] == "rejected":
            return "layout.strided: rejected"
        if layout["contiguous"] == "required":
            return "layout.contiguous: required"
    return None


def _kernel_can_read(t: torch.Tensor, op: str) -> bool:
    dense = t.is_contiguous() or (op in READS_CHANNELS_LAST and is_channels_last(t))
    return t.numel() == 0 or (dense and t.storage_offset() == 0)


def _device_ok(t: torch.Tensor, first: torch.Tensor) -> bool:
    # Meta tensors (and fake tensors of either kind) only ever reach the shape-inference kernels.
    return t.device == first.device and t.device.type in ("cpu", "meta")


def check_inputs(contracts: ContractSet, op: str, inputs: Sequence[tuple[str, torch.Tensor | None]]) -> Contract:
    """Select the contract by the first tensor's dtype and check every input against it."""
    kernels = contracts.for_op(op)
    if not kernels:
        raise ContractViolation(f"fuel::{op}: no contract is installed for this op")
    first_name, first = inputs[0]
    rule = next((k for k in kernels if k.dtype == first.dtype), None)
    if rule is None:
        raise violation(op, "|".join(k.kernel for k in kernels), kernels[0].inputs[0].name,
                        "dtypes: [" + ", ".join(_fkc_name(k.dtype) for k in kernels) + "]", dtype_str(first.dtype),
                        "convert the tensors to one of torch.float32, torch.float64, torch.bfloat16, torch.float16")
    tensors = dict(inputs)
    for clause in rule.inputs:
        t = tensors.get(clause.name)
        if t is None:
            if not clause.optional:
                raise violation(op, rule.kernel, clause.name, "optional: false", "None", "pass a tensor")
            continue
        if not _device_ok(t, first):
            raise violation(op, rule.kernel, clause.name, "backend: Cpu",
                            f"device {t.device} ('{first_name}' is on {first.device})",
                            "move every tensor of the call to the CPU (meta tensors only for shape inference, "
                            "all of them meta)")
        if _fkc_name(t.dtype) not in clause.dtypes:
            raise violation(op, rule.kernel, clause.name, "dtypes: [" + ", ".join(clause.dtypes) + "]",
                            dtype_str(t.dtype), f"convert '{clause.name}' to {dtype_str(rule.dtype)} "
                            "(every tensor of one call has one dtype)")
        broken = broken_layout_clause(t, clause.layout)
        if broken is None and not _kernel_can_read(t, op):
            broken = "layout.contiguous: required"
        if broken:
            raise violation(op, rule.kernel, clause.name, broken, layout_seen(t), _layout_fix(op, broken))
        if clause.rank is not None and t.dim() != clause.rank:
            raise violation(op, rule.kernel, clause.name, f"rank: {clause.rank}",
                            f"rank {t.dim()} (shape {shape_str(t.shape)})", f"pass a {clause.rank}-d tensor")
    for clause in rule.inputs:
        partner = clause.same_as
        t, other = tensors.get(clause.name), tensors.get(partner) if partner else None
        if t is not None and other is not None and t.shape != other.shape:
            raise violation(op, rule.kernel, clause.name, f"shape_constraint: same_as={partner}",
                            f"{clause.name} {shape_str(t.shape)}, {partner} {shape_str(other.shape)}",
                            "pass tensors of one shape (the kernel does not broadcast), or call through fuel_torch "
                            "under layout_policy('contiguize'), which broadcasts first")
    return rule


def check_out(rule: Contract, out: torch.Tensor, dtype: torch.dtype, shape: Sequence,
              inputs: Sequence[tuple[str, torch.Tensor | None]]) -> None:
    """The `out=` tensor: exact dtype and shape, contiguous (or channels_last where the op reads it), zero
    offset, sharing no input's memory."""
    op, kernel, ret = rule.op, rule.kernel, rule.outputs[0]
    first_name, first = inputs[0]
    if out.device != first.device:
        raise violation(op, kernel, "out", "backend: Cpu", f"device {out.device} ('{first_name}' is on {first.device})",
                        "allocate out on the device of the inputs")
    if out.dtype != dtype:
        raise violation(op, kernel, "out", f"return.dtype_rule: {ret.dtype_rule}", dtype_str(out.dtype),
                        f"allocate out with dtype {dtype_str(dtype)} (.out never casts)")
    if tuple(out.shape) != tuple(shape):
        raise violation(op, kernel, "out", f"return.shape_rule: {ret.shape_rule}",
                        f"shape {shape_str(out.shape)}, expected {shape_str(shape)}",
                        f"allocate out with shape {shape_str(shape)} (.out never resizes)")
    if not _kernel_can_read(out, op):
        raise violation(op, kernel, "out", f"return.layout_guarantee: {ret.layout_guarantee}", layout_seen(out),
                        "pass a fresh contiguous zero-offset tensor as out")
    for name, t in inputs:
        if t is not None and out.numel() > 0 and t.numel() > 0 and torch._C._is_alias_of(out, t):
            raise violation(op, kernel, "out", f"return.aliasing: {ret.aliasing}", f"out shares memory with '{name}'",
                            "write into a tensor that no input uses")
