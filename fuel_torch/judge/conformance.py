"""Conformance audit: every accept clause probed both ways, and the return clause, on every path.

A probe is one call the contract either accepts (it must run on the eager op, the Python API and the
fake kernel, with the result the return clause promises) or rejects (every path must refuse it with
a contract message, `fuel::<op> [...]`; anything else, a run or a stray exception, fails the claim).
Claims the Judge cannot probe are reported as such, never as passes: `reverse_strides` (torch has
no negative strides) is "not constructible", a rule the Judge does not understand is "unverified".
"""
from __future__ import annotations

import re
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from fuel_torch import reference
from fuel_torch.contracts import Contract

from . import probes
from .probes import PATHS, Call, FakeResult

PASS, FAIL, NOT_CONSTRUCTIBLE, UNVERIFIED = "pass", "fail", "not constructible", "unverified"


class _Audit:
    def __init__(self, contract: Contract, family: Any):
        self.contract, self.family = contract, family
        self.mode = FakeTensorMode()
        self.results: list[dict] = []
        self.has_out = "out" in getattr(torch.ops.fuel, contract.op).overloads()

    def add(self, claim: str, probe: str, verdict: str, paths: dict | None = None, detail: str = "") -> None:
        entry = {"claim": claim, "probe": probe, "verdict": verdict}
        if paths:
            entry["paths"] = paths
        if detail:
            entry["detail"] = detail
        self.results.append(entry)

    def run_all(self, call: Call, out_factory=None) -> dict[str, probes.Outcome]:
        outcomes = {}
        for path in PATHS:
            out = out_factory() if out_factory else None
            outcomes[path] = probes.run(path, call, out=out, mode=self.mode)
        return outcomes

    def expect_reject(self, claim: str, probe: str, call: Call, out_factory=None) -> None:
        outcomes = self.run_all(call, out_factory)
        ok = all(not o.ran and o.contract_error for o in outcomes.values())
        self.add(claim, probe, PASS if ok else FAIL, {p: o.short() for p, o in outcomes.items()})

    def expect_accept(self, claim: str, probe: str, call: Call, expected: torch.Tensor | None = None) -> dict:
        """Every path runs; with `expected`, eager and api results equal it bit for bit."""
        outcomes = self.run_all(call)
        problems = [f"{p}: {o.short()}" for p, o in outcomes.items() if not o.ran]
        if expected is not None:
            for path in ("eager", "api"):
                o = outcomes[path]
                if o.ran and not reference.bit_equal(o.result, expected):
                    problems.append(f"{path}: ran but its values differ from the same call on contiguous copies")
        self.add(claim, probe, FAIL if problems else PASS, {p: o.short() for p, o in outcomes.items()},
                 "; ".join(problems))
        return outcomes


def _with_rank(t: torch.Tensor, rank: int) -> torch.Tensor:
    """t's elements as a contiguous tensor of `rank` dimensions (leading 1s added, trailing dims merged)."""
    if rank >= t.dim():
        return t.reshape((1,) * (rank - t.dim()) + tuple(t.shape)).contiguous()
    if rank == 0:
        return t.reshape(-1)[0].clone()
    return t.reshape(tuple(t.shape[:rank - 1]) + (-1,)).contiguous()


def _shape(result: Any) -> tuple:
    return tuple(result.shape)


def _contiguous(result: Any) -> bool:
    if isinstance(result, FakeResult):
        return result.contiguous and result.storage_offset == 0
    return result.is_contiguous() and result.storage_offset() == 0


def _shares_memory(result: torch.Tensor, tensors: dict) -> list[str]:
    if result.numel() == 0:
        return []
    return [name for name, t in tensors.items()
            if t is not None and t.numel() > 0 and torch._C._is_alias_of(result, t)]


def _expected_shape(rule: str, call: Call, family: Any) -> tuple | None:
    match = re.fullmatch(r"\s*same_as\((\w+)\)\s*", rule)
    if match and match.group(1) in call.tensors:
        return tuple(call.tensors[match.group(1)].shape)
    shape = family.expected_shape(rule, call)
    return tuple(shape) if shape is not None else None


def _expected_dtype(rule: str, call: Call) -> torch.dtype | None:
    match = re.fullmatch(r"\s*passthrough\((\w+)\)\s*", rule)
    if match and call.tensors.get(match.group(1)) is not None:
        return call.tensors[match.group(1)].dtype
    return None


# contiguous_or_channels_last: contiguous for contiguous operands (the base call), channels_last when
# an operand is channels_last (checked by the channels_last layout probe).
LAYOUT_GUARANTEES = ("contiguous", "contiguous_or_channels_last")


def _check_channels_last_result(audit: _Audit, name: str, outcomes: dict[str, probes.Outcome]) -> None:
    """contiguous_or_channels_last: a call with a channels_last operand returns a channels_last result."""
    ret = audit.contract.outputs[0]
    if ret.layout_guarantee != "contiguous_or_channels_last":
        return
    ran = {p: o.result for p, o in outcomes.items() if o.ran and isinstance(o.result, torch.Tensor)}
    bad = [p for p, r in ran.items() if not r.is_contiguous(memory_format=torch.channels_last)]
    audit.add(f"return.layout_guarantee: {ret.layout_guarantee}", f"{name} channels_last: result is channels_last",
              FAIL if bad or not ran else PASS, detail="; ".join(f"{p}: not channels_last" for p in bad))


