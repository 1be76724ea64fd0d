"""The one registry of kernel families: for each family, the module that serves its ops and the
module that holds the Judge's probes for them (imported only when the Judge asks)."""
from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

import torch

from . import convolution, elementwise


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    module: ModuleType  # OPS, the Python API, fake kernels, parity, example_call
    probes: str  # the Judge's probe module (kept out of `import fuel_torch`)


FAMILIES: tuple[Family, ...] = (
    Family("elementwise", elementwise, "fuel_torch.judge.family_elementwise"),
    Family("convolution", convolution, "fuel_torch.judge.family_convolution"),
)


def family(op: str) -> Family:
    for entry in FAMILIES:
        if op in entry.module.OPS:
            return entry
    raise KeyError(f"fuel::{op} belongs to no kernel family")


def of(op: str) -> ModuleType:
    """The module serving fuel::<op>."""
    return family(op).module


def probes(op: str) -> ModuleType:
    """The Judge's probe module for fuel::<op>."""
    return importlib.import_module(family(op).probes)


def missing_kernel(op: str) -> str | None:
    """Why fuel::<op> cannot be audited here, or None when it can."""
    if not hasattr(torch.ops.fuel, op):
        return f"torch.ops.fuel has no {op}: this build does not register that kernel"
    try:
        family(op)
    except KeyError as error:
        return str(error.args[0])
    return None
