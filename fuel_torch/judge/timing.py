"""Cost audit: time each kernel and its torch twin across sizes, fit overhead + rate, measure the machine.

Timing follows the benchmarks' rules: warm-up first, ours and torch's interleaved within every
repeat (alternating who goes first), the median of the repeats kept. Small calls run in a batch
per sample so the clock's resolution does not dominate. The model fitted to the medians is
`seconds = launch_overhead + amount / rate`, with `amount` the contract's `bytes_moved` (bandwidth
classes: rate in GB/s) or `flops` (compute classes such as conv: rate in GFLOP/s), by least squares
on relative residuals so a 1 us call counts as much as a 10 ms one.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import numpy as np
import torch

from fuel_torch.cost import bind, formula_names, formula_values
from fuel_torch.contracts import Contract

from .expr import ExprError

LEVEL = {"quick": dict(repeats=3, sample_s=5e-4), "default": dict(repeats=7, sample_s=2e-3),
         "full": dict(repeats=15, sample_s=5e-3)}
COMPUTE_CLASSES = ("conv", "matmul", "gemm")


def basis_of(contract: Contract) -> str:
    kind = str(contract.cost.get("class", ""))
    return "flops" if any(word in kind for word in COMPUTE_CLASSES) else "bytes_moved"


def _batch(fn: Callable[[], Any], sample_s: float) -> int:
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, min(10_000, int(sample_s / once)))


def _sample(fn: Callable[[], Any], batch: int) -> float:
    start = time.perf_counter()
    for _ in range(batch):
        fn()
    return (time.perf_counter() - start) / batch


def time_pairs(pairs: list[tuple[Callable, Callable]], level: str) -> list[tuple[float, float]]:
    """Median seconds per call of (ours, theirs) for each pair, interleaved."""
    settings = LEVEL[level]
    batches = []
    for ours, theirs in pairs:
        ours(), theirs()  # warm-up: first-touch allocation, lazy init
        batches.append((_batch(ours, settings["sample_s"]), _batch(theirs, settings["sample_s"])))
    samples: list[tuple[list[float], list[float]]] = [([], []) for _ in pairs]
    for repeat in range(settings["repeats"]):
        for (ours, theirs), (b_ours, b_theirs), (s_ours, s_theirs) in zip(pairs, batches, samples):
            if repeat % 2:
                s_theirs.append(_sample(theirs, b_theirs))
                s_ours.append(_sample(ours, b_ours))
            else:
                s_ours.append(_sample(ours, b_ours))
                s_theirs.append(_sample(theirs, b_theirs))
    return [(statistics.median(a), statistics.median(b)) for a, b in samples]


def fit(amounts: list[float], seconds: list[float]) -> dict:
    """Least squares of seconds = overhead + amount / rate on relative residuals; overhead >= 0."""
    x, t = np.asarray(amounts, float), np.asarray(seconds, float)
    weights = 1 / t
    design = np.stack([np.ones_like(x), x], axis=1) * weights[:, None]
    (overhead, per_unit), *_ = np.linalg.lstsq(design, t * weights, rcond=None)
    if overhead < 0 or per_unit <= 0:
        if per_unit <= 0:  # flat timings: all overhead; rate taken from the largest call
            per_unit = float(t[-1] / x[-1]) if x[-1] > 0 else float("nan")
            overhead = max(float(np.median(t - x * per_unit)), 0.0)
        else:
            overhead = 0.0
            per_unit = float(np.sum(x * t / t**2) / np.sum(x * x / t**2))
    predicted = overhead + x * per_unit
    return {"launch_overhead_s": float(overhead), "per_second": float(1 / per_unit),
            "max_relative_residual": float(np.max(np.abs(predicted - t) / t))}


def audit(contract: Contract, family: Any, level: str) -> dict:
    basis = basis_of(contract)
    calls = family.cost_calls(contract, level)
    op = getattr(torch.ops.fuel, contract.op)
    points, amounts = [], []
    try:
        for call in calls:
            out = op(*call.tensors.values(), **call.params)
            bound = bind(contract.op, tuple(call.tensors.values()), dict(call.params))
            names = formula_names(contract.op, bound, out.shape, contract.dtype)
            values = formula_values(contract, names)
            amounts.append(values[basis])
            points.append({"size": family.size_label(call), **values})
    except ExprError as error:
        return {"verdict": "fail", "failed_claims": [f"cost formula: {error}"], "error": str(error)}
    pairs = [(lambda c=call: op(*c.tensors.values(), **c.params), lambda c=call: family.torch_op(c)) for call in calls]
    try:
        timings = time_pairs(pairs, level)
        torch_error = ""
    except Exception as error:  # noqa: BLE001 - torch may lack the op for a dtype (e.g. half conv)
        torch_error = f"{family.torch_name(contract.op)} failed: {error}"
        timings = [(t, float("nan")) for t, in time_singles([p[0] for p in pairs], level)]
    for point, (ours, theirs) in zip(points, timings):
        point.update(ours_s=ours, torch_s=theirs)
    ours_fit = fit(amounts, [t for t, _ in timings])
    torch_fit = fit(amounts, [t for _, t in timings]) if not torch_error else None
    unit, scale = ("GFLOP/s", 1e9) if basis == "flops" else ("GB/s", 1e9)
    largest = points[-1]
    return {
        "basis": basis,
        "unit": unit,
        "class": contract.cost.get("class"),
        "formulas": {"flops": contract.cost.get("flops"), "bytes_moved": contract.cost.get("bytes_moved"),
                     "host_bytes": contract.cost.get("memory", {}).get("host_bytes")},
        "points": points,
        "ours": {**ours_fit, "rate": ours_fit["per_second"] / scale},
        "torch": ({**torch_fit, "rate": torch_fit["per_second"] / scale, "op": family.torch_name(contract.op)}
                  if torch_fit else {"op": family.torch_name(contract.op), "note": torch_error}),
        "time_ratio_at_largest": largest["ours_s"] / largest["torch_s"] if not torch_error else None,
        "largest": largest["size"],
        "verdict": "measured",
        "failed_claims": [],
    }


def time_singles(fns: list[Callable], level: str) -> list[tuple[float]]:
    settings = LEVEL[level]
    result = []
    for fn in fns:
        fn()
        batch = _batch(fn, settings["sample_s"])
        result.append((statistics.median(_sample(fn, batch) for _ in range(settings["repeats"])),))
    return result


# ---- the machine ---------------------------------------------------------------------------------

def machine(level: str) -> dict:
    """Memory bandwidth (a large copy), peak GFLOP/s (a large matmul), and the contiguize copy fit."""
    settings = LEVEL[level]
    elements = {"quick": 1 << 23, "default": 1 << 25, "full": 1 << 26}[level]
    src = torch.randn(elements)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy_s = statistics.median(_sample(lambda: dst.copy_(src), 1) for _ in range(settings["repeats"]))
    bandwidth = 2 * src.numel() * src.element_size() / copy_s
    del src, dst
    peak = {}
    for dtype, n in ((torch.float32, {"quick": 768, "default": 1536, "full": 2048}[level]),
                     (torch.float64, {"quick": 512, "default": 1024, "full": 1536}[level])):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.mm(a, b)
        seconds = statistics.median(_sample(lambda: torch.mm(a, b), 1) for _ in range(max(3, settings["repeats"] // 2)))
        peak[str(dtype).replace("torch.", "")] = 2 * n**3 / seconds / 1e9
    # The layout policy's contiguize step: materializing a strided view (read + write).
    sizes = [1 << 10, 1 << 16, 1 << 20, 1 << 22]
    views = [torch.randn(2 * n)[::2] for n in sizes]
    medians = [t for t, in time_singles([lambda v=v: v.clone(memory_format=torch.contiguous_format) for v in views], level)]
    contiguize = fit([2 * n * 4 for n in sizes], medians)
    return {"memory_bandwidth_GBps": bandwidth / 1e9, "peak_GFLOPs": peak, "contiguize": contiguize,
            "how": "bandwidth: median torch copy_ of a float32 tensor, read + write bytes; peak: median torch.mm; "
                   "contiguize: clone of a stride-2 float32 view, fitted like the kernels"}
