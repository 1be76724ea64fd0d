"""The minimax coefficients of exp2_of_product in csrc/kernels/elementwise_kernels.cpp.

Run with python3 and mpmath: prints the coefficients in hex and each fit's relative error (4.2e-12 and
3.9e-9; the coefficients rounded to double keep those figures).
"""
import mpmath as mp
mp.mp.dps = 50
from remez import remez  # noqa: E402  (tools/ is the script's folder, so on sys.path)


# log2 z = s P(s^2), s = (z - 1) / (z + 1) up to (sqrt(2) - 1) / (sqrt(2) + 1): relative error.
smax = (mp.sqrt(2) - 1) / (mp.sqrt(2) + 1)
g = lambda w: 2 * mp.atanh(mp.sqrt(w)) / (mp.log(2) * mp.sqrt(w)) if w else 2 / mp.log(2)
P, err = remez(g, lambda w: 1 / g(w), mp.mpf(0), smax**2, 5, grid=4001)
print("P", ", ".join(float(c).hex() for c in P), "rel err %.2g" % err)
# 2^f = 1 + f Q(f), |f| <= 1/2: relative error.
h = lambda f: (2**f - 1) / f
Q, err = remez(h, lambda f: abs(f) / 2**f, mp.mpf(-0.5), mp.mpf(0.5), 6, grid=4001)
print("Q", ", ".join(float(c).hex() for c in Q), "rel err %.2g" % err)
