"""Graph rewriting: replace a matched ATen node by fuel calls, materializing operands first.

Every node made here carries its fake value (`meta["val"]`, computed under the graph's fake mode), so
later passes (inductor's lowering, the next rewrite) see sizes and strides as for torch's own nodes; the
fuel fake kernels run the contract checks on the way, so a call they would reject is never inserted.

Materialization is the contracts' Contiguize: a broadcast operand is expanded to the output's shape and
copied contiguous, a strided or offset one copied contiguous, a Python number filled into a contiguous
tensor of the output's shape. Symbolic sizes (dynamic shapes) are read from the operands with
`aten.sym_size`, so the plan stays valid for every size.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch
from torch.fx.node import map_arg

from .support import Match, Operand, Unsupported, val

aten = torch.ops.aten
fuel = torch.ops.fuel


class Emitter:
    """Creates nodes before `anchor`, each with its fake value; `undo()` erases them all."""

    def __init__(self, graph: torch.fx.Graph, anchor: torch.fx.Node):
        self.graph, self.anchor, self.made = graph, anchor, []
        self.fake_mode = _fake_mode(anchor)

    def __call__(self, target: Callable, args: tuple, kwargs: dict | None = None) -> torch.fx.Node:
        kwargs = kwargs or {}
        with self.graph.inserting_before(self.anchor):
            node = self.graph.call_function(target, args, kwargs)
        self.made.append(node)
        vals = map_arg((args, kwargs), lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = target(*vals[0], **vals[1])
        node.meta["stack_trace"] = self.anchor.meta.get("stack_trace")
        return node

    def undo(self) -> None:
        for node in reversed(self.made):
            self.graph.erase_node(node)
        self.made.clear()


def _fake_mode(node: torch.fx.Node):
    from torch._subclasses.fake_tensor import FakeTensor

    for value in (node, *node.all_input_nodes):
        v = val(value)
        if isinstance(v, FakeTensor):
            return v.fake_mode
        if isinstance(v, (tuple, list)):
            for item in v:
                if isinstance(item, FakeTensor):
                    return item.fake_mode
    raise Unsupported("no fake tensors on the node's inputs")


def _same_size(a: Any, b: Any) -> bool:
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        return (isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt) and a.node.expr == b.node.expr)
    return a == b


def size_plan(out: torch.Tensor, sources: list[torch.fx.Node]) -> list[Any]:
    """The output's sizes as graph arguments: ints, or (node, dim) to read a symbolic size from."""
    sizes = []
    for i, size in enumerate(out.shape):
        if not isinstance(size, torch.SymInt):
            sizes.append(int(size))
            continue
        for node in sources:
            v = val(node)
            j = i - (out.dim() - v.dim())
            if j >= 0 and _same_size(v.shape[j], size):
                sizes.append((node, j))
                break
        else:
            raise Unsupported(f"symbolic size {size} of the output is no operand's size")
    return sizes


def _sizes(emit: Emitter, plan: list[Any]) -> list[Any]:
    return [emit(aten.sym_size.int, item) if isinstance(item, tuple) else item for item in plan]


def materialize(emit: Emitter, operand: Operand, out: torch.Tensor, sources: list[torch.fx.Node]) -> Any:
    """The operand as the fuel kernel takes it: contiguous, zero offset, the output's shape for elementwise."""
    if operand.copy is None:
        return operand.value
    if operand.copy == "python scalar":
        return emit(aten.full.default, (_sizes(emit, size_plan(out, sources)), operand.value),
                    {"dtype": out.dtype, "layout": torch.strided, "device": out.device, "pin_memory": False})
    value = operand.value
    if operand.copy == "broadcast":
        value = emit(aten.expand.default, (value, _sizes(emit, size_plan(out, sources))))
    return emit(aten.clone.default, (value,), {"memory_format": torch.contiguous_format})


def _check_plannable(match: Match) -> None:
    """Fail before emitting anything where a symbolic size could not be expressed."""
    sources = [o.value for o in match.operands if isinstance(o.value, torch.fx.Node)]
    if any(o.copy in ("python scalar", "broadcast") for o in match.operands):
        size_plan(match.out, sources)


def elementwise(emit: Emitter, node: torch.fx.Node, match: Match) -> torch.fx.Node:
    _check_plannable(match)
    sources = [o.value for o in match.operands if isinstance(o.value, torch.fx.Node)]
    lhs, rhs = (materialize(emit, o, match.out, sources) for o in match.operands)
    return emit(getattr(fuel, match.op).default, (lhs, rhs))


def convolution(emit: Emitter, node: torch.fx.Node, match: Match) -> torch.fx.Node:
    x, weight, bias = (materialize(emit, o, match.out, []) for o in match.operands)
    p = match.params
    if match.op == "conv2d":
        return emit(fuel.conv2d.default, (x, weight, bias, p["stride"], p["padding"], p["dilation"], p["groups"]))
    return emit(fuel.conv_transpose2d.default,
                (x, weight, bias, p["stride"], p["padding"], p["output_padding"], p["groups"], p["dilation"]))


