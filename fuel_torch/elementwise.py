"""The elementwise binary family: fuel::add, sub, mul, div, maximum, minimum, pow, rem.

One place per concern: the contract check (shared with the fake kernels), the fake kernels
torch.compile traces with, and the Python API that applies the layout policy.
"""
from __future__ import annotations

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


def _make_api(op: str):
    packet = getattr(torch.ops.fuel, op)

    # No contract check of its own: the op it calls is checked by the C++ kernel (eager) or by the
    # fake kernel (tracing), both against the same clauses and with the same message.
    def api(lhs: torch.Tensor, rhs: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        lhs, rhs = layout.prepare((lhs, rhs), broadcast=True)
        return packet.default(lhs, rhs) if out is None else packet.out(lhs, rhs, out=out)

    api.__name__ = api.__qualname__ = op
    api.__doc__ = (f"fuel::{op}(lhs, rhs, *, out=None): elementwise {op} of same-shape, same-dtype CPU tensors, "
                   f"the contract of torch.ops.fuel.{op} enforced and the layout policy applied.")
    return api


for _op in OPS:
    _register_fakes(_op)
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
