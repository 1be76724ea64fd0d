"""Determinism audit: 16 repeated invocations byte-identical, and identical for every thread count.

The repeat count is the seeds' own evidence standard. The probe is large enough (and, for the
elementwise family, of odd length) that at::parallel_for really splits it and a vector tail exists.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from fuel_torch import reference
from fuel_torch.contracts import Contract

REPEATS = 16


def thread_counts(level: str, maximum: int | None = None) -> list[int]:
    n = maximum or os.cpu_count() or 1
    if level == "quick":
        return sorted({1, n})
    if level == "default" and n > 8:
        return sorted({1, 2, 3, 4, n // 2, n - 1, n})
    return list(range(1, n + 1))


def audit(contract: Contract, family: Any, level: str, max_threads: int | None = None) -> dict:
    call = family.determinism_call(contract, level)
    op = getattr(torch.ops.fuel, call.op)

    def once():
        return op(*call.tensors.values(), **call.params)

    first = once()
    repeats_same = sum(reference.bit_equal(once(), first) for _ in range(REPEATS - 1)) + 1
    original = torch.get_num_threads()
    per_threads = {}
    try:
        for n in thread_counts(level, max_threads):
            torch.set_num_threads(n)
            per_threads[n] = reference.bit_equal(once(), first)
    finally:
        torch.set_num_threads(original)
    claimed = contract.determinism == "same_hardware_bitwise" or bool(contract.precision.get("bit_stable_on_same_hardware"))
    deterministic = repeats_same == REPEATS and all(per_threads.values())
    failed = []
    if claimed and repeats_same != REPEATS:
        failed.append(f"determinism: {contract.determinism} ({repeats_same}/{REPEATS} repeats identical)")
    if claimed and not all(per_threads.values()):
        bad = [n for n, same in per_threads.items() if not same]
        failed.append(f"determinism: {contract.determinism} (differs with {bad} threads)")
    return {
        "claimed": {"determinism": contract.determinism,
                    "bit_stable_on_same_hardware": contract.precision.get("bit_stable_on_same_hardware")},
        "probe": family.size_label(call),
        "repeats": REPEATS,
        "repeats_identical": repeats_same,
        "threads": {str(n): same for n, same in per_threads.items()},
        "default_threads": original,
        "deterministic": deterministic,
        "failed_claims": failed,
        "verdict": "fail" if failed else ("pass" if claimed else "no claim"),
    }