def _check_return(audit: _Audit, call: Call, outcomes: dict[str, probes.Outcome]) -> None:
    ret = audit.contract.outputs[0]
    ran = {p: o.result for p, o in outcomes.items() if o.ran}
    if not ran:
        for clause in ("dtype_rule", "shape_rule", "layout_guarantee", "aliasing"):
            audit.add(f"return.{clause}: {getattr(ret, clause)}", "base call", UNVERIFIED,
                      detail="the base call did not run on any path")
        return
    dtype = _expected_dtype(ret.dtype_rule, call)
    if dtype is None:
        audit.add(f"return.dtype_rule: {ret.dtype_rule}", "base call", UNVERIFIED, detail="rule not understood")
    else:
        bad = [f"{p}: {r.dtype}" for p, r in ran.items() if r.dtype != dtype]
        audit.add(f"return.dtype_rule: {ret.dtype_rule}", f"result dtype is {dtype}", FAIL if bad else PASS,
                  detail="; ".join(bad))
    shape = _expected_shape(ret.shape_rule, call, audit.family)
    if shape is None:
        audit.add(f"return.shape_rule: {ret.shape_rule}", "base call", UNVERIFIED, detail="rule not understood")
    else:
        bad = [f"{p}: {list(_shape(r))}" for p, r in ran.items() if _shape(r) != shape]
        audit.add(f"return.shape_rule: {ret.shape_rule}", f"result shape is {list(shape)}", FAIL if bad else PASS,
                  detail="; ".join(bad))
    if ret.layout_guarantee not in LAYOUT_GUARANTEES:
        audit.add(f"return.layout_guarantee: {ret.layout_guarantee}", "base call", UNVERIFIED,
                  detail=f"only {' and '.join(f'`{g}`' for g in LAYOUT_GUARANTEES)} are understood")
    else:
        bad = [p for p, r in ran.items() if not _contiguous(r)]
        audit.add(f"return.layout_guarantee: {ret.layout_guarantee}", "result is contiguous with zero offset",
                  FAIL if bad else PASS, detail="; ".join(f"{p}: not contiguous" for p in bad))
    claim = f"return.aliasing: {ret.aliasing}"
    if ret.aliasing != "none":
        audit.add(claim, "base call", UNVERIFIED, detail="only `none` is understood")
        return
    bad = [f"{p}: result shares memory with {names}" for p, r in ran.items()
           if not isinstance(r, FakeResult) and (names := _shares_memory(r, call.tensors))]
    audit.add(claim, "result shares no memory with an input", FAIL if bad else PASS, detail="; ".join(bad))
    if audit.has_out and shape is not None:
        for name, t in call.tensors.items():
            if t is None:
                continue
            outcomes = {}
            for path in PATHS:  # a fresh pair per path: the input and `out` share one storage
                shared, out = probes.overlapping(t, shape)
                outcomes[path] = probes.run(path, call.with_tensor(name, shared), out=out, mode=audit.mode)
            ok = all(not o.ran and o.contract_error for o in outcomes.values())
            audit.add(claim, f"out= overlapping '{name}' is rejected", PASS if ok else FAIL,
                      {p: o.short() for p, o in outcomes.items()})


def _check_out_variant(audit: _Audit, call: Call, expected: torch.Tensor | None) -> None:
    ret = audit.contract.outputs[0]
    shape = _expected_shape(ret.shape_rule, call, audit.family)
    dtype = _expected_dtype(ret.dtype_rule, call)
    if shape is None or dtype is None:
        return
    problems, shorts = [], {}
    for path in PATHS:
        out = torch.full(shape, float("nan"), dtype=dtype)  # NaN: an element left unwritten shows
        outcome = probes.run(path, call, out=out, mode=audit.mode)
        shorts[path] = outcome.short()
        if not outcome.ran:
            problems.append(f"{path}: {outcome.short()}")
        elif path == "fake":
            if not outcome.result.is_out:
                problems.append("fake: did not return `out` itself")
        else:
            if outcome.result is not out:
                problems.append(f"{path}: did not return `out` itself")
            if expected is not None and not reference.bit_equal(out, expected):
                problems.append(f"{path}: `out` differs from the functional result")
    audit.add("accept (.out overload)", "a fresh out= of the result's shape and dtype is filled and returned",
              FAIL if problems else PASS, shorts, "; ".join(problems))
    wrong_dtype = next(d for d in (torch.float64, torch.float32) if d != dtype)
    wrong_shape = tuple(shape[:-1]) + (shape[-1] + 1,) if shape else (2,)
    bad_outs = [
        (f"return.dtype_rule: {ret.dtype_rule}", f"out= of dtype {wrong_dtype} is rejected",
         lambda: torch.empty(shape, dtype=wrong_dtype)),
        (f"return.shape_rule: {ret.shape_rule}", f"out= of shape {list(wrong_shape)} is rejected (never resized)",
         lambda: torch.empty(wrong_shape, dtype=dtype)),
    ]
    strided = probes.strided_copy(torch.empty(shape, dtype=dtype))
    if strided is not None:
        bad_outs.append((f"return.layout_guarantee: {ret.layout_guarantee}", "a strided out= is rejected",
                         lambda: probes.strided_copy(torch.empty(shape, dtype=dtype))))
    for claim, probe, factory in bad_outs:
        audit.expect_reject(claim, probe, call, out_factory=factory)


