"""`python -m fuel_torch`: the CPU and the kernels' instruction-set level, then every registered kernel
with its contract and a live parity check.

`python -m fuel_torch judge ...` runs the contract audit (see fuel_torch.judge).
"""
from __future__ import annotations

import sys

import torch

import fuel_torch
from fuel_torch import families


def capability_line() -> str:
    from fuel_torch.timing import cpu_model

    return (f"CPU: {cpu_model()}; fuel kernels at {fuel_torch.cpu_capability()} (this CPU supports "
            f"{', '.join(fuel_torch.capability.supported_capabilities())}; built: "
            f"{', '.join(fuel_torch.capability.built_capabilities())}; FUEL_CPU_CAPABILITY forces one); bfloat16 "
            f"convolutions on brgemm: {fuel_torch.bfloat16_brgemm() or 'no'} (FUEL_BF16_BRGEMM=0 turns it off); float32 "
            f"convolutions on brgemm: {'yes' if fuel_torch.float_brgemm() else 'no'} (FUEL_BRGEMM=0 "
            f"turns it off); whole patches per brgemm: {'yes' if fuel_torch.patch_brgemm() else 'no'} "
            f"(FUEL_PATCH=0 turns it off); float16 div by the {fuel_torch.float16_division()} "
            "(FUEL_FLOAT16_DIVISION=reciprocal|divider chooses)")


def kernel_table() -> int:
    print(capability_line() + "\n")
    contracts = fuel_torch.installed()
    rows = [("kernel", "op", "dtype", "precision claim", "live parity check")]
    failures = 0
    for contract in contracts.registrable:
        precision = contract.precision
        claim = "exact" if precision.get("max_ulp") == 0 else (
            f"<= {precision['max_ulp']} ulp" if precision.get("max_ulp") is not None else "see contract")
        ok, detail = families.of(contract.op).parity(contract)
        failures += not ok
        rows.append((contract.kernel, f"fuel::{contract.op}", str(contract.dtype).replace("torch.", ""), claim,
                     ("ok   " if ok else "FAIL ") + detail))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for number, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if number == 0:
            print("  ".join("-" * width for width in widths))
    print(f"\n{len(rows) - 1} kernels from {contracts.directory}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {failures} parity failures")
    return 1 if failures else 0


def judge_main(argv: list[str] | None = None) -> int:
    from fuel_torch.judge.cli import main

    return main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["judge"]:
        return judge_main(argv[1:])
    if argv:
        print("usage: python -m fuel_torch            table of kernels, contracts and live parity\n"
              "       python -m fuel_torch judge ...  audit every contract claim (--help)", file=sys.stderr)
        return 2
    return kernel_table()


if __name__ == "__main__":
    sys.exit(main())
