"""fuel::<op>.out against torch's op with out=, side by side: `python benchmarks/bench_elementwise.py`.

Every side is called through its .out form, so the figures compare kernels, not the autograd layer:
fuel's `torch.ops.fuel.<op>.out`, aten's own kernel reached the same way (`torch.ops.aten.<op>.out`,
the same generic `torch.ops` call path), and torch's Python function `torch.<op>(a, b, out=o)`,
whose binding skips that path (about 1-2 us less per call, which is torch's floor, not its kernel's).
Medians of interleaved repeats (fuel_torch.timing); ratios below 1.0 mean fuel is faster. The
target column of issue "Speed I" is judged on fuel/aten (kernel against kernel, same call path);
fuel/torch.fn is printed beside it, and so is the lowest and highest fuel/aten of a single repeat
("per repeat": how far the machine's noise moved it).
Options: --sizes 65536 4194304, --ops add pow, --dtypes float32, --threads N, --repeats R.
"""
from __future__ import annotations

import argparse
import statistics

import torch

import fuel_torch  # noqa: F401  (registers torch.ops.fuel)
from fuel_torch.elementwise import OPS, TORCH_EQUIVALENT
from fuel_torch.timing import ISA_CAPS, add_isa_option, interleaved_samples, machine_line, ratio_range, rerun_with

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


# aten's .out overload of each op, reached through torch.ops as fuel's is.
ATEN_OUT = {
    "add": torch.ops.aten.add.out, "sub": torch.ops.aten.sub.out, "mul": torch.ops.aten.mul.out,
    "div": torch.ops.aten.div.out, "maximum": torch.ops.aten.maximum.out, "minimum": torch.ops.aten.minimum.out,
    "pow": torch.ops.aten.pow.Tensor_Tensor_out, "rem": torch.ops.aten.remainder.Tensor_out,
}


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
    add_isa_option(parser)
    args = parser.parse_args()
    rerun_with(ISA_CAPS.get(args.isa, {}))
    torch.set_num_threads(args.threads)
    misses = 0
    for op in args.ops:
        print(machine_line())
        print(f"fuel::{op}.out vs aten::{op} .out and torch.{TORCH_EQUIVALENT[op].__name__}(out=), "
              f"median of {args.repeats} interleaved repeats")
        print(f"{'op':8} {'dtype':9} {'numel':>9} {'fuel us':>9} {'aten us':>9} {'fn us':>9} "
              f"{'fuel/aten':>9} {'per repeat':>10} {'fuel/fn':>8} {'target':>7}")
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            for numel in args.sizes:
                lhs, rhs = operands(op, dtype, numel)
                out_fuel, out_aten, out_fn = (torch.empty_like(lhs) for _ in range(3))
                fuel_out, aten_out, torch_fn = getattr(torch.ops.fuel, op).out, ATEN_OUT[op], TORCH_EQUIVALENT[op]
                samples = interleaved_samples({
                    "fuel": lambda: fuel_out(lhs, rhs, out=out_fuel),
                    "aten": lambda: aten_out(lhs, rhs, out=out_aten),
                    "fn": lambda: torch_fn(lhs, rhs, out=out_fn),
                }, repeats=args.repeats)
                medians = {name: statistics.median(values) for name, values in samples.items()}
                ratio = medians["fuel"] / medians["aten"]
                low, high = ratio_range(samples["fuel"], samples["aten"])
                goal = target(op, dtype, numel)
                verdict = "" if goal is None else f"<={goal} {'met' if ratio <= goal else 'MISSED'}"
                misses += goal is not None and ratio > goal
                us = {name: f"{seconds * 1e6:>9.2f}" for name, seconds in medians.items()}
                print(f"{op:8} {dtype_name:9} {numel:>9} {us['fuel']} {us['aten']} {us['fn']} {ratio:>9.2f} "
                      f"{f'{low:.2f}-{high:.2f}':>10} {medians['fuel'] / medians['fn']:>8.2f} {verdict:>7}", flush=True)
        print()
    print(f"{misses} rows missed their target")


if __name__ == "__main__":
    main()