def _contiguous(emit: Emitter, node: torch.fx.Node) -> torch.fx.Node:
    return emit(aten.clone.default, (node,), {"memory_format": torch.contiguous_format})


def _dim(emit: Emitter, node: torch.fx.Node, i: int) -> Any:
    """Size i of a node's value: an int, or a sym_size node where it is symbolic."""
    size = val(node).shape[i]
    return emit(aten.sym_size.int, (node, i)) if isinstance(size, torch.SymInt) else int(size)


def conv2d_weight_grad(emit: Emitter, x: torch.fx.Node, grad: torch.fx.Node, kernel, stride, padding, dilation,
                       groups: int) -> torch.fx.Node:
    """d(sum(grad * conv2d(x, w)))/dw as one fuel conv2d, the formula csrc/autograd.cpp uses
    written as graph nodes: the batch becomes the reduction (x arranged [Cin/groups, groups*N, H, W], grad
    arranged [Cout, N, Ho, Wo], grouped by the conv's groups), stride and dilation trade places, and the
    result is cut to the kernel's size. -1 stands for the (possibly symbolic) batch in every reshape."""
    c_in, h, w = int(val(x).shape[1]), _dim(emit, x, 2), _dim(emit, x, 3)
    per_group = c_in // groups
    xs = emit(aten.view.default, (x, [-1, groups, per_group, h, w]))
    xs = _contiguous(emit, emit(aten.permute.default, (xs, [2, 1, 0, 3, 4])))
    xs = emit(aten.view.default, (xs, [per_group, -1, h, w]))
    gs = _contiguous(emit, emit(aten.permute.default, (grad, [1, 0, 2, 3])))
    full = emit(fuel.conv2d.default, (xs, gs, None, list(dilation), list(padding), list(stride), groups))
    full = emit(aten.slice.Tensor, (full, 2, 0, kernel[0]))
    full = emit(aten.slice.Tensor, (full, 3, 0, kernel[1]))
    return _contiguous(emit, emit(aten.permute.default, (full, [1, 0, 2, 3])))


def convolution_backward(emit: Emitter, node: torch.fx.Node, match: Match) -> dict[int, torch.fx.Node]:
    """aten.convolution_backward split as csrc/autograd.cpp computes it: the input gradient is the other
    convolution, the weight gradient one fuel conv2d (conv2d_weight_grad), the bias gradient our sum
    (fuel_backward::conv_bias_grad), so a planned backward has eager fuel's bits."""
    grad, x, weight = (materialize(emit, o, match.out, []) for o in match.operands)
    p = match.params
    stride, padding, dilation, groups, mask = p["stride"], p["padding"], p["dilation"], p["groups"], p["mask"]
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    xv, wv = val(x), val(weight)
    kernel = [int(s) for s in wv.shape[2:]]
    results: dict[int, torch.fx.Node] = {}
    if mask[0] and not p["transposed"]:
        results[0] = emit(fuel.conv_transpose2d.default,
                          (grad, weight, None, stride, padding, p["grad_output_padding"], groups, dilation))
    elif mask[0]:
        grad_x = emit(fuel.conv2d.default, (grad, weight, None, stride, padding, dilation, groups))
        if not all(statically_known_true(a == b) for a, b in zip(val(grad_x).shape[2:], xv.shape[2:])):
            # output_padding >= stride reaches past x's grid: those rows and columns are not x's.
            grad_x = emit(aten.slice.Tensor, (grad_x, 2, 0, _dim(emit, x, 2)))
            grad_x = _contiguous(emit, emit(aten.slice.Tensor, (grad_x, 3, 0, _dim(emit, x, 3))))
        results[0] = grad_x
    if mask[1]:
        image, out_grad = (x, grad) if not p["transposed"] else (grad, x)
        results[1] = conv2d_weight_grad(emit, image, out_grad, kernel, stride, padding, dilation, groups)
    if mask[2]:
        results[2] = emit(torch.ops.fuel_backward.conv_bias_grad.default, (grad,))
    return results


def replace(node: torch.fx.Node, match: Match) -> list[torch.fx.Node]:
    """Rewrite `node` onto fuel; returns the nodes made. On any failure the graph is left as it was."""
    graph = node.graph
    emit = Emitter(graph, node)
    try:
        if match.op == "convolution_backward":
            results = convolution_backward(emit, node, match)
            users = list(node.users)
            if any(u.target is not operator.getitem for u in users):
                raise Unsupported("convolution_backward result used other than by index")
            for user in users:
                user.replace_all_uses_with(results[user.args[1]])
                graph.erase_node(user)
        else:
            new = convolution(emit, node, match) if match.op.startswith("conv") else elementwise(emit, node, match)
            node.replace_all_uses_with(new)
    except Exception:
        emit.undo()
        raise
    graph.erase_node(node)
    return emit.made
