"""What every family's probes share: a call, the three paths into a kernel, awkward layouts.

A `Call` is one invocation of a fuel op: its tensor arguments in schema order (None for an absent
optional) and its non-tensor parameters. The Judge runs a call on each path a user can take:

- ``eager``: ``torch.ops.fuel.<op>`` (the C++ kernel and its C++ contract check),
- ``api``:   ``fuel_torch.<op>`` (Python check + layout policy; the Judge runs it under "strict"),
- ``fake``:  ``torch.ops.fuel.<op>`` under FakeTensorMode (the fake kernel torch.compile traces).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fuel_torch

PATHS = ("eager", "api", "fake")


@dataclasses.dataclass
class Call:
    op: str
    tensors: dict[str, torch.Tensor | None]
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ""

    def with_tensor(self, name: str, tensor: torch.Tensor | None, note: str = "") -> "Call":
        tensors = dict(self.tensors)
        tensors[name] = tensor
        return Call(self.op, tensors, dict(self.params), note or self.note)

    def with_params(self, note: str = "", **params: Any) -> "Call":
        return Call(self.op, dict(self.tensors), {**self.params, **params}, note or self.note)

    def describe(self) -> str:
        parts = [f"{name}=None" if t is None else f"{name}{list(t.shape)} {str(t.dtype).replace('torch.', '')}"
                 for name, t in self.tensors.items()]
        parts += [f"{k}={v}" for k, v in self.params.items()]
        return ", ".join(parts)


@dataclasses.dataclass
class Outcome:
    """What one path did with one call: ran (with its result) or raised."""

    path: str
    ran: bool
    result: Any = None
    error: str = ""
    contract_error: bool = False  # the exception is one of our contract messages ("fuel::<op> ...")

    def short(self) -> str:
        if self.ran:
            return "ran"
        first = self.error.splitlines()[0] if self.error else ""
        return ("rejected: " if self.contract_error else "raised a non-contract error: ") + first[:160]


def _invoke(fn: Callable, call: Call, out: torch.Tensor | None) -> Any:
    args = list(call.tensors.values())
    return fn(*args, **call.params) if out is None else fn(*args, **call.params, out=out)


def run(path: str, call: Call, out: torch.Tensor | None = None, mode: FakeTensorMode | None = None) -> Outcome:
    """Run `call` on one path. Exceptions are the data here, never propagated."""
    try:
        if path == "eager":
            packet = getattr(torch.ops.fuel, call.op)
            result = _invoke(packet.default if out is None else packet.out, call, out)
        elif path == "api":
            api = getattr(fuel_torch, call.op, None)
            if api is None:
                return Outcome(path, False, error=f"fuel_torch.{call.op} does not exist", contract_error=False)
            with fuel_torch.layout_policy("strict"):
                result = _invoke(api, call, out)
        elif path == "fake":
            mode = mode or FakeTensorMode()
            fake = Call(call.op, {k: None if t is None else mode.from_tensor(t) for k, t in call.tensors.items()},
                        call.params)
            fake_out = None if out is None else mode.from_tensor(out)
            packet = getattr(torch.ops.fuel, call.op)
            with mode:
                result = _invoke(packet.default if out is None else packet.out, fake, fake_out)
            # Fake results only carry metadata; keep what the return clause is checked against.
            result = FakeResult(tuple(result.shape), result.dtype, result.is_contiguous(), result.storage_offset(),
                                fake_out is not None and result is fake_out)
        else:
            raise ValueError(path)
    except Exception as error:  # noqa: BLE001 - any exception is an outcome to report
        text = str(error)
        return Outcome(path, False, error=f"{type(error).__name__}: {text}",
                       contract_error=text.startswith(f"fuel::{call.op}"))
    return Outcome(path, True, result=result)


@dataclasses.dataclass(frozen=True)
class FakeResult:
    shape: tuple
    dtype: torch.dtype
    contiguous: bool
    storage_offset: int
    is_out: bool


# ---- awkward layouts with the same shape and values as a contiguous tensor ---------------------

def strided_copy(t: torch.Tensor) -> torch.Tensor | None:
    """Non-contiguous (every stride doubled), zero offset, no stride 0."""
    if t.numel() < 2:
        return None
    strides = [2 * s for s in torch.empty(t.shape).stride()]
    return torch.empty_strided(t.shape, strides, dtype=t.dtype).copy_(t)


def stride0_view(t: torch.Tensor) -> torch.Tensor | None:
    """An expanded view: stride 0 along the last dimension of size > 1, zero offset."""
    dims = [d for d in range(t.dim()) if t.shape[d] > 1]
    if not dims:
        return None
    d = dims[-1]
    return t.narrow(d, 0, 1).expand(t.shape)


def offset_copy(t: torch.Tensor) -> torch.Tensor | None:
    """Contiguous, but starting one element into its storage."""
    buffer = torch.empty(t.numel() + 1, dtype=t.dtype)
    return buffer[1:].view(t.shape).copy_(t)


def channels_last_copy(t: torch.Tensor) -> torch.Tensor | None:
    """A 4-d tensor laid out as torch.channels_last (NHWC in memory), zero offset; None where that layout
    would also be contiguous (one channel, or a 1x1 image)."""
    if t.dim() != 4:
        return None
    variant = t.contiguous(memory_format=torch.channels_last)
    return None if variant.is_contiguous() else variant


LAYOUT_VARIANTS: dict[str, Callable[[torch.Tensor], torch.Tensor | None]] = {
    "strided": strided_copy,
    "broadcast_stride0": stride0_view,
    "start_offset": offset_copy,
    "channels_last": channels_last_copy,
}
NOT_CONSTRUCTIBLE = {"reverse_strides": "not constructible in torch (no negative strides); the kernel requires "
                                        "contiguous, so such a view could never reach it"}


def overlapping(t: torch.Tensor, out_shape: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """(t', out): t' equal to t, both contiguous with zero offset, sharing one storage."""
    buffer = torch.empty(max(t.numel(), math.prod(out_shape), 1), dtype=t.dtype)
    return buffer[:t.numel()].view(t.shape).copy_(t), buffer[:math.prod(out_shape)].view(out_shape)


def other_dtype(dtypes: tuple[str, ...]) -> torch.dtype:
    """A floating dtype the clause does not list."""
    from fuel_torch.contracts import FKC_NAME

    return next(d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16) if FKC_NAME[d] not in dtypes)
