"""Judge probes for the elementwise binary family (fuel::add ... fuel::rem, schema `op(lhs, rhs)`)."""
from __future__ import annotations

import numpy as np
import torch

from fuel_torch import elementwise
from fuel_torch.contracts import Contract, InputClause

from .exact import pow64, round_to
from .probes import Call

OPS = elementwise.OPS
NAMES = ("lhs", "rhs")
SIZES = {  # precision corpus (random part), determinism probe, cost sizes
    "quick": dict(corpus=2048, determinism=100_003, cost=[256, 16_384, 1 << 20]),
    "default": dict(corpus=32_768, determinism=200_003, cost=[1, 256, 4096, 65_536, 1 << 20, 1 << 22]),
    "full": dict(corpus=1 << 20, determinism=1_000_003, cost=[1, 64, 1024, 16_384, 262_144, 1 << 20, 1 << 22, 1 << 24]),
}
# NaNs with a payload, and negative NaNs, as unsigned bit patterns.
NAN_BITS = {torch.float32: [0x7FC00001, 0xFFC00000, 0x7FC12345], torch.float64: [0x7FF8000000000001, 0xFFF8000000000000],
            torch.bfloat16: [0x7FC1, 0xFFC0], torch.float16: [0x7E01, 0xFE00]}
INT_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
            torch.float16: torch.int16}


def torch_op(call: Call) -> torch.Tensor:
    return elementwise.TORCH_EQUIVALENT[call.op](call.tensors["lhs"], call.tensors["rhs"])


def torch_name(op: str) -> str:
    return f"torch.{elementwise.TORCH_EQUIVALENT[op].__name__}"


def _random(dtype: torch.dtype, shape, generator: torch.Generator, op: str) -> torch.Tensor:
    t = torch.randn(shape, generator=generator, dtype=torch.float64) * 3
    return (t.abs() if op == "pow" else t).to(dtype)


def base_call(contract: Contract, shape=(5, 7), seed: int = 0) -> Call:
    generator = torch.Generator().manual_seed(seed)
    return Call(contract.op, {name: _random(contract.dtype, shape, generator, contract.op) for name in NAMES})


def positive_calls(contract: Contract) -> list[tuple[str, Call]]:
    """Inputs the contract accepts beyond the base call: every rank of `rank: any`, zero elements."""
    calls = []
    if all(clause.rank is None for clause in contract.inputs):
        for shape in [(), (1,), (0,), (3, 0, 2), (2, 3, 4), (1, 2, 1, 3, 1, 2)]:
            calls.append((f"rank: any (shape {list(shape)})", base_call(contract, shape)))
    return calls


def shape_violations(contract: Contract, clause: InputClause, base: Call) -> list[tuple[str, Call]] | None:
    """Inputs breaking `clause.shape_constraint`; None when the constraint is not one this family knows."""
    partner = clause.same_as
    if partner is None or partner not in base.tensors:
        return None
    t = base.tensors[clause.name]
    wider = torch.cat([t, t[..., :1]], dim=-1)
    leading = t.unsqueeze(0)  # torch would broadcast this one; the contract does not
    return [(f"{clause.name} {list(wider.shape)} vs {partner} {list(t.shape)}", base.with_tensor(clause.name, wider)),
            (f"{clause.name} {list(leading.shape)} vs {partner} {list(t.shape)} (broadcastable)",
             base.with_tensor(clause.name, leading))]


def param_violations(contract: Contract, base: Call) -> list[tuple[str, Call]]:
    return []  # the schema has no parameters


def expected_shape(rule: str, call: Call):
    return None  # only same_as(<input>) rules, handled generically


# ---- precision -----------------------------------------------------------------------------------

def _specials(dtype: torch.dtype) -> torch.Tensor:
    info = torch.finfo(dtype)
    mantissa = {torch.float32: 24, torch.float64: 53, torch.bfloat16: 8, torch.float16: 11}[dtype]
    values = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0,
              1.5, -2.5, 0.1, -7.25, 10.0, 1e-3, 1e3, info.max, -info.max, info.tiny, -info.tiny,
              info.smallest_normal - info.tiny / 2 ** (mantissa - 1),  # largest subnormal
              info.tiny / 2 ** (mantissa - 1), -info.tiny / 2 ** (mantissa - 1),  # smallest subnormal
              1 + info.eps, 1 - info.eps / 2, 2.0 ** (mantissa - 1), 2.0 ** (mantissa - 1) - 1, -(2.0 ** mantissa)]
    plain = torch.tensor(values, dtype=torch.float64).to(dtype)
    width = torch.finfo(dtype).bits
    signed = [b - (1 << width) if b >> (width - 1) else b for b in NAN_BITS[dtype]]
    nans = torch.tensor(signed, dtype=INT_VIEW[dtype]).view(dtype)
    return torch.cat([plain, nans])


def _random_bits(dtype: torch.dtype, n: int, generator: torch.Generator) -> torch.Tensor:
    info = torch.iinfo(INT_VIEW[dtype])
    return torch.randint(info.min, info.max, (n,), generator=generator, dtype=torch.int64).to(INT_VIEW[dtype]).view(dtype)


