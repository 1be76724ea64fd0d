"""float64 pow where its error budget is tight: <= 1 ulp from the correctly rounded power (the long
double reference of the parity tests) on inputs the random pairs there almost never reach.

- bases near 1 with exponents that take |y log x| to 600-745, where the log's relative error is
  multiplied the most (csrc/kernels/pow_double_avx512.h: rows 0 and 1 of its log table);
- bases on either side of every row boundary of the AVX-512 log table (1 + (2j + 1)/64 times a
  power of 2) and of its wrap (2 - 2^-6), where the reduction switches rows;
- results near overflow, at the bottom of the normal range and subnormal (rounded once there);
- subnormal bases, and integer exponents.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fuel_torch  # noqa: F401  (registers torch.ops.fuel)
from fuel_torch.reference import ulp_distance

from elementwise_cases import pow_reference

N = 40_000


def exponent_for(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """y with y log x close to t (x != 1)."""
    return t / np.log(x)


def hard_case(name: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    u = lambda: rng.random(N)  # noqa: E731
    if name == "near_one_large_y":
        x = 1 + np.ldexp(u() * 2 - 1, -rng.integers(1, 53, size=N))
        x[x == 1] = np.nextafter(1.0, 2.0)
        return x, exponent_for(x, np.where(u() < 0.5, 1, -1) * (600 + u() * 145))
    if name == "row_boundaries":
        # 1 + (2j - 1)/64 for j = 1..32: between rows j - 1 and j, j = 32 the wrap (2 - 2^-6, which
        # halved is row 0's lower end, 1 - 2^-7).
        edge = 1 + (2 * rng.integers(1, 33, size=N) - 1) / 64.0
        x = np.ldexp(edge + rng.integers(-4, 5, size=N) * 2.0**-52, rng.integers(-3, 4, size=N))
        return x, exponent_for(x, (u() * 2 - 1) * 700)
    if name == "near_overflow":
        x = np.exp((u() * 2 - 1) * 700)
        return x, exponent_for(x, 709 + u() * 1.2)
    if name == "subnormal_results":
        x = np.exp((u() * 2 - 1) * 700)
        return x, exponent_for(x, -707 - u() * 39)
    if name == "subnormal_bases":
        b = rng.integers(1, 1 << 52, size=N, dtype=np.int64) >> rng.integers(0, 52, size=N)
        x = np.maximum(b, 1).view(np.float64)
        return x, (u() * 2 - 1) * 1.4
    if name == "integer_exponents":
        y = rng.integers(-100, 101, size=N).astype(np.float64)
        return np.exp((u() * 2 - 1) * 700 / np.maximum(np.abs(y), 1)), y
    raise ValueError(name)


CASES = ("near_one_large_y", "row_boundaries", "near_overflow", "subnormal_results", "subnormal_bases",
         "integer_exponents")


@pytest.mark.parametrize("case", CASES)
def test_pow_float64_within_one_ulp_where_the_budget_is_tight(case):
    x, y = hard_case(case, np.random.default_rng(CASES.index(case)))
    lhs, rhs = torch.from_numpy(x), torch.from_numpy(y)
    ours = torch.ops.fuel.pow(lhs, rhs)
    reference = pow_reference(lhs, rhs)
    assert not torch.isnan(reference).any()
    distance = ulp_distance(ours, reference)
    worst = int(distance.argmax())
    assert int(distance[worst]) <= 1, (
        f"{case}: pow({x[worst].hex()}, {y[worst].hex()}) is {int(distance[worst])} ulp from correctly rounded")
