"""Cost audit: time each kernel and its torch twin across sizes, fit overhead + rate, check every
figure against the machine's roof for that size.

Timing is fuel_torch.timing's (torch.utils.benchmark, ours and torch's interleaved, medians), at the
Judge's level: quick, default or full repeats and sample lengths. The model fitted to the medians
is `seconds = launch_overhead + amount / rate`, with `amount` the contract's `bytes_moved`
(bandwidth classes: rate in GB/s) or `flops` (compute classes such as conv: rate in GFLOP/s), by
least squares on relative residuals so a 1 us call counts as much as a 10 ms one.

Roofs. A kernel cannot move bytes faster than the machine streams them at the same working-set
size and thread count, nor compute faster than the machine's matmul in its dtype or its vectors'
multiply-adds, whichever is faster. So the bandwidth
roof is measured at each point's own working set (the contract's `bytes_moved`: in cache for a
small call, DRAM for a large one), with the bytes counted the way the contracts count them, and
the compute roof per dtype. A figure above its roof is a measurement error (a clock, frequency or
load artefact), not a result: the point is measured again, and so is its roof; a figure still
above is marked unreliable, with why, and left out of the fit.
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable

import numpy as np
import torch

from fuel_torch import _C, timing as clock
from fuel_torch.contracts import Contract
from fuel_torch.costmodel import bind, formula_names, formula_values
from fuel_torch.expr import ExprError

LEVEL = {"quick": dict(repeats=3, sample_s=5e-4), "default": dict(repeats=7, sample_s=2e-3),
         "full": dict(repeats=15, sample_s=5e-3)}
RECHECK_LEVEL = "full"  # a figure above its roof is measured again with the most repeats
COMPUTE_CLASSES = ("conv", "matmul", "gemm")
# Two medians of the same quantity differ by a few per cent on a quiet machine; a figure within
# this factor of its roof is within the noise of the two measurements, not above the roof.
ROOF_TOLERANCE = 1.10
# A bandwidth roof needs the streaming time to stand out of the per-call floor; below this share
# of the call the working set is too small to bound (the point is overhead-bound, not checked).
MIN_STREAMING_SHARE = 0.1
TORCH_GRAIN = 32_768  # elements per task of torch's TensorIterator loops (at::internal::GRAIN_SIZE)
HALVES = (torch.bfloat16, torch.float16)


def basis_of(contract: Contract) -> str:
    kind = str(contract.cost.get("class", ""))
    return "flops" if any(word in kind for word in COMPUTE_CLASSES) else "bytes_moved"


def measure_pair(ours: Callable[[], Any], theirs: Callable[[], Any], level: str) -> tuple[float, float]:
    """Median seconds per call of ours and theirs, interleaved."""
    return clock.compare(ours, theirs, **LEVEL[level])


def measure_single(fn: Callable[[], Any], level: str, threads: int | None = None) -> float:
    return clock.interleaved_medians({"fn": fn}, threads=threads, **LEVEL[level])["fn"]


# ---- the roofs -----------------------------------------------------------------------------------

def _kib(nbytes: float) -> str:
    return f"{nbytes / 1024:.0f} KiB" if nbytes < 1 << 20 else f"{nbytes / (1 << 20):.1f} MiB"


def last_level_cache_bytes() -> int | None:
    sizes = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in os.listdir(base):
            try:
                with open(f"{base}/{index}/size", encoding="utf-8") as f:
                    text = f.read().strip()
            except OSError:
                continue
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
    except (OSError, ValueError):
        return None
    return max(sizes) if sizes else None


class Roofs:
    """The machine's roofs at the sizes and thread count the kernels are measured at.

    `bandwidth(working_set)`: GB/s of the best of torch's streaming kernels (add with out=: two
    reads and a write, as the binary contracts count `bytes_moved`; copy_: a read and a write) and
    a triad with non-temporal stores (fuel_torch._C.streaming_triad: two reads and a write that
    skips the read for ownership torch's stores pay, as fuel's elementwise kernels do past their
    caches, so torch's kernels alone understate what the memory system moves) over the same number
    of bytes, measured on first use and kept. Their per-call floor (the same
    kernels at one element) is taken off the time, so a kernel with a smaller call overhead than
    torch's is not judged against torch's overhead. Where torch's loop would run on fewer threads
    than the kernels may use (fewer than threads x 32768 elements), the roof is also the threads x
    the one-thread rate over a thread's share, whichever is higher: the roof bounds any split.
    `peak(dtype)`: GFLOP/s of torch.mm in that dtype, or of the vector multiply-add probe where
    that is higher (for bfloat16/float16 at least float32's: a half kernel may compute in float32)."""

    def __init__(self, level: str, threads: int | None = None):
        self.level = level
        self.threads = threads or torch.get_num_threads()
        self.bandwidth_table: dict[int, dict] = {}
        self.peak_table: dict[str, dict] = {}
        self._floor: dict[str, float] | None = None

    # bandwidth
    def _streams(self, working_set: int, threads: int) -> dict[str, tuple[float, float]]:
        """(bytes, seconds) of each streaming kernel over `working_set` bytes."""
        n_add, n_copy = max(1, working_set // 12), max(1, working_set // 8)
        a, b, c = torch.rand(n_add), torch.rand(n_add), torch.empty(n_add)
        src, dst = torch.rand(n_copy), torch.empty(n_copy)
        medians = clock.interleaved_medians({"add": lambda: torch.add(a, b, out=c), "copy": lambda: dst.copy_(src),
                                             "triad": lambda: _C.streaming_triad(a, b, c)},
                                            threads=threads, **LEVEL[self.level])
        return {"torch.add(out=) float32": (12 * n_add, medians["add"]),
                "torch.Tensor.copy_ float32": (8 * n_copy, medians["copy"]),
                "streaming triad float32": (12 * n_add, medians["triad"])}

    def _floors(self) -> dict[str, float]:
        if self._floor is None:
            one = self._streams(12, self.threads)  # one element each: the per-call floor
            self._floor = {name: seconds for name, (_, seconds) in one.items()}
        return self._floor

    def _measure_bandwidth(self, working_set: int) -> dict:
        floors = self._floors()
        candidates = []
        for name, (nbytes, seconds) in self._streams(working_set, self.threads).items():
            streaming = seconds - floors[name]
            if streaming > MIN_STREAMING_SHARE * seconds:
                candidates.append((nbytes / streaming / 1e9, f"{name}, {self.threads} threads"))
        if self.threads > 1 and working_set // 12 < self.threads * TORCH_GRAIN:
            share = max(12, working_set // self.threads)
            for name, (nbytes, seconds) in self._streams(share, 1).items():
                streaming = seconds - floors[name]  # the multi-thread floor: an over-estimate of the one-thread one
                if streaming > MIN_STREAMING_SHARE * seconds:
                    candidates.append((self.threads * nbytes / streaming / 1e9,
                                       f"{self.threads} x {name} on 1 thread over 1/{self.threads} of the bytes"))
        if not candidates:
            return {"bytes": working_set, "GBps": None, "by": "overhead-bound: the streaming time does not stand "
                    "out of the per-call floor at this size, so no bandwidth roof bounds it"}
        rate, by = max(candidates)
        return {"bytes": working_set, "GBps": rate, "by": by}

    def bandwidth(self, working_set: int, remeasure: bool = False) -> dict:
        working_set = int(working_set)
        entry = self.bandwidth_table.get(working_set)
        if entry is None or remeasure:
            fresh = self._measure_bandwidth(working_set)
            if entry is not None and (fresh["GBps"] is None or (entry["GBps"] or 0) >= fresh["GBps"]):
                fresh = {**entry}
            fresh["measurements"] = (entry or {}).get("measurements", 0) + 1
            self.bandwidth_table[working_set] = entry = fresh
        return entry

    # compute
    def _measure_peak(self, dtype: torch.dtype) -> dict:
        """The higher of torch.mm's rate and, for float32/float64, the vector multiply-add probe's
        (_C.peak_probe, at the kernels' level): torch.mm is no roof where its BLAS takes a narrower
        code path than our kernels (MKL runs AVX2 code on AMD CPUs: on a Zen 5 at 2 threads, float32
        210 GFLOP/s against 506 for AVX-512 multiply-adds, and our convolutions measured above it)."""
        n = {"quick": 512, "default": 1024, "full": 1536}[self.level]
        if dtype == torch.float64 or dtype in HALVES:
            n = n * 3 // 4
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        timing = {**LEVEL[self.level], "repeats": max(3, LEVEL[self.level]["repeats"] // 2)}
        seconds = clock.interleaved_medians({"mm": lambda: torch.mm(a, b)}, threads=self.threads, **timing)["mm"]
        candidates = [(2 * n**3 / seconds / 1e9, f"torch.mm {n}x{n}, {self.threads} threads")]
        if dtype in (torch.float32, torch.float64):
            rate = clock.multiply_add_peak(str(dtype).replace("torch.", ""), self.threads, _C.peak_probe, **timing)
            candidates.append((rate, f"vector multiply-adds at {_C.cpu_capability()}, {self.threads} threads"))
        rate, by = max(candidates)
        return {"GFLOPs": rate, "by": by}

    def peak(self, dtype: torch.dtype, remeasure: bool = False) -> dict:
        """The compute roof of a `dtype` kernel."""
        dtypes = [dtype] + ([torch.float32] if dtype in HALVES else [])
        entries = []
        for d in dtypes:
            name = str(d).replace("torch.", "")
            entry = self.peak_table.get(name)
            if entry is None or remeasure:
                fresh = self._measure_peak(d)
                if entry is not None and entry["GFLOPs"] >= fresh["GFLOPs"]:
                    fresh = {**entry}
                fresh["measurements"] = (entry or {}).get("measurements", 0) + 1
                self.peak_table[name] = entry = fresh
            entries.append((entry["GFLOPs"], f"{name}: {entry['by']}"))
        best = max(entries)
        return {"GFLOPs": best[0], "by": best[1]}

    def roof(self, basis: str, point: dict, dtype: torch.dtype, remeasure: bool = False) -> tuple[float | None, str]:
        """The roof for one point: (rate in GB/s or GFLOP/s, or None when none bounds it; how)."""
        if basis == "flops":
            entry = self.peak(dtype, remeasure)
            return entry["GFLOPs"], f"{entry['GFLOPs']:.3g} GFLOP/s peak ({entry['by']})"
        entry = self.bandwidth(point["bytes_moved"], remeasure)
        if entry["GBps"] is None:
            return None, entry["by"]
        return entry["GBps"], f"{entry['GBps']:.3g} GB/s at {_kib(entry['bytes'])} ({entry['by']})"

    def as_dict(self) -> dict:
        return {"threads": self.threads,
                "bandwidth_GBps_by_working_set": [self.bandwidth_table[k] for k in sorted(self.bandwidth_table)],
                "peak_GFLOPs": {k: v["GFLOPs"] for k, v in self.peak_table.items()},
                "peak_how": {k: v["by"] for k, v in self.peak_table.items()}}


# ---- the fit and the audit -----------------------------------------------------------------------

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


def _above_roof(point: dict, amount: float, roof: float | None) -> list[str]:
    if roof is None:
        return []
    return [who for who in ("ours", "torch") if isinstance(point.get(f"{who}_s"), float)
            and math.isfinite(point[f"{who}_s"]) and amount / point[f"{who}_s"] / 1e9 > roof * ROOF_TOLERANCE]


def check_roofs(points: list[dict], amounts: list[float], basis: str, dtype: torch.dtype, roofs: Roofs,
                remeasure: Callable[[int], tuple[float, float]]) -> list[str]:
    """Compare every point's figures with its roof; re-measure the ones above it (point and roof),
    mark those still above unreliable. Returns the unreliable points' reasons."""
    unit = "GFLOP/s" if basis == "flops" else "GB/s"
    reasons = []
    for index, (point, amount) in enumerate(zip(points, amounts)):
        roof, how = roofs.roof(basis, point, dtype)
        point["working_set_bytes"] = point["bytes_moved"]
        point["roof"] = {"rate": roof, "unit": unit, "how": how}
        above = _above_roof(point, amount, roof)
        if not above:
            continue
        first = {who: amount / point[f"{who}_s"] / 1e9 for who in above}
        point["ours_s"], point["torch_s"] = remeasure(index)
        roof, how = roofs.roof(basis, point, dtype, remeasure=True)
        point["roof"] = {"rate": roof, "unit": unit, "how": how}
        point["remeasured"] = {"because": ", ".join(f"{who} {rate:.3g} {unit} above the roof" for who, rate in first.items())}
        still = _above_roof(point, amount, roof)
        if still:
            figures = ", ".join(f"{'fuel' if who == 'ours' else 'torch'} {amount / point[f'{who}_s'] / 1e9:.3g} {unit}"
                                for who in still)
            point["unreliable"] = (f"{figures} above the roof {how}, measured twice: a measurement error (load, clock "
                                   "or frequency change between the kernel's and the roof's timings), not a result")
            reasons.append(f"{point['size']}: {point['unreliable']}")
    return reasons


def audit(contract: Contract, family: Any, level: str, roofs: Roofs | None = None) -> dict:
    roofs = roofs or Roofs(level)
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
    ours_fns = [lambda c=call: op(*c.tensors.values(), **c.params) for call in calls]
    torch_fns = [lambda c=call: family.torch_op(c) for call in calls]
    torch_error = ""
    try:
        family.torch_op(calls[0])
    except Exception as error:  # noqa: BLE001 - torch may lack the op for a dtype (e.g. half conv)
        torch_error = f"{family.torch_name(contract.op)} failed: {error}"

    def timed(index: int, at: str) -> tuple[float, float]:
        if torch_error:
            return measure_single(ours_fns[index], at), float("nan")
        return measure_pair(ours_fns[index], torch_fns[index], at)

    for index, point in enumerate(points):
        point["ours_s"], point["torch_s"] = timed(index, level)
    unreliable = check_roofs(points, amounts, basis, contract.dtype, roofs, lambda index: timed(index, RECHECK_LEVEL))
    reliable = [i for i, p in enumerate(points) if "unreliable" not in p]
    used = reliable if len(reliable) >= 2 else list(range(len(points)))
    ours_fit = fit([amounts[i] for i in used], [points[i]["ours_s"] for i in used])
    torch_fit = fit([amounts[i] for i in used], [points[i]["torch_s"] for i in used]) if not torch_error else None
    unit, scale = ("GFLOP/s", 1e9) if basis == "flops" else ("GB/s", 1e9)
    largest = points[-1]
    result = {
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
        "unreliable": unreliable,
        "verdict": "measured",
        "failed_claims": [],
    }
    if unreliable:
        result["fit_points"] = [points[i]["size"] for i in used]
    return result


# ---- the machine ---------------------------------------------------------------------------------

def machine(level: str, roofs: Roofs) -> dict:
    """DRAM bandwidth (a working set of 4x the last-level cache), the float32/float64 peaks, and the
    contiguize copy fit. The per-size roofs are added by the kernels' audits as they need them."""
    cache = last_level_cache_bytes() or 32 << 20
    dram = roofs.bandwidth(min(max(4 * cache, 64 << 20), 1 << 30))
    for dtype in (torch.float32, torch.float64):
        roofs.peak(dtype)
    # The layout policy's contiguize step: materializing a strided view (read + write).
    sizes = [1 << 10, 1 << 16, 1 << 20, 1 << 22]
    views = [torch.randn(2 * n)[::2] for n in sizes]
    medians = [measure_single(lambda v=v: v.clone(memory_format=torch.contiguous_format), level) for v in views]
    contiguize = fit([2 * n * 4 for n in sizes], medians)
    return {"dram_bandwidth_GBps": dram["GBps"], "dram_working_set_bytes": dram["bytes"],
            "last_level_cache_bytes": cache, "contiguize": contiguize,
            "how": "bandwidth roofs: the best of torch add(out=) and copy_ (float32) over the same working set as "
                   "each kernel point, read + write bytes counted as the contracts' bytes_moved, per-call floor "
                   "taken off, at the kernels' thread count; DRAM: 4x the last-level cache; peak: median torch.mm "
                   "per dtype; contiguize: clone of a stride-2 float32 view, fitted like the kernels"}
