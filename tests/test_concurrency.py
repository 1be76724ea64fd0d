"""The ops from 8 Python threads at once, with torch.set_num_threads changing between calls: every
result bit-identical to the same call made serially.

torch.ops calls release the GIL, so the kernels (and their own at::parallel_for teams) really run
side by side; torch.set_num_threads is changed by the threads themselves while others compute.
Both families, every op and dtype, functional and .out, sizes that do and do not split into tasks.
"""
from __future__ import annotations

import random
import threading

import pytest
import torch

from elementwise_cases import DTYPES, OPS, cross, random_pair
from fuel_torch.reference import bit_equal

THREADS = 8
ROUNDS = 3


def operands(op: str, dtype: torch.dtype, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random operands with the special-value cross product at the front."""
    lhs, rhs = random_pair(numel, dtype, numel, op)
    special_lhs, special_rhs = cross(dtype)
    count = min(numel, len(special_lhs))
    lhs[:count], rhs[:count] = special_lhs[:count], special_rhs[:count]
    return lhs, rhs


def calls() -> list[tuple[str, object]]:
    """(name, zero-argument call) for every op and dtype, small and large enough to be split."""
    made = []
    for dtype in DTYPES:
        for op in OPS:
            packet = getattr(torch.ops.fuel, op)
            for numel in (33, 200_003):
                lhs, rhs = operands(op, dtype, numel)
                made.append((f"{op} {dtype} {numel}", lambda p=packet, a=lhs, b=rhs: p(a, b)))
                made.append((f"{op}.out {dtype} {numel}",
                             lambda p=packet, a=lhs, b=rhs: p.out(a, b, out=torch.empty_like(a))))
        generator = torch.Generator().manual_seed(1)
        x = torch.randn(2, 12, 19, 17, generator=generator, dtype=torch.float64).to(dtype)
        w = torch.randn(18, 4, 3, 3, generator=generator, dtype=torch.float64).to(dtype)
        wt = torch.randn(12, 6, 3, 3, generator=generator, dtype=torch.float64).to(dtype)
        b = torch.randn(18, generator=generator, dtype=torch.float64).to(dtype)
        made.append((f"conv2d {dtype}", lambda x=x, w=w, b=b: torch.ops.fuel.conv2d(x, w, b, [2, 1], [1, 1], [1, 2], 3)))
        made.append((f"conv_transpose2d {dtype}", lambda x=x, w=wt, b=b: torch.ops.fuel.conv_transpose2d(
            x, w, b, [2, 2], [1, 0], [1, 0], 3, [1, 1])))
        made.append((f"conv2d.out {dtype}", lambda x=x, w=w, b=b: torch.ops.fuel.conv2d.out(
            x, w, b, [1, 1], [0, 0], [1, 1], 3, out=torch.empty(2, 18, 17, 15, dtype=x.dtype))))
    return made


def test_eight_threads_with_changing_thread_counts_match_serial_calls():
    work = calls()
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = [call() for _, call in work]
        start = threading.Barrier(THREADS)
        mismatches: list[str] = []
        errors: list[BaseException] = []

        def worker(index: int) -> None:
            rng = random.Random(index)
            order = list(range(len(work))) * ROUNDS
            rng.shuffle(order)
            try:
                start.wait()
                for position, k in enumerate(order):
                    torch.set_num_threads(1 + (index + position) % 4)
                    name, call = work[k]
                    if not bit_equal(call(), serial[k]):
                        mismatches.append(f"thread {index}: {name}")
            except BaseException as error:  # noqa: BLE001 - reported by the main thread
                errors.append(error)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        torch.set_num_threads(previous)
    assert not errors, errors
    assert not mismatches, mismatches[:20]
    assert len(work) >= 80


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_thread_count_never_changes_a_bit_nan_payloads_included(dtype):
    """The parity suite's thread-count test uses finite data; this one has every special value."""
    previous = torch.get_num_threads()
    differ = []
    try:
        for op in OPS:
            lhs, rhs = operands(op, dtype, 200_003)
            torch.set_num_threads(1)
            single = getattr(torch.ops.fuel, op)(lhs, rhs)
            for count in (2, 3, 4):
                torch.set_num_threads(count)
                if not bit_equal(single, getattr(torch.ops.fuel, op)(lhs, rhs)):
                    differ.append((op, count))
    finally:
        torch.set_num_threads(previous)
    assert not differ, differ


def test_the_comparison_can_fail():
    """bit_equal tells apart results that differ in one NaN payload or one signed zero."""
    a = torch.tensor([0.0, float("nan")])
    b = a.clone()
    b.view(torch.int32)[1] += 1
    assert not bit_equal(a, b)
    assert not bit_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
