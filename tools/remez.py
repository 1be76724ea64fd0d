"""Remez exchange for the minimax polynomial fits of tools/pow_float_coefficients.py and
tools/pow_double_coefficients.py (the callers set mpmath's working precision)."""
import mpmath as mp


def remez(f, w, a, b, n, grid):
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
