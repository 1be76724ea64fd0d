"""`python -m fuel_torch judge` / `fuel-judge`: audit the contracts, print the table, write judge.json.

Exit status: 0 when every audited claim holds, 1 when any fails, 2 on a usage error.
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import fuel_torch
from fuel_torch.contracts import ContractFormatError, load_contracts
from fuel_torch.costmodel import calibration_path, save_calibration

from . import audit, report


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fuel_torch judge",
        description="Audit every claim of the FKC contracts against the fuel kernels by measurement: conformance "
                    "(accept/return clauses on the eager op, the Python API and the fake kernel), precision (vs a "
                    "correctly rounded reference), determinism (16 repeats, every thread count) and cost (fitted "
                    "launch overhead + GB/s or GFLOP/s, next to torch). Exits 1 when any claim fails.")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", const="quick", dest="level",
                      help="CI-sized corpus and timings (well under a minute for every kernel)")
    size.add_argument("--full", action="store_const", const="full", dest="level",
                      help="the thorough corpus (1M-element precision corpus, more sizes and repeats)")
    p.add_argument("--kernel", action="append", metavar="NAME",
                   help="audit only this kernel (e.g. add_f32; globs such as 'pow_*' work); repeatable")
    p.add_argument("--contracts", metavar="DIR",
                   help="audit the *.fkc.md files of DIR (a draft) instead of the installed contracts; the kernels "
                        "still enforce the installed ones, so a wrong claim in the draft shows up as a failure")
    p.add_argument("--out", metavar="DIR", help="where judge.json and roofline.png go (default: a fresh ./judge-<time>/)")
    p.add_argument("--checks", default=",".join(audit.CHECKS),
                   help=f"comma-separated subset of {','.join(audit.CHECKS)} (default: all)")
    p.add_argument("--threads", type=int, metavar="N", help="highest thread count for the determinism check "
                   "(default: os.cpu_count())")
    p.add_argument("--no-save-calibration", action="store_true",
                   help="do not store the measured cost model for fuel_torch.cost (one entry per CPU model and "
                        "capability in $FUEL_TORCH_CALIBRATION, else ~/.cache/fuel_torch/calibration.json)")
    p.set_defaults(level="default")
    return p


def _out_dir(requested: str | None) -> Path:
    if requested:
        path = Path(requested)
        path.mkdir(parents=True, exist_ok=True)
        return path
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(f"judge-{stamp}")
    suffix = 1
    while path.exists():
        path, suffix = Path(f"judge-{stamp}-{suffix}"), suffix + 1
    path.mkdir(parents=True)
    return path


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    unknown = sorted(set(checks) - set(audit.CHECKS))
    if unknown or not checks:
        print(f"judge: unknown checks {unknown}; choose from {', '.join(audit.CHECKS)}", file=sys.stderr)
        return 2
    try:
        contracts = load_contracts(args.contracts) if args.contracts else fuel_torch.installed()
        audit.select(contracts, args.kernel)
    except (ContractFormatError, KeyError) as error:
        print(f"judge: {error.args[0] if isinstance(error, KeyError) else error}", file=sys.stderr)
        return 2
    out = _out_dir(args.out)
    print(f"judge: auditing {contracts.directory} ({args.level}); results go to {out.resolve()}", file=sys.stderr)

    def progress(line: str) -> None:
        print(f"judge: {line}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    result = audit.run(contracts, args.kernel, args.level, checks, progress, args.threads)
    result["command"] = ["judge", *(argv if argv is not None else sys.argv[1:])]
    result["warnings"] = [w for w in [report.busy_warning(result)] if w]
    why_no_png = report.roofline(result, out / "roofline.png")
    result["roofline"] = "roofline.png" if why_no_png is None else why_no_png
    if "calibration" in result and not args.no_save_calibration:
        if result["contracts_are_installed"]:
            result["calibration_saved_to"] = str(save_calibration(result["calibration"]))
        else:
            result["calibration_saved_to"] = None  # a draft's formulas must not calibrate fuel_torch.cost
    report.write_json(result, out / "judge.json")
    print(report.table(result))
    print(f"\njudge.json: {(out / 'judge.json').resolve()}")
    print(f"roofline.png: {(out / 'roofline.png').resolve()}" if why_no_png is None else f"roofline.png: {why_no_png}")
    if result.get("calibration_saved_to"):
        print(f"calibration for fuel_torch.cost: {result['calibration_saved_to']}")
    print(f"judge: done in {time.perf_counter() - started:.0f}s; "
          f"{'all claims hold' if result['summary']['passed'] else 'FAILED CLAIMS above'}", file=sys.stderr)
    return 0 if result["summary"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
