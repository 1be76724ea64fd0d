"""Elementwise kernels against torch (the oracle) and against exact references.

Which oracle, per op:
- add, sub, mul, div: torch, bit for bit, for every non-NaN result in every dtype; NaN exactly where
  torch has NaN. NaN payloads are not compared: torch's depend on its formula (sub is add with
  alpha=-1) and on the element's position; ours are pinned by the position-invariance and
  determinism tests instead.
- maximum, minimum: NaN-ness against torch; bits against the definition (one operand bit for bit,
  lhs on ties), which torch itself does not follow consistently for +-0 and NaN payloads.
- rem: an exact fmod-based reference everywhere, and torch bit for bit wherever |lhs/rhs| does not
  overflow the computing type (torch's vector path returns NaN there, a known torch bug).
- pow: C99 special cases and <= 1 ulp from the correctly rounded power (float64 reference for f32 and
  halves, long double for f64). Never torch: its answer depends on the code path (bf16 pow(NaN, 0) is
  NaN in its scalar tail and 1 in its vector body, so it changes with the position and the CPU's
  vector width).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fuel_torch
from fuel_torch.elementwise import TORCH_EQUIVALENT
from fuel_torch.reference import bit_equal, bits, ulp_distance

from elementwise_cases import (DTYPES, OPS, SIZES, c99_fixed, cross, exact_rem, pow_reference, random_pair,
                               selection_reference, specials)


def fuel(op, lhs, rhs):
    return getattr(torch.ops.fuel, op)(lhs, rhs)


def max_ulp(distance):
    return int(distance.max()) if distance.numel() else 0


def assert_same_nan(ours, theirs):
    assert torch.equal(torch.isnan(ours), torch.isnan(theirs)), "NaN positions differ"


def assert_bits_where(ours, theirs, where, what):
    bad = where & (bits(ours) != bits(theirs))
    assert not bad.any(), f"{int(bad.sum())} elements differ from {what}, first at {bad.nonzero()[0].item()}"


def overflowing_quotient(lhs, rhs):
    """Where torch's vector remainder overflows: |lhs/rhs| beyond the computing type's range."""
    compute = torch.float64 if lhs.dtype == torch.float64 else torch.float32
    with np.errstate(all="ignore"):
        q = np.abs(lhs.double().reshape(-1).numpy() / rhs.double().reshape(-1).numpy())
    too_big = torch.from_numpy(q > torch.finfo(compute).max).reshape(lhs.shape)
    return too_big & torch.isfinite(lhs) & torch.isfinite(rhs)


def assert_pow_defined(ours, lhs, rhs):
    reference = pow_reference(lhs, rhs)
    assert_same_nan(ours, reference)
    distance = ulp_distance(ours, reference)
    assert max_ulp(distance) <= 1, f"pow is {max_ulp(distance)} ulp from correctly rounded"
    fixed = c99_fixed(lhs, rhs, reference)
    assert_bits_where(ours, reference, fixed & ~torch.isnan(ours), "the C99 special case")


def check_against_oracle(op, lhs, rhs):
    ours = fuel(op, lhs, rhs)
    assert ours.dtype == lhs.dtype and ours.shape == lhs.shape and ours.is_contiguous()
    theirs = TORCH_EQUIVALENT[op](lhs, rhs)
    not_nan = ~torch.isnan(ours)
    if op in ("add", "sub", "mul", "div"):
        assert_same_nan(ours, theirs)
        assert_bits_where(ours, theirs, not_nan, f"torch.{op}")
    elif op in ("maximum", "minimum"):
        assert_same_nan(ours, theirs)
        assert bit_equal(ours, selection_reference(op, lhs, rhs))
    elif op == "rem":
        reference = exact_rem(lhs, rhs)
        assert_same_nan(ours, reference)
        assert_bits_where(ours, reference, not_nan, "the exact remainder")
        torch_defined = ~overflowing_quotient(lhs, rhs)
        assert_same_nan(ours[torch_defined], theirs[torch_defined])
        assert_bits_where(ours, theirs, not_nan & torch_defined, "torch.remainder")
    elif op == "pow":
        assert_pow_defined(ours, lhs, rhs)
    return ours


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_special_values_cross_product(op, dtype):
    lhs, rhs = cross(dtype)
    check_against_oracle(op, lhs, rhs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_random_data_of_many_sizes(op, dtype):
    for seed, numel in enumerate(SIZES):
        lhs, rhs = random_pair(numel, dtype, seed, op)
        check_against_oracle(op, lhs, rhs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rem_near_integer_quotients_and_negative_divisors(dtype):
    """Quotients landing on or next to integers are where a floor-based formula goes wrong."""
    g = torch.Generator().manual_seed(7)
    rhs = torch.tensor([3.0, -3.0, 0.5, -0.5, 0.1, -0.1, 7.0, -2.5], dtype=torch.float64)
    k = torch.randint(-50, 50, (4096,), generator=g).double()
    divisor = rhs[torch.randint(0, len(rhs), (4096,), generator=g)]
    nudge = torch.tensor([-1, 0, 1])[torch.randint(0, 3, (4096,), generator=g)]
    lhs = (k * divisor).to(dtype)
    lhs = torch.where(nudge == 0, lhs, torch.nextafter(lhs, lhs + nudge.to(dtype)))
    divisor = divisor.to(dtype)
    ours = check_against_oracle("rem", lhs, divisor)
    finite = torch.isfinite(ours)
    # |r| can reach |b| only through the rounding of m + b, never beyond it.
    assert (ours[finite].double().abs() <= divisor.double().abs()[finite]).all()


def test_rem_cases_named_in_the_issue():
    lhs = torch.tensor([-6.0, 1.0, 1.0, 3e38, 7.0, -7.0])
    rhs = torch.tensor([3.0, float("inf"), float("-inf"), 0.5, -3.0, 3.0])
    ours = fuel("rem", lhs, rhs)
    assert bit_equal(ours, torch.tensor([-0.0, 1.0, float("-inf"), 0.0, -2.0, 2.0]))
    # torch's vector path (64 elements) loses rem(3e38, 0.5); ours does not depend on length.
    big = fuel("rem", torch.full((64,), 3e38), torch.full((64,), 0.5))
    assert bit_equal(big, torch.zeros(64))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pow_special_cases(dtype):
    nan, inf = float("nan"), float("inf")
    cases = [  # (base, exponent, expected)
        (nan, 0.0, 1.0), (nan, -0.0, 1.0), (1.0, nan, 1.0), (-1.0, inf, 1.0), (-1.0, -inf, 1.0),
        (-2.0, 0.5, nan), (0.0, -1.0, inf), (-0.0, -1.0, -inf), (-0.0, -2.0, inf), (-0.0, 3.0, -0.0),
        (0.0, 3.0, 0.0), (-inf, 3.0, -inf), (-inf, -3.0, -0.0), (inf, -1.0, 0.0), (0.5, inf, 0.0),
        (2.0, -inf, 0.0), (2.0, inf, inf), (-2.0, 3.0, -8.0), (-8.0, 1.0 / 3.0, nan),
    ]
    lhs, rhs, expected = (torch.tensor(col, dtype=torch.float64).to(dtype) for col in zip(*cases))
    ours = fuel("pow", lhs, rhs)
    assert_same_nan(ours, expected)
    assert bit_equal(ours.nan_to_num(0.0), expected.nan_to_num(0.0))


@pytest.mark.parametrize("op", ("maximum", "minimum"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_selection_ties_and_nan_payloads_follow_the_definition(op, dtype):
    """lhs wins +-0 ties and NaN-vs-NaN; a lone NaN operand comes back with its own payload."""
    lhs, rhs = cross(dtype)
    ours = fuel(op, lhs, rhs)
    both_zero = (lhs == 0) & (rhs == 0)
    assert bit_equal(ours[both_zero], lhs[both_zero])
    lhs_nan, rhs_nan = torch.isnan(lhs), torch.isnan(rhs)
    assert bit_equal(ours[lhs_nan], lhs[lhs_nan])
    assert bit_equal(ours[rhs_nan & ~lhs_nan], rhs[rhs_nan & ~lhs_nan])


@pytest.mark.parametrize("op", ("maximum", "minimum"))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_selection_over_every_lhs_bit_pattern(op, dtype):
    """Halves choose on their bits (integer keys for sign and magnitude, NaN above infinity's
    magnitude) at the vector levels: every one of the 65536 lhs patterns (both zeros, subnormals,
    infinities, every NaN payload) against the special values and 64 random patterns, bit for bit
    against the definition computed in float64. (All 2^32 pairs were checked once, offline.)"""
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    drawn = torch.randint(-32768, 32768, (64,), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    rhs_values = torch.cat([specials(dtype), drawn.to(torch.int16).view(dtype)])
    lhs = every.repeat(len(rhs_values))
    rhs = rhs_values.repeat_interleave(len(every))
    ours = fuel(op, lhs, rhs)
    assert bit_equal(ours, selection_reference(op, lhs, rhs))
    assert bit_equal(fuel(op, rhs, lhs), selection_reference(op, rhs, lhs))


QUIET_BIT = {torch.float32: 1 << 22, torch.float64: 1 << 51, torch.float16: 1 << 9}


@pytest.mark.parametrize("op", ("add", "sub", "mul", "div"))
@pytest.mark.parametrize("dtype", [d for d in DTYPES if d in QUIET_BIT], ids=str)
def test_arithmetic_nan_payloads_follow_the_lhs(op, dtype):
    """A NaN lhs comes back with its own payload, quieted, whatever rhs is; a lone NaN rhs with its.
    add and mul are commutative, so this pins the operand order of the instruction they issue.
    float16's payload survives its float detour through the F16C conversions; the DEFAULT level
    converts in software (c10's rule), which keeps the chosen NaN's sign and gives it the one
    canonical payload 0x7e00. bfloat16's narrowing turns every NaN into one pattern, so it has no
    payload to pin."""
    lhs, rhs = cross(dtype)
    ours = fuel(op, lhs, rhs)
    lhs_nan, rhs_nan = torch.isnan(lhs), torch.isnan(rhs)
    lone = rhs_nan & ~lhs_nan
    assert lone.any() and (lhs_nan & rhs_nan).any()
    if dtype == torch.float16 and fuel_torch.cpu_capability() == "DEFAULT":
        def expected(chosen):
            return (bits(chosen) & -0x8000) | 0x7E00  # the sign bit, then the canonical NaN
    else:
        def expected(chosen):
            return bits(chosen) | QUIET_BIT[dtype]
    assert torch.equal(bits(ours[lhs_nan]), expected(lhs[lhs_nan]))
    assert torch.equal(bits(ours[lone]), expected(rhs[lone]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_position_invariance(op, dtype):
    """op(a, b) equals, bit for bit, the op applied to every one-element slice on its own."""
    specials_lhs, specials_rhs = cross(dtype)
    for numel in range(1, 70):
        lhs, rhs = random_pair(numel, dtype, numel, op)
        # Mix in special values so ties, NaNs and overflows land at every position.
        lhs[::3], rhs[::3] = specials_lhs[numel:numel + len(lhs[::3])], specials_rhs[numel:numel + len(rhs[::3])]
        whole = fuel(op, lhs, rhs)
        pieces = torch.cat([fuel(op, lhs[i:i + 1].clone(), rhs[i:i + 1].clone()) for i in range(numel)])
        assert bit_equal(whole, pieces), f"length {numel}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_results_do_not_depend_on_thread_count(dtype):
    previous = torch.get_num_threads()
    try:
        for op in OPS:
            lhs, rhs = random_pair(300_007, dtype, 11, op)
            torch.set_num_threads(1)
            single = fuel(op, lhs, rhs)
            torch.set_num_threads(2)
            assert bit_equal(single, fuel(op, lhs, rhs)), op
            assert all(bit_equal(single, fuel(op, lhs, rhs)) for _ in range(3))
    finally:
        torch.set_num_threads(previous)


def cache_bytes(index: int, fallback: int) -> int:
    try:
        with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size") as f:
            return int(f.read().strip().rstrip("K")) * 1024
    except (OSError, ValueError):
        return fallback


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16), ids=str)
@pytest.mark.parametrize("op", ("add", "maximum", "pow", "rem"))
def test_streaming_stores_give_the_same_bits(op, dtype):
    """Working sets past the caches worth keeping are written with non-temporal stores (the rule in
    elementwise_kernels.cpp: past the threads' L2 on Intel, past half the last-level cache
    elsewhere). A size past both rules streams on every CPU; its result must equal, bit for bit,
    the same elements computed in pieces too small to stream, and the oracle."""
    item = torch.empty(0, dtype=dtype).element_size()
    threshold = max(cache_bytes(3, 32 << 20) // 2, 2 * cache_bytes(2, 2 << 20))
    numel = min(threshold // (3 * item) + 4099, 24 << 20)
    lhs, rhs = random_pair(numel, dtype, 13, op)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        whole = fuel(op, lhs, rhs)
        torch.set_num_threads(1)
        assert bit_equal(whole, fuel(op, lhs, rhs))
    finally:
        torch.set_num_threads(previous)
    piece = 4096 + 3  # 96 KiB at most: below any L2, so these calls store normally
    pieces = torch.cat([fuel(op, lhs[i:i + piece].clone(), rhs[i:i + piece].clone()) for i in range(0, numel, piece)])
    assert bit_equal(whole, pieces)
    if op == "pow":
        assert_pow_defined(whole, lhs, rhs)
    elif op == "rem":
        assert bit_equal(whole, exact_rem(lhs, rhs))
    else:
        assert bit_equal(whole, TORCH_EQUIVALENT[op](lhs, rhs) if op == "add" else selection_reference(op, lhs, rhs))


def test_float16_division_matches_torch_for_every_dividend():
    """float16 div at the AVX512 level may replace the divider by a reciprocal estimate and one
    correction (elementwise_kernels.cpp, DivByReciprocal; fuel_torch.float16_division() says which
    this process takes), whose bits equal the division's only by an argument about how close a
    float16 quotient can come to a rounding boundary (checked over all 2^32 pairs when it was
    written). Every float16 bit pattern as the dividend, against divisors from every binade, both
    signs, subnormals, the extremes and the special values, in orders that mix special and ordinary
    lanes within a vector: bit for bit torch's a / b (NaN results: NaN where torch's is; their
    payloads are test_arithmetic_nan_payloads_follow_the_lhs's)."""
    def assert_torchs_quotient(ours, theirs, divisor):
        nan = torch.isnan(theirs)
        assert torch.equal(torch.isnan(ours), nan), divisor
        assert bit_equal(ours[~nan], theirs[~nan]), divisor

    dividends = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    generator = torch.Generator().manual_seed(43)
    patterns = torch.randint(-32768, 32768, (300,), generator=generator, dtype=torch.int32).to(torch.int16)
    named = torch.tensor([1.0, -1.0, 2.0, 0.5, 3.0, 1.5, 65504.0, -65504.0, 6.1035e-05, 5.9605e-08, -5.9605e-08,
                          0.0, -0.0, float("inf"), float("-inf"), float("nan"), 0.33325, 1e-4], dtype=torch.float16)
    for divisor in torch.cat([named, patterns.view(torch.float16)]):
        rhs = divisor.expand(dividends.shape).contiguous()
        assert_torchs_quotient(fuel("div", dividends, rhs), dividends / rhs, divisor.item())
        assert_torchs_quotient(fuel("div", rhs, dividends), rhs / dividends, divisor.item())


def run_with_float16_division(code: str, choice: str) -> subprocess.CompletedProcess:
    """`code` in a child process with FUEL_FLOAT16_DIVISION=`choice` (read once per process), from
    tests/ (the repository root would import the source folder, not the installed package)."""
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, "FUEL_FLOAT16_DIVISION": choice},
                          cwd=Path(__file__).parent, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("choice", ("reciprocal", "divider"))
