"""The tables and polynomial coefficients of the AVX-512 float64 pow core,
csrc/kernels/pow_double_avx512.h (pow_double_core's variant at that level: a 32-row log table and a
16-row exp table, looked up by permutes).

Run with python3 and mpmath (about 10 s): prints the C++ constants, each fit's error over its
interval and the figures the error budget there uses (the largest |r| of the log reduction, the
largest |r^3/3| / |log x| over the rows); asserts that r is exact and that the Fast2Sum t1 + r
holds on every row.
"""
import math
from fractions import Fraction as F

import mpmath as mp

mp.mp.prec = 300


from remez import remez  # noqa: E402  (tools/ is the script's folder, so on sys.path)


def hexf(d):
    return float(d).hex()


def log2abs(v):
    return float(mp.log(abs(v), 2)) if v else float("-inf")


# ---- log table: m in [1, 2) (getmant), row j = top 5 fraction bits of m + 2^-6 (rounded to the
# nearest 1/32): row j >= 1 covers [1 + (2j - 1)/64, 1 + (2j + 1)/64); row 0 covers [1, 1 + 2^-6)
# and, after the carry (m >= 2 - 2^-6 becomes z = m/2, k + 1), [1 - 2^-7, 1).
LN2 = mp.log(2)
ln2hi = F(int(mp.nint(LN2 * 2**42)), 2**42)  # multiple of 2^-42: k * ln2hi exact for |k| < 2^11
ln2lo = float(LN2 - mp.mpf(ln2hi.numerator) / ln2hi.denominator)
rows, ratios, rmax = [], [], F(0)
for j in range(32):
    if j == 0:
        lo, hi, invc = F(1) - F(1, 128), F(1) + F(1, 64), F(1)
        r = max(abs(lo * invc - 1), abs(hi * invc - 1))
    else:
        lo, hi = 1 + F(2 * j - 1, 64), 1 + F(2 * j + 1, 64)
        best = None
        # 1/c on the grid 2^-7 where that keeps |r| < 2^-6, else on 2^-6 (|r| < 2^-5): either way
        # z * invc - 1 is a multiple of 2^-59 (2^-58) below 2^-6 (2^-5), so it fits 53 bits exactly.
        for q, bound in ((7, F(1, 64)), (6, F(1, 32))):
            ideal = 2 / (lo + hi)
            for d in (-1, 0, 1, 2):
                c = F(math.floor(ideal * 2**q) + d, 2**q)
                rr = max(abs(lo * c - 1), abs(hi * c - 1))
                if rr < bound and (best is None or rr < best[0]):
                    best = (rr, c, q)
            if best is not None and best[2] == q:
                break
        r, invc, _ = best
    rmax = max(rmax, r)
    logc = -mp.log(mp.mpf(invc.numerator) / invc.denominator)
    logc_hi = mp.nint(logc * 2**43) / 2**43  # multiple of 2^-43: k ln2hi + logc_hi is exact
    logc_lo = logc - logc_hi
    # Fast2Sum t1 + r needs |t1| >= |r| wherever t1 != 0 (k = -1 is the closest case for j >= 1).
    for k in (-2, -1, 0, 1):
        t1 = k * (mp.mpf(ln2hi.numerator) / ln2hi.denominator) + logc_hi
        assert t1 == 0 or abs(t1) >= float(r), (j, k)
    rows.append((float(invc), float(logc_hi), float(logc_lo)))
    # The error budget's ratio |r|^3/3 / |log x| (the r^3 P term's rounding, relative to log x),
    # at the row's smallest |log x|: k = 0 (z = m), or k = -1 (x = m/2, just below 1).
    if j == 0:
        ratio = r * r / 3  # log x ~ r here
    else:
        min_log = min(mp.log(mp.mpf(lo.numerator) / lo.denominator),
                      -mp.log(mp.mpf(hi.numerator) / hi.denominator / 2))
        ratio = (mp.mpf(r.numerator) / r.denominator) ** 3 / 3 / min_log
    ratios.append(float(ratio))