def audit(contract: Contract, family: Any) -> dict:
    a = _Audit(contract, family)
    base = family.base_call(contract)
    eager = probes.run("eager", base)
    expected = eager.result if eager.ran else None
    outcomes = a.expect_accept("accept (base call)", base.describe(), base)
    _check_return(a, base, outcomes)
    if a.has_out:
        _check_out_variant(a, base, expected)
    for claim, call in family.positive_calls(contract):
        a.expect_accept(claim, call.describe(), call)

    first = contract.inputs[0].name
    for clause in contract.inputs:
        t = base.tensors.get(clause.name)
        if t is None:
            continue
        wrong = probes.other_dtype(clause.dtypes)
        a.expect_reject(f"{clause.name}.dtypes: [{', '.join(clause.dtypes)}]", f"{clause.name} as {wrong}",
                        base.with_tensor(clause.name, t.to(wrong)))
        for flag, value in clause.layout.items():
            claim = f"{clause.name}.layout.{flag}: {value}"
            if flag in probes.NOT_CONSTRUCTIBLE:
                a.add(claim, f"{clause.name} with a negative stride", NOT_CONSTRUCTIBLE,
                      detail=probes.NOT_CONSTRUCTIBLE[flag])
                continue
            if flag == "contiguous":
                if value == "required":
                    variant = probes.strided_copy(t)
                    if variant is not None:
                        a.expect_reject(claim, f"{clause.name} non-contiguous", base.with_tensor(clause.name, variant))
                elif value == "accepted":
                    a.add(claim, "base call (contiguous operands)", a.results[0]["verdict"])
                else:
                    a.expect_reject(claim, "contiguous operands (the base call)", base)
                continue
            if flag == "channels_last" and t.dim() != 4:
                continue  # a layout of 4-d tensors only: no claim about other ranks
            variant = probes.LAYOUT_VARIANTS[flag](t)
            if variant is None:
                a.add(claim, f"{clause.name} {flag}", UNVERIFIED, detail="the base tensor is too small for this layout")
                continue
            call = base.with_tensor(clause.name, variant)
            probe = f"{clause.name} {flag}: shape {list(variant.shape)}, strides {list(variant.stride())}, " \
                    f"offset {variant.storage_offset()}"
            if value == "rejected":
                a.expect_reject(claim, probe, call)
            elif value == "accepted":
                outcomes = a.expect_accept(claim, probe, call, expected)
                if flag == "channels_last":
                    _check_channels_last_result(a, clause.name, outcomes)
            else:
                a.add(claim, probe, UNVERIFIED, detail="`required` is only meaningful for `contiguous`")
        if clause.rank is not None:
            # Ranks next to the claimed one, and the base tensor's own rank if the claim excludes it.
            for rank in sorted({clause.rank - 1, clause.rank + 1, t.dim()} - {clause.rank}):
                if rank >= 0:
                    a.expect_reject(f"{clause.name}.rank: {clause.rank}", f"{clause.name} of rank {rank}",
                                    base.with_tensor(clause.name, _with_rank(t, rank)))
        if clause.shape_constraint:
            claim = f"{clause.name}.shape_constraint: {clause.shape_constraint}"
            violations = family.shape_violations(contract, clause, base)
            if not violations:
                a.add(claim, "-", UNVERIFIED, detail="no violating input could be constructed for this constraint")
            for probe, call in violations or []:
                a.expect_reject(claim, probe, call)
        if clause.optional:
            a.expect_accept(f"{clause.name}.optional: true", f"{clause.name}=None", base.with_tensor(clause.name, None))
        if clause.name != first:
            a.expect_reject("backend: Cpu", f"{clause.name} on the meta device, '{first}' on cpu",
                            base.with_tensor(clause.name, t.to("meta")))
    everything_int = Call(base.op, {k: None if v is None else v.to(torch.int32) for k, v in base.tensors.items()},
                          dict(base.params))
    a.expect_reject("dtypes (every input int32)", "int32 operands", everything_int)
    for probe, call in family.param_violations(contract, base):
        a.expect_reject(f"op_params ({probe})", call.describe(), call)

    counts = {v: sum(r["verdict"] == v for r in a.results) for v in (PASS, FAIL, NOT_CONSTRUCTIBLE, UNVERIFIED)}
    failed = sorted({r["claim"] for r in a.results if r["verdict"] == FAIL})
    return {"probes": a.results, "counts": counts, "failed_claims": failed, "paths": list(PATHS),
            "verdict": FAIL if failed else PASS}
