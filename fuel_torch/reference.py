"""Bit-level comparison helpers shared by tests, the CLI and the Judge."""
from __future__ import annotations

import torch

INT_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
            torch.float16: torch.int16}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns of a floating tensor, as signed integers of the same width."""
    return t.contiguous().view(INT_VIEW[t.dtype])


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool((bits(a) == bits(b)).all())


def ordinal(t: torch.Tensor) -> torch.Tensor:
    """Maps floats to int64 so that adjacent representable values differ by one (-0 == +0)."""
    b = bits(t).to(torch.int64)
    width = torch.finfo(t.dtype).bits
    sign = torch.tensor(1, dtype=torch.int64) << (width - 1)
    magnitude = b & (sign - 1) if width < 64 else b & torch.iinfo(torch.int64).max
    return torch.where(b < 0, -magnitude, magnitude)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Units in the last place between a and b, elementwise; 0 where both are NaN, huge where one is."""
    distance = (ordinal(a) - ordinal(b)).abs()
    a_nan, b_nan = torch.isnan(a), torch.isnan(b)
    distance = torch.where(a_nan & b_nan, torch.zeros_like(distance), distance)
    return torch.where(a_nan ^ b_nan, torch.full_like(distance, torch.iinfo(torch.int64).max), distance)


def round_to(exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round float64 values once, to nearest even, into `dtype`.

    torch converts float64 to a half type through float32, which can round twice. Rounding to
    float32 *to odd* first makes the second rounding exact (float32 has more than p+2 bits of
    either half type), so the result is the correctly rounded one.
    """
    exact = exact.double()
    if dtype in (torch.float64, torch.float32):
        return exact.to(dtype)
    x = exact.float()
    back = x.double()
    inexact = torch.isfinite(x) & (back != exact)
    x = torch.where(inexact & (back.abs() > exact.abs()), torch.nextafter(x, torch.zeros_like(x)), x)
    odd = torch.where(inexact, bits(x) | 1, bits(x)).view(torch.float32)
    return odd.to(dtype)
