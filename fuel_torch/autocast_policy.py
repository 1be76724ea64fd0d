"""CPU autocast for the fuel ops: torch's policy for the torch op each one replaces.

Under `torch.autocast("cpu", dtype=...)` torch runs conv2d and conv_transpose2d in the autocast dtype (its
lower_precision_fp list): every floating-point CPU tensor argument except a float64 one is cast to it first.
torch's elementwise binary ops are on no CPU autocast list: mixed operands run in the type torch's promotion
gives them, the widest input type. Each fuel op gets the same behaviour from a kernel on the AutocastCPU
dispatch key, which casts and calls the op again below that key, where the contract is enforced as always.

Outside an autocast region torch keeps AutocastCPU in the thread's excluded dispatch keys, so these kernels
are never reached and cost nothing. As in torch, the .out overloads are not autocast: they write the dtype
of the tensor they are given.
"""
from __future__ import annotations

import torch

from . import convolution, elementwise

_BELOW_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
_LIB = torch.library.Library("fuel", "IMPL")


def _to_autocast_dtype(args: tuple) -> tuple:
    """torch's lower_precision_fp cast (at::autocast::cached_cast): CPU floating tensors, float64 excepted."""
    dtype = torch.get_autocast_dtype("cpu")

    def cast(value):
        if (isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64
                and value.device.type == "cpu"):
            return value.to(dtype)
        return value

    return tuple(cast(value) for value in args)


def _to_widest(args: tuple) -> tuple:
    """torch's type promotion of two floating operands: both in the wider type (bfloat16 with float16 is
    float32). Anything else is left for the contract to judge."""
    lhs, rhs = args
    if (isinstance(lhs, torch.Tensor) and isinstance(rhs, torch.Tensor) and lhs.dtype != rhs.dtype
            and lhs.is_floating_point() and rhs.is_floating_point()):
        dtype = torch.promote_types(lhs.dtype, rhs.dtype)
        return lhs.to(dtype), rhs.to(dtype)
    return args


def _register(op: str, cast) -> None:
    functional = getattr(torch.ops.fuel, op).default

    def kernel(*args):
        with torch._C._ExcludeDispatchKeyGuard(_BELOW_AUTOCAST):
            return functional(*cast(args))

    _LIB.impl(op, kernel, "AutocastCPU")


for _op in convolution.OPS:
    _register(_op, _to_autocast_dtype)
for _op in elementwise.OPS:
    _register(_op, _to_widest)
