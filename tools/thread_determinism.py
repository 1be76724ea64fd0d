"""Bits against thread counts on a machine with many cores: `python tools/thread_determinism.py`.

The test suite checks 1, 2 and 3 threads (its machines have 2 cores). This script runs every
benchmark convolution (benchmarks/bench_convolution.py's shapes, forward and the three gradients,
NCHW and channels_last inputs) and every elementwise op at 1 thread and at each count up to the
machine's cores (2, 3, 4, 6, 8, 12, 16, ...), and reports any output whose bits differ from the
1-thread one. Exit status 1 if any does.

Options: --threads 1 2 4 8 (the counts to compare), --dtypes float32 bfloat16 (default: all four).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

import fuel_torch
from fuel_torch import reference
from fuel_torch.elementwise import OPS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_convolution import DTYPES, SHAPES  # noqa: E402

FORMATS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}


def default_counts() -> list[int]:
    cores = os.cpu_count() or 1
    return sorted({c for c in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if c <= cores} | {cores})


def conv_results(op, x, w, b, geometry) -> list[torch.Tensor]:
    """The output and the gradients of x, w and b for a fixed upstream gradient."""
    x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
    out = getattr(fuel_torch, op)(x, w, b, **geometry)
    grad = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).reshape(out.shape).to(out.dtype)
    out.backward(grad)
    return [out.detach(), x.grad, w.grad, b.grad]


def conv_cases(dtypes):
    generator = torch.Generator().manual_seed(0)
    for name, op, x_shape, w_shape, geometry in SHAPES:
        for dtype_name in dtypes:
            dtype = DTYPES[dtype_name]
            x = torch.randn(x_shape, generator=generator).to(dtype)
            w = torch.randn(w_shape, generator=generator).to(dtype)
            cout = w_shape[0] if op == "conv2d" else w_shape[1] * geometry.get("groups", 1)
            b = torch.randn(cout, generator=generator).to(dtype)
            for fmt_name, fmt in FORMATS.items():
                xf = x.contiguous(memory_format=fmt)
                yield f"{name} {dtype_name} {fmt_name}", lambda op=op, xf=xf, w=w, b=b, g=geometry: conv_results(
                    op, xf, w, b, g)


def elementwise_cases(dtypes):
    generator = torch.Generator().manual_seed(1)
    for op in OPS:
        for dtype_name in dtypes:
            dtype = DTYPES[dtype_name]
            lhs = (torch.rand(1 << 20, generator=generator, dtype=torch.float64) * 4 - 2).to(dtype)
            rhs = (torch.rand(1 << 20, generator=generator, dtype=torch.float64) * 4 - 2).to(dtype)
            yield f"{op} {dtype_name} 1M", lambda op=op, lhs=lhs, rhs=rhs: [getattr(torch.ops.fuel, op)(lhs, rhs)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=default_counts())
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    args = parser.parse_args()
    counts = sorted(set(args.threads) | {1})
    print(f"{fuel_torch.cpu_capability()} kernels, torch {torch.__version__}, {os.cpu_count()} cores; threads {counts}")
    previous = torch.get_num_threads()
    differing = 0
    try:
        for name, run in [*conv_cases(args.dtypes), *elementwise_cases(args.dtypes)]:
            torch.set_num_threads(1)
            expected = run()
            bad = []
            for count in counts[1:]:
                torch.set_num_threads(count)
                got = run()
                bad += [f"{count} threads, result {i}" for i, (e, g) in enumerate(zip(expected, got))
                        if not reference.bit_equal(e, g)]
            differing += bool(bad)
            print(f"{'DIFFERS' if bad else 'same   '} {name}" + (f": {'; '.join(bad)}" if bad else ""), flush=True)
    finally:
        torch.set_num_threads(previous)
    print(f"{differing} case(s) with bits that depend on the thread count")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
