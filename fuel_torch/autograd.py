"""Autograd for every functional fuel op, registered on the op itself (torch.library.register_autograd).

The formulas are torch 2.13's own (tools/autograd/derivatives.yaml and FunctionsManual.cpp), in the
same operation order, with our kernels wherever one exists: a backward pass runs on fuel ops and
differentiates again (double backward) through these same registrations. Torch supplies only what we
have no kernel for: where/masked_fill, neg, log, floor division, sums and layout changes.

Convolution: conv2d and conv_transpose2d are each other's adjoint, so each one's input gradient is
the other op; a weight gradient is a grouped conv2d in which the batch becomes the reduction (see
_conv2d_weight_grad); a bias gradient is a sum.

Two things register_autograd alone would get silently wrong, and this module turns into errors:
- Forward-mode AD: register_autograd takes no forward formula, and a dual tensor would pass through
  the op with its tangent dropped (torch.func.jvp returns zeros). Every autograd kernel here first
  refuses tangents, naming the op.
- The .out overloads: like torch's out= functions they have no autograd; with grad mode on and an
  input that requires grad they raise, instead of returning a result cut off from the graph.
"""
from __future__ import annotations

import functools

import torch
import torch.autograd.forward_ad as forward_ad

from . import elementwise, layout

F = torch.ops.fuel


