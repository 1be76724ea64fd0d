"""Drop-in nn modules on fuel kernels, and convert() to move an existing model onto them.

fuel_torch.nn.Conv2d and ConvTranspose2d subclass torch.nn.Conv2d / ConvTranspose2d: the constructor,
parameters (weight, bias), their initialization and the state_dict keys are torch's own; only forward
runs our ops. What the contracts cannot serve is refused when the module is built, with the reason:
padding_mode other than 'zeros', padding='same' where it is asymmetric, dtypes other than
float32/float64/bfloat16/float16.

Like torch's modules they take batched [N, C, H, W] or unbatched [C, H, W] input of any layout: a
module is a planner in the sense of the layout policy, so a strided or offset input is materialized
into a contiguous copy before the (strict) kernel sees it.
"""
from __future__ import annotations

import dataclasses
import warnings

import torch

from . import layout
from .contracts import FKC_DTYPES

__all__ = ["Conv2d", "ConvTranspose2d", "ConversionReport", "ConversionWarning", "convert"]


def _padding(module: torch.nn.Conv2d) -> tuple[int, int] | str:
    """The symmetric padding fuel::conv2d takes for `module.padding`, or why there is none."""
    padding = module.padding
    if padding == "valid":
        return (0, 0)
    if padding == "same":
        # torch pads dilation * (kernel - 1) in total per dimension, the odd element after the input.
        totals = [d * (k - 1) for d, k in zip(module.dilation, module.kernel_size)]
        if any(total % 2 for total in totals):
            return (f"padding='same' with kernel_size={tuple(module.kernel_size)}, dilation={tuple(module.dilation)} "
                    f"pads asymmetrically (torch puts the odd element after the input); fuel::conv2d pads "
                    f"symmetrically")
        return (totals[0] // 2, totals[1] // 2)
    return tuple(padding)


def _unsupported(module: torch.nn.Module) -> str | None:
    """Why fuel cannot run `module`, or None if it can."""
    if module.padding_mode != "zeros":
        return f"padding_mode={module.padding_mode!r}: fuel kernels pad with zeros only"
    if isinstance(module, torch.nn.Conv2d) and isinstance(_padding(module), str):
        return _padding(module)
    for name, tensor in module.named_parameters(recurse=False):
        if tensor.dtype not in FKC_DTYPES.values():
            return (f"{name} has dtype {tensor.dtype}: fuel kernels serve torch.float32, torch.float64, "
                    f"torch.bfloat16 and torch.float16")
        if tensor.device.type not in ("cpu", "meta"):
            return f"{name} is on device {tensor.device}: fuel kernels run on the CPU"
    return None


def _batched(input: torch.Tensor):
    """The 4-d contiguous input our kernels take, and whether the result should drop the batch again."""
    unbatched = input.dim() == 3
    x = input.unsqueeze(0) if unbatched else input
    if torch.compiler.is_compiling():
        # Dynamo cannot read storage_offset(); in a graph the strides are what matters (intermediates start at
        # offset 0), and a graph input that is an offset view still meets the op's fake, which names it.
        return x.contiguous(), unbatched
    return layout.materialize(x, keep_channels_last=True), unbatched


class Conv2d(torch.nn.Conv2d):
    """torch.nn.Conv2d computed by fuel::conv2d (same constructor, parameters, init and state_dict)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        reason = _unsupported(self)
        if reason:
            raise ValueError(f"fuel_torch.nn.Conv2d: {reason}. Use torch.nn.Conv2d for this configuration.")

    def _get_name(self) -> str:
        # The name repr() prints: `fuel.Conv2d(16, 32, kernel_size=(3, 3), ...)` tells a printed model's fuel
        # modules from torch's.
        return "fuel.Conv2d"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x, unbatched = _batched(input)
        weight, bias = layout.prepare((self.weight, self.bias), keep_channels_last=True)
        out = torch.ops.fuel.conv2d(x, weight, bias, self.stride, _padding(self), self.dilation, self.groups)
        return out.squeeze(0) if unbatched else out


class ConvTranspose2d(torch.nn.ConvTranspose2d):
    """torch.nn.ConvTranspose2d computed by fuel::conv_transpose2d (same constructor, parameters, init and
    state_dict; forward takes the same optional output_size)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        reason = _unsupported(self)
        if reason:
            raise ValueError(f"fuel_torch.nn.ConvTranspose2d: {reason}. Use torch.nn.ConvTranspose2d for this "
                             f"configuration.")

    def _get_name(self) -> str:
        return "fuel.ConvTranspose2d"

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        # torch's own rule (and error) for turning a requested output_size into output_padding.
        output_padding = self._output_padding(input, output_size, self.stride, self.padding, self.kernel_size, 2,
                                              self.dilation)
        x, unbatched = _batched(input)
        weight, bias = layout.prepare((self.weight, self.bias), keep_channels_last=True)
        out = torch.ops.fuel.conv_transpose2d(x, weight, bias, self.stride, self.padding, output_padding,
                                              self.groups, self.dilation)
        return out.squeeze(0) if unbatched else out


_SWAPS = {torch.nn.Conv2d: Conv2d, torch.nn.ConvTranspose2d: ConvTranspose2d}


class ConversionWarning(UserWarning):
    """convert() left a convolution on torch (the message says which and why)."""


# convert() swaps modules only; what a model's forward computes with plain torch ops is the planner's.
OTHER_OPS_NOTE = ("convert() swaps Conv2d / ConvTranspose2d modules only: residual adds, activations and every "
                  "other torch op in forward stay on torch; torch.compile(model, backend=\"fuel\") routes those onto "
                  "fuel kernels where the contracts allow and it pays")


@dataclasses.dataclass
class ConversionReport:
    converted: list[str]  # qualified module names now running on fuel kernels
    skipped: dict[str, str]  # qualified module name -> why it stays on torch
    note: str = OTHER_OPS_NOTE

    def __str__(self) -> str:
        lines = [f"fuel_torch.nn.convert: {len(self.converted)} converted, {len(self.skipped)} left on torch"]
        lines += [f"  {name or '<root>'}: {reason}" for name, reason in self.skipped.items()]
        lines.append(f"  note: {self.note}")
        return "\n".join(lines)


def convert(model: torch.nn.Module) -> ConversionReport:
    """Swap, in place, every torch.nn.Conv2d / ConvTranspose2d in `model` for its fuel twin.

    A swapped module keeps its identity: the same object, parameters (so optimizers holding them stay
    valid), buffers, hooks and mode; only its class changes, and the fuel classes add no state. Modules
    fuel cannot serve stay as they are, each with a ConversionWarning and an entry in the returned report.
    The rest of the model's computation (residual adds, activations: plain torch ops in forward, not modules
    to swap) stays on torch; `torch.compile(model, backend="fuel")` routes those, and the report says so.
    Subclasses of the torch modules (LazyConv2d, user subclasses with their own forward) are left alone too:
    their forward is not torch's to replace.
    """
    report = ConversionReport(converted=[], skipped={})
    for name, module in model.named_modules():
        kind = type(module)
        if kind in _SWAPS.values():
            continue
        base = next((torch_kind for torch_kind in _SWAPS if isinstance(module, torch_kind)), None)
        if base is None:
            continue
        if kind is not base:
            reason = (f"{kind.__qualname__} subclasses torch.nn.{base.__name__}; its own behaviour would be lost, "
                      f"so it stays on torch")
        else:
            reason = _unsupported(module)
        if reason:
            report.skipped[name] = reason
            warnings.warn(f"fuel_torch.nn.convert: left {name or '<root>'} ({kind.__name__}) on torch: {reason}",
                          ConversionWarning, stacklevel=2)
            continue
        module.__class__ = _SWAPS[base]
        report.converted.append(name)
    return report
