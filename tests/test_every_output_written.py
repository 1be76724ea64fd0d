"""Every output element is written: the parity tests again with torch.empty NaN-filled.

Under torch.use_deterministic_algorithms(True) with
torch.utils.deterministic.fill_uninitialized_memory = True, every tensor torch allocates without
initializing it (the kernels' own outputs included, they come from at::empty) starts as NaN, and
every `.out` tensor here is pre-filled with NaN. An element a kernel forgot to write then stays
NaN, and the parity oracles, which require NaN exactly where the definition gives NaN, fail.
"""
from __future__ import annotations

import pytest
import torch

import test_convolution as conv_parity
import test_elementwise_parity as elementwise_parity
from elementwise_cases import DTYPES, OPS, cross, random_pair
from fuel_torch.reference import bit_equal

CONV_OPS = ("conv2d", "conv_transpose2d")


@pytest.fixture
def nan_filled_empty():
    deterministic = torch.are_deterministic_algorithms_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        assert torch.empty(64).isnan().all(), "the mode must make torch.empty NaN-filled"
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
        torch.use_deterministic_algorithms(deterministic)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_elementwise_parity_with_nan_filled_memory(nan_filled_empty, op, dtype):
    elementwise_parity.test_special_values_cross_product(op, dtype)
    elementwise_parity.test_out_overload_overwrites_every_element(op, dtype)
    for seed, numel in enumerate((0, 1, 7, 8, 9, 17, 33, 65, 4099, 65537)):
        lhs, rhs = random_pair(numel, dtype, seed, op)
        elementwise_parity.check_against_oracle(op, lhs, rhs)
        out = torch.full_like(lhs, float("nan"))
        assert bit_equal(getattr(torch.ops.fuel, op).out(lhs, rhs, out=out), getattr(torch.ops.fuel, op)(lhs, rhs))


@pytest.mark.parametrize("op", OPS)
def test_elementwise_ranks_with_nan_filled_memory(nan_filled_empty, op):
    for shape in [(), (0,), (3, 0, 2), (2, 3, 4), (2, 1, 3, 1, 2), (1, 2, 1, 3, 1, 2)]:
        elementwise_parity.test_ranks_zero_to_six_and_empty_tensors(op, shape)


@pytest.mark.parametrize("number", range(0, len(conv_parity.GRID), 3))
def test_convolution_parity_with_nan_filled_memory(nan_filled_empty, number):
    """Every third case of the convolution parity grid (it covers every op, dtype and geometry factor)."""
    conv_parity.test_parity_grid(number)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", CONV_OPS)
def test_convolution_edges_with_nan_filled_memory(nan_filled_empty, op, dtype):
    conv_parity.test_out_overload_overwrites_every_element(op, dtype)
    conv_parity.test_integer_valued_inputs_are_exact(op, dtype)
    conv_parity.test_empty_batch(op, dtype)
    if dtype == torch.float32:
        conv_parity.test_no_input_channels_give_the_bias(op)
        conv_parity.test_empty_input_rows_read_only_padding(op)


def test_a_skipped_element_would_be_caught(nan_filled_empty):
    """The oracle really sees an unwritten element: one NaN left in an otherwise right result fails it."""
    lhs, rhs = cross(torch.float32)
    keep = ~torch.isnan(lhs) & ~torch.isnan(rhs)
    lhs, rhs = lhs[keep], rhs[keep]
    ours = torch.ops.fuel.mul(lhs, rhs)
    finite = torch.isfinite(ours).nonzero()[0].item()
    ours[finite] = float("nan")
    with pytest.raises(AssertionError, match="NaN positions differ"):
        elementwise_parity.assert_same_nan(ours, torch.mul(lhs, rhs))
