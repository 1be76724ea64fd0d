"""The audit of one contract set: every selected kernel through every check, plus the machine."""
from __future__ import annotations

import datetime
import fnmatch
import hashlib
import os
import platform
import sys
import time
import traceback
from typing import Callable, Iterable

import torch

import fuel_torch
from fuel_torch.contracts import Contract, ContractSet, installed
from fuel_torch import families
from fuel_torch.costmodel import CALIBRATION_FORMAT, machine_key
from fuel_torch.timing import cpu_model

from . import conformance, determinism, precision, timing

CHECKS = ("conformance", "precision", "determinism", "cost")


def select(contracts: ContractSet, patterns: Iterable[str] | None) -> list[Contract]:
    """Kernels by name or glob (`add_f32`, `pow_*`); every registrable one when no pattern is given."""
    patterns = list(patterns or [])
    if not patterns:
        return list(contracts.registrable)
    chosen = [c for c in contracts.registrable if any(fnmatch.fnmatchcase(c.kernel, p) for p in patterns)]
    unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(c.kernel, p) for c in contracts.registrable)]
    if unknown:
        names = ", ".join(c.kernel for c in contracts.registrable)
        raise KeyError(f"no registrable kernel matches {unknown} in {contracts.directory}; known: {names}")
    return chosen


def audit_kernel(contract: Contract, level: str, checks: Iterable[str], max_threads: int | None = None,
                 roofs: timing.Roofs | None = None) -> dict:
    entry = {"kernel": contract.kernel, "op": f"fuel::{contract.op}", "dtype": str(contract.dtype).replace("torch.", ""),
             "contract_file": contract.source}
    missing = families.missing_kernel(contract.op)
    if missing:  # e.g. a convolution contract audited against a build without the conv kernels
        entry.update(skipped=f"skipped: {missing}", verdict="skipped", failed_claims=[])
        return entry
    family = families.probes(contract.op)
    runners: dict[str, Callable[[], dict]] = {
        "conformance": lambda: conformance.audit(contract, family),
        "precision": lambda: precision.audit(contract, family, level),
        "determinism": lambda: determinism.audit(contract, family, level, max_threads),
        "cost": lambda: timing.audit(contract, family, level, roofs),
    }
    failed: list[str] = []
    for check in CHECKS:
        if check not in checks:
            continue
        start = time.perf_counter()
        try:
            result = runners[check]()
        except Exception as error:  # noqa: BLE001 - a crashing check is a finding, not a Judge crash
            result = {"verdict": "fail", "failed_claims": [f"{check}: the check crashed: {type(error).__name__}: {error}"],
                      "traceback": traceback.format_exc()}
        result["seconds"] = round(time.perf_counter() - start, 3)
        entry[check] = result
        failed += result.get("failed_claims", [])
    entry["failed_claims"] = failed
    entry["verdict"] = "fail" if failed else "pass"
    return entry


def machine_facts() -> dict:
    facts = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
             "cpu_capability": torch.backends.cpu.get_cpu_capability(), "calibration_key": machine_key(),
             "platform": platform.platform(), "python": sys.version.split()[0], "hostname": platform.node()}
    facts["id"] = hashlib.sha256(f"{facts['hostname']}|{facts['cpu']}|{facts['cpu_count']}".encode()).hexdigest()[:16]
    return facts


def calibration_of(report: dict) -> dict:
    """The measured cost values in the form fuel_torch.cost reads and a contract's cost block carries."""
    kernels = {}
    for entry in report["kernels"]:
        cost = entry.get("cost")
        if not cost or "ours" not in cost:
            continue
        kernels[entry["kernel"]] = {"op": entry["op"], "dtype": entry["dtype"], "basis": cost["basis"],
                                    "launch_overhead_s": cost["ours"]["launch_overhead_s"],
                                    "per_second": cost["ours"]["per_second"], "unit": cost["unit"],
                                    "rate": cost["ours"]["rate"]}
        theirs = cost.get("torch") or {}
        if "launch_overhead_s" in theirs and "per_second" in theirs:  # the planner weighs both sides
            kernels[entry["kernel"]]["torch"] = {"launch_overhead_s": theirs["launch_overhead_s"],
                                                 "per_second": theirs["per_second"], "basis": cost["basis"]}
    machine = report["machine"]
    return {"format": CALIBRATION_FORMAT, "key": machine["calibration_key"], "created": report["created"],
            "torch": report["torch"], "machine_id": machine["id"], "machine": {k: machine[k] for k in ("cpu", "cpu_count", "torch_threads")},
            "level": report["level"], "contiguize": machine.get("measured", {}).get("contiguize"), "kernels": kernels}


