"""fuel::<op> versus the torch op, side by side: `python benchmarks/bench_elementwise.py`.

Prints median time per call for both (interleaved repeats) and the ratio fuel/torch: below 1.0
means fuel is faster. Options: --sizes 1000 1000000, --ops add pow, --dtypes float32, --threads N.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import fuel_torch  # noqa: F401  (registers torch.ops.fuel)
from fuel_torch.elementwise import OPS, TORCH_EQUIVALENT

sys.path.insert(0, str(Path(__file__).parent))
from timing import compare  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000, 4_000_000])
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, median of {args.repeats} interleaved repeats")
    print(f"{'op':8} {'dtype':9} {'numel':>9} {'fuel us':>10} {'torch us':>10} {'fuel/torch':>10}")
    for op in args.ops:
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            for numel in args.sizes:
                lhs = (torch.rand(numel, dtype=torch.float64) + 0.5).to(dtype)
                rhs = (torch.rand(numel, dtype=torch.float64) + 0.5).to(dtype)
                out_fuel, out_torch = torch.empty_like(lhs), torch.empty_like(lhs)
                fuel_out = getattr(torch.ops.fuel, op).out
                torch_op = TORCH_EQUIVALENT[op]
                ours, theirs = compare(lambda: fuel_out(lhs, rhs, out=out_fuel),
                                       lambda: torch_op(lhs, rhs, out=out_torch), args.repeats)
                print(f"{op:8} {dtype_name:9} {numel:>9} {ours * 1e6:>10.2f} {theirs * 1e6:>10.2f} "
                      f"{ours / theirs:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
