"""Torch's own OpInfo samples for the corresponding torch ops, as a ready-made corpus.

Used: tensor-tensor samples of one dtype with no extra keyword arguments (alpha, rounding_mode).
Samples of one shape are made contiguous; broadcastable ones are broadcast explicitly first (our
kernels do not broadcast). Same oracles as the parity tests.
"""
from __future__ import annotations

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from elementwise_cases import DTYPES
from test_elementwise_parity import check_against_oracle

FUEL_OP = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "maximum", "minimum": "minimum",
           "pow": "pow", "remainder": "rem"}


def samples(torch_name, dtype):
    infos = [o for o in op_db if o.name == torch_name and o.variant_test_name in ("", "no_rounding_mode")]
    assert infos, torch_name
    for info in infos:
        for sample in info.sample_inputs("cpu", dtype):
            other = sample.args[0] if sample.args else None
            if (isinstance(other, torch.Tensor) and not sample.kwargs and len(sample.args) == 1
                    and other.dtype == sample.input.dtype):
                try:
                    lhs, rhs = torch.broadcast_tensors(sample.input, other)
                except RuntimeError:
                    continue
                yield lhs.contiguous(), rhs.contiguous()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("torch_name", sorted(FUEL_OP))
def test_opinfo_samples(torch_name, dtype):
    used = 0
    for lhs, rhs in samples(torch_name, dtype):
        check_against_oracle(FUEL_OP[torch_name], lhs.detach(), rhs.detach())
        used += 1
    assert used >= 1, f"no usable OpInfo sample for {torch_name}"
