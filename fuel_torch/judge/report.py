"""The Judge's outputs: the terminal table, judge.json, and roofline.png."""
from __future__ import annotations

import json
import math
from pathlib import Path

from .precision import format_ulp

ROOFLINE_HINT = "roofline.png needs matplotlib: pip install 'fuel-torch[judge]' (or pip install matplotlib)"


def busy_warning(report: dict) -> str | None:
    """Other work on the machine skews every timing; say so instead of presenting noise as a result."""
    # The load when the Judge started: later readings include the Judge's own threads.
    load, cpus = report["machine"].get("load_average", [0.0])[0], report["machine"]["cpu_count"] or 1
    if "cost" in report["checks"] and load > max(1.0, 0.5 * cpus):
        return (f"WARNING: the machine was busy (1-minute load average {load:.1f} on {cpus} CPUs at the start): cost "
                "figures and ratios include other programs' time; rerun on a quiet machine to calibrate")
    return None


def _conformance_cell(c: dict | None) -> str:
    if not c:
        return "-"
    counts = c.get("counts")
    if not counts:
        return "FAIL (crashed)"
    total = sum(counts.values())
    text = f"{counts['pass']}/{total} ok" if not counts["fail"] else f"FAIL {counts['fail']}/{total}"
    extras = [f"{counts[k]} {label}" for k, label in (("not constructible", "n/c"), ("unverified", "unverified"))
              if counts[k]]
    return text + (f" ({', '.join(extras)})" if extras else "")


def _error_text(values: dict, key: str) -> str:
    value = values.get(key)
    if value is None:
        return "-"
    if key == "max_ulp":
        return format_ulp(value)
    return f"{value:.2g} {'rel' if key == 'max_relative' else 'abs'}"


def _precision_cell(p: dict | None) -> tuple[str, str]:
    if not p:
        return "-", "-"
    if "measured" not in p:
        return "FAIL (crashed)", "-"
    declared = p["declared"]
    keys = [k for k in ("max_ulp", "max_relative", "max_absolute") if declared.get(k) is not None]
    if not keys:  # nothing declared: the natural unit (ulp; relative error of a sum in f32/f64)
        keys = ["max_relative"] if p.get("kind") == "exact" and p["measured"]["max_relative"] < 1e-5 else ["max_ulp"]
    ours = ", ".join(f"{_error_text(p['measured'], k)} <= {_claim(declared[k], k)}" if declared.get(k) is not None
                     else f"{_error_text(p['measured'], k)} (no claim)" for k in keys)
    status = {"fail": "FAIL ", "pass": "", "no claim": ""}[p["verdict"]]
    theirs = ", ".join(_error_text(p["torch"], k) for k in keys) if "max_ulp" in p["torch"] else "n/a"
    if "documented_bound" in p:
        ours += f", {p['documented_bound']['max_error_over_bound']:.2g}x documented bound"
    return status + ours, theirs


def _claim(value, key: str) -> str:
    if value is None:
        return "(no claim)"
    return f"{value} ulp" if key == "max_ulp" else f"{value:g} {'rel' if key == 'max_relative' else 'abs'}"


def _determinism_cell(d: dict | None) -> str:
    if not d:
        return "-"
    if "threads" not in d:
        return "FAIL (crashed)"
    threads = d["threads"]
    same = [n for n, ok in threads.items() if ok]
    text = f"{d['repeats_identical']}/{d['repeats']} same, threads {','.join(same) or '-'} same"
    if len(same) != len(threads):
        text += f"; DIFFERS at {','.join(n for n, ok in threads.items() if not ok)}"
    return ("FAIL " if d["verdict"] == "fail" else "") + text


def _rate(fitted: dict, unit: str) -> str:
    if not fitted or "rate" not in fitted:
        return "n/a"
    return f"{fitted['launch_overhead_s'] * 1e6:.1f}us + {fitted['rate']:.3g} {unit}"


def _cost_cells(c: dict | None) -> tuple[str, str, str]:
    if not c:
        return "-", "-", "-"
    if "ours" not in c:
        return "FAIL " + c.get("error", "crashed")[:40], "-", "-"
    ratio = c.get("time_ratio_at_largest")
    ratio_text = f"{ratio:.2f}x" if ratio else "n/a"
    if "unreliable" in c["points"][-1]:
        ratio_text += " UNRELIABLE"
    unreliable = len(c.get("unreliable", []))
    fits = f" ({unreliable} pt above roof)" if unreliable else ""
    return _rate(c["ours"], c["unit"]) + fits, _rate(c["torch"], c["unit"]), ratio_text


