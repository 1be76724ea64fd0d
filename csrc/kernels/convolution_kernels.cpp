// The convolution family's arithmetic (validation and registration are in ../convolution.cpp).
// Compiled once per instruction-set level (setup.py); everything here lives in fuel::<level>.
//
// fuel::conv2d and fuel::conv_transpose2d (NCHW, groups, stride, padding, dilation,
// output_padding), four dtypes each.
//
// One chassis serves all 8 kernels. A task computes a block of output positions of one image, one
// group and a block of output channels as a small matrix product
//     out[co][p] = bias[co] + sum_t W[co][t] * col[t][p]
// over the taps t = (ci, kh, kw) that reach those positions. col is gathered from x for the task
// (implicit zero padding, stride and dilation resolved there), so the arithmetic loop has no
// branches and runs on whole vectors. conv_transpose2d is the same gather: its output positions
// are split into stride phases (oh % stride), and within a phase it is an ordinary stride-1
// correlation over the taps that land on that phase. Nothing is scattered, so there is no race.
//
// Accumulation is in acc_t (float for f32/bf16/f16, double for f64): bf16/f16 widen on load and
// narrow once on store, bias included in the accumulator. Every output's sum runs in one fixed
// order, in three levels: blocks of kBlock taps, each a chain of fused multiply-adds (the first
// block's chain starts at the bias, the others at zero); the blocks of each chunk of kTapChunk taps
// summed from zero; the chunk sums added in turn to the running total. That order depends on the
// geometry only, never on the thread count or on how the work is split, so results are
// bit-identical for every torch.set_num_threads. Short sums round once per tap, like a plain fused
// chain; long ones stay more accurate than torch's own (measured against a float64 reference).
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "convolution_kernels.h"

