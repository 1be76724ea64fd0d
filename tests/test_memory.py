"""Memory: 100k calls of each family leave the resident set flat, and no call's peak memory exceeds
what its contract's memory block declares.

Both run in a child process, so the measurement sees nothing of the test session, with glibc told
to serve every allocation of 64 KiB or more by mmap (MALLOC_MMAP_THRESHOLD_): freed blocks go back
to the system at once, so each call's allocations show up as fresh resident pages instead of
hiding in memory an earlier call freed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CALLS = 100_000
# Growth allowed over 100k calls, after a warm-up: 2 MiB, i.e. 20 bytes per call. The warm-up lets
# torch, the allocator and the interpreter reach their steady state (caches, arenas, the dispatcher's
# lazily built tables); after it, a leak of even one small tensor per call (a TensorImpl and its
# storage are over 200 bytes) grows the resident set by more than 20 MiB over 100k calls.
RSS_SLACK = 2 << 20
# Peak allowance beyond the contract: Linux batches each thread's resident-page count and folds it
# into the process's only every 64 page faults (256 KiB), so a reading can lag or lead by that much
# per thread; plus page rounding and the interpreter's small objects made by the call itself.
PEAK_SLACK = 512 << 10

_CHILD_PRELUDE = """
import json, os, sys, torch, fuel_torch
PAGE = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE
def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
def peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
"""


def run_child(body: str) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    run = subprocess.run([sys.executable, "-c", _CHILD_PRELUDE + body], capture_output=True, text=True,
                         timeout=900, env=env, cwd=Path(__file__).parent)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


FLAT_BODY = """
# One thread: the calls stay cheap on a loaded 2-core machine (a parallel region per tiny call can
# wait a scheduling slice); the kernels run the same code, their scratch included, on one thread.
torch.set_num_threads(1)
family = {family!r}
dtypes = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
if family == "elementwise":
    ops = [getattr(torch.ops.fuel, op) for op in ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "rem")]
    operands = [(torch.rand(16, dtype=d) + 0.5, torch.rand(16, dtype=d) + 0.5) for d in dtypes]
    outs = [torch.empty(16, dtype=d) for d in dtypes]
    def call(i):
        op, k = ops[i % 8], (i // 8) % 4
        if i % 3:
            op(*operands[k])
        else:
            op.out(*operands[k], out=outs[k])
else:
    xs = [torch.rand(1, 4, 5, 5, dtype=d) for d in dtypes]
    ws = [torch.rand(4, 2, 3, 3, dtype=d) for d in dtypes]
    bs = [torch.rand(4, dtype=d) for d in dtypes]
    outs = [torch.empty(1, 4, 5, 5, dtype=d) for d in dtypes]
    def call(i):
        k = i % 4
        if i % 3 == 0:
            torch.ops.fuel.conv2d(xs[k], ws[k], bs[k], [1, 1], [1, 1], [1, 1], 2)
        elif i % 3 == 1:
            torch.ops.fuel.conv_transpose2d(xs[k], ws[k], bs[k], [1, 1], [1, 1], [0, 0], 2, [1, 1])
        else:
            torch.ops.fuel.conv2d.out(xs[k], ws[k], bs[k], [1, 1], [1, 1], [1, 1], 2, out=outs[k])
for i in range(20_000):
    call(i)
before = rss()
for i in range({calls}):
    call(i)
after = rss()
print(json.dumps({{"before": before, "after": after}}))
"""


@pytest.mark.parametrize("family", ["elementwise", "convolution"])
def test_many_calls_leave_the_resident_set_flat(family):
    measured = run_child(FLAT_BODY.format(family=family, calls=CALLS))
    growth = measured["after"] - measured["before"]
    assert growth <= RSS_SLACK, f"{family}: resident set grew by {growth} bytes over {CALLS} calls ({measured})"


def test_a_leak_would_be_seen():
    """The measurement itself: keeping one small tensor per call grows the resident set far past the slack."""
    body = FLAT_BODY.format(family="elementwise", calls=CALLS).replace(
        "for i in range(100000):\n    call(i)", "kept = []\nfor i in range(100000):\n    kept.append(torch.ones(16))")
    assert "kept.append" in body
    measured = run_child(body)
    assert measured["after"] - measured["before"] > 10 * RSS_SLACK


PEAK_BODY = """
cases = {cases!r}
results = []
torch.set_num_threads({threads})
for op, dtype_name, shapes, geometry, use_out in cases:
    dtype = getattr(torch, dtype_name)
    tensors = [torch.rand(s, dtype=torch.float64).to(dtype) for s in shapes]
    packet = getattr(torch.ops.fuel, op)
    expected_shape = tuple(packet(*tensors, **geometry).shape)  # warm-up: threads, lazy tables
    out = torch.rand(expected_shape, dtype=torch.float64).to(dtype) if use_out else None
    contract = fuel_torch.contract(op, dtype)
    host = fuel_torch.cost(op, *tensors, **geometry).host_bytes
    scratch = contract.cost["memory"].get("scratch_bytes_per_thread", 0) * torch.get_num_threads()
    reset_peak()
    base = rss()
    result = packet.out(*tensors, **geometry, out=out) if use_out else packet(*tensors, **geometry)
    extra = peak() - base
    # .out: the output exists already, so only the rest of host_bytes (packed weights) may be new.
    out_bytes = result.numel() * result.element_size()
    allowed = (host - out_bytes if use_out else host) + scratch
    results.append({{"case": f"{{op}} {{dtype_name}} out={{use_out}}", "extra": extra, "allowed": allowed,
                    "host_bytes": host}})
    del result
print(json.dumps(results))
"""

PEAK_CASES = [
    ("add", "float32", [(4_000_000,), (4_000_000,)], {}, False),
    ("add", "float32", [(4_000_000,), (4_000_000,)], {}, True),
    ("pow", "bfloat16", [(4_000_000,), (4_000_000,)], {}, False),
    ("rem", "float16", [(4_000_000,), (4_000_000,)], {}, True),
    ("conv2d", "float32", [(2, 64, 40, 40), (96, 64, 3, 3), (96,)], {"padding": [1, 1]}, False),
    ("conv2d", "bfloat16", [(2, 64, 40, 40), (96, 64, 3, 3), (96,)], {"padding": [1, 1]}, True),
    ("conv2d", "float64", [(1, 32, 30, 30), (64, 8, 5, 5), (64,)], {"groups": 4, "stride": [2, 2]}, False),
    ("conv_transpose2d", "float32", [(2, 64, 20, 20), (64, 48, 4, 4), (48,)], {"stride": [2, 2]}, False),
    ("conv_transpose2d", "float16", [(2, 64, 20, 20), (64, 48, 4, 4), (48,)], {"stride": [2, 2]}, True),
]


@pytest.mark.parametrize("threads", [1, 2])
def test_no_call_needs_more_memory_than_its_contract_declares(threads):
    """Peak resident growth of one call <= memory.host_bytes (evaluated by fuel_torch.cost for the
    call) + memory.scratch_bytes_per_thread * threads, plus PEAK_SLACK."""
    results = run_child(PEAK_BODY.format(cases=PEAK_CASES, threads=threads))
    assert len(results) == len(PEAK_CASES)
    over = [r for r in results if r["extra"] > r["allowed"] + PEAK_SLACK]
    assert not over, over
    # The measurement sees allocations: a functional call's output alone is most of its peak.
    functional = [r for r, case in zip(results, PEAK_CASES) if not case[4] and case[0] == "add"]
    assert all(r["extra"] >= 0.9 * r["host_bytes"] for r in functional), functional