HEADER = ("kernel", "conformance", "precision (measured <= claim)", "torch err", "determinism",
          "cost: overhead + rate", "torch: overhead + rate", "time vs torch")


def table(report: dict) -> str:
    rows = [HEADER]
    for e in report["kernels"]:
        if "skipped" in e:
            rows.append((e["kernel"], e["skipped"], "", "", "", "", "", ""))
            continue
        precision, theirs = _precision_cell(e.get("precision"))
        ours_rate, torch_rate, ratio = _cost_cells(e.get("cost"))
        rows.append((e["kernel"], _conformance_cell(e.get("conformance")), precision, theirs,
                     _determinism_cell(e.get("determinism")), ours_rate, torch_rate, ratio))
    widths = [max(len(r[i]) for r in rows if len(r) > i) for i in range(len(HEADER))]
    lines = []
    for number, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))
    summary = report["summary"]
    machine = report["machine"]
    lines.append("")
    measured = machine.get("measured")
    if measured:
        lines += roof_lines(machine)
        unreliable = [f"{e['kernel']} {reason}" for e in report["kernels"] for reason in e.get("cost", {}).get("unreliable", [])]
        if unreliable:
            lines.append(f"UNRELIABLE timings ({len(unreliable)}; left out of the fits, not results):")
            lines += [f"  - {text}" for text in unreliable]
    if (warning := busy_warning(report)) is not None:
        lines.append(warning)
    lines.append("time vs torch: our median time / torch's at the largest size (below 1: faster). "
                 "n/c: not constructible in torch (reverse_strides).")
    if report.get("uncovered"):
        lines.append(f"not covered by {report['contracts']}: {', '.join(report['uncovered'])}")
    if summary["failed_claims"]:
        lines.append(f"FAILED CLAIMS ({len(summary['failed_claims'])}):")
        lines += [f"  - {claim}" for claim in summary["failed_claims"]]
    lines.append(f"{summary['kernels']} kernels audited from {report['contracts']} in {summary['seconds']:.0f}s "
                 f"({report['level']}); {summary['failed_kernels']} with failed claims; torch {report['torch']}")
    return "\n".join(lines)


