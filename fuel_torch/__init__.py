"""fuel_torch: contract-enforced CPU custom operators for PyTorch.

Importing the package registers torch.ops.fuel.* (the C++ kernels), installs the rules parsed
from the shipped FKC contracts and the compiled convolution geometry table into them, and
registers the fake kernels torch.compile uses.
"""
from importlib import metadata as _metadata

import torch

from . import _C  # noqa: F401  (loading the library registers the ops)
# importing capability chooses the kernels' instruction-set level
from .capability import (amx_convolution, bfloat16_brgemm, cpu_capability, float16_division, float_brgemm,
                         patch_brgemm)
from .contracts import Contract, ContractFormatError, ContractSet, contract, installed, load_contracts, rules_for_cpp
from .enforce import ContractViolation
from .layout import current_policy, layout_policy

_C.install_rules(rules_for_cpp(installed()))
from . import geometry  # noqa: E402
geometry.install(geometry.installed())  # the convolution geometry checks, for C++ and the fake kernels alike

from . import convolution, elementwise  # noqa: E402  (needs the ops registered above)
from . import compile_fixes, nn, vmap  # noqa: E402,F401  (a torch.compile fix, nn modules, vmap batching rules)

add, sub, mul, div = (elementwise.API[op] for op in ("add", "sub", "mul", "div"))
maximum, minimum, pow, rem = (elementwise.API[op] for op in ("maximum", "minimum", "pow", "rem"))
conv2d, conv_transpose2d = convolution.conv2d, convolution.conv_transpose2d
from .costmodel import cost  # noqa: E402  (predicted cost of a call; calibrated by `python -m fuel_torch judge`)
from .planner import plan_report  # noqa: E402  (torch.compile backends "fuel" and "fuel_inductor")
from . import autocast_policy  # noqa: E402,F401  (torch's CPU autocast behaviour for the fuel ops)

try:
    __version__ = _metadata.version("fuel-torch")
except _metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"

__all__ = [
    "Contract", "ContractFormatError", "ContractSet", "ContractViolation", "contract", "installed",
    "load_contracts", "cpu_capability", "amx_convolution", "bfloat16_brgemm", "float_brgemm", "patch_brgemm",
    "float16_division",
    "layout_policy", "current_policy",
    "add", "sub", "mul", "div", "maximum", "minimum", "pow", "rem", "conv2d", "conv_transpose2d",
]
