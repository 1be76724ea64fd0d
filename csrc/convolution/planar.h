// The planar path of the chassis: every convolution whose padded input copy stays modest.
//
// Instead of gathering every tap's inputs per task, the input is copied once per call into
// zero-padded planes, widened to the accumulator type (and from NHWC to planes where the input is
// channels_last). A strided conv2d splits each channel into stride x stride planes by residue
// (space to depth), so that along every plane a tap steps by 1: tap offset o = in_step * q + r
// reads plane r at row/column j + q. conv_transpose2d steps by 1 in every phase already. A task's
// positions are then whole grid rows of one phase laid out with the planes' pitch Wp,
// q = jh * Wp + jw, and tap t's inputs for them are one contiguous run of its plane, which the
// micro-kernel reads in place. The Wp - count columns past each grid row are computed and dropped.
// The taps, their order and the micro-kernel are the chassis's, so are the bits.
#pragma once

#include <tuple>

#include "axes.h"
#include "chassis.h"
#include "kernel_common.h"
#include "micro_kernel.h"

namespace fuel {
namespace CPU_CAPABILITY {

// A tap offset o (input = in_step * j + o) as plane residue r and plane shift q: o = in_step * q + r.
struct Split {
  int64_t q, r;
};

inline Split split(int64_t offset, int64_t in_step) {
  const int64_t q = floor_div(offset, in_step);
  return {q, offset - q * in_step};
}

struct PaddedPlanes {
  int64_t step_h = 1, step_w = 1;  // residues per axis (the input step: conv2d's stride, else 1)
  int64_t min_h = 0, min_w = 0;    // the smallest plane shift a tap reads (negative: padding)
  int64_t Hp = 0, Wp = 0, size = 0;
  // Per residue along each axis, whether a tap reads it: a kernel narrower than the stride (a 1x1
  // at stride 2) reads one residue of two, and the fills leave the planes of the others unwritten.
  // A float32 NCHW 1x1 256 -> 512 at stride 2 on 56x56 spent a fifth of its time filling planes no
  // brgemm read (Zen 3, 1 thread).
  // Empty (a step above 64): every residue counts as read.
  std::vector<char> read_h, read_w;
  bool read(int64_t rh, int64_t rw) const { return (read_h.empty() || read_h[rh]) && (read_w.empty() || read_w[rw]); }
};

inline PaddedPlanes padded_planes(const Axis& ax_h, const Axis& ax_w, int64_t block_width) {
  PaddedPlanes pl{ax_h.in_step, ax_w.in_step};
  auto extent = [](const Axis& ax, int64_t& min_shift) {
    int64_t lo = 0, hi = 0, count = 0;
    bool first = true;
    for (const Phase& ph : ax.phases) {
      count = std::max(count, ph.count);
      for (const Tap& t : ph.taps) {
        const int64_t q = split(t.offset, ax.in_step).q;
        lo = first ? q : std::min(lo, q), hi = first ? q : std::max(hi, q), first = false;
      }
    }
    min_shift = lo;
    return count + hi - lo;
  };
  pl.Hp = extent(ax_h, pl.min_h);
  pl.Wp = extent(ax_w, pl.min_w);
  auto residues_read = [](const Axis& ax) {
    std::vector<char> read(ax.in_step <= 64 ? ax.in_step : 0, 0);
    if (read.empty()) return read;
    for (const Phase& ph : ax.phases) {
      for (const Tap& t : ph.taps) read[split(t.offset, ax.in_step).r] = 1;
    }
    return read;
  };
  pl.read_h = residues_read(ax_h), pl.read_w = residues_read(ax_w);
  // A task's last vector block may run up to block_width - 1 past its last grid row, and every
  // tap's run starts up to Wp - count columns after its row: the slack keeps those reads inside.
  pl.size = pl.Hp * pl.Wp + pl.Wp + block_width;
  return pl;
}

template <typename acc_t>
bool planes_fit(const Problem& p, const PaddedPlanes& pl) {
  const double bytes = double(p.N) * p.Cin * pl.step_h * pl.step_w * pl.size * sizeof(acc_t);
  return bytes < double(1 << 28);
}

// Plane column j of residue rw reads input column step_w * (j + min_w) + rw: inside [0, W) for j in
// [lo, hi).
struct PlaneColumns {
  int64_t lo, hi;
};
inline PlaneColumns plane_columns(const Problem& p, const PaddedPlanes& pl, int64_t rw) {
  const int64_t lo = std::clamp<int64_t>(-floor_div(rw + pl.step_w * pl.min_w, pl.step_w), 0, pl.Wp);
  return {lo, std::clamp<int64_t>(floor_div(p.W - 1 - rw, pl.step_w) - pl.min_w + 1, lo, pl.Wp)};
}

// rows[k][j] becomes rows[j][k]: log2(V) rounds of interleaving row i with row i + V / 2 (a perfect
// shuffle of the row and column index bits each round). tiles.h's transposes take 32-bit lanes at
// AVX2 and AVX-512 only; the planes are float or double, at every level.
template <typename acc_t>
inline void transpose_square(Vectorized<acc_t> (&rows)[Vectorized<acc_t>::size()]) {
  constexpr int V = Vectorized<acc_t>::size();
  for (int round = 1; round < V; round *= 2) {
    Vectorized<acc_t> shuffled[V];
    for (int i = 0; i < V / 2; ++i) {
      std::tie(shuffled[2 * i], shuffled[2 * i + 1]) = at::vec::interleave2(rows[i], rows[i + V / 2]);
    }
    for (int i = 0; i < V; ++i) rows[i] = shuffled[i];
  }
}

// The first `count` channels of a channels_last pixel, widened exactly; zeros past them.
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
inline Vectorized<acc_t> load_pixel(const scalar_t* src, int64_t count) {
  if constexpr (is_half<scalar_t>) {
    return std::get<0>(at::vec::convert_to_float<scalar_t>(Vectorized<scalar_t>::loadu(src, count)));
  } else {
    return count == Vectorized<acc_t>::size() ? Vectorized<acc_t>::loadu(src) : Vectorized<acc_t>::loadu(src, count);
  }
}

// fill_padded_planes for a channels_last x: V channels of an image at a time, each pixel's V
// channels read as one vector and V pixels turned into V plane rows. Read plane by plane, a
// channels_last input gives one element per cache line: the fill took 31% of a float64 1x1
// convolution (4x256x28x28 -> 64), which went from 4.2 to 3.1 ms at 1 thread on a Zen 4 (torch 2.4).
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
void fill_planes_from_channels_last(const Problem& p, const PaddedPlanes& pl, const scalar_t* x, const Layout& xl,
                                    acc_t* planes) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  const int64_t per_channel = pl.step_h * pl.step_w, groups = (p.Cin + V - 1) / V, plane_step = per_channel * pl.size;
  const int64_t grain = std::max<int64_t>(1, (1 << 14) / (pl.size * V));
  at::parallel_for(0, p.N * groups * per_channel, grain, [&](int64_t first, int64_t last) {
    for (int64_t index = first; index < last; ++index) {
      const int64_t rw = index % pl.step_w, rh = index / pl.step_w % pl.step_h;
      const int64_t group = index / per_channel % groups, n = index / per_channel / groups;
      if (!pl.read(rh, rw)) continue;
      const int64_t c0 = group * V, count = std::min(V, p.Cin - c0);
      acc_t* const dst = planes + ((n * p.Cin + c0) * per_channel + rh * pl.step_w + rw) * pl.size;  // channel c0's
      const auto [lo, hi] = plane_columns(p, pl, rw);
      for (int64_t i = 0; i < pl.Hp; ++i) {
        const int64_t ih = pl.step_h * (i + pl.min_h) + rh;
        if (ih < 0 || ih >= p.H) {
          for (int64_t k = 0; k < count; ++k) zero(dst + k * plane_step + i * pl.Wp, pl.Wp);
          continue;
        }
        const scalar_t* const row = x + n * xl.n + ih * xl.h + c0;
        for (int64_t j0 = 0; j0 < pl.Wp; j0 += V) {
          Vec block[V];
          for (int64_t jj = 0; jj < V; ++jj) {
            const int64_t j = j0 + jj;
            block[jj] = j >= lo && j < hi ? load_pixel<scalar_t>(row + (pl.step_w * (j + pl.min_w) + rw) * xl.w, count)
                                          : Vec(acc_t(0));
          }
          transpose_square<acc_t>(block);
          const int64_t columns = std::min(V, pl.Wp - j0);
          for (int64_t k = 0; k < count; ++k) {
            acc_t* const out = dst + k * plane_step + i * pl.Wp + j0;
            if (columns == V) block[k].store(out);
            else block[k].store(out, static_cast<int>(columns));
          }
        }
      }
      for (int64_t k = 0; k < count; ++k) zero(dst + k * plane_step + pl.Hp * pl.Wp, pl.size - pl.Hp * pl.Wp);
    }
  });
}

// planes[((n * Cin + c) * step_h + rh) * step_w + rw][i][j] = x[n][c][step_h * (i + min_h) + rh]
// [step_w * (j + min_w) + rw], zero outside x.
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
void fill_padded_planes(const Problem& p, const PaddedPlanes& pl, const scalar_t* x, const Layout& xl, acc_t* planes) {
  // A few channels (an RGB stem's three) fill a vector's transpose with mostly zeros: gathered, a
  // float16 7x7 stem took 1.49 ms at 1 thread on a Zen 4, transposed 1.54.
  if (xl.c == 1 && xl.w != 1 && 2 * p.Cin >= Vectorized<acc_t>::size()) {
    return fill_planes_from_channels_last<scalar_t>(p, pl, x, xl, planes);
  }
  const int64_t per_channel = pl.step_h * pl.step_w;
  at::parallel_for(0, p.N * p.Cin * per_channel, std::max<int64_t>(1, (1 << 14) / pl.size), [&](int64_t first, int64_t last) {
    for (int64_t index = first; index < last; ++index) {
      const int64_t rw = index % pl.step_w, rh = index / pl.step_w % pl.step_h, plane = index / per_channel;
      if (!pl.read(rh, rw)) continue;
      const scalar_t* src = x + plane / p.Cin * xl.n + plane % p.Cin * xl.c;
      acc_t* dst = planes + index * pl.size;
      const auto [lo, hi] = plane_columns(p, pl, rw);
      const int64_t step = pl.step_w * xl.w;
      // Rows that need no padding and lie back to back in x (an unpadded stride-1 NCHW plane, as
      // in a 1x1 convolution) are one run: widened in one go, not row by row.
      int64_t i = 0;
      if (pl.step_h == 1 && lo == 0 && hi == pl.Wp && step == 1 && xl.h == pl.Wp) {
        const int64_t first = std::clamp<int64_t>(-pl.min_h, 0, pl.Hp);
        const int64_t last = std::clamp<int64_t>(p.H - pl.min_h, first, pl.Hp);
        zero(dst, first * pl.Wp);
        widen<scalar_t>(src + (first + pl.min_h) * xl.h + pl.min_w * xl.w, dst + first * pl.Wp, (last - first) * pl.Wp);
        i = last;
      }
      for (; i < pl.Hp; ++i) {
        acc_t* row = dst + i * pl.Wp;
        const int64_t ih = pl.step_h * (i + pl.min_h) + rh;
        if (ih < 0 || ih >= p.H) {
          zero(row, pl.Wp);
          continue;
        }
        zero(row, lo);
        const scalar_t* in = src + ih * xl.h + (pl.step_w * (lo + pl.min_w) + rw) * xl.w;
        if (step == 1) {
          widen<scalar_t>(in, row + lo, hi - lo);
        } else {
          for (int64_t j = 0; j < hi - lo; ++j) row[lo + j] = static_cast<acc_t>(in[j * step]);
        }
        zero(row + hi, pl.Wp - hi);
      }
      zero(dst + pl.Hp * pl.Wp, pl.size - pl.Hp * pl.Wp);
    }
  });
}

// Tap t's run for grid row 0 of a phase, for every tap of the phase in the chassis order; the
// image's planes are `pitch` elements apart.
template <typename acc_t>
void tap_runs(const Problem& p, const PaddedPlanes& pl, const Phase& ph, const Phase& pw, const acc_t* image_planes,
              int64_t pitch, int64_t g, std::vector<const acc_t*>& runs) {
  const int64_t Cin_g = p.Cin / p.groups, per_channel = pl.step_h * pl.step_w;
  runs.clear();
  for (int64_t ci = 0; ci < Cin_g; ++ci) {
    const acc_t* channel = image_planes + (g * Cin_g + ci) * per_channel * pitch;
    for (const Tap& a : ph.taps) {
      const Split sa = split(a.offset, pl.step_h);
      for (const Tap& b : pw.taps) {
        const Split sb = split(b.offset, pl.step_w);
        runs.push_back(channel + (sa.r * pl.step_w + sb.r) * pitch + (sa.q - pl.min_h) * pl.Wp + (sb.q - pl.min_w));
      }
    }
  }
}

// How many of phase pw's kernel columns read the plane row its first one reads: those whose offsets
// share its residue, a column apart (a 3x3's three, a 7x7/2's four). Counted, not sorted: a
// std::sort here would be a template instance compiled with this level's instructions, which the
// linker may keep for every level (test_isa_levels).
inline int64_t columns_per_row(const Phase& pw, int64_t step_w) {
  if (pw.taps.empty()) return 1;
  const int64_t first = split(pw.taps[0].offset, step_w).r;
  int64_t same = 0;
  for (const Tap& b : pw.taps) same += split(b.offset, step_w).r == first;
  return same;
}

// Whether x's images already are their padded planes: an unpadded stride-1 NCHW input of the
// accumulator type (a 1x1 convolution's, or any unpadded one), whose planes lie back to back. A
// task's runs read up to the planes' slack past a plane's end, which stays inside x for every plane
// but the last when a plane is at least the slack long; the last plane is read from a padded copy.
template <typename scalar_t>
bool reads_in_place(const Problem& p, const PaddedPlanes& pl, const Layout& xl) {
  if constexpr (is_half<scalar_t>) {
    return false;
  } else {
    const int64_t plane = p.H * p.W, slack = pl.size - pl.Hp * pl.Wp;
    return pl.step_h == 1 && pl.step_w == 1 && pl.min_h == 0 && pl.min_w == 0 && pl.Hp == p.H && pl.Wp == p.W &&
           xl.w == 1 && xl.h == p.W && xl.c == plane && xl.n == p.Cin * plane && plane >= slack;
  }
}

template <typename scalar_t>
void convolve_planar(const Problem& p, const ChassisPlan& plan, const PaddedPlanes& pl, const scalar_t* x,
                     const Layout& xl, const acc_type<scalar_t>* w_rows, const acc_type<scalar_t>* bias, scalar_t* out,
                     const Layout& ol) {
  using acc_t = acc_type<scalar_t>;
  constexpr int64_t block_width = kVectorBlock * Vectorized<acc_t>::size();
  const bool in_place = reads_in_place<scalar_t>(p, pl, xl);
  Problem copied = p;
  copied.N = in_place ? 0 : p.N;
  const auto planes = scratch<acc_t>(copied.N * p.Cin * pl.step_h * pl.step_w * pl.size);
  fill_padded_planes<scalar_t>(copied, pl, x, xl, planes.get());
  // In place: the last plane of x, and its padded copy that the tasks read instead.
  const acc_t* last_plane = in_place ? reinterpret_cast<const acc_t*>(x + (p.N - 1) * xl.n + (p.Cin - 1) * xl.c) : nullptr;
  const auto last_copy = scratch<acc_t>(in_place ? pl.size : 0);
  if (in_place) {
    std::copy_n(last_plane, pl.Hp * pl.Wp, last_copy.get());
    zero(last_copy.get() + pl.Hp * pl.Wp, pl.size - pl.Hp * pl.Wp);
  }

  const int64_t G = p.groups, Cin_g = p.Cin / G, Cout_g = p.Cout / G, group_size = Cout_g * Cin_g * p.Kh * p.Kw;
  const int64_t n_ph = static_cast<int64_t>(plan.ax_h.phases.size()), n_pw = static_cast<int64_t>(plan.ax_w.phases.size());
  const int64_t co_chunks = (Cout_g + kChannelChunk - 1) / kChannelChunk;
  int64_t max_rows = 1;
  for (const Phase& ph : plan.ax_h.phases) max_rows = std::max(max_rows, ph.count);
  // Grid rows per task: as many as keep the running totals within kScratchBytes, but enough tasks
  // for every thread. Any split gives the same bits. Where a task's weights pass 1 MiB (twice the
  // L2 of the Zen 3 measured), the totals may take as many bytes as the weights, up to 4 MiB: fewer,
  // longer tasks. float64 512 -> 512 3x3 on 14x14: 48-53 -> 41-49 ms at 1 thread, 47-53 -> 45-48 at
  // 2, channels_last 58-60 -> 51-57; bfloat16 22.2 -> 19.8 ms (Zen 3, same process). With fewer
  // weights the same rule moved a float64 CIFAR 3x3 +6% and a ResNet one -6%, so they keep the 128 KiB.
  const int64_t weight_bytes = plan.chunk_rows * plan.max_taps * static_cast<int64_t>(sizeof(acc_t));
  const int64_t totals_bytes = weight_bytes > (1 << 20) ? std::min<int64_t>(weight_bytes, 4 << 20) : kScratchBytes;
  const int64_t budget = totals_bytes / static_cast<int64_t>(sizeof(acc_t)) / plan.chunk_rows;
  const int64_t others = p.N * G * n_ph * n_pw * co_chunks;
  const int64_t wanted_blocks = (2 * at::get_num_threads() + others - 1) / others;
  const int64_t rows_per_task =
      std::clamp<int64_t>(std::min(budget / pl.Wp, (max_rows + wanted_blocks - 1) / wanted_blocks), 1, max_rows);
  const int64_t row_blocks = (max_rows + rows_per_task - 1) / rows_per_task;
  const int64_t ld = staggered_pitch<acc_t>((rows_per_task * pl.Wp + block_width - 1) / block_width * block_width);
  const int64_t image_size = p.Cin * pl.step_h * pl.step_w * pl.size;
  std::vector<int64_t> pieces;  // taps per piece, per phase along w
  for (const Phase& pw : plan.ax_w.phases) pieces.push_back(taps_per_piece(columns_per_row(pw, pl.step_w)));

  at::parallel_for(0, others * row_blocks, 1, [&](int64_t first_task, int64_t last_task) {
    const auto outer = scratch<acc_t>(plan.chunk_rows * ld), partial = scratch<acc_t>(plan.chunk_rows * ld);
    std::vector<const acc_t*> runs;
    for (int64_t task = first_task; task < last_task; ++task) {
      const auto [n, g, i, j, block, chunk] = phase_task(task, G, n_ph, n_pw, row_blocks, co_chunks);
      const Phase &ph = plan.ax_h.phases[i], &pw = plan.ax_w.phases[j];
      const int64_t jh0 = block * rows_per_task, jh1 = std::min(ph.count, jh0 + rows_per_task);
      if (jh0 >= jh1) continue;  // a phase with fewer grid rows than the longest
      const int64_t taps = Cin_g * static_cast<int64_t>(ph.taps.size() * pw.taps.size());
      const int64_t width = ((jh1 - jh0) * pl.Wp + block_width - 1) / block_width * block_width;
      const int64_t co0 = chunk * kChannelChunk, rows = std::min(kChannelChunk, Cout_g - co0);
      const acc_t* w = w_rows + g * group_size + plan.phase_offsets[i * n_pw + j] + co0 * taps;
      const acc_t* task_bias = bias + g * Cout_g + co0;
      // No taps (no input channels): the outputs are the bias. Otherwise the first chunk starts
      // from it (multiply_block).
      if (taps == 0) {
        for (int64_t c = 0; c < rows; ++c) std::fill_n(outer.get() + c * ld, width, task_bias[c]);
      }
      if (in_place) {
        tap_runs<acc_t>(p, pl, ph, pw, reinterpret_cast<const acc_t*>(x + n * xl.n), xl.c, g, runs);
        for (acc_t const*& run : runs) {
          if (run >= last_plane) run = last_copy.get() + (run - last_plane);
        }
      } else {
        tap_runs<acc_t>(p, pl, ph, pw, planes.get() + n * image_size, pl.size, g, runs);
      }
      for (acc_t const*& run : runs) run += jh0 * pl.Wp;
      for (int64_t t0 = 0; t0 < taps; t0 += kTapChunk) {
        const int64_t t1 = std::min(taps, t0 + kTapChunk);
        multiply<acc_t>(rows, w, taps, t0, runs.data() + t0, t1 - t0, outer.get(), partial.get(), ld, width,
                        t0 == 0 ? task_bias : nullptr, pieces[j]);
      }
      // Grid position (jh, jw) is output (r_h + out_step_h * jh, r_w + out_step_w * jw).
      const int64_t step = plan.ax_w.out_step * ol.w;
      for (int64_t c = 0; c < rows; ++c) {
        scalar_t* dst = out + n * ol.n + (g * Cout_g + co0 + c) * ol.c + pw.r * ol.w;
        for (int64_t jh = jh0; jh < jh1; ++jh) {
          store_row<scalar_t>(outer.get() + c * ld + (jh - jh0) * pl.Wp,
                              dst + (ph.r + plan.ax_h.out_step * jh) * ol.h, step, pw.count);
        }
      }
    }
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace fuel
