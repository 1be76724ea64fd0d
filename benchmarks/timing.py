"""Interleaved timing: ours and torch's alternate within each repeat, medians compared."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def per_call_seconds(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def calls_for(fn: Callable[[], object], budget_s: float = 0.02) -> int:
    """Enough back-to-back calls for one timing to last about budget_s."""
    fn()
    once = per_call_seconds(fn, 3)
    return max(1, int(budget_s / max(once, 1e-7)))


def compare(ours: Callable[[], object], theirs: Callable[[], object], repeats: int = 15) -> tuple[float, float]:
    """Median seconds per call of `ours` and `theirs`, measured alternately."""
    calls = min(calls_for(ours), calls_for(theirs))
    ours_times, theirs_times = [], []
    for _ in range(repeats):
        ours_times.append(per_call_seconds(ours, calls))
        theirs_times.append(per_call_seconds(theirs, calls))
    return statistics.median(ours_times), statistics.median(theirs_times)
