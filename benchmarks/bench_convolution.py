"""Speed of fuel::conv2d / fuel::conv_transpose2d against torch.nn.functional, as a ratio.

    python benchmarks/bench_convolution.py [--repeats 15] [--dtype float32 ...] [--threads N]

For each shape and dtype, the two ops run interleaved (ours, torch, ours, torch, ...) after a
warm-up; the table shows each side's median and ours / torch (below 1: ours is faster).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import fuel_torch

# (name, op, x shape, weight shape, geometry)
SHAPES = [
    ("3x3 64->64 56x56 N4", "conv2d", (4, 64, 56, 56), (64, 64, 3, 3), dict(padding=1)),
    ("7x7/2 stem 3->64 224x224", "conv2d", (1, 3, 224, 224), (64, 3, 7, 7), dict(stride=2, padding=3)),
    ("1x1 256->128 28x28 N4", "conv2d", (4, 256, 28, 28), (128, 256, 1, 1), dict()),
    ("3x3/2 128->256 28x28 N4", "conv2d", (4, 128, 28, 28), (256, 128, 3, 3), dict(stride=2, padding=1)),
    ("depthwise 3x3 128 56x56 N4", "conv2d", (4, 128, 56, 56), (128, 1, 3, 3), dict(padding=1, groups=128)),
    ("T 4x4/2 64->32 28x28 N4", "conv_transpose2d", (4, 64, 28, 28), (64, 32, 4, 4), dict(stride=2, padding=1)),
    ("T 3x3 32->32 56x56 N4", "conv_transpose2d", (4, 32, 56, 56), (32, 32, 3, 3), dict(padding=1)),
    ("T 3x3/2 128->64 14x14 N8", "conv_transpose2d", (8, 128, 14, 14), (128, 64, 3, 3),
     dict(stride=2, padding=1, output_padding=1)),
]
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(op: str, x, w, b, geometry: dict, repeats: int) -> tuple[float, float]:
    ours = lambda: getattr(fuel_torch, op)(x, w, b, **geometry)  # noqa: E731
    theirs = lambda: getattr(F, op)(x, w, b, **geometry)  # noqa: E731
    for fn in (ours, theirs, ours, theirs):
        fn()
    ours_t, theirs_t = [], []
    for _ in range(repeats):
        ours_t.append(seconds(ours))
        theirs_t.append(seconds(theirs))
    return statistics.median(ours_t), statistics.median(theirs_t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--dtype", action="append", choices=list(DTYPES))
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, cpu capability "
          f"{torch.backends.cpu.get_cpu_capability()}, median of {args.repeats} interleaved runs")
    rows = [("shape", "dtype", "fuel ms", "torch ms", "fuel/torch")]
    for dtype_name in args.dtype or list(DTYPES):
        dtype = DTYPES[dtype_name]
        for name, op, x_shape, w_shape, geometry in SHAPES:
            x = torch.randn(x_shape, generator=generator).to(dtype)
            w = torch.randn(w_shape, generator=generator).to(dtype)
            cout = w_shape[0] if op == "conv2d" else w_shape[1] * geometry.get("groups", 1)
            b = torch.randn(cout, generator=generator).to(dtype)
            ours, theirs = measure(op, x, w, b, geometry, args.repeats)
            rows.append((name, dtype_name, f"{ours * 1e3:.2f}", f"{theirs * 1e3:.2f}", f"{ours / theirs:.2f}"))
            print("  ".join(rows[-1]), flush=True)
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    print()
    for number, row in enumerate(rows):
        print("  ".join(cell.rjust(width) if i > 1 else cell.ljust(width) for i, (cell, width) in
                        enumerate(zip(row, widths))))
        if number == 0:
            print("  ".join("-" * width for width in widths))


if __name__ == "__main__":
    main()
