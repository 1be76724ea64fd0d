"""Correct rounding to each dtype, and a correctly rounded float64 pow.

The precision audit compares a kernel against the correctly rounded result. For float32 and the
halves the exact result is first computed in float64 and rounded once to the target type here.
For float64 itself the references use IEEE arithmetic (correctly rounded by definition for + - * /
and for fmod, which is exact) or mpmath at 160 bits for pow.
"""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import torch


def round_to(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Round float64 values once, to nearest even, into `dtype` (never f64 -> f32 -> bf16 twice)."""
    values = np.asarray(values, dtype=np.float64)
    if dtype == torch.float64:
        return torch.from_numpy(values.copy())
    if dtype in (torch.float32, torch.float16):
        # numpy converts double -> float and double -> half directly (npy_double_to_half), rounding
        # once; overflow to infinity is the right answer, so numpy's warning about it is noise.
        with np.errstate(over="ignore"):
            return torch.from_numpy(values.astype(np.float32 if dtype == torch.float32 else np.float16))
    if dtype == torch.bfloat16:
        # Round to odd into float32 (24 bits >= 8 + 2), then to nearest even into bfloat16:
        # the pair is equivalent to one correct rounding, where plain f64 -> f32 -> bf16 is not.
        with np.errstate(all="ignore"):
            nearest = values.astype(np.float32)
            back = nearest.astype(np.float64)
            inexact = np.isfinite(values) & (back != values)
            bits = nearest.view(np.uint32).copy()
            bits[inexact & (np.abs(back) > np.abs(values))] -= 1  # truncate toward zero (sign-magnitude)
            bits[inexact] |= 1
        return torch.from_numpy(bits.view(np.float32)).to(torch.bfloat16)
    raise TypeError(f"no rounding rule for {dtype}")


def _to_float(value: mpmath.mpf) -> float:
    """mpf -> nearest double, subnormals and overflow included (Python's int division rounds once)."""
    sign, man, exp, _ = value._mpf_
    exact = Fraction(man * 2**exp) if exp >= 0 else Fraction(man, 2**-exp)
    try:
        result = float(exact)
    except OverflowError:
        result = math.inf
    return -result if sign else result


def pow64(base: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """Correctly rounded float64 pow. C99 special cases come from the C library's pow (numpy),
    every other element from mpmath at 160 bits, rounded once."""
    base, exponent = np.asarray(base, np.float64), np.asarray(exponent, np.float64)
    with np.errstate(all="ignore"):
        result = np.power(base, exponent)  # right on every special case; refined below
        integral = np.floor(exponent) == exponent
        regular = (np.isfinite(base) & np.isfinite(exponent) & (base != 0) & (exponent != 0) & (base != 1)
                   & ((base > 0) | integral))
        log2_magnitude = exponent * np.log2(np.abs(base))
    odd = integral & (np.fmod(np.abs(exponent), 2) == 1)
    negative = (base < 0) & odd
    with mpmath.workprec(160):
        for i in np.flatnonzero(regular):
            if log2_magnitude[i] > 1100:
                value = math.inf
            elif log2_magnitude[i] < -1200:
                value = 0.0
            else:
                value = abs(_to_float(mpmath.power(mpmath.mpf(abs(float(base[i]))), mpmath.mpf(float(exponent[i])))))
            result[i] = -value if negative[i] else value
    return result