namespace fuel {
namespace CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

constexpr int64_t kBlock = 16;           // taps per fused multiply-add chain
constexpr int64_t kTapChunk = 256;       // taps gathered at once (a multiple of kBlock)
constexpr int64_t kChannelChunk = 256;   // output channels per task
constexpr int64_t kScratchBytes = 131072; // per thread, for the gathered taps and for the running totals
constexpr int64_t kMaxPositions = 4096;   // output positions per task, at most
constexpr int kChannelBlock = 6;         // output channels per register block (12 accumulators)
constexpr int kVectorBlock = 2;          // vectors of positions per register block
static_assert(kTapChunk % kBlock == 0, "a tap chunk must hold whole blocks, or chunking would change the sums");

template <typename T> using acc_type = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
constexpr bool is_half = std::is_same_v<T, at::BFloat16> || std::is_same_v<T, at::Half>;

// floor(a / b) for b > 0, clamped to +-2^62: callers clamp it to a grid range anyway, and the margin
// lets them add or negate it without overflow.
int64_t floor_div(__int128 a, int64_t b) {
  __int128 q = a / b;
  if (a % b != 0 && a < 0) --q;
  constexpr __int128 limit = __int128(1) << 62;
  return static_cast<int64_t>(std::clamp<__int128>(q, -limit, limit));
}

// One kernel tap along one axis: the kernel index, and the grid range [lo, hi) whose input
// coordinate step * j + offset lies inside the input.
struct Tap {
  int64_t k, offset, lo, hi;
};

// The output positions r + out_step * j (j in [0, count)) of one phase along one axis, and the taps
// that reach them. conv2d has one phase per axis (r = 0, out_step = 1, in_step = stride);
// conv_transpose2d has one per stride residue (out_step = stride, in_step = 1).
struct Phase {
  int64_t r, count;
  std::vector<Tap> taps;
};

struct Axis {
  int64_t in_step, out_step;
  std::vector<Phase> phases;
};

Axis make_axis(const ConvProblem& p, int i) {
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

template <typename T>
inline void zero(T* dst, int64_t n) {
  using Vec = Vectorized<T>;
  const Vec z(T(0));
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) z.store(dst + i);
  for (; i < n; ++i) dst[i] = T(0);
}

template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
inline void widen(const scalar_t* src, acc_t* dst, int64_t n) {
  if constexpr (!is_half<scalar_t>) {
    // Short runs are the common case (one input row per segment): inline vector moves, no memmove.
    using Vec = Vectorized<acc_t>;
    int64_t i = 0;
    for (; i + Vec::size() <= n; i += Vec::size()) Vec::loadu(src + i).store(dst + i);
    for (; i < n; ++i) dst[i] = src[i];
  } else {
    constexpr int64_t step = Vectorized<scalar_t>::size(), half = Vectorized<float>::size();
    for (int64_t i = 0; i < n; i += step) {
      const int64_t count = std::min(step, n - i);
      auto [lo, hi] = at::vec::convert_to_float<scalar_t>(Vectorized<scalar_t>::loadu(src + i, count));
      lo.store(dst + i, std::min(half, count));
      if (count > half) hi.store(dst + i + half, count - half);
    }
  }
}

// Narrowing (round to nearest even) of a contiguous run: every element through the same vector code.
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
inline void narrow(const acc_t* src, scalar_t* dst, int64_t n) {
  if constexpr (!is_half<scalar_t>) {
    std::copy(src, src + n, dst);
  } else {
    constexpr int64_t step = Vectorized<scalar_t>::size(), half = Vectorized<float>::size();
    for (int64_t i = 0; i < n; i += step) {
      const int64_t count = std::min(step, n - i);
      const auto lo = Vectorized<float>::loadu(src + i, std::min(half, count));
      const auto hi = count > half ? Vectorized<float>::loadu(src + i + half, count - half) : Vectorized<float>(0.f);
      at::vec::convert_from_float<scalar_t>(lo, hi).store(dst + i, count);
    }
  }
}

// outer[c][0..VB vectors) += sum over taps [0, taps) of w[c][t] * col[t][0..VB vectors), for CB
// channels. The taps (one chunk, at most kTapChunk, starting at a multiple of it) are summed in
// three levels: blocks of kBlock taps as fused chains, the chunk's blocks from zero, then the chunk
// into the running total; in the first chunk the first chain starts at the running total (the
// bias) and the chunk sum replaces it. Block and chunk boundaries sit at fixed multiples from the
// first tap, so the order of every sum is fixed by the geometry; CB and VB only choose how many
// sums run side by side.
template <typename acc_t, int CB, int VB>
inline void multiply_block(const acc_t* w, int64_t ldw, const acc_t* col, int64_t ldc, int64_t taps, acc_t* outer,
                           int64_t ldo, bool first_chunk) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  Vec chunk[CB][VB];
  for (int c = 0; c < CB; ++c) {
    for (int v = 0; v < VB; ++v) chunk[c][v] = Vec(acc_t(0));
  }
  for (int64_t t0 = 0; t0 < taps; t0 += kBlock) {
    const int64_t t1 = std::min(taps, t0 + kBlock);
    // The very first block's chain starts at the running total (the bias), so that a short sum is
    // one fused chain from the bias, rounded once per tap.
    const bool from_bias = first_chunk && t0 == 0;
    Vec acc[CB][VB];
    for (int c = 0; c < CB; ++c) {
      for (int v = 0; v < VB; ++v) acc[c][v] = from_bias ? Vec::loadu(outer + c * ldo + v * V) : Vec(acc_t(0));
    }
    for (int64_t t = t0; t < t1; ++t) {
      Vec xv[VB];
      for (int v = 0; v < VB; ++v) xv[v] = Vec::loadu(col + t * ldc + v * V);
      for (int c = 0; c < CB; ++c) {
        const Vec wv(w[c * ldw + t]);
        for (int v = 0; v < VB; ++v) acc[c][v] = at::vec::fmadd(wv, xv[v], acc[c][v]);
      }
    }
    for (int c = 0; c < CB; ++c) {
      for (int v = 0; v < VB; ++v) chunk[c][v] = chunk[c][v] + acc[c][v];
    }
  }
  for (int c = 0; c < CB; ++c) {
    for (int v = 0; v < VB; ++v) {
      acc_t* o = outer + c * ldo + v * V;
      (first_chunk ? chunk[c][v] : Vec::loadu(o) + chunk[c][v]).store(o);
    }
  }
}

