"""Per-call cost of the Python API: `python benchmarks/bench_api.py`.

fuel_torch.add against torch.add at small sizes (where the call, not the arithmetic, is the cost), next to
the raw ops reached through torch.ops (fuel's and aten's), all interleaved in one run. Ratios are to
torch.add. Options: --sizes 1 1000, --ops add mul, --repeats N, --threads N.
"""
from __future__ import annotations

import argparse

import torch

import fuel_torch
from fuel_torch import timing
from fuel_torch.elementwise import OPS, TORCH_EQUIVALENT

# The aten overload torch.ops reaches for each op with two tensors.
ATEN = {"add": "add.Tensor", "sub": "sub.Tensor", "mul": "mul.Tensor", "div": "div.Tensor",
        "maximum": "maximum.default", "minimum": "minimum.default", "pow": "pow.Tensor_Tensor",
        "rem": "remainder.Tensor"}


def _aten(op: str):
    name, overload = ATEN[op].split(".")
    return getattr(getattr(torch.ops.aten, name), overload)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 1000])
    parser.add_argument("--ops", nargs="+", default=["add"], choices=OPS)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(timing.machine_line())
    print(f"median of {args.repeats} interleaved repeats; ratio = time / torch.<op> time")
    print(f"{'op':8} {'numel':>7} {'call':34} {'us':>8} {'ratio':>7}")
    for op in args.ops:
        for numel in args.sizes:
            lhs, rhs = torch.rand(numel) + 0.5, torch.rand(numel) + 0.5
            api, torch_fn = fuel_torch.elementwise.API[op], TORCH_EQUIVALENT[op]
            raw, aten = getattr(torch.ops.fuel, op).default, _aten(op)
            calls = {
                f"torch.{torch_fn.__name__}": lambda: torch_fn(lhs, rhs),
                f"fuel_torch.{op}": lambda: api(lhs, rhs),
                f"torch.ops.aten.{ATEN[op]}": lambda: aten(lhs, rhs),
                f"torch.ops.fuel.{op}.default": lambda: raw(lhs, rhs),
            }
            medians = timing.interleaved_medians(calls, repeats=args.repeats)
            base = medians[f"torch.{torch_fn.__name__}"]
            for name, seconds in medians.items():
                print(f"{op:8} {numel:>7} {name:34} {seconds * 1e6:>8.2f} {seconds / base:>7.2f}", flush=True)


if __name__ == "__main__":
    main()
