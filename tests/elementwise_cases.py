"""Inputs shared by the elementwise tests: special values, random data, references."""
from __future__ import annotations

import numpy as np
import torch

from fuel_torch.reference import bits, round_to

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
OPS = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "rem")
# Vector widths in elements on AVX2 (8 f32, 4 f64, 16 halves) and their neighbours.
SIZES = (0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4099, 65537, 1_048_583)

_PAYLOAD_NANS = {
    torch.float32: [0x7FC00001, -0x3FFFFF, 0x7F800001, -0x7FFFFF],  # quiet+payload, negative, signalling
    torch.float64: [0x7FF8000000000001, -0x7FFFFFFFFFFFF, 0x7FF0000000000001],
    torch.bfloat16: [0x7FC1, -0x3F, 0x7F81],
    torch.float16: [0x7E01, -0x1FF, 0x7C01],
}


def specials(dtype: torch.dtype) -> torch.Tensor:
    """Signed zeros, infinities, NaNs with payloads, subnormals, extremes, integers and near-integers."""
    fi = torch.finfo(dtype)
    values = [0.0, -0.0, float("inf"), float("-inf"), float("nan"),
              fi.tiny, -fi.tiny, fi.smallest_normal / 2, -fi.smallest_normal / 2, fi.max, -fi.max,
              fi.max / 3, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, 7.0, -7.0, 6.0, -6.0,
              1 - fi.eps, 1 + fi.eps, -(1 - fi.eps), 0.1, -0.1, 1e-3, 123.25, -123.25, 17.0, 100.0, -0.75]
    # The smallest subnormal.
    values.append(float(torch.tensor(1, dtype=bits(torch.zeros(1, dtype=dtype)).dtype).view(dtype)))
    plain = torch.tensor(values, dtype=torch.float64).to(dtype)
    nans = torch.tensor(_PAYLOAD_NANS[dtype], dtype=bits(plain).dtype).view(dtype)
    return torch.cat([plain, nans])


def cross(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Every special value against every special value."""
    s = specials(dtype)
    return s.repeat_interleave(len(s)), s.repeat(len(s))


def random_pair(numel: int, dtype: torch.dtype, seed: int, op: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lhs = torch.randn(numel, generator=g, dtype=torch.float64) * 8
    rhs = torch.randn(numel, generator=g, dtype=torch.float64) * 8
    if op == "pow":
        lhs = lhs.abs() / 4  # most results finite; sign and specials are covered by the cross product
        rhs = rhs / 4
    return lhs.to(dtype), rhs.to(dtype)


def exact_rem(lhs: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """torch.remainder's definition computed exactly: fmod (exact in numpy), then one rounded add."""
    a, b = lhs.double().reshape(-1).numpy(), rhs.double().reshape(-1).numpy()
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = np.fmod(a, b)
        moved = (m != 0) & ((m < 0) != (b < 0))
        # For f32 and halves the f64 sum is exact; round_to rounds it once. For f64 it rounds once here.
        result = np.where(moved, m + b, m)
    return round_to(torch.from_numpy(result).reshape(lhs.shape), lhs.dtype)


def pow_reference(lhs: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """C99 pow rounded to the dtype: f64 pow for the narrower types, long double (64-bit significand) for
    f64, which rounds twice: within 2**-11 ulp of correctly rounded, so a distance of 1 ulp is allowed."""
    wide = np.longdouble if lhs.dtype == torch.float64 else np.float64
    with np.errstate(all="ignore"):
        exact = np.power(lhs.double().reshape(-1).numpy().astype(wide), rhs.double().reshape(-1).numpy().astype(wide))
        if lhs.dtype == torch.float64:
            return torch.from_numpy(exact.astype(np.float64)).reshape(lhs.shape)
    return round_to(torch.from_numpy(exact).reshape(lhs.shape), lhs.dtype)


def c99_fixed(lhs: torch.Tensor, rhs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Where C99 fixes pow's result exactly: zeros, infinities, and the ones C99 names. A result that
    merely rounds to 1 is not fixed: the long double reference can round it the wrong way from a
    midpoint, e.g. (1 - 2**-52) ** -0.5, just above 1 + 2**-53, which rounds up, not to 1."""
    c99_one = (rhs == 0) | (lhs == 1) | ((lhs == -1) & torch.isinf(rhs))
    return (~torch.isfinite(reference) | (reference == 0) | c99_one) & ~torch.isnan(reference)


def selection_reference(op: str, lhs: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """maximum/minimum as defined: lhs if NaN, else rhs if NaN, else the larger/smaller, lhs on ties."""
    a, b = lhs.double(), rhs.double()
    better = b > a if op == "maximum" else b < a
    take_rhs = (torch.isnan(b) & ~torch.isnan(a)) | better
    return torch.where(take_rhs, rhs, lhs)