// All rows x all positions of one tap chunk. Positions go in the outer loop so that the gathered
// taps of a position block stay in L1 while every channel block reads them. width is a multiple of
// kVectorBlock vectors.
template <typename acc_t>
void multiply(int64_t rows, const acc_t* w, int64_t ldw, const acc_t* col, int64_t ldc, int64_t taps,
              acc_t* outer, int64_t ldo, int64_t width, bool first_chunk) {
  constexpr int64_t V = Vectorized<acc_t>::size(), step = kVectorBlock * V;
  int64_t p = 0;
  // Few channels (depthwise and the like): wider position blocks keep enough independent sums in
  // flight to hide the fused multiply-add latency.
  if (rows == 1) {
    for (; p + 6 * V <= width; p += 6 * V) multiply_block<acc_t, 1, 6>(w, ldw, col + p, ldc, taps, outer + p, ldo, first_chunk);
  } else if (rows == 2) {
    for (; p + 4 * V <= width; p += 4 * V) multiply_block<acc_t, 2, 4>(w, ldw, col + p, ldc, taps, outer + p, ldo, first_chunk);
  }
  for (; p < width; p += step) {
    int64_t c = 0;
    for (; c + kChannelBlock <= rows; c += kChannelBlock) {
      multiply_block<acc_t, kChannelBlock, kVectorBlock>(w + c * ldw, ldw, col + p, ldc, taps, outer + c * ldo + p, ldo, first_chunk);
    }
    const acc_t* wc = w + c * ldw;
    acc_t* oc = outer + c * ldo + p;
    switch (rows - c) {
      case 5: multiply_block<acc_t, 5, kVectorBlock>(wc, ldw, col + p, ldc, taps, oc, ldo, first_chunk); break;
      case 4: multiply_block<acc_t, 4, kVectorBlock>(wc, ldw, col + p, ldc, taps, oc, ldo, first_chunk); break;
      case 3: multiply_block<acc_t, 3, kVectorBlock>(wc, ldw, col + p, ldc, taps, oc, ldo, first_chunk); break;
      case 2: multiply_block<acc_t, 2, kVectorBlock>(wc, ldw, col + p, ldc, taps, oc, ldo, first_chunk); break;
      case 1: multiply_block<acc_t, 1, kVectorBlock>(wc, ldw, col + p, ldc, taps, oc, ldo, first_chunk); break;
      default: break;
    }
  }
}

// One grid row's share of a task: grid columns [jw0, jw1) of grid row jh, stored from `offset` on.
struct Segment {
  int64_t jh, jw0, jw1, offset;
};

// One gathered row: dst[offset + jw - jw0] = plane[in_step_h * jh + a.offset][in_step_w * jw + b.offset]
// for every segment, zero where that falls outside the input (the implicit padding), and zero
// from `used` up to `width` (the unused lanes of the last vector block).
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
void gather(const scalar_t* plane, int64_t W, int64_t in_step_h, int64_t in_step_w, const Tap& a, const Tap& b,
            const std::vector<Segment>& segments, acc_t* dst, int64_t used, int64_t width) {
  for (const Segment& seg : segments) {
    acc_t* d = dst + seg.offset - seg.jw0;  // d[jw] is the slot of grid column jw (jw >= jw0)
    if (seg.jh < a.lo || seg.jh >= a.hi) {
      zero(d + seg.jw0, seg.jw1 - seg.jw0);
      continue;
    }
    const scalar_t* row = plane + (in_step_h * seg.jh + a.offset) * W + b.offset;
    const int64_t lo = std::clamp(b.lo, seg.jw0, seg.jw1), hi = std::clamp(b.hi, lo, seg.jw1);
    zero(d + seg.jw0, lo - seg.jw0);
    if (in_step_w == 1) {
      widen<scalar_t>(row + lo, d + lo, hi - lo);
    } else {
      for (int64_t jw = lo; jw < hi; ++jw) d[jw] = static_cast<acc_t>(row[in_step_w * jw]);
    }
    zero(d + hi, seg.jw1 - hi);
  }
  zero(dst + used, width - used);
}