def _op_specific(op: str, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 operands aimed at each op's hard cases."""
    def randn():
        return torch.randn(n, generator=generator, dtype=torch.float64)

    def uniform(lo, hi):
        return lo + (hi - lo) * torch.rand(n, generator=generator, dtype=torch.float64)

    if op == "pow":
        half = n // 2
        base = torch.cat([uniform(0, 4)[:half], randn()[: n - half] * 2])
        exponent = torch.cat([uniform(-12, 12)[:half], torch.randint(-12, 13, (n - half,), generator=generator).double()])
        near_one = torch.rand(n, generator=generator) < 0.1
        base = torch.where(near_one, 1 + randn() * 1e-3, base)
        exponent = torch.where(near_one, randn() * 1000, exponent)
        return base, exponent
    if op == "rem":
        divisor = randn() * 10 ** uniform(-2, 2)
        multiple = torch.round(randn() * 10 ** uniform(0, 6))
        dividend = divisor * multiple * (1 + randn() * 1e-7 * (torch.rand(n, generator=generator) < 0.5))
        return dividend, divisor
    if op in ("add", "sub"):
        lhs = randn() * 10 ** uniform(-6, 6)
        close = lhs * (1 + randn() * 1e-6)
        return lhs, -close if op == "add" else close
    if op in ("maximum", "minimum"):
        lhs = torch.round(randn() * 4) / 2
        return lhs, torch.where(torch.rand(n, generator=generator) < 0.3, -lhs, torch.round(randn() * 4) / 2)
    scale = 2.0 ** torch.randint(-160, 160, (n,), generator=generator).double()
    return randn() * scale, randn() / scale  # mul/div: overflow, underflow, subnormal results


def precision_corpus(contract: Contract, level: str, seed: int = 1234) -> list[Call]:
    """One flat call: every pair of special values, random bit patterns, scaled normals and the op's
    own hard cases, in the contract's dtype."""
    dtype, op = contract.dtype, contract.op
    generator = torch.Generator().manual_seed(seed)
    specials = _specials(dtype)
    lhs = [specials.repeat_interleave(len(specials))]
    rhs = [specials.repeat(len(specials))]
    n = SIZES[level]["corpus"] // 4
    lhs.append(_random_bits(dtype, n, generator))
    rhs.append(_random_bits(dtype, n, generator))
    for _ in range(2):
        scale = 10 ** (8 * torch.rand(n, generator=generator, dtype=torch.float64) - 4)
        lhs.append((torch.randn(n, generator=generator, dtype=torch.float64) * scale).to(dtype))
        rhs.append((torch.randn(n, generator=generator, dtype=torch.float64) * scale).to(dtype))
    a, b = _op_specific(op, n, generator)
    lhs.append(a.to(dtype))
    rhs.append(b.to(dtype))
    return [Call(op, {"lhs": torch.cat(lhs), "rhs": torch.cat(rhs)}, note="corpus")]


def reference(call: Call) -> torch.Tensor:
    """The correctly rounded result in the operands' dtype (maximum/minimum: the operand the
    contract's rule picks, bit for bit)."""
    lhs, rhs, op = call.tensors["lhs"], call.tensors["rhs"], call.op
    if op in ("maximum", "minimum"):
        pick_rhs = (rhs > lhs) if op == "maximum" else (rhs < lhs)
        return torch.where(torch.isnan(lhs), lhs, torch.where(torch.isnan(rhs) | pick_rhs, rhs, lhs))
    a, b = lhs.double().numpy(), rhs.double().numpy()
    with np.errstate(all="ignore"):
        if op == "add":
            exact = a + b
        elif op == "sub":
            exact = a - b
        elif op == "mul":
            exact = a * b
        elif op == "div":
            exact = a / b
        elif op == "rem":
            m = np.fmod(a, b)  # exact in every dtype
            exact = np.where((m != 0) & ((m < 0) != (b < 0)), m + b, m)
        elif op == "pow":
            exact = pow64(a, b) if lhs.dtype == torch.float64 else np.power(a, b)
        else:
            raise KeyError(op)
    # float64 + - * / and the rem correction are IEEE operations, so correctly rounded for f64; for
    # narrower types the float64 value is exact or carries >= 2p+2 bits, so one rounding is right.
    return round_to(exact, lhs.dtype)


REFERENCE_NOTE = {
    "pow": "correctly rounded pow: float64 pow rounded once (f32/halves); mpmath 160-bit rounded once (f64)",
    "rem": "exact: fmod (exact) plus one correctly rounded correction, rounded once",
    "maximum": "the operand the contract's rule selects (NaN first, then larger, lhs on ties)",
    "minimum": "the operand the contract's rule selects (NaN first, then smaller, lhs on ties)",
}


def reference_note(op: str) -> str:
    return REFERENCE_NOTE.get(op, f"IEEE {op} in float64, rounded once to the dtype (correctly rounded)")


# ---- determinism and cost ------------------------------------------------------------------------

def determinism_call(contract: Contract, level: str) -> Call:
    return base_call(contract, (SIZES[level]["determinism"],), seed=7)


def cost_calls(contract: Contract, level: str) -> list[Call]:
    return [base_call(contract, (n,), seed=11) for n in SIZES[level]["cost"]]


def size_label(call: Call) -> str:
    return f"n={call.tensors['lhs'].numel()}"
