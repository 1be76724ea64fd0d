"""The planner: `torch.compile(model, backend="fuel")` routes an unmodified model's ATen ops onto fuel
kernels where the contracts allow it and the cost model says it pays (backend.py), and
`fuel_torch.plan_report()` says what went where and why (report.py).

The backends are registered with torch under "fuel" and "fuel_inductor" exactly once, whichever way torch
finds them first: through this package's `torch_dynamo_backends` entry points (torch.compile without
`import fuel_torch`), or through `import fuel_torch`, which offers torch the same entry without
registering it (a second registration under one name is an error in torch 2.13).
"""
from __future__ import annotations

from .backend import Options, fuel, fuel_inductor, plan_graph
from .report import Decision, PlanReport, plan_report, plan_reports

BACKENDS = {"fuel": fuel, "fuel_inductor": fuel_inductor}


class _EntryPoint:
    """What torch's registry keeps for a backend it has not loaded yet (an importlib entry point's .load())."""

    def __init__(self, name: str):
        self.name = name

    def load(self):
        return BACKENDS[self.name]


def offer_backends() -> None:
    from torch._dynamo.backends import registry

    for name in BACKENDS:
        if name not in registry._COMPILER_FNS:
            registry._BACKENDS[name] = _EntryPoint(name)


offer_backends()

__all__ = ["Decision", "Options", "PlanReport", "fuel", "fuel_inductor", "plan_graph", "plan_report", "plan_reports"]
