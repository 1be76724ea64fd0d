"""`torch.compile(model, backend="fuel")` and `backend="fuel_inductor"`: route ATen nodes onto fuel kernels.

Both backends work on the ATen graphs aot_autograd makes (forward and backward of a training graph, or one
inference graph). For every candidate node the planner asks the contracts whether a fuel kernel may
serve it (support.py), prices both choices (cost.py), picks one by the route option, rewrites the graph
(rewrite.py) and records the decision (report.py). `fuel` then runs the graph as it is (torch's kernels
for the rest, like aot_eager); `fuel_inductor` hands it to inductor's codegen.

Options (`torch.compile(..., options={...})`):
- "route": "cost" (default: where the calibrated cost model says fuel is faster), "all" (every node the
  contracts allow) or "none" (nothing: a baseline with the same compilation path);
- "ops": a list of fuel ops (e.g. ["conv2d"] or ["fuel::add", "fuel::mul"]) routing is limited to.
For fuel_inductor every other option goes to inductor as a config patch.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Any

import torch

from ..costmodel import CALIBRATION_ENV, calibration_path
from . import rewrite, support
from .cost import Calibration, Call, Prediction, concrete, fmt, predict, shape_of
from .report import Decision, PlanReport, begin

ROUTES = ("cost", "all", "none")
PLANNER_OPTIONS = ("route", "ops")


@dataclasses.dataclass(frozen=True)
class Options:
    route: str = "cost"
    ops: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, options: dict | None, backend: str) -> tuple["Options", dict]:
        options = dict(options or {})
        route = options.pop("route", "cost")
        if route not in ROUTES:
            raise ValueError(f"torch.compile(backend={backend!r}): options['route'] must be one of {list(ROUTES)}, "
                             f"got {route!r}")
        ops = options.pop("ops", None)
        if ops is not None:
            if isinstance(ops, str) or not all(isinstance(o, str) for o in ops):
                raise ValueError(f"torch.compile(backend={backend!r}): options['ops'] is a list of fuel op names such "
                                 f"as ['conv2d', 'add'], got {ops!r}")
            ops = tuple(o.split("::", 1)[-1] for o in ops)
            unknown = sorted(set(ops) - set(support.FUEL_OPS))
            if unknown:
                raise ValueError(f"torch.compile(backend={backend!r}): unknown fuel ops {unknown} in options['ops']; "
                                 f"known: {list(support.FUEL_OPS)}")
        if options and backend == "fuel":
            raise ValueError(f"torch.compile(backend='fuel'): unknown options {sorted(options)}; the planner takes "
                             f"{list(PLANNER_OPTIONS)} (inductor's options go with backend='fuel_inductor')")
        return cls(route, ops), options


# ---------------------------------------------------------------------------------------------------------
# Pricing a match at a size scale (1: the sizes the graph was traced with; 2: every symbol doubled).

def _calls(m: support.Match, scale: int) -> tuple[list[Call], list[tuple[int, torch.dtype]]]:
    copies = [(concrete(o.numel, scale), m.dtype) for o in m.operands if o.copy]
    p = m.params
    if m.op in support.ELEMENTWISE.values():
        shape = shape_of(m.out, scale)
        return [Call(m.op, m.dtype, {"lhs": shape, "rhs": shape}, {})], copies
    values = {o.name: support.val(o.value) for o in m.operands}
    shapes = {name: (shape_of(v, scale) if isinstance(v, torch.Tensor) else None) for name, v in values.items()}
    geometry = {k: p[k] for k in ("stride", "padding", "dilation", "groups")}
    if m.op == "conv2d":
        return [Call("conv2d", m.dtype, shapes, geometry)], copies
    if m.op == "conv_transpose2d":
        return [Call("conv_transpose2d", m.dtype, shapes, {**geometry, "output_padding": p["output_padding"]})], copies
    # convolution_backward: the calls rewrite.convolution_backward makes, and its layout copies.
    grad, x, weight = shapes["grad"], shapes["x"], shapes["weight"]
    image, out_grad = (x, grad) if not p["transposed"] else (grad, x)
    calls = []
    if p["mask"][0]:
        if p["transposed"]:
            calls.append(Call("conv2d", m.dtype, {"x": grad, "weight": weight, "bias": None}, geometry))
        else:
            calls.append(Call("conv_transpose2d", m.dtype, {"x": grad, "weight": weight, "bias": None},
                              {**geometry, "output_padding": p["grad_output_padding"]}))
    if p["mask"][1]:
        n, c_in, h, w = image
        groups = p["groups"]
        calls.append(Call("conv2d", m.dtype, {"x": (c_in // groups, groups * n, h, w),
                                              "weight": (out_grad[1], n, *out_grad[2:]), "bias": None},
                          {"stride": p["dilation"], "padding": p["padding"], "dilation": p["stride"], "groups": groups}))
        copies += [(math.prod(image), m.dtype), (math.prod(out_grad), m.dtype), (math.prod(weight), m.dtype)]
    return calls, copies


def price(m: support.Match, calibration: Calibration | None, scale: int = 1) -> Prediction:
    calls, copies = _calls(m, scale)
    return predict(calls, copies, calibration)


def decide(m: support.Match, first: Prediction, calibration: Calibration | None) -> tuple[bool, str, str | None]:
    """(route to fuel?, why, guard). Under dynamic shapes the cost difference is taken as affine in the
    output's element count (exact where sizes scale together, as a batch does), fitted from the traced
    sizes and twice them. Where the crossover lies outside what the symbols can reach, the choice holds for
    every size; otherwise it is taken at the traced sizes and guarded, so a size on the other side of the
    crossover recompiles rather than reusing a wrong plan."""
    from torch.fx.experimental.symbolic_shapes import guard_bool, statically_known_true

    costs = f"{fmt(first.fuel, first.unit)} vs aten {fmt(first.aten, first.unit)}"
    basis = "" if first.calibrated else "; formula hints only (bytes; no calibration for it)"

    def verdict(go: bool) -> str:
        if go and not first.calibrated and first.fuel == first.aten:
            return f"same bytes by the formula hints (no calibration for it), fuel kept: fuel {costs}"
        return f"{'cheaper' if go else 'slower'} by the model: fuel {costs}{basis}"

    # Ties go to fuel only on the formula hints, where the bytes are all there is to compare.
    cheaper = (lambda d: d < 0) if first.calibrated else (lambda d: d <= 0)
    d1 = first.fuel - first.aten
    numel = m.out.numel()
    if not isinstance(numel, torch.SymInt):
        return cheaper(d1), verdict(cheaper(d1)), None
    second = price(m, calibration, 2)
    m1, m2 = concrete(numel, 1), concrete(numel, 2)
    slope = ((second.fuel - second.aten) - d1) / (m2 - m1) if m2 != m1 else 0.0
    if abs(slope) * max(m1, 1) <= 1e-12 * max(abs(first.fuel), abs(first.aten), 1e-30):
        return cheaper(d1), verdict(cheaper(d1)) + " (at every size)", None
    crossover = m1 - d1 / slope  # output elements where both cost the same
    relation, bound = (">", math.floor(crossover)) if slope < 0 else ("<", math.ceil(crossover))
    fuel_region = numel > bound if slope < 0 else numel < bound
    condition = f"numel {relation} {bound}"
    if statically_known_true(fuel_region):
        return True, verdict(True) + f" (for every size: fuel iff {condition})", None
    if statically_known_true(torch.sym_not(fuel_region)):
        return False, verdict(False) + f" (for every size: fuel iff {condition})", None
    go = guard_bool(fuel_region)  # installs the guard
    guard = f"{numel} {relation} {bound}"
    return go, verdict(go) + f" (size-dependent: fuel iff {condition}; guarded on {guard})", guard


# ---------------------------------------------------------------------------------------------------------

def _basis(calibration: Calibration | None) -> str:
    if calibration is None:
        return (f"formula hints only: no calibration at {calibration_path()} (run `python -m fuel_torch "
                "judge`); costs are bytes moved by the contracts' formulas, both sides assumed equally fast, so only "
                "a Contiguize copy tips a choice")
    if not calibration.theirs:
        return (f"calibration {calibration.source} has fuel's fits but not torch's (point ${CALIBRATION_ENV} "
                "at the Judge's judge.json, which has both): formula hints (bytes) used")
    return f"calibrated: {calibration.source} (seconds = launch overhead + amount / rate, fuel's and torch's fits)"


def plan_graph(gm: torch.fx.GraphModule, graph: str, options: Options, report: PlanReport,
               calibration: Calibration | None) -> list[Decision]:
    """Decide and rewrite every candidate node of one ATen graph, in place."""
    decisions = []
    for node in list(gm.graph.nodes):
        if not support.is_candidate(node):
            continue
        ops = support.fuel_ops_of(node)
        decision = Decision(graph=graph, node=node.name, target=str(node.target), chosen="aten", fuel_op=None,
                            contiguized=(), reason="")
        decisions.append(decision)
        try:
            m = support.match(node)
            first = price(m, calibration)
        except support.Unsupported as error:
            decision.reason = str(error)
            continue
        except Exception as error:  # noqa: BLE001 - a fake kernel or formula refusing the call is a reason, not a crash
            decision.reason = f"the contract rejects the call: {str(error).splitlines()[0]}"
            continue
        decision.fuel_cost, decision.aten_cost, decision.cost_unit = first.fuel, first.aten, first.unit
        if options.route == "none":
            decision.reason = "route='none': the baseline, nothing routed"
            continue
        if options.ops is not None and not set(ops) <= set(options.ops):
            missing = sorted(set(ops) - set(options.ops))
            decision.reason = f"excluded by options ops={list(options.ops)} (needs {', '.join(missing)})"
            continue
        if options.route == "all":
            go, why, guard = True, "route='all': the contracts allow it", None
        else:
            go, why, guard = decide(m, first, calibration)
        decision.guard = guard
        if not go:
            decision.reason = why
            continue
        try:
            rewrite.replace(node, m)
        except support.Unsupported as error:
            decision.reason = str(error)
            continue
        except Exception as error:  # noqa: BLE001 - e.g. the fuel fake kernel's contract check
            decision.reason = f"the contract rejects the call: {str(error).splitlines()[0]}"
            continue
        copied = [o for o in m.operands if o.copy]
        decision.chosen = "fuel"
        decision.fuel_op = "+".join(f"fuel::{op}" for op in ops)
        decision.contiguized = tuple(o.label for o in copied)
        if copied:
            why += "; Contiguize " + ", ".join(f"{o.label} ({o.copy})" for o in copied)
        decision.reason = why
    gm.graph.lint()
    gm.recompile()
    report.decisions.extend(decisions)
    if os.environ.get("FUEL_PLAN_LOG", "") not in ("", "0"):
        print(f"[fuel plan] {graph} graph of {report.summary()}\n[fuel plan] cost basis: {report.basis}\n"
              f"{report.table(graph)}", file=sys.stderr, flush=True)
    return decisions


def _start(backend: str, options: Options) -> tuple[PlanReport, Calibration | None]:
    calibration = Calibration.load()
    return begin(PlanReport(backend, options.route, options.ops, _basis(calibration))), calibration


def fuel(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, mode: str | None = None):
    """torch.compile backend "fuel": plan, then run the ATen graphs as they are (torch for the rest)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    if mode not in (None, "default"):
        raise ValueError(f"torch.compile(backend='fuel'): mode={mode!r} is an inductor mode; the planner with "
                         "inductor's codegen is backend='fuel_inductor'")
    planner_options, _ = Options.parse(options, "fuel")
    report, calibration = _start("fuel", planner_options)

    def compiler(graph: str):
        def compile_graph(module: torch.fx.GraphModule, inputs):
            plan_graph(module, graph, planner_options, report, calibration)
            return make_boxed_func(module.forward)
        return compile_graph

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                        inference_compiler=compiler("inference"))(gm, example_inputs)


