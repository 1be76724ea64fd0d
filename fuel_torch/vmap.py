"""Batching rules for torch.vmap (torch.library.register_vmap): one contiguous kernel call per batch.

Without a rule, vmap falls back to calling the op once per sample on slices of the batched tensors, and
every slice past the first has a storage offset our contracts reject. Each rule here folds the batch into
the op's own dimensions instead, so the kernel sees one fresh contiguous operand per argument:

- elementwise: batch dims moved to the front, unbatched operands expanded to the batch, then made
  contiguous; one call on [B, *shape].
- convolution with only x batched: the batch folds into N ([B, N, C, H, W] -> [B*N, C, H, W]).
- convolution with the weight or bias batched: the batch folds into groups. Sample b's channels become
  groups b*groups .. (b+1)*groups - 1 of one grouped convolution (x's channels repeated per sample when x
  is unbatched), and its output channels come out as [N, B*Cout, Ho, Wo].
- the bias gradient (fuel_backward::conv_bias_grad, in a vmapped backward): the batch folds into channels.

Each output element is the same sum, in the same order, as in a per-sample call (the kernels' reduction
order depends only on the group's geometry), so vmap gives the per-sample results bit for bit.

The contract is checked per sample first: each rule runs the op once on meta tensors of one sample's shape
(the fake kernel, same clauses and messages as the C++ kernel), so a bad call under vmap fails with the
message the same call gets without vmap, not one about the folded shapes.
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from . import elementwise

F = torch.ops.fuel


def _sample(t: torch.Tensor | None, dim: int | None) -> torch.Tensor | None:
    """A meta tensor shaped like one sample of `t` (contiguous: folding makes every operand contiguous)."""
    if t is None:
        return None
    shape = list(t.shape)
    if dim is not None:
        del shape[dim]
    return torch.empty(shape, dtype=t.dtype, device="meta")


def _to_front(t: torch.Tensor, dim: int | None, batch: int) -> torch.Tensor:
    """t with the batch as dim 0: moved there, or expanded there when t is not batched."""
    if dim is None:
        return t.unsqueeze(0).expand(batch, *t.shape)
    return t.movedim(dim, 0)


def _elementwise_rule(op: str):
    packet = getattr(F, op)

    def rule(info, in_dims, lhs, rhs):
        lhs_dim, rhs_dim = in_dims
        packet.default(_sample(lhs, lhs_dim), _sample(rhs, rhs_dim))
        lhs = _to_front(lhs, lhs_dim, info.batch_size).contiguous()
        rhs = _to_front(rhs, rhs_dim, info.batch_size).contiguous()
        return packet.default(lhs, rhs), 0

    return rule


def _fold_into_groups(x, weight, bias, x_dim, weight_dim, bias_dim, groups, batch):
    """(x, weight, bias, groups) of one grouped call computing every sample: sample b is groups b*groups.."""
    x = _to_front(x, x_dim, batch)                            # [B, N, Cin, H, W]
    n, c_in = x.shape[1], x.shape[2]
    x = x.transpose(0, 1).reshape(n, batch * c_in, *x.shape[3:])
    weight = _to_front(weight, weight_dim, batch)            # [B, Cout, Cin/g, kh, kw] or [B, Cin, Cout/g, kh, kw]
    weight = weight.reshape(batch * weight.shape[1], *weight.shape[2:])
    if bias is not None:
        bias = _to_front(bias, bias_dim, batch).reshape(-1)  # [B * Cout]
    return x.contiguous(), weight.contiguous(), bias.contiguous() if bias is not None else None, groups * batch


def _conv_rule(op: str, transpose: bool):
    packet = getattr(F, op)

    def rule(info, in_dims, x, weight, bias=None, *params):
        x_dim, weight_dim, bias_dim = (*in_dims, None, None)[:3]
        if any(d is not None for d in pytree.tree_leaves(in_dims[3:])):  # int lists come with lists of Nones
            raise RuntimeError(f"fuel::{op} under vmap: only x, weight and bias can be batched")
        # Validate one sample's call with the op's own checks and messages.
        packet.default(_sample(x, x_dim), _sample(weight, weight_dim), _sample(bias, bias_dim), *params)
        batch = info.batch_size
        if weight_dim is None and bias_dim is None:
            x = _to_front(x, x_dim, batch)
            folded = x.reshape(batch * x.shape[1], *x.shape[2:]).contiguous()
            out = packet.default(folded, weight, bias, *params)
            return out.reshape(batch, x.shape[1], *out.shape[1:]), 0
        # Both schemas put groups fourth after (x, weight, bias): (stride, padding, dilation, groups) and
        # (stride, padding, output_padding, groups, dilation). Missing trailing params take the defaults.
        params = list(params) + ([1, 0, 0, 1, 1] if transpose else [1, 0, 1, 1])[len(params):]
        x, weight, bias, params[3] = _fold_into_groups(x, weight, bias, x_dim, weight_dim, bias_dim, params[3], batch)
        out = packet.default(x, weight, bias, *params)            # [N, B*Cout, Ho, Wo]
        return out.reshape(out.shape[0], batch, out.shape[1] // batch, *out.shape[2:]), 1

    return rule


def _bias_grad_rule(info, in_dims, grad):
    """The batch folds into channels ([B, N, C, H, W] -> [N, B*C, H, W]): each channel's sum keeps its
    terms and order, so every sample's bias gradient has its own call's bits."""
    (grad_dim,) = in_dims
    torch.ops.fuel_backward.conv_bias_grad.default(_sample(grad, grad_dim))
    grad = grad.movedim(grad_dim, 1)                                  # [N, B, C, H, W]
    folded = grad.reshape(grad.shape[0], -1, *grad.shape[3:]).contiguous()
    return torch.ops.fuel_backward.conv_bias_grad.default(folded).reshape(info.batch_size, -1), 0


def _register() -> None:
    for op in elementwise.OPS:
        torch.library.register_vmap(f"fuel::{op}", _elementwise_rule(op))
    torch.library.register_vmap("fuel::conv2d", _conv_rule("conv2d", transpose=False))
    torch.library.register_vmap("fuel::conv_transpose2d", _conv_rule("conv_transpose2d", transpose=True))
    torch.library.register_vmap("fuel_backward::conv_bias_grad", _bias_grad_rule)


_register()