def test_float16_division_either_way_matches_torch_for_every_dividend(choice):
    """The CPU picks one way to divide float16 (fuel_torch.float16_division()); the other must stay
    right too, since another CPU picks it. Each runs the every-dividend test in a child process that
    reports the way it took: the reciprocal wherever the kernels run at AVX512."""
    code = ("import sys, pytest, fuel_torch; print(fuel_torch.float16_division()); "
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
            "'test_elementwise_parity.py::test_float16_division_matches_torch_for_every_dividend']))")
    result = run_with_float16_division(code, choice)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    taken = "reciprocal" if choice == "reciprocal" and fuel_torch.cpu_capability() == "AVX512" else "divider"
    assert lines[0] == taken
    assert lines[-1].startswith("1 passed"), lines[-1]


def test_an_unknown_float16_division_is_refused_at_import():
    result = run_with_float16_division("import fuel_torch", "fast")
    assert result.returncode != 0, "FUEL_FLOAT16_DIVISION=fast was accepted"
    assert result.stderr.strip().splitlines()[-1] == (
        "ImportError: fuel: FUEL_FLOAT16_DIVISION='fast' names no way to divide float16: use 'reciprocal' or "
        "'divider', or unset it to let the CPU choose.")


@pytest.mark.parametrize("op", ("add", "sub", "mul", "div"))
def test_bfloat16_rounding_matches_torch_for_every_lhs(op):
    """bfloat16 results are narrowed from float by our own rounding (elementwise_kernels.cpp,
    narrow_bf16: to nearest even, subnormals kept, every NaN 0xffff), on blocks widened out of
    order and packed back (at AVX512 by one permute of both vectors' high halves). Every bfloat16 bit pattern as lhs, in order and shuffled (so that NaN,
    subnormal, overflowing and ordinary lanes share vectors), against rhs from every binade, both
    signs, ties, subnormals, the extremes and the special values: bit for bit torch's result (NaN
    results: NaN where torch's is; their payloads are test_arithmetic_nan_payloads_follow_the_lhs's)."""
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    generator = torch.Generator().manual_seed(44)
    shuffled = every[torch.randperm(every.numel(), generator=generator)]
    patterns = torch.randint(-32768, 32768, (40,), generator=generator, dtype=torch.int32).to(torch.int16)
    named = torch.tensor([1.0, -1.0, 1.0078125, 1.5, 3.0, 0.333984375, 2.0**-126, 2.0**-133, -(2.0**-130), 2.0**127,
                          3.3895e38, 0.0, -0.0, float("inf"), float("nan")], dtype=torch.bfloat16)
    for rhs_value in torch.cat([named, patterns.view(torch.bfloat16)]):
        for lhs in (every, shuffled):
            rhs = rhs_value.expand(lhs.shape).contiguous()
            for a, b in ((lhs, rhs), (rhs, lhs)):
                ours, theirs = fuel(op, a, b), TORCH_EQUIVALENT[op](a, b)
                nan = torch.isnan(theirs)
                assert torch.equal(torch.isnan(ours), nan), rhs_value.item()
                assert bit_equal(ours[~nan], theirs[~nan]), rhs_value.item()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_subnormals_are_kept(dtype):
    tiny = torch.tensor([torch.finfo(dtype).tiny], dtype=dtype)
    half_tiny = fuel("div", tiny, torch.tensor([2.0], dtype=dtype))
    assert half_tiny.item() != 0.0 and bit_equal(half_tiny, tiny / 2)
    assert fuel("sub", tiny * 1.5, tiny).item() != 0.0


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3), (2, 3, 4), (1, 2, 3, 4), (2, 1, 3, 1, 2),
                                   (1, 2, 1, 3, 1, 2)], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_ranks_zero_to_six_and_empty_tensors(op, shape):
    g = torch.Generator().manual_seed(3)
    lhs, rhs = torch.rand(shape, generator=g) + 0.5, torch.rand(shape, generator=g) + 0.5
    ours = fuel(op, lhs, rhs)
    assert ours.shape == lhs.shape and ours.is_contiguous()
    if op == "pow":
        assert_pow_defined(ours, lhs, rhs)
    else:
        assert bit_equal(ours, TORCH_EQUIVALENT[op](lhs, rhs))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_out_overload_overwrites_every_element(op, dtype):
    lhs, rhs = random_pair(1001, dtype, 5, op)
    out = torch.full_like(lhs, float("nan"))
    returned = getattr(torch.ops.fuel, op).out(lhs, rhs, out=out)
    assert returned is out
    assert bit_equal(out, fuel(op, lhs, rhs))
    api_out = torch.empty_like(lhs)
    assert getattr(fuel_torch, op)(lhs, rhs, out=api_out) is api_out and bit_equal(api_out, out)


def test_python_api_matches_the_op():
    lhs, rhs = random_pair(513, torch.float32, 9)
    for op in OPS:
        assert bit_equal(getattr(fuel_torch, op)(lhs, rhs), fuel(op, lhs, rhs))
