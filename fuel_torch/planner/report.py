"""The plan of one compilation: one Decision per candidate node, printable as a table."""
from __future__ import annotations

import dataclasses
import threading

from .cost import fmt


@dataclasses.dataclass
class Decision:
    graph: str                    # "forward", "backward" or "inference"
    node: str                     # the FX node name
    target: str                   # the ATen op, e.g. "aten.convolution.default"
    chosen: str                   # "fuel" or "aten"
    fuel_op: str | None           # e.g. "fuel::conv2d" (a convolution backward: "fuel::conv_transpose2d+fuel::conv2d")
    contiguized: tuple[str, ...]  # operands the plan materializes (expand + contiguous) before the fuel call
    reason: str                   # one line: why
    fuel_cost: float | None = None  # predicted cost of the fuel choice, materialization included
    aten_cost: float | None = None  # predicted cost of torch's op
    cost_unit: str = ""           # "s" (calibrated seconds) or "B" (bytes by the formula hints)
    guard: str | None = None      # the size condition a size-dependent choice holds under

    def row(self) -> tuple[str, ...]:
        return (self.graph, self.node, self.target, self.chosen, self.fuel_op or "-",
                fmt(self.fuel_cost, self.cost_unit), fmt(self.aten_cost, self.cost_unit),
                ",".join(self.contiguized) or "-", self.reason)


HEADER = ("graph", "node", "target", "chosen", "fuel op", "fuel cost", "aten cost", "contiguized", "reason")


@dataclasses.dataclass
class PlanReport:
    backend: str
    route: str
    ops: tuple[str, ...] | None
    basis: str
    decisions: list[Decision] = dataclasses.field(default_factory=list)

    def on(self, chosen: str) -> list[Decision]:
        return [d for d in self.decisions if d.chosen == chosen]

    def summary(self) -> str:
        graphs = sorted({d.graph for d in self.decisions}, key=("inference", "forward", "backward").index)
        per_graph = ", ".join(
            f"{g}: {sum(d.chosen == 'fuel' for d in self.decisions if d.graph == g)}/"
            f"{sum(d.graph == g for d in self.decisions)} on fuel" for g in graphs)
        ops = "all" if self.ops is None else ",".join(self.ops)
        return (f"fuel plan (backend={self.backend}, route={self.route}, ops={ops}): {len(self.decisions)} candidate "
                f"nodes, {len(self.on('fuel'))} on fuel, {len(self.on('aten'))} on aten"
                + (f" ({per_graph})" if per_graph else ""))

    def table(self, graph: str | None = None) -> str:
        rows = [HEADER] + [d.row() for d in self.decisions if graph is None or d.graph == graph]
        widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER) - 1)]
        return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in rows)

    def __str__(self) -> str:
        return f"{self.summary()}\ncost basis: {self.basis}\n{self.table()}"


_history: list[PlanReport] = []
_lock = threading.Lock()


def begin(report: PlanReport) -> PlanReport:
    with _lock:
        _history.append(report)
    del _history[:-32]  # a long-running process compiles many graphs; keep the recent plans only
    return report


def plan_report() -> PlanReport | None:
    """The plan of the most recent torch.compile(..., backend="fuel"/"fuel_inductor") compilation (None
    before any). A training graph's backward decisions join it when the backward compiles."""
    return _history[-1] if _history else None


def plan_reports() -> list[PlanReport]:
    """The recent plans, oldest first (one per compiled graph: a graph break makes two)."""
    return list(_history)
