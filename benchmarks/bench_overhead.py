"""Per-call cost of a fuel op against torch's own op: `python benchmarks/bench_overhead.py`.

The same call reached three ways, timed in interleaved repeats (fuel_torch.timing.interleaved_medians):
`torch.ops.fuel.<op>.default(...)`, `torch.ops.aten.<op>.<overload>(...)` (torch's op through the same generic
torch.ops path) and the torch function itself (`torch.add`, ...: torch's fast binding). Both with grad mode off
(`torch.no_grad`) and on with no input requiring grad. The ratio that measures what fuel adds is fuel / aten:
the torch.ops path itself costs the same for both (issue 8 target: <= 1.1 at n = 1).
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import torch.nn.functional as TF

import fuel_torch  # noqa: F401  (registers torch.ops.fuel)
from fuel_torch.timing import interleaved_medians, machine_line

F, A = torch.ops.fuel, torch.ops.aten


def cases(numel: int):
    """name -> (fuel call, aten call through torch.ops, torch function call)."""
    a = torch.rand(numel) + 0.5
    b = torch.rand(numel) + 0.5
    yield "add", (lambda: F.add.default(a, b), lambda: A.add.Tensor(a, b), lambda: torch.add(a, b))
    yield "pow", (lambda: F.pow.default(a, b), lambda: A.pow.Tensor_Tensor(a, b), lambda: torch.pow(a, b))
    # A small conv: one 4x4 image, 2 -> 2 channels, 3x3 (numel selects the batch: 1 or 1000 images would be
    # a different benchmark, so the conv row is the same for every numel and printed once).
    if numel == 1:
        x, w = torch.rand(1, 2, 4, 4), torch.rand(2, 2, 3, 3)
        conv_args = ([1, 1], [0, 0], [1, 1], 1)
        yield "conv2d 1x2x4x4", (lambda: F.conv2d.default(x, w, None, *conv_args),
                                 lambda: A.conv2d.default(x, w, None, *conv_args),
                                 lambda: TF.conv2d(x, w))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 1000])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sample-ms", type=float, default=20.0, help="length of one timed sample")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_line())
    print(f"median of {args.repeats} interleaved repeats of {args.sample_ms:g} ms samples; ratios within one row's run")
    print(f"{'op':16} {'numel':>6} {'grad mode':9} {'fuel us':>8} {'aten us':>8} {'torch.fn us':>11} "
          f"{'fuel/aten':>9} {'fuel/torch.fn':>13}")
    for numel in args.sizes:
        for name, (fuel, aten, function) in cases(numel):
            for mode in ("no_grad", "enabled"):
                with torch.no_grad() if mode == "no_grad" else contextlib.nullcontext():
                    t = interleaved_medians({"fuel": fuel, "aten": aten, "fn": function}, repeats=args.repeats,
                                            sample_s=args.sample_ms / 1e3)
                print(f"{name:16} {numel:>6} {mode:9} {t['fuel'] * 1e6:8.2f} {t['aten'] * 1e6:8.2f} "
                      f"{t['fn'] * 1e6:11.2f} {t['fuel'] / t['aten']:9.2f} {t['fuel'] / t['fn']:13.2f}")


if __name__ == "__main__":
    main()