def _gbps(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def roof_lines(machine: dict) -> list[str]:
    """The roofs every cost figure was checked against."""
    measured = machine["measured"]
    roofs = measured.get("roofs", {})
    lines = [f"machine: {machine['cpu']}, {machine['torch_threads']} threads; DRAM bandwidth "
             f"{_gbps(measured.get('dram_bandwidth_GBps'))} GB/s (working set "
             f"{measured.get('dram_working_set_bytes', 0) / (1 << 20):.0f} MiB)"]
    by_size = [r for r in roofs.get("bandwidth_GBps_by_working_set", []) if r.get("GBps") is not None]
    if by_size:
        lines.append("bandwidth roofs by working set: " + ", ".join(
            f"{_size(r['bytes'])} {r['GBps']:.1f}" for r in by_size) + " GB/s")
    peaks = roofs.get("peak_GFLOPs", {})
    if peaks:
        lines.append("compute peak GFLOP/s (torch.mm or vector multiply-adds, the higher): "
                     + ", ".join(f"{k} {v:.1f}" for k, v in peaks.items()))
    return lines


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def write_json(report: dict, path: Path) -> None:
    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return repr(value)
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    path.write_text(json.dumps(clean(report), indent=2) + "\n", encoding="utf-8")


def _bars(ax, entries: list[dict], unit: str) -> None:
    """Achieved rate at the largest size, each pair of bars under its own roof (the roof measured at
    that point's working set, or the dtype's peak); a bar measured above its roof is hatched."""
    names = [e["kernel"] for e in entries]
    scale = 1e9
    amount = "bytes_moved" if unit == "GB/s" else "flops"
    largest = [e["cost"]["points"][-1] for e in entries]
    ours = [p[amount] / p["ours_s"] / scale for p in largest]
    theirs = [p[amount] / p["torch_s"] / scale if isinstance(p.get("torch_s"), float) and math.isfinite(p["torch_s"])
              else 0.0 for p in largest]
    from matplotlib.lines import Line2D  # noqa: PLC0415 - matplotlib is optional (roofline() checked it)
    from matplotlib.patches import Patch  # noqa: PLC0415

    unreliable = ["unreliable" in p for p in largest]
    xs = list(range(len(names)))
    hatch = ["xx" if bad else "" for bad in unreliable]
    for x, value, bad in zip(xs, ours, hatch):
        ax.bar(x - 0.2, value, width=0.4, color="tab:blue", hatch=bad, edgecolor="red" if bad else None)
    for x, value, bad in zip(xs, theirs, hatch):
        ax.bar(x + 0.2, value, width=0.4, color="tab:orange", hatch=bad, edgecolor="red" if bad else None)
    roofs = [(p.get("roof") or {}).get("rate") for p in largest]
    for x, roof in zip(xs, roofs):
        if roof is not None:
            ax.plot([x - 0.45, x + 0.45], [roof, roof], color="black", linewidth=1.2)
    handles = [Patch(color="tab:blue", label="fuel kernel"), Patch(color="tab:orange", label="torch equivalent"),
               Line2D([], [], color="black", linewidth=1.2,
                      label="roof at this working set" if unit == "GB/s" else "compute peak of this dtype")]
    if any(unreliable):
        handles.append(Patch(facecolor="white", hatch="xx", edgecolor="red", label="above its roof twice: unreliable"))
    ax.set_xticks(xs, names, rotation=90, fontsize=7)
    ax.set_ylabel(f"achieved {unit} at the largest size")
    ax.legend(handles=handles, fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)


def roofline(report: dict, path: Path) -> str | None:
    """Write roofline.png; returns None on success, else the reason (matplotlib missing, no cost data).

    Panels: achieved GB/s of the bandwidth-bound kernels, each against the bandwidth roof measured
    at its own working set; achieved GFLOP/s of the compute-bound ones (convolution) against the
    compute peak of their dtype; and the classic roofline (intensity vs GFLOP/s) with every kernel,
    ours and torch's side by side, under the best cache-resident and the DRAM bandwidth."""
    measured = report["machine"].get("measured")
    entries = [e for e in report["kernels"] if e.get("cost", {}).get("points") and "ours" in e["cost"]]
    if not measured or not entries:
        return "no cost measurements in this run (roofline.png needs the cost check)"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ROOFLINE_HINT
    roofs = measured.get("roofs", {})
    dram = measured.get("dram_bandwidth_GBps") or 1.0
    cached = max([r["GBps"] for r in roofs.get("bandwidth_GBps_by_working_set", []) if r.get("GBps")] + [dram])
    peak = max(roofs.get("peak_GFLOPs", {}).values() or [1.0])
    groups = [(unit, [e for e in entries if e["cost"]["unit"] == unit]) for unit in ("GB/s", "GFLOP/s")]
    groups = [(unit, members) for unit, members in groups if members]
    fig, axes = plt.subplots(1, len(groups) + 1, figsize=(7 + 6 * len(groups), 6.5),
                             gridspec_kw={"width_ratios": [max(len(m), 4) for _, m in groups] + [12]})
    for ax, (unit, members) in zip(axes, groups):
        _bars(ax, members, unit)
    ax = axes[-1]
    intensities = []
    for e in entries:
        largest = e["cost"]["points"][-1]
        intensity = largest["flops"] / largest["bytes_moved"]
        intensities.append(intensity)
        ax.scatter([intensity], [largest["flops"] / largest["ours_s"] / 1e9], marker="o", color="tab:blue", s=14)
        if isinstance(largest.get("torch_s"), float) and math.isfinite(largest["torch_s"]):
            ax.scatter([intensity], [largest["flops"] / largest["torch_s"] / 1e9], marker="x", color="tab:orange", s=14)
        if "unreliable" in largest:  # ringed: measured above its roof twice
            for seconds in (largest["ours_s"], largest.get("torch_s")):
                if isinstance(seconds, float) and math.isfinite(seconds):
                    ax.scatter([intensity], [largest["flops"] / seconds / 1e9], marker="o", s=90,
                               facecolors="none", edgecolors="red", linewidths=1)
    lo, hi = min(intensities) / 4, max(intensities + [peak / dram]) * 4
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, cached * x) for x in xs], color="black", linewidth=1,
            label=f"roof: best in-cache {cached:.1f} GB/s, {peak:.0f} GFLOP/s")
    ax.plot(xs, [min(peak, dram * x) for x in xs], color="black", linewidth=1, linestyle="--",
            label=f"roof: DRAM {dram:.1f} GB/s")
    ax.scatter([], [], marker="o", color="tab:blue", label="fuel kernels")
    ax.scatter([], [], marker="x", color="tab:orange", label="torch equivalents")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (contract flops / bytes_moved)")
    ax.set_ylabel("achieved GFLOP/s (contract flops / median time)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"fuel-torch Judge: {report['machine']['cpu']}, {report['machine']['torch_threads']} threads, "
                 f"torch {report['torch']} ({report['created']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
