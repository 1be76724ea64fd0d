"""The Judge's probe module for each kernel family (the kernel-side registry is fuel_torch.families)."""
from __future__ import annotations

from types import ModuleType

import torch

from . import family_convolution, family_elementwise

FAMILIES: tuple[ModuleType, ...] = (family_elementwise, family_convolution)


def of(op: str) -> ModuleType:
    for family in FAMILIES:
        if op in family.OPS:
            return family
    raise KeyError(f"the Judge has no probes for fuel::{op}")


def missing_kernel(op: str) -> str | None:
    """Why fuel::<op> cannot be audited here, or None when it can."""
    if not hasattr(torch.ops.fuel, op):
        return f"torch.ops.fuel has no {op}: this build does not register that kernel"
    try:
        of(op)
    except KeyError as error:
        return str(error)
    return None
