"""The minimax coefficients of exp2_of_product in csrc/kernels/elementwise_kernels.cpp.

Run with python3 and mpmath: prints the coefficients in hex and each fit's relative error (4.2e-12 and
3.9e-9; the coefficients rounded to double keep those figures).
"""
import mpmath as mp
mp.mp.dps = 50
def remez(f, w, a, b, n, grid=4001):
    """c[0..n-1] minimizing max |w(x) (f(x) - sum c[i] x^i)| over [a, b]: Remez exchange, the
    extrema of the error taken on a grid of grid + 1 points."""
    xs = [a + (b - a) * mp.mpf(i) / grid for i in range(grid + 1)]
    ref = [xs[int(mp.nint(grid * (1 - mp.cos(mp.pi * i / n)) / 2))] for i in range(n + 1)]  # Chebyshev
    while True:
        A = mp.matrix([[x**j for j in range(n)] + [(-1)**i / w(x)] for i, x in enumerate(ref)])
        sol = mp.lu_solve(A, mp.matrix([f(x) for x in ref]))
        c = [sol[j] for j in range(n)]
        e = [w(x) * (f(x) - mp.polyval(c[::-1], x)) for x in xs]
        ext = []  # local extrema of |e|, one per run of equal sign
        for i in range(len(e)):
            if all(abs(e[i]) >= abs(e[j]) for j in (i - 1, i + 1) if 0 <= j < len(e)):
                if ext and mp.sign(e[ext[-1]]) == mp.sign(e[i]):
                    ext[-1] = max(ext[-1], i, key=lambda j: abs(e[j]))
                else:
                    ext.append(i)
        while len(ext) > n + 1:
            ext.pop(0 if abs(e[ext[0]]) < abs(e[ext[-1]]) else -1)
        worst = max(abs(v) for v in e)
        if len(ext) < n + 1 or worst - abs(sol[n]) < 1e-4 * worst:
            return c, worst
        ref = [xs[i] for i in ext]
# log2 z = s P(s^2), s = (z - 1) / (z + 1) up to (sqrt(2) - 1) / (sqrt(2) + 1): relative error.
smax = (mp.sqrt(2) - 1) / (mp.sqrt(2) + 1)
g = lambda w: 2 * mp.atanh(mp.sqrt(w)) / (mp.log(2) * mp.sqrt(w)) if w else 2 / mp.log(2)
P, err = remez(g, lambda w: 1 / g(w), mp.mpf(0), smax**2, 5)
print("P", ", ".join(float(c).hex() for c in P), "rel err %.2g" % err)
# 2^f = 1 + f Q(f), |f| <= 1/2: relative error.
h = lambda f: (2**f - 1) / f
Q, err = remez(h, lambda f: abs(f) / 2**f, mp.mpf(-0.5), mp.mpf(0.5), 6)
print("Q", ", ".join(float(c).hex() for c in Q), "rel err %.2g" % err)
