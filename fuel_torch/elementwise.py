"""The elementwise binary family: fuel::add, sub, mul, div, maximum, minimum, pow, rem.

One place per concern: the contract check (shared with the fake kernels), the fake kernels
torch.compile traces with, and the Python API that applies the layout policy.
"""
from __future__ import annotations

import numbers

import torch

from . import enforce, layout, reference
from .contracts import Contract, installed

OPS = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "rem")

# The torch op each fuel op is measured against.
TORCH_EQUIVALENT = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "pow": torch.pow,
    "rem": torch.remainder,
}


def check(op: str, lhs: torch.Tensor, rhs: torch.Tensor, out: torch.Tensor | None = None) -> Contract:
    operands = [("lhs", lhs), ("rhs", rhs)]
    rule = enforce.check_inputs(installed(), op, operands)
    if out is not None:
        enforce.check_out(rule, out, lhs.dtype, lhs.shape, operands)
    return rule


def _register_fakes(op: str) -> None:
    def fake(lhs, rhs):
        check(op, lhs, rhs)
        return lhs.new_empty(lhs.shape)

    def fake_out(lhs, rhs, *, out):
        check(op, lhs, rhs, out)
        return out

    torch.library.register_fake(f"fuel::{op}", fake)
    torch.library.register_fake(f"fuel::{op}.out", fake_out)


def _number_as_tensor(value, like: torch.Tensor) -> torch.Tensor:
    """A Python number as torch's binary ops see it next to a tensor: a 0-dim tensor of that tensor's dtype,
    broadcast to its shape (materialized: the kernel reads contiguous operands). The number is rounded to
    the dtype once (an overflowing float becomes inf, as a cast does, instead of torch.full's error)."""
    scalar = torch.scalar_tensor(value, dtype=torch.float64, device=like.device).to(like.dtype)
    return scalar.expand(like.shape).contiguous()


_NUMBERS = (numbers.Real, torch.SymInt, torch.SymFloat, torch.SymBool)


def _operands(op: str, lhs, rhs) -> tuple:
    """The call's operands as tensors: a Python number on either side takes the other operand's dtype and
    shape. Anything else is left for the op to refuse with its own message."""
    lhs_number, rhs_number = isinstance(lhs, _NUMBERS), isinstance(rhs, _NUMBERS)
    if lhs_number and rhs_number:
        raise TypeError(f"fuel_torch.{op}: at least one operand must be a tensor, got two numbers ({lhs!r}, {rhs!r}); "
                        f"use Python arithmetic or torch.tensor")
    if rhs_number and isinstance(lhs, torch.Tensor):
        return lhs, _number_as_tensor(rhs, lhs)
    if lhs_number and isinstance(rhs, torch.Tensor):
        return _number_as_tensor(lhs, rhs), rhs
    return lhs, rhs


def _make_api(op: str):
    packet = getattr(torch.ops.fuel, op)
    # Bound once: each call then costs what torch.ops.fuel.<op>.default costs, plus the checks below.
    functional, with_out = packet.default, packet.out
    policy, Tensor = layout._policy, torch.Tensor

    # No contract check of its own: the op it calls is checked by the C++ kernel (eager) or by the
    # fake kernel (tracing), both against the same clauses and with the same message.
    def api(lhs, rhs, *, out: torch.Tensor | None = None) -> torch.Tensor:
        if type(lhs) is Tensor and type(rhs) is Tensor and out is None and policy.name == "strict":
            # What the general path below does for two plain tensors under the strict policy, without the
            # calls that would return their arguments unchanged.
            return functional(lhs, rhs)
        lhs, rhs = layout.prepare(_operands(op, lhs, rhs), broadcast=True)
        return functional(lhs, rhs) if out is None else with_out(lhs, rhs, out=out)

    api.__name__ = api.__qualname__ = op
    api.__doc__ = (f"fuel::{op}(lhs, rhs, *, out=None): elementwise {op} of same-shape, same-dtype CPU tensors, "
                   f"the contract of torch.ops.fuel.{op} enforced and the layout policy applied. A Python number "
                   f"on either side is a tensor of the other operand's dtype, broadcast to its shape (under every "
                   f"policy), as torch treats a number next to a tensor.")
    return api


# Kernels of the Tensor_Scalar / Scalar_Tensor overloads (csrc/schemas.cpp): they exist only to refuse a
# Python number given to the raw op with a message that names the API that takes one. Registered for every
# backend at once (CompositeImplicitAutograd), so eager calls, fake tensors and tracing all see the same error.
_REFUSALS = torch.library.Library("fuel", "IMPL")


def _register_number_refusals(op: str) -> None:
    def refusal(arg: str):
        def kernel(lhs, rhs):
            number = rhs if arg == "rhs" else lhs
            raise TypeError(
                f"fuel::{op}: argument '{arg}' is the number {number!r}, but the raw op takes tensors only "
                f"(its strict schema: fuel::{op}(Tensor lhs, Tensor rhs) -> Tensor). Fix: call fuel_torch.{op}, "
                f"which takes a number as a tensor of the other operand's dtype and shape, or pass a tensor.")
        return kernel

    _REFUSALS.impl(f"{op}.Tensor_Scalar", refusal("rhs"), "CompositeImplicitAutograd")
    _REFUSALS.impl(f"{op}.Scalar_Tensor", refusal("lhs"), "CompositeImplicitAutograd")


for _op in OPS:
    _register_fakes(_op)
    _register_number_refusals(_op)
API = {op: _make_api(op) for op in OPS}



def parity(contract: Contract, numel: int = 4099, seed: int = 0) -> tuple[bool, str]:
    """A live check of one kernel against its torch op on random data, for `python -m fuel_torch`."""
    generator = torch.Generator().manual_seed(seed)
    lhs, rhs = ((torch.randn(numel, generator=generator, dtype=torch.float64) * 4).to(contract.dtype)
                for _ in range(2))
    if contract.op == "pow":
        lhs = lhs.abs()  # keep most results finite and away from NaN
    ours = getattr(torch.ops.fuel, contract.op)(lhs, rhs)
    theirs = TORCH_EQUIVALENT[contract.op](lhs, rhs)
    name = f"torch.{TORCH_EQUIVALENT[contract.op].__name__}"
    if contract.op == "pow":
        # Both sides are within 1 ulp of the correctly rounded power, so at most 2 apart.
        worst = int(reference.ulp_distance(ours, theirs).max())
        return worst <= 2, f"within {worst} ulp of {name}"
    same = reference.bit_equal(ours, theirs)
    return same, f"bit-identical to {name}" if same else f"DIFFERS from {name}"


def example_call(op: str, dtype: torch.dtype) -> tuple[tuple, dict]:
    """A small valid call of fuel::`op` in `dtype` (any dtype: used to probe what a kernel accepts)."""
    lhs = torch.linspace(0.5, 2.0, 7, dtype=torch.float64).to(dtype)
    return (lhs, lhs.flip(0).contiguous()), {}
