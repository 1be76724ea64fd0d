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

from fuel_torch import reference


def round_to(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Round float64 values once, to nearest even, into `dtype` (fuel_torch.reference.round_to on numpy input)."""
    return reference.round_to(torch.from_numpy(np.array(values, dtype=np.float64)), dtype)


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
