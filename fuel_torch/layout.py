"""The opt-in layout policy: the planner step the seed runs before a contiguous-only kernel.

Kernels accept only contiguous, zero-offset operands of matching shape. By default (`strict`)
anything else is a contract error. Under `layout_policy("contiguize")` the fuel_torch API first
broadcasts same-dtype operands to one shape and materializes strided, offset or expanded operands
into fresh contiguous tensors. The policy belongs to the Python API (the planner layer);
torch.ops.fuel.* are the raw kernels and always strict.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch

POLICIES = ("strict", "contiguize")


class _Policy(threading.local):
    # A thread-local rather than a ContextVar: torch.compile traces a thread-local attribute (and
    # guards on it, recompiling when the policy changes) but breaks the graph on a ContextVar.
    name = "strict"


_policy = _Policy()


@contextlib.contextmanager
def layout_policy(name: str) -> Iterator[None]:
    """`with fuel_torch.layout_policy("contiguize"):` lets the API repair awkward layouts."""
    if name not in POLICIES:
        raise ValueError(f"fuel_torch.layout_policy: unknown policy {name!r}; expected one of {list(POLICIES)}")
    previous, _policy.name = _policy.name, name
    try:
        yield
    finally:
        _policy.name = previous


def current_policy() -> str:
    return _policy.name


def _channels_last(t: torch.Tensor) -> bool:
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)


def needs_copy(t: torch.Tensor, keep_channels_last: bool = False) -> bool:
    dense = t.is_contiguous() or (keep_channels_last and _channels_last(t))
    return not (dense and t.storage_offset() == 0)


def materialize(t: torch.Tensor, keep_channels_last: bool = False) -> torch.Tensor:
    """A contiguous, zero-offset tensor with t's values (t itself when it already is one).

    keep_channels_last: for kernels that read channels_last (the convolutions), a 4-d tensor laid out
    as torch.channels_last stays as it is (or is copied into that layout), as torch's convs keep it."""
    fmt = torch.channels_last if keep_channels_last and t.dim() == 4 and _suggests_channels_last(t) \
        else torch.contiguous_format
    if torch.compiler.is_compiling():
        # Dynamo cannot trace storage_offset(); a fresh copy is right whatever the layout.
        return t.clone(memory_format=fmt)
    return t.clone(memory_format=fmt) if needs_copy(t, keep_channels_last) else t


def _suggests_channels_last(t: torch.Tensor) -> bool:
    from torch._prims_common import suggest_memory_format
    return suggest_memory_format(t) == torch.channels_last


def prepare(tensors: tuple, broadcast: bool = False, keep_channels_last: bool = False) -> tuple:
    """Apply the current policy to a call's tensor operands (None entries stay None)."""
    if _policy.name == "strict":
        return tensors
    present = [t for t in tensors if t is not None]
    if broadcast and len({t.dtype for t in present}) == 1:
        it = iter(torch.broadcast_tensors(*present))
        tensors = tuple(next(it) if t is not None else None for t in tensors)
    return tuple(materialize(t, keep_channels_last) if t is not None else None for t in tensors)