def cost_block(entry: dict, report: dict) -> dict | None:
    """A `cost:` block a contract could carry, with the calibration folded in (the Judge never edits one)."""
    cost = entry.get("cost")
    if not cost or "ours" not in cost:
        return None
    return {"provenance": "judge_measured", "class": cost["class"], "flops": cost["formulas"]["flops"],
            "bytes_moved": cost["formulas"]["bytes_moved"],
            "memory": {"device_bytes": 0, "host_bytes": cost["formulas"]["host_bytes"], "disk_bytes": 0},
            "calibration": {"model": f"seconds = launch_overhead_s + {cost['basis']} / per_second",
                            "launch_overhead_s": cost["ours"]["launch_overhead_s"],
                            "per_second": cost["ours"]["per_second"],
                            f"achieved_{cost['unit'].replace('/', 'p')}": cost["ours"]["rate"],
                            "measured_on": {"cpu": report["machine"]["cpu"],
                                            "threads": report["machine"]["torch_threads"],
                                            "torch": report["torch"], "date": report["created"]}}}


def run(contracts: ContractSet, patterns: Iterable[str] | None = None, level: str = "default",
        checks: Iterable[str] = CHECKS, progress: Callable[[str], None] = lambda line: None,
        max_threads: int | None = None) -> dict:
    checks = tuple(c for c in CHECKS if c in set(checks))
    chosen = select(contracts, patterns)
    report = {"format": "fuel-torch-judge/1", "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "level": level, "checks": list(checks), "contracts": contracts.directory,
        "contracts_are_installed": os.path.realpath(contracts.directory) == os.path.realpath(installed().directory),
        "torch": torch.__version__, "fuel_torch": _version(), "machine": machine_facts(), "kernels": []}
    start, load_start = time.perf_counter(), _load()
    roofs = timing.Roofs(level) if "cost" in checks else None
    if roofs is not None:
        progress("measuring the machine (DRAM bandwidth, compute peaks, contiguize copy) ...")
        report["machine"]["measured"] = timing.machine(level, roofs)
    for number, contract in enumerate(chosen, start=1):
        began = time.perf_counter()
        entry = audit_kernel(contract, level, checks, max_threads, roofs)
        entry["seconds"] = round(time.perf_counter() - began, 3)
        if (block := cost_block(entry, report)) is not None:
            entry["cost_block"] = block
        report["kernels"].append(entry)
        verdicts = " ".join(f"{check} {entry[check]['verdict']}" for check in checks if check in entry)
        progress(f"[{number:>2}/{len(chosen)}] {contract.kernel:<22} {entry['verdict'].upper():<4} "
                 f"{verdicts or entry.get('skipped', '')} ({entry['seconds']:.1f}s)")
    report["machine"]["load_average"] = [round(load_start, 2), round(_load(), 2)]
    if roofs is not None:  # the roofs the kernels' points were judged against, measured as they asked
        report["machine"]["measured"]["roofs"] = roofs.as_dict()
    audited = {(c.op, c.dtype) for c in contracts.registrable}
    report["uncovered"] = sorted(f"{c.kernel} (fuel::{c.op} {c.dtype})" for c in installed().registrable
                                 if (c.op, c.dtype) not in audited)
    failed = [f"{e['kernel']}: {claim}" for e in report["kernels"] for claim in e["failed_claims"]]
    report["summary"] = {"kernels": len(chosen), "failed_kernels": sum(e["verdict"] == "fail" for e in report["kernels"]),
                         "skipped_kernels": [f"{e['kernel']}: {e['skipped']}" for e in report["kernels"] if "skipped" in e],
                         "failed_claims": failed, "passed": not failed,
                         "seconds": round(time.perf_counter() - start, 1)}
    if "cost" in checks:
        report["calibration"] = calibration_of(report)
    return report


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this platform
        return 0.0


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("fuel-torch")
    except Exception:  # noqa: BLE001 - running from a source tree without metadata
        return "unknown"