def _tensors(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def _refuse_forward_ad(op: str, args, kwargs) -> None:
    # _current_level is -1 outside every dual_level (torch.func.jvp opens one too): the common case costs
    # one comparison.
    if forward_ad._current_level >= 0 and any(
            forward_ad.unpack_dual(t).tangent is not None for t in _tensors(args, kwargs)):
        raise RuntimeError(
            f"fuel::{op}: forward-mode AD (torch.autograd.forward_ad, torch.func.jvp) is not supported: the op "
            f"registers a backward formula only. Use reverse mode (backward, torch.autograd.grad), or the torch op "
            f"for forward-mode derivatives.")


class _Library(torch.library.Library):
    """The library our autograd kernels are registered through: each kernel refuses forward-mode AD first."""

    def impl(self, op_name, fn, dispatch_key="", *, with_keyset=False, allow_override=True):
        name = op_name if isinstance(op_name, str) else op_name._opname
        op = name.split("::")[-1]
        if dispatch_key == "Autograd" and with_keyset:
            kernel = fn

            @functools.wraps(kernel)
            def fn(keyset, *args, **kwargs):
                _refuse_forward_ad(op, args, kwargs)
                return kernel(keyset, *args, **kwargs)

        return super().impl(op_name, fn, dispatch_key, with_keyset=with_keyset, allow_override=allow_override)


_LIB = _Library("fuel", "IMPL")


def _dense(t: torch.Tensor) -> torch.Tensor:
    # Incoming gradients can be expanded (the backward of sum) or strided; our kernels take neither.
    return layout.materialize(t)


# ---------------------------------------------------------------------------------------------------
# Elementwise: (grad_lhs, grad_rhs) as functions of (grad, lhs, rhs, result), as in derivatives.yaml.

def _half(g):
    return F.div(g, torch.full_like(g, 2, memory_format=torch.contiguous_format))


def _max_min(lhs_loses):
    # maximum/minimum: a tie splits the gradient in half; otherwise the winner takes it. With a NaN
    # operand no comparison holds and torch gives both operands the whole gradient; so do we.
    def grad_lhs(g, a, b, y):
        return torch.where(a == b, _half(g), g).masked_fill(lhs_loses(a, b), 0)

    def grad_rhs(g, a, b, y):
        return torch.where(a == b, _half(g), g).masked_fill(lhs_loses(b, a), 0)

    return grad_lhs, grad_rhs


def _pow_grad_base(g, a, b, y):
    # b * a^(b-1), and exactly 0 where b == 0 (so pow(0, 0) has gradient 0, not 0 * inf).
    scaled = F.mul(g, F.mul(b, F.pow(a, F.sub(b, torch.ones_like(b, memory_format=torch.contiguous_format)))))
    return torch.where(b == 0, 0.0, scaled)


def _pow_grad_exponent(g, a, b, y):
    # a^b * log(a), with torch's one mask: 0 where a == 0 and b >= 0 (there a^b is 0 or 1 for every
    # b nearby). A negative base is not masked: log gives NaN there, as in torch.
    return F.mul(g, torch.where((a == 0) & (b >= 0), 0.0, F.mul(y, torch.log(a))))


ELEMENTWISE_GRADS = {
    "add": (lambda g, a, b, y: g, lambda g, a, b, y: g),
    "sub": (lambda g, a, b, y: g, lambda g, a, b, y: torch.neg(g)),
    "mul": (lambda g, a, b, y: F.mul(g, b), lambda g, a, b, y: F.mul(g, a)),
    "div": (lambda g, a, b, y: F.div(g, b), lambda g, a, b, y: F.mul(torch.neg(g), F.div(F.div(a, b), b))),
    "maximum": _max_min(lambda a, b: a < b),
    "minimum": _max_min(lambda a, b: a > b),
    "pow": (_pow_grad_base, _pow_grad_exponent),
    "rem": (lambda g, a, b, y: g,
            lambda g, a, b, y: F.mul(torch.neg(g), torch.div(a, b, rounding_mode="floor"))),
}
# What each formula reads, so that add/sub keep nothing alive and only pow keeps its result.
_SAVES_INPUTS = {op: op not in ("add", "sub") for op in ELEMENTWISE_GRADS}
_SAVES_RESULT = {op: op == "pow" for op in ELEMENTWISE_GRADS}


def _register_elementwise(op: str) -> None:
    grad_lhs, grad_rhs = ELEMENTWISE_GRADS[op]

    def setup_context(ctx, inputs, output):
        lhs, rhs = inputs
        ctx.save_for_backward(*((lhs, rhs) if _SAVES_INPUTS[op] else ()),
                              *((output,) if _SAVES_RESULT[op] else ()))

    def backward(ctx, grad):
        saved = list(ctx.saved_tensors)
        lhs, rhs = (saved.pop(0), saved.pop(0)) if _SAVES_INPUTS[op] else (None, None)
        result = saved.pop(0) if _SAVES_RESULT[op] else None
        grad = _dense(grad)
        need_lhs, need_rhs = ctx.needs_input_grad
        return (grad_lhs(grad, lhs, rhs, result) if need_lhs else None,
                grad_rhs(grad, lhs, rhs, result) if need_rhs else None)

    torch.library.register_autograd(f"fuel::{op}", backward, setup_context=setup_context, lib=_LIB)


# ---------------------------------------------------------------------------------------------------
# Convolution.

def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _conv2d_weight_grad(x, grad_out, kernel, stride, padding, dilation, groups):
    """d(sum(grad_out * conv2d(x, w)))/dw, as one fuel conv2d.

    dw[o, i, kh, kw] = sum over images n and output positions p of grad_out[n, o, p] * x[n, i, p*stride +
    k*dilation - padding]. Read as a convolution over (image, group) channels, the batch is the reduction:
    input x arranged [Cin/groups, groups*N, H, W], weights grad_out arranged [Cout, N, Ho, Wo], grouped by
    the conv's groups, with stride and dilation trading places. The result can extend past the kernel
    (positions no output reached are still "in range" of the swapped conv): keep the first kh x kw.
    """
    n, c_in, h, w = x.shape
    c_out = grad_out.shape[1]
    if n == 0:
        return x.new_zeros((c_out, c_in // groups, *kernel))
    xs = x.reshape(n, groups, c_in // groups, h, w).permute(2, 1, 0, 3, 4).reshape(c_in // groups, groups * n, h, w)
    gs = grad_out.transpose(0, 1).contiguous()
    full = F.conv2d(xs.contiguous(), gs, None, dilation, padding, stride, groups)
    return full[:, :, :kernel[0], :kernel[1]].transpose(0, 1).contiguous()


def _transposed_size(out_size, k, stride, padding, dilation):
    """conv_transpose2d's output length without output_padding, for input length out_size."""
    return (out_size - 1) * stride - 2 * padding + dilation * (k - 1) + 1


def _conv2d_setup(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, groups = inputs
    ctx.save_for_backward(x, weight)
    ctx.args = (_pair(stride), _pair(padding), _pair(dilation), groups)


def _needs(ctx):
    # (x, weight, bias): the dispatcher drops trailing defaulted arguments, bias included, before autograd
    # sees the call, so needs_input_grad can be shorter than the schema.
    return (*ctx.needs_input_grad, False, False, False)[:3]


def _conv2d_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.args
    grad = _dense(grad)
    need_x, need_w, need_b = _needs(ctx)
    kernel = tuple(weight.shape[2:])
    grad_x = grad_w = grad_b = None
    if need_x:
        # The adjoint: conv_transpose2d maps grad back onto x's grid; output_padding restores the rows
        # and columns the forward's floor division dropped (always fewer than stride).
        output_padding = [x.shape[2 + d] - _transposed_size(grad.shape[2 + d], kernel[d], stride[d], padding[d],
                                                            dilation[d]) for d in range(2)]
        grad_x = F.conv_transpose2d(grad, weight, None, stride, padding, output_padding, groups, dilation)
    if need_w:
        grad_w = _conv2d_weight_grad(x, grad, kernel, stride, padding, dilation, groups)
    if need_b:
        grad_b = grad.sum((0, 2, 3))
    return grad_x, grad_w, grad_b, None, None, None, None


def _conv_transpose2d_setup(ctx, inputs, output):
    x, weight, bias, stride, padding, output_padding, groups, dilation = inputs
    ctx.save_for_backward(x, weight)
    ctx.args = (_pair(stride), _pair(padding), _pair(dilation), groups)


def _conv_transpose2d_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.args
    grad = _dense(grad)
    need_x, need_w, need_b = _needs(ctx)
    grad_x = grad_w = grad_b = None
    if need_x:
        # The adjoint is conv2d with the same weight. When output_padding >= stride (torch allows it up to
        # dilation) the conv2d reaches past x's grid: those extra rows/columns are not x's, drop them.
        grad_x = F.conv2d(grad, weight, None, stride, padding, dilation, groups)
        if tuple(grad_x.shape[2:]) != tuple(x.shape[2:]):
            grad_x = grad_x[:, :, :x.shape[2], :x.shape[3]].contiguous()
    if need_w:
        # conv_transpose2d(x, w) is the input gradient of conv2d(., w); its weight gradient is conv2d's
        # weight gradient with grad as the image and x as the output gradient.
        grad_w = _conv2d_weight_grad(grad, x, tuple(weight.shape[2:]), stride, padding, dilation, groups)
    if need_b:
        grad_b = grad.sum((0, 2, 3))
    return grad_x, grad_w, grad_b, None, None, None, None, None


CONV_GRADS = {
    "conv2d": (_conv2d_setup, _conv2d_backward),
    "conv_transpose2d": (_conv_transpose2d_setup, _conv_transpose2d_backward),
}


# ---------------------------------------------------------------------------------------------------
# .out overloads: no autograd, as torch's out= functions.

def _register_out(op: str) -> None:
    overload = getattr(F, op).out

    def out_autograd(keyset, *args, **kwargs):
        if torch.is_grad_enabled() and any(t.requires_grad for t in _tensors(args, kwargs)):
            raise RuntimeError(
                f"fuel::{op}.out: out= does not support automatic differentiation, but an argument requires grad. "
                f"Call fuel::{op} (torch.ops.fuel.{op}) to get a differentiable result, or run under torch.no_grad().")
        with torch._C._AutoDispatchBelowAutograd():
            return overload.redispatch(keyset & torch._C._after_autograd_keyset, *args, **kwargs)

    _LIB.impl(f"{op}.out", out_autograd, "Autograd", with_keyset=True)


def _register_all() -> None:
    for op in elementwise.OPS:
        _register_elementwise(op)
        _register_out(op)
    for op, (setup_context, backward) in CONV_GRADS.items():
        torch.library.register_autograd(f"fuel::{op}", backward, setup_context=setup_context, lib=_LIB)
        _register_out(op)


_register_all()
