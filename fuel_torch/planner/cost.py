"""Predicted cost of both choices for one matched node: the fuel call (plus its Contiguize copies) and torch's.

Amounts (flops, bytes_moved) come from the fuel contract's formula hints, evaluated over the call's
sizes; both sides do the same arithmetic, so the same amounts price torch's op too. Seconds come from
the Judge's calibration: `launch_overhead_s + amount / per_second`, fitted per kernel for ours and, from
a judge.json, for torch's op on the same calls; a materialization costs one copy at the measured
contiguize rate. Without a calibration the plan compares bytes by the formula hints (both kernels
assumed to move bytes at the same rate, so only a Contiguize copy can tip the choice) and says so.

Under dynamic shapes, sizes are SymInts: a cost is evaluated at the symbols' hints, and at twice them to
see how the choice moves with size (see Plan.decide).
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import torch

from ..costmodel import bind, calibration_path, formula_names, formula_values, load_calibration
from ..contracts import installed

ELEMENT_BYTES = {torch.float32: 4, torch.float64: 8, torch.bfloat16: 2, torch.float16: 2}


@dataclasses.dataclass
class Calibration:
    ours: dict            # kernel -> {launch_overhead_s, per_second, basis}
    theirs: dict          # kernel -> torch's fit on the same calls
    contiguize: dict | None
    source: str

    @classmethod
    def load(cls) -> "Calibration | None":
        path = calibration_path()
        data = load_calibration(path)
        if data is None:
            return None
        theirs = {k: v["torch"] for k, v in data.get("kernels", {}).items() if isinstance(v.get("torch"), dict)}
        try:  # a judge.json holds torch's fits next to ours; a calibration file may not
            report = json.loads(path.read_text(encoding="utf-8"))
            for entry in report.get("kernels", []) if isinstance(report.get("kernels"), list) else []:
                fit = (entry.get("cost") or {}).get("torch") or {}
                if "launch_overhead_s" in fit and "per_second" in fit:
                    theirs[entry["kernel"]] = {**fit, "basis": entry["cost"]["basis"]}
        except (OSError, ValueError, KeyError, TypeError):
            pass
        machine = data.get("machine", {})
        source = f"{path} ({data.get('created', '?')}, {machine.get('cpu', '?')}, torch {data.get('torch', '?')})"
        return cls(data.get("kernels", {}), theirs, data.get("contiguize"), source)

    def covers(self, kernels: list[str]) -> bool:
        return bool(self.contiguize) and all(k in self.ours and k in self.theirs for k in kernels)


@dataclasses.dataclass
class Prediction:
    fuel: float
    aten: float
    unit: str            # "s" (calibrated) or "B" (formula hints: bytes moved)
    calibrated: bool
    detail: str = ""


def concrete(size: Any, scale: int = 1) -> int:
    """An int size: a SymInt evaluated with every symbol at `scale` times its hint."""
    if not isinstance(size, torch.SymInt):
        return int(size)
    node = size.node
    expr = node.expr
    env = node.shape_env
    hints = getattr(env, "backed_var_to_val", None) or env.var_to_val
    missing = [s for s in expr.free_symbols if s not in hints]
    if missing:
        raise ValueError(f"size {size} has no hint (data-dependent)")
    return int(expr.xreplace({s: hints[s] * scale for s in expr.free_symbols}))


def shape_of(t: torch.Tensor, scale: int = 1) -> tuple[int, ...]:
    return tuple(concrete(s, scale) for s in t.shape)


@dataclasses.dataclass
class Call:
    """One fuel kernel call of a plan, at concrete sizes."""

    op: str
    dtype: torch.dtype
    shapes: dict[str, tuple[int, ...] | None]   # tensor arguments by schema name
    params: dict[str, Any]

    def amounts(self) -> tuple[str, dict[str, float]]:
        contract = installed().get(self.op, self.dtype)
        tensors = {name: (torch.empty(shape, dtype=self.dtype, device="meta") if shape is not None else None)
                   for name, shape in self.shapes.items()}
        bound = bind(self.op, (), {**tensors, **self.params})
        out = getattr(torch.ops.fuel, self.op).default(**bound)
        names = formula_names(self.op, bound, out.shape, self.dtype)
        return contract.kernel, formula_values(contract, names)


def _seconds(entry: dict, values: dict[str, float]) -> float:
    return entry["launch_overhead_s"] + values[entry.get("basis", "bytes_moved")] / entry["per_second"]


def predict(calls: list[Call], copies: list[tuple[Any, torch.dtype]], calibration: Calibration | None) -> Prediction:
    """Fuel: the calls plus one copy per materialized operand (elements, dtype); torch: the same calls on its kernels."""
    priced = [call.amounts() for call in calls]
    copy_bytes = [2 * n * ELEMENT_BYTES[dtype] for n, dtype in copies]  # read + write, as fuel_torch.cost counts
    if calibration is not None and calibration.covers([kernel for kernel, _ in priced]):
        c = calibration.contiguize
        fuel = sum(_seconds(calibration.ours[k], v) for k, v in priced)
        fuel += sum(c["launch_overhead_s"] + b / c["per_second"] for b in copy_bytes)
        aten = sum(_seconds(calibration.theirs[k], v) for k, v in priced)
        return Prediction(fuel, aten, "s", True)
    moved = sum(v["bytes_moved"] for _, v in priced)
    return Prediction(moved + sum(copy_bytes), moved, "B", False)


def fmt(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "s":
        return f"{value * 1e6:.1f}us"
    for scale, suffix in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if value >= scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.0f}B"