print("// largest |r| of the log reduction: %r = %s = 2^%.3f" % (float(rmax), float(rmax).hex(), math.log2(rmax)))
print("// largest |r|^3/3 / |log x| over the rows: 2^%.2f (row %d); row 0's r^2/3: 2^%.2f"
      % (math.log2(max(ratios)), ratios.index(max(ratios)), math.log2(ratios[0])))
print("ln2hi", hexf(float(ln2hi)), "ln2lo", hexf(ln2lo))
for name, col in (("invc", 0), ("logc_hi", 1), ("logc_lo", 2)):
    print("LOG_%s {%s}" % (name.upper(), ", ".join(hexf(r[col]) for r in rows)))

# log1p(r) = r - r^2/2 + r^3 P(r) on |r| <= rmax: relative error of the whole.
a_log = mp.mpf(rmax.numerator) / rmax.denominator
f_log = lambda r: (mp.log1p(r) - r + r * r / 2) / r**3 if abs(r) > 1e-40 else mp.mpf(1) / 3 - r / 4
for n_log in (8,):  # the degree used (7 terms give 2^-61.7, short of the budget)
    P, _ = remez(f_log, lambda r: abs(r**3 / mp.log1p(r)) if abs(r) > 1e-40 else mp.mpf(1), -a_log, a_log, n_log, grid=3001)
    Pd = [float(c) for c in P]
    err = max(abs((r - r * r / 2 + r**3 * mp.polyval([mp.mpf(c) for c in Pd[::-1]], r)) - mp.log1p(r)) / abs(mp.log1p(r))
              for r in [a_log * (mp.mpf(i) / 1000 - 1) for i in range(2001) if i != 1000])
    print("LOG_POLY%d {%s} // rel err 2^%.1f" % (n_log, ", ".join(hexf(c) for c in Pd), log2abs(err)))

# ---- exp: 2^(j/16), j = 0..15, as the nearest double and its relative tail.
N_EXP = 16
tails, his = [], []
for j in range(N_EXP):
    v = mp.mpf(2) ** (mp.mpf(j) / N_EXP)
    h = float(v)
    his.append(h)
    tails.append(float((v - h) / h))
print("EXP_HI {%s}" % ", ".join(hexf(h) for h in his))
print("EXP_TAIL {%s}" % ", ".join(hexf(t) for t in tails))
ln2n = LN2 / N_EXP
# ln2/16 to 37 bits: kd * hi is exact for |kd| < 2^16 (|y log x| <= 1000 gives |kd| <= 23084).
hiN = mp.nint(ln2n * 2**41) / 2**41
assert int(mp.nint(hiN * 2**41)) < 2**37
print("invln2N", hexf(float(N_EXP / LN2)), "ln2hiN", hexf(float(hiN)), "ln2loN", hexf(float(ln2n - hiN)))
# exp(r) - 1 = r + r^2 Q(r), |r| <= ln2/32 plus the rounding slack of the reduction: absolute error.
a_exp = LN2 / 32 + mp.mpf(2)**-20
f_exp = lambda r: (mp.exp(r) - 1 - r) / r**2 if abs(r) > 1e-40 else mp.mpf(1) / 2 + r / 6
for n_exp in (6,):  # the degree used (5 terms give 2^-56.3)
    Q, _ = remez(f_exp, lambda r: r * r, -a_exp, a_exp, n_exp, grid=3001)
    Qd = [float(c) for c in Q]
    err = max(abs((r + r * r * mp.polyval([mp.mpf(c) for c in Qd[::-1]], r)) - mp.expm1(r))
              for r in [a_exp * (mp.mpf(i) / 1000 - 1) for i in range(2001)])
    print("EXP_POLY%d {%s} // abs err 2^%.1f" % (n_exp, ", ".join(hexf(c) for c in Qd), log2abs(err)))
