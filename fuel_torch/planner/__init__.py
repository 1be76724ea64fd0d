"""The planner: `torch.compile(model, backend="fuel")` routes an unmodified model's ATen ops onto fuel
kernels where the contracts allow it and the cost model says it pays (backend.py), and
`fuel_torch.plan_report()` says what went where and why (report.py).

torch finds the backends "fuel" and "fuel_inductor" through this package's `torch_dynamo_backends` entry
points (pyproject.toml), so torch.compile works without `import fuel_torch`, and registers each once, when
first asked for. Importing fuel_torch therefore registers nothing and does not import torch._dynamo
(seconds of import time); only where the package runs without its installed metadata (a bare source
tree) does the import offer torch the same lazy entries itself. Either way a name is registered once: a
second registration under one name is an error in torch 2.13.
"""
from __future__ import annotations

import importlib
from importlib import metadata

from .report import Decision, PlanReport, plan_report, plan_reports

BACKENDS = ("fuel", "fuel_inductor")
ENTRY_POINT_GROUP = "torch_dynamo_backends"


def __getattr__(name: str):
    # The backends and their options load with torch's compile machinery, on first use.
    if name in ("fuel", "fuel_inductor", "Options", "plan_graph"):
        return getattr(importlib.import_module(".backend", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _EntryPoint:
    """What torch's registry keeps for a backend it has not loaded yet: like an entry point, it has .load()."""

    def __init__(self, name: str):
        self.name = name

    def load(self):
        return getattr(importlib.import_module(".backend", __name__), self.name)


def _installed_entry_points() -> set[str]:
    try:
        eps = metadata.distribution("fuel-torch").entry_points
    except metadata.PackageNotFoundError:
        return set()
    return {ep.name for ep in eps if ep.group == ENTRY_POINT_GROUP}


def offer_backends() -> None:
    """Put lazy entries for the backends into torch's registry (registered by torch on first lookup)."""
    from torch._dynamo.backends import registry

    for name in BACKENDS:
        if name not in registry._COMPILER_FNS:
            registry._BACKENDS[name] = _EntryPoint(name)


if not set(BACKENDS) <= _installed_entry_points():
    offer_backends()

__all__ = ["Decision", "PlanReport", "fuel", "fuel_inductor", "offer_backends", "plan_report", "plan_reports"]