def _fallbacks_take_contiguous_inputs() -> None:
    """Fuel kernels read contiguous inputs only. Inductor lowers an untagged custom op with the stride order
    of its inputs' fake values, which an upstream buffer (a clone of a permute, say) need not keep; register
    each fuel op's fallback with inductor's contiguous-strides constraint instead. The constraint is set even
    where the op already has a lowering: plain inductor, compiling a fuel op first, registers an implicit
    fallback with the stride-order constraint, which would otherwise stay for the rest of the process."""
    from torch._inductor import lowering

    for name in support.FUEL_OPS:
        op = getattr(torch.ops.fuel, name).default
        if op not in lowering.lowerings:
            lowering.make_fallback(op, layout_constraint=lowering.require_contiguous_strides, warn=False)
        else:
            lowering.add_layout_constraint(op, lowering.require_contiguous_strides)


def fuel_inductor(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, mode: str | None = None):
    """torch.compile backend "fuel_inductor": plan each ATen graph, then inductor's codegen for the rest.

    AOTAutograd's cache would hand back a compiled artifact without running the planner (so with decisions
    made under other contracts or another calibration): it is off for this backend. Inductor's FX graph
    cache keys the graph it receives, which is the planned one, fuel nodes included."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    planner_options, inductor_options = Options.parse(options, "fuel_inductor")
    _fallbacks_take_contiguous_inputs()
    report, calibration = _start("fuel_inductor", planner_options)
    config_patches = dict(inductor_options)
    if mode is not None:
        from torch._inductor import list_mode_options
        config_patches = {**list_mode_options(mode), **config_patches}

    def inner_compile(module: torch.fx.GraphModule, inputs, **kwargs):
        graph = "backward" if kwargs.get("is_backward") else "inference" if kwargs.get("is_inference") else "forward"
        plan_graph(module, graph, planner_options, report, calibration)
        return compile_fx_inner(module, inputs, **kwargs)

    with torch._functorch.config.patch(enable_autograd_cache=False), inductor_config.patch(config_patches):
        return compile_fx(gm, example_inputs, inner_compile=inner_compile)
