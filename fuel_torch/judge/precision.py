"""Precision audit: measured error against a correctly rounded (or exact) reference, next to the claim.

Units: ulp distance counts representable values between result and reference; +0 vs -0 counts as 1
(a wrong signed zero is a wrong result); any NaN matches any NaN (payloads are not audited); NaN
against a number is reported as a mismatch, worse than any ulp bound. Relative error for
convolution is |ours - exact| / (sum |x*w| + |bias|): the scale the rounding error of a sum is
proportional to, so cancellation in the exact value does not make it blow up.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from fuel_torch import reference
from fuel_torch.contracts import Contract

from .probes import Call

NAN_MISMATCH = torch.iinfo(torch.int64).max


def ulp_errors(result: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    distance = reference.ulp_distance(result, ref)
    zero_sign = (result == 0) & (ref == 0) & (torch.signbit(result) != torch.signbit(ref))
    return torch.where(zero_sign, torch.ones_like(distance), distance)


def format_ulp(value: int | None) -> str:
    if value is None:
        return "-"
    return "NaN mismatch" if value >= NAN_MISMATCH else f"{value} ulp"


def _scalar(t: torch.Tensor, i: int) -> float:
    return float(t.reshape(-1)[i].double())


def _worst(call: Call, result: torch.Tensor, ref: torch.Tensor, errors: torch.Tensor) -> dict:
    i = int(torch.argmax(errors.reshape(-1)))
    entry = {"output": _scalar(result, i), "reference": _scalar(ref, i)}
    flat = {name: t.reshape(-1) for name, t in call.tensors.items() if t is not None}
    if all(t.numel() == result.numel() for t in flat.values()):  # elementwise: show the operands
        entry["inputs"] = {name: float(t[i].double()) for name, t in flat.items()}
    else:
        entry["call"] = call.describe()
    return {k: (repr(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in entry.items()}


def _accumulate(target: dict, value: torch.Tensor, ref: torch.Tensor) -> None:
    """Fold one result's errors against a same-dtype reference into running maxima."""
    if not value.numel():
        return
    target["max_ulp"] = max(target["max_ulp"], int(ulp_errors(value, ref).max()))
    finite = torch.isfinite(ref) & torch.isfinite(value)
    diff = (value.double() - ref.double()).abs()[finite]
    if diff.numel():
        target["max_absolute"] = max(target["max_absolute"], float(diff.max()))
        relative = diff / ref.double().abs()[finite]
        relative = relative[torch.isfinite(relative)]
        if relative.numel():
            target["max_relative"] = max(target["max_relative"], float(relative.max()))


def audit(contract: Contract, family: Any, level: str) -> dict:
    declared = {key: contract.precision.get(key) for key in ("max_ulp", "max_relative", "max_absolute")}
    calls = family.precision_corpus(contract, level)
    ours = {"max_ulp": 0, "max_relative": 0.0, "max_absolute": 0.0}
    theirs = {"max_ulp": 0, "max_relative": 0.0, "max_absolute": 0.0}
    worst: dict | None = None
    bound_ratio: float | None = None  # measured error / the family's documented bound, worst case
    torch_note = ""
    elements = 0
    for call in calls:
        op = getattr(torch.ops.fuel, call.op)
        result = op(*call.tensors.values(), **call.params)
        try:
            torch_result = family.torch_op(call)
        except Exception as error:  # noqa: BLE001 - e.g. a half conv torch lacks on CPU
            torch_result, torch_note = None, f"{family.torch_name(call.op)} failed: {error}"
        elements += result.numel()
        if hasattr(family, "exact_reference"):  # exact value + error scale (convolution)
            exact, scale = family.exact_reference(call)
            rounded = family.round_reference(exact, result.dtype)
            for target, value in ((ours, result), (theirs, torch_result)):
                if value is None:
                    continue
                error = np.abs(value.double().numpy().astype(exact.dtype) - exact)
                if error.size:
                    target["max_absolute"] = max(target["max_absolute"], float(error.max()))
                    relative = np.divide(error, scale, out=np.zeros_like(error), where=scale > 0)
                    target["max_relative"] = max(target["max_relative"], float(relative.max()))
                    target["max_ulp"] = max(target["max_ulp"], int(ulp_errors(value, rounded).max()))
            errors = ulp_errors(result, rounded)
            ref = rounded
            if hasattr(family, "accumulation_bound") and result.numel():
                error = np.abs(result.double().numpy().astype(exact.dtype) - exact).astype(np.float64)
                limit = family.accumulation_bound(call, result, scale)
                ratio = float(np.max(np.divide(error, limit, out=np.zeros_like(error), where=limit > 0)))
                bound_ratio = max(bound_ratio or 0.0, ratio)
        else:  # correctly rounded reference in the dtype
            ref = family.reference(call)
            errors = ulp_errors(result, ref)
            for target, value in ((ours, result), (theirs, torch_result)):
                if value is not None:
                    _accumulate(target, value, ref)
        if errors.numel() and (worst is None or int(errors.max()) > worst["ulp"]):
            worst = {"ulp": int(errors.max()), **_worst(call, result, ref, errors)}
    failed = []
    for key, bound in declared.items():
        if bound is not None and ours[key] > bound:
            failed.append(f"precision.{key}: {bound} (measured {format_ulp(ours[key]) if key == 'max_ulp' else f'{ours[key]:.3g}'})")
    bound = None
    if bound_ratio is not None:
        bound = {"what": family.BOUND_NOTE, "max_error_over_bound": bound_ratio}
        # The slack is the reference's own error relative to the bound (long double vs f64: < 2^-11).
        if bound_ratio > 1 + 2.0 ** -11:
            failed.append(f"precision.notes: the documented accumulation bound (measured {bound_ratio:.3g}x of it)")
    return {
        "declared": declared,
        **({"documented_bound": bound} if bound else {}),
        "measured": ours,
        "torch": {**theirs, "op": family.torch_name(contract.op), **({"note": torch_note} if torch_note else {})},
        "worst_case": worst,
        "elements": elements,
        "calls": len(calls),
        "reference": family.reference_note(contract.op),
        "kind": "exact" if hasattr(family, "exact_reference") else "rounded",
        "units": "ulp: +0/-0 counts 1, NaN matches NaN; relative: see fuel_torch.judge.precision",
        "failed_claims": failed,
        "verdict": "fail" if failed else ("pass" if any(v is not None for v in declared.values()) else "no claim"),
    }
