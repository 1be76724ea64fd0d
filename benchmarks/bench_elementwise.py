"""fuel::<op>.out against torch's op with out=, side by side: `python benchmarks/bench_elementwise.py`.

Both sides are called through their .out form (fuel's `torch.ops.fuel.<op>.out`, torch's
`torch.<op>(a, b, out=o)`) so the figures compare kernels, not the autograd layer. Medians of
interleaved repeats (fuel_torch.timing); ratio = fuel / torch, below 1.0 means fuel is faster. The
default run covers the targets of issue "Speed I" and marks each row against its target.
Options: --sizes 65536 4194304, --ops add pow, --dtypes float32, --threads N, --repeats R.
"""
from __future__ import annotations

import argparse

import torch

import fuel_torch  # noqa: F401  (registers torch.ops.fuel)
from fuel_torch.elementwise import OPS, TORCH_EQUIVALENT
from fuel_torch.timing import interleaved_medians, machine_line

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
HALVES = (torch.bfloat16, torch.float16)


def target(op: str, dtype: torch.dtype, numel: int) -> float | None:
    """The issue's target ratio for this row (None: no target at this size)."""
    if op in ("pow", "rem"):
        return 0.5 if numel >= 65_536 else None
    if numel == 65_536:
        return 0.9
    if numel >= 4_000_000:
        return 0.8 if dtype in HALVES else 0.95
    return None


def operands(op: str, dtype: torch.dtype, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(numel)
    lhs = torch.rand(numel, generator=g, dtype=torch.float64) + 0.5
    rhs = torch.rand(numel, generator=g, dtype=torch.float64) * (4 if op == "pow" else 1) + 0.5
    return lhs.to(dtype), rhs.to(dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[65_536, 4_194_304])
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    misses = 0
    for op in args.ops:
        print(machine_line())
        print(f"fuel::{op}.out vs torch out=, median of {args.repeats} interleaved repeats")
        print(f"{'op':8} {'dtype':9} {'numel':>9} {'fuel us':>10} {'torch us':>10} {'fuel/torch':>10} {'target':>7}")
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            for numel in args.sizes:
                lhs, rhs = operands(op, dtype, numel)
                out_fuel, out_torch = torch.empty_like(lhs), torch.empty_like(lhs)
                fuel_out, torch_op = getattr(torch.ops.fuel, op).out, TORCH_EQUIVALENT[op]
                medians = interleaved_medians({
                    "fuel": lambda: fuel_out(lhs, rhs, out=out_fuel),
                    "torch": lambda: torch_op(lhs, rhs, out=out_torch),
                }, repeats=args.repeats)
                ratio = medians["fuel"] / medians["torch"]
                goal = target(op, dtype, numel)
                verdict = "" if goal is None else f"<={goal} {'met' if ratio <= goal else 'MISSED'}"
                misses += goal is not None and ratio > goal
                print(f"{op:8} {dtype_name:9} {numel:>9} {medians['fuel'] * 1e6:>10.2f} "
                      f"{medians['torch'] * 1e6:>10.2f} {ratio:>10.2f} {verdict:>7}", flush=True)
        print()
    print(f"{misses} rows missed their target")


if __name__ == "__main__":
    main()