template <typename scalar_t>
void convolve(const ConvProblem& p, const void* x_buffer, const void* weight_buffer, const void* bias_buffer,
              void* out_buffer) {
  using acc_t = acc_type<scalar_t>;
  using Vec = Vectorized<acc_t>;
  if (p.N * p.Cout * p.Ho * p.Wo == 0) return;
  const int64_t G = p.groups, Cin_g = p.Cin / G, Cout_g = p.Cout / G;
  const Axis ax_h = make_axis(p, 0), ax_w = make_axis(p, 1);
  const int64_t n_ph = static_cast<int64_t>(ax_h.phases.size()), n_pw = static_cast<int64_t>(ax_w.phases.size());

  // Weights as acc_t rows W[g][phase][co][t], taps t = (ci, kh, kw) in the phase's order. conv2d
  // in f32/f64 reads the weight tensor itself: [Cout, Cin / groups, Kh, Kw] already is that layout.
  const scalar_t* w_data = static_cast<const scalar_t*>(weight_buffer);
  std::vector<acc_t> packed;
  std::vector<int64_t> phase_base(n_ph * n_pw);  // offset of (phase) inside one group's block
  const acc_t* w_rows = nullptr;
  const int64_t group_size = Cout_g * Cin_g * p.Kh * p.Kw;
  {
    int64_t base = 0;
    for (int64_t i = 0; i < n_ph; ++i) {
      for (int64_t j = 0; j < n_pw; ++j) {
        phase_base[i * n_pw + j] = base;
        base += Cout_g * Cin_g * static_cast<int64_t>(ax_h.phases[i].taps.size() * ax_w.phases[j].taps.size());
      }
    }
  }
  if constexpr (!is_half<scalar_t>) {
    if (!p.transpose) w_rows = w_data;
  }
  if (!w_rows) {
    packed.resize(G * group_size);
    // Threads only for weights worth it: waking them costs more than packing a small kernel.
    const int64_t per_item = std::max<int64_t>(1, group_size / (n_ph * n_pw));
    at::parallel_for(0, G * n_ph * n_pw, std::max<int64_t>(1, (1 << 16) / per_item), [&](int64_t first, int64_t last) {
      for (int64_t item = first; item < last; ++item) {
        const int64_t g = item / (n_ph * n_pw), i = item / n_pw % n_ph, j = item % n_pw;
        const auto &th = ax_h.phases[i].taps, &tw = ax_w.phases[j].taps;
        acc_t* dst = packed.data() + g * group_size + phase_base[i * n_pw + j];
        for (int64_t co = 0; co < Cout_g; ++co) {
          for (int64_t ci = 0; ci < Cin_g; ++ci) {
            for (const Tap& a : th) {
              for (const Tap& b : tw) {
                const int64_t index = p.transpose
                    ? (((g * Cin_g + ci) * Cout_g + co) * p.Kh + a.k) * p.Kw + b.k
                    : (((g * Cout_g + co) * Cin_g + ci) * p.Kh + a.k) * p.Kw + b.k;
                *dst++ = static_cast<acc_t>(w_data[index]);
              }
            }
          }
        }
      }
    });
    w_rows = packed.data();
  }
  std::vector<acc_t> bias_acc(p.Cout, acc_t(0));
  if (bias_buffer) {
    const scalar_t* b = static_cast<const scalar_t*>(bias_buffer);
    for (int64_t co = 0; co < p.Cout; ++co) bias_acc[co] = static_cast<acc_t>(b[co]);
  }

  // Positions per task: as many as keep the gathered taps and the running totals within
  // kScratchBytes each (they stay in L2), so that tasks with few taps or channels (depthwise) are not
  // dominated by per-task work. Any split gives the same bits; only the speed depends on it.
  int64_t max_taps = 0;
  for (const Phase& ph : ax_h.phases) {
    for (const Phase& pw : ax_w.phases) {
      max_taps = std::max<int64_t>(max_taps, Cin_g * static_cast<int64_t>(ph.taps.size() * pw.taps.size()));
    }
  }
  const int64_t chunk_taps = std::clamp<int64_t>(max_taps, 1, kTapChunk);
  const int64_t chunk_rows = std::clamp<int64_t>(Cout_g, 1, kChannelChunk);
  constexpr int64_t block_width = kVectorBlock * Vec::size();
  const int64_t fit = kScratchBytes / static_cast<int64_t>(sizeof(acc_t)) / std::max(chunk_taps, chunk_rows);
  const int64_t positions = std::clamp<int64_t>(fit / block_width * block_width, block_width, kMaxPositions);

  // Work items: (phase, first position, last position) over the phase's flattened grid.
  struct Item {
    int64_t i, j, first, last;
  };
  std::vector<Item> items;
  for (int64_t i = 0; i < n_ph; ++i) {
    for (int64_t j = 0; j < n_pw; ++j) {
      const int64_t count = ax_h.phases[i].count * ax_w.phases[j].count;
      for (int64_t first = 0; first < count; first += positions) {
        items.push_back({i, j, first, std::min(count, first + positions)});
      }
    }
  }
  const int64_t n_items = static_cast<int64_t>(items.size());
  const int64_t co_chunks = (Cout_g + kChannelChunk - 1) / kChannelChunk;
  const int64_t tasks = p.N * G * n_items * co_chunks;
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, chunk_rows * max_taps * positions));

  const scalar_t* x_data = static_cast<const scalar_t*>(x_buffer);
  scalar_t* out_data = static_cast<scalar_t*>(out_buffer);

  at::parallel_for(0, tasks, grain, [&](int64_t first_task, int64_t last_task) {
    std::vector<acc_t> col(chunk_taps * positions), outer(chunk_rows * positions);
    std::vector<Segment> segments;
    for (int64_t task = first_task; task < last_task; ++task) {
      int64_t rest = task;
      const int64_t chunk = rest % co_chunks;
      rest /= co_chunks;
      const Item& item = items[rest % n_items];
      rest /= n_items;
      const int64_t g = rest % G, n = rest / G;
      const Phase &ph = ax_h.phases[item.i], &pw = ax_w.phases[item.j];
      const int64_t nh = static_cast<int64_t>(ph.taps.size()), nw = static_cast<int64_t>(pw.taps.size());
      const int64_t taps = Cin_g * nh * nw;
      const int64_t width = (item.last - item.first + block_width - 1) / block_width * block_width;
      const int64_t co0 = chunk * kChannelChunk, rows = std::min(kChannelChunk, Cout_g - co0);
      const acc_t* w = w_rows + g * group_size + phase_base[item.i * n_pw + item.j] + co0 * taps;

      for (int64_t c = 0; c < rows; ++c) std::fill_n(outer.data() + c * positions, width, bias_acc[g * Cout_g + co0 + c]);

      // The task's positions, one segment per grid row, shared by every tap and by the store.
      segments.clear();
      for (int64_t q = item.first; q < item.last;) {
        const int64_t jh = q / pw.count, jw0 = q % pw.count, jw1 = std::min(pw.count, jw0 + (item.last - q));
        segments.push_back({jh, jw0, jw1, q - item.first});
        q += jw1 - jw0;
      }
      for (int64_t t0 = 0; t0 < taps; t0 += kTapChunk) {
        const int64_t t1 = std::min(taps, t0 + kTapChunk);
        int64_t ci = t0 / (nh * nw), ia = t0 / nw % nh, ib = t0 % nw;
        for (int64_t t = t0; t < t1; ++t) {
          const scalar_t* plane = x_data + ((n * p.Cin + g * Cin_g + ci) * p.H) * p.W;
          gather(plane, p.W, ax_h.in_step, ax_w.in_step, ph.taps[ia], pw.taps[ib], segments,
                 col.data() + (t - t0) * positions, item.last - item.first, width);
          if (++ib == nw) {
            ib = 0;
            if (++ia == nh) ia = 0, ++ci;
          }
        }
        multiply<acc_t>(rows, w + t0, taps, col.data(), positions, t1 - t0, outer.data(), positions, width, t0 == 0);
      }

      // Store: grid position (jh, jw) is output (r_h + out_step_h * jh, r_w + out_step_w * jw).
      for (int64_t c = 0; c < rows; ++c) {
        scalar_t* plane = out_data + (n * p.Cout + g * Cout_g + co0 + c) * p.Ho * p.Wo;
        const acc_t* src = outer.data() + c * positions;
        for (const Segment& seg : segments) {
          scalar_t* row = plane + (ph.r + ax_h.out_step * seg.jh) * p.Wo + pw.r;
          const acc_t* from = src + seg.offset;  // from[jw - jw0] holds grid column jw
          if (ax_w.out_step == 1) {
            narrow<scalar_t>(from, row + seg.jw0, seg.jw1 - seg.jw0);
          } else {
            for (int64_t jw = seg.jw0; jw < seg.jw1; ++jw) {
              row[ax_w.out_step * jw] = static_cast<scalar_t>(from[jw - seg.jw0]);
            }
          }
        }
      }
    }
  });
}

}  // namespace

// Constant-initialized (no code runs at load); dtypes float, double, BFloat16, Half.
extern const ConvolutionKernels convolution_kernels;
const ConvolutionKernels convolution_kernels = {
    {convolve<float>, convolve<double>, convolve<at::BFloat16>, convolve<at::Half>}};

}  // namespace CPU_CAPABILITY
}  // namespace fuel
