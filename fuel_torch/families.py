"""Which module serves each fuel op: one module per kernel family."""
from __future__ import annotations

from types import ModuleType

from . import convolution, elementwise

_FAMILIES: list[ModuleType] = [elementwise, convolution]


def of(op: str) -> ModuleType:
    for family in _FAMILIES:
        if op in family.OPS:
            return family
    raise KeyError(f"fuel::{op} belongs to no kernel family")


def all_families() -> list[ModuleType]:
    return list(_FAMILIES)
