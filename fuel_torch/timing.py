"""The one timing helper for benchmarks/ and the Judge: interleaved medians on torch.utils.benchmark.

Rules every figure of this project follows: each callable is warmed up, then timed in repeats in
which all callables take turns (the order rotates between repeats, so none always runs first on a
cold cache or after a neighbour's thread wake-up); each sample is a torch.utils.benchmark
measurement of a fixed number of back-to-back calls sized so one sample lasts about `sample_s`; the
median over repeats is reported. Ratios are taken between callables of the same run only; the
benchmarks also print the range of the ratio over the repeats, since this project's machines are
shared VMs whose neighbours move a single repeat by tens of per cent.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
from typing import Callable, Mapping

import torch
import torch.utils.benchmark as benchmark


def _timer(fn: Callable[[], object], threads: int) -> benchmark.Timer:
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)


def _calls_per_sample(timer: benchmark.Timer, sample_s: float) -> int:
    once = timer.timeit(1).median
    if once < sample_s / 4:  # one short call is mostly clock noise: average a few before sizing
        once = timer.timeit(max(2, min(1000, int(sample_s / 4 / max(once, 1e-8))))).median
    return max(1, min(100_000, int(sample_s / max(once, 1e-8))))


def interleaved_samples(fns: Mapping[str, Callable[[], object]], *, repeats: int = 7, sample_s: float = 2e-3,
                        threads: int | None = None) -> dict[str, list[float]]:
    """Seconds per call of each callable in each of the interleaved repeats, in repeat order, at
    `threads` threads (default: torch's current count): entry i of two callables' lists were
    measured side by side, so their ratio shows how far one repeat's ratio strays."""
    threads = threads or torch.get_num_threads()
    names = list(fns)
    timers = {name: _timer(fns[name], threads) for name in names}
    for name in names:  # warm-up: first-touch allocation, lazy initialisation, weight packing
        timers[name].timeit(1)
    calls = {name: _calls_per_sample(timers[name], sample_s) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]
        for name in order:
            samples[name].append(timers[name].timeit(calls[name]).median)
    return samples


def interleaved_medians(fns: Mapping[str, Callable[[], object]], **kwargs) -> dict[str, float]:
    """Median seconds per call of each callable over interleaved repeats (interleaved_samples)."""
    return {name: statistics.median(values) for name, values in interleaved_samples(fns, **kwargs).items()}


def ratio_range(ours: list[float], theirs: list[float]) -> tuple[float, float]:
    """The lowest and highest ratio ours / theirs of one repeat (lists from interleaved_samples)."""
    ratios = [a / b for a, b in zip(ours, theirs)]
    return min(ratios), max(ratios)


def compare(ours: Callable[[], object], theirs: Callable[[], object], **kwargs) -> tuple[float, float]:
    """Median seconds per call of `ours` and `theirs`, interleaved (see interleaved_medians)."""
    medians = interleaved_medians({"ours": ours, "theirs": theirs}, **kwargs)
    return medians["ours"], medians["theirs"]


# Rounds of the multiply-add probe per call: about 0.4 ms of a 264 GFLOP/s float32 core.
PROBE_ITERATIONS = 200_000


def multiply_add_peak(dtype: str, threads: int | None = None, probe: Callable[[str, int], float] | None = None,
                      **kwargs) -> float:
    """GFLOP/s of the vector multiply-add probe (`probe`, default fuel_torch._C.peak_probe: fuel's
    level, 'float32' or 'float64') at `threads` threads (default: torch's count), timed by
    interleaved_medians with `kwargs`. The probe runs its rounds on each of torch's threads, so its
    count is taken per thread at this process's count and scaled to `threads`."""
    if probe is None:
        from fuel_torch import _C

        probe = _C.peak_probe
    threads = threads or torch.get_num_threads()
    per_thread = probe(dtype, PROBE_ITERATIONS) / torch.get_num_threads()
    seconds = interleaved_medians({"probe": lambda: probe(dtype, PROBE_ITERATIONS)}, threads=threads, **kwargs)["probe"]
    return per_thread * threads / seconds / 1e9


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_line() -> str:
    """One line naming what a figure was measured on: CPU model, cores, capability levels, torch."""
    import fuel_torch

    fuel_level = getattr(fuel_torch, "cpu_capability", lambda: "n/a")()
    return (f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs); torch {torch.__version__} capability "
            f"{torch.backends.cpu.get_cpu_capability()}; fuel capability {fuel_level}; "
            f"threads {torch.get_num_threads()}" + isa_cap_note())


# The environment that runs both sides at one instruction-set level on a CPU that has a higher one:
# our kernels (FUEL_CPU_CAPABILITY), ATen's own kernels (ATEN_CPU_CAPABILITY), oneDNN (torch's
# convolutions, and the brgemm kernel our float paths call) and MKL. A proxy for a CPU that stops at
# that level, not a measurement of one: the caches, the clock and the execution ports stay this CPU's.
ISA_CAPS: dict[str, dict[str, str]] = {
    "AVX2": {"FUEL_CPU_CAPABILITY": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "DEFAULT": {"FUEL_CPU_CAPABILITY": "DEFAULT", "ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}


def add_isa_option(parser) -> None:
    """A benchmark's --isa option: `native`, or a level of ISA_CAPS to re-run at (rerun_with)."""
    parser.add_argument("--isa", choices=["native", *ISA_CAPS], default="native",
                        help="run torch and ours at this level (fuel_torch.timing.ISA_CAPS): a proxy for a CPU "
                             "without the higher ones")


def isa_cap_note() -> str:
    """The machine line's note where oneDNN's ISA is capped (ISA_CAPS), else nothing."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    return f"; ISA capped (oneDNN {cap}, MKL {os.environ.get('MKL_ENABLE_INSTRUCTIONS', 'uncapped')})" if cap else ""


def rerun_with(environment: Mapping[str, str]) -> None:
    """Re-executes this script with `environment` added to its own, unless it has it already: the
    variables take effect only when the libraries load (the allocator's tunables, ISA_CAPS)."""
    if any(os.environ.get(name) != value for name, value in environment.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **environment})
