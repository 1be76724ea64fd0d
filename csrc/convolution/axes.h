// Work planning along one spatial axis: which kernel taps reach which output positions.
//
// conv2d has one phase per axis (every output position sees every tap, at input stride `stride`).
// conv_transpose2d splits its outputs into stride phases (o % stride): within a phase it is an
// ordinary stride-1 correlation over the taps that land on that phase, so it gathers and never
// scatters.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernel_common.h"

// In the level's namespace like every kernel header: an inline function compiled with AVX-512
// flags must never be the copy the linker keeps for another level.
namespace fuel {
namespace CPU_CAPABILITY {

// One kernel tap along one axis: the kernel index, and the grid range [lo, hi) whose input
// coordinate step * j + offset lies inside the input.
struct Tap {
  int64_t k, offset, lo, hi;
};

// The output positions r + out_step * j (j in [0, count)) of one phase along one axis, and the taps
// that reach them. conv2d: r = 0, out_step = 1, in_step = stride; conv_transpose2d: one phase per
// stride residue, out_step = stride, in_step = 1.
struct Phase {
  int64_t r, count;
  std::vector<Tap> taps;
};

struct Axis {
  int64_t in_step, out_step;
  std::vector<Phase> phases;
};

// floor(a / b) for b > 0, clamped to +-2^62: callers clamp it to a grid range anyway, and the margin
// lets them add or negate it without overflow.
inline int64_t floor_div(__int128 a, int64_t b) {
  constexpr __int128 limit = __int128(1) << 62;
  // The common case in 64 bits: a 128-bit division is a library call, and the planar path asks
  // for several per plane and per tap.
  if (a > -limit && a < limit) {
    const int64_t a64 = static_cast<int64_t>(a), q64 = a64 / b;
    return q64 - (a64 % b != 0 && a64 < 0);
  }
  __int128 q = a / b;
  if (a % b != 0 && a < 0) --q;
  return static_cast<int64_t>(std::clamp<__int128>(q, -limit, limit));
}

// A task of the planar-geometry paths: (image n, group g, phase (i, j), block of grid positions,
// chunk of output channels), numbered with the channel chunk fastest.
struct PhaseTask {
  int64_t n, g, i, j, block, chunk;
};

inline PhaseTask phase_task(int64_t task, int64_t G, int64_t n_ph, int64_t n_pw, int64_t blocks, int64_t chunks) {
  PhaseTask t;
  t.chunk = task % chunks, task /= chunks;
  t.block = task % blocks, task /= blocks;
  t.j = task % n_pw, task /= n_pw;
  t.i = task % n_ph, task /= n_ph;
  t.g = task % G, t.n = task / G;
  return t;
}

inline Axis make_axis(const Problem& p, int i) {
  const int64_t in = i == 0 ? p.H : p.W, out = i == 0 ? p.Ho : p.Wo, kernel = i == 0 ? p.Kh : p.Kw;
  const int64_t s = p.stride[i], pad = p.padding[i], d = p.dilation[i];
  Axis axis;
  auto tap = [&](int64_t k, __int128 offset, int64_t step, int64_t count) {
    // step * j + offset in [0, in)  <=>  j in [ceil(-offset / step), floor((in - 1 - offset) / step)]
    const int64_t lo = -floor_div(offset, step);
    const int64_t hi = floor_div(static_cast<__int128>(in) - 1 - offset, step) + 1;
    return Tap{k, static_cast<int64_t>(offset), std::clamp<int64_t>(lo, 0, count), std::clamp<int64_t>(hi, 0, count)};
  };
  if (!p.transpose) {
    axis = {s, 1, {Phase{0, out, {}}}};
    for (int64_t k = 0; k < kernel; ++k) {
      axis.phases[0].taps.push_back(tap(k, static_cast<__int128>(k) * d - pad, s, out));
    }
    return axis;
  }
  // out index o = i * s - pad + k * d, so tap k reaches the outputs o = r + s * j with
  // r = (k * d - pad) mod s, reading input row j + (r + pad - k * d) / s.
  axis = {1, s, {}};
  const int64_t n_phases = std::min(s, out);
  for (int64_t r = 0; r < n_phases; ++r) {
    axis.phases.push_back(Phase{r, static_cast<int64_t>((static_cast<__int128>(out) - r + s - 1) / s), {}});
  }
  for (int64_t k = 0; k < kernel; ++k) {
    const __int128 reach = static_cast<__int128>(k) * d - pad;
    const int64_t r = static_cast<int64_t>(((reach % s) + s) % s);
    if (r >= n_phases) continue;  // lands on no output
    Phase& phase = axis.phases[r];
    phase.taps.push_back(tap(k, (r - reach) / s, 1, phase.count));
  }
  return axis;
}

}  // namespace CPU_CAPABILITY
}  // namespace fuel
