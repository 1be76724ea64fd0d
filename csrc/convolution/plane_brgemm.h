// float32 convolutions whose output keeps the input's size, stride 1 (a ResNet 3x3, a dilated 3x3
// padded by its dilation, their stride-1 transposes), on torch's brgemm with nothing copied: x is
// read in place and C is the output itself. NCHW: C[co][q] += sum over ci of W_tap[co][ci] *
// x[ci][q + shift] (the per-tap path's orientation; B = x's planes, ldb and ldc a plane).
// channels_last: C[q][co] += sum over ci of x[q + shift][ci] * W_tap[ci][co] (the patch path's; A =
// x's pixels, lda and ldc a pixel).
//
// Positions q = row * W + column run on across rows because the output rows are as long as the
// input's: a tap shifted by (dh, dw) reads x at q + dh * W + dw. What that reads wrong is the
// padding: rows past the top or bottom (those positions are left out of the tap's brgemm), and
// columns past a row's end, which read the neighbouring row's first or last elements: their C values
// are kept before the tap and put back after it, so that the tap adds nothing to them.
//
// The sums are the patch path's for the calls it serves (patch_brgemm.h), and so those of the same
// call in the other layout: each output starts at its bias, then the taps (rows, then columns, each sorted
// by input offset), each tap's channels in chunks of kPatchChunk (a whole number of them: the patch
// path cuts its runs every kPatchChunk terms, which then fall on tap boundaries), each chunk summed by
// oneDNN's kernel from zero and added to C. The patch path adds zeros for a tap in the padding;
// leaving the tap out gives the same bits, because every output here has a tap in range (the one at
// offset 0) and a chunk summed from zero is never -0. On a Zen 4 the NCHW ResNet 3x3 (4x64x56x56, 1
// thread) spent a tenth of its time staging x and turning C round on the patch path.
#pragma once

#include <ATen/native/CPUBlas.h>

#include <optional>

#include "axes.h"
#include "float_brgemm.h"
#include "kernel_common.h"
#include "kernel_table.h"
#include "patch_brgemm.h"

namespace fuel {
namespace CPU_CAPABILITY {

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)

constexpr int64_t kPlanePositions = 128;  // positions per brgemm (at most; N for planes, M for pixels)
constexpr int64_t kPlaneChannels = 64;    // output channels per brgemm (at most; M for planes, N for pixels)

// Whether the axis is one phase that steps by 1 in and out, keeps the input's length and has a tap
// at offset 0 (which every output then has in range).
inline bool keeps_size(const Axis& ax, int64_t in_length, int64_t out_length) {
  if (ax.in_step != 1 || ax.out_step != 1 || ax.phases.size() != 1 || in_length != out_length) return false;
  const Phase& ph = ax.phases[0];
  const bool centred = std::any_of(ph.taps.begin(), ph.taps.end(), [](const Tap& t) { return t.offset == 0; });
  return ph.r == 0 && ph.count == out_length && centred;
}

// How x and the output lay out a call's positions: NCHW planes (a position's neighbour along the
// row is the next element) or channels_last (the next pixel); null where this path does not serve
// the layouts. Either way a row's positions follow the previous row's, which the path relies on.
enum class PlaneLayout { planes, pixels };
inline std::optional<PlaneLayout> plane_layout(const Problem& p, const Layout& xl, const Layout& ol) {
  const int64_t plane = p.H * p.W;
  if (xl.w == 1 && xl.h == p.W && xl.c == plane && ol.w == 1 && ol.h == p.W && ol.c == plane) return PlaneLayout::planes;
  if (xl.c == 1 && xl.w == p.Cin && xl.h == p.W * p.Cin && ol.c == 1 && ol.w == p.Cout && ol.h == p.W * p.Cout) {
    return PlaneLayout::pixels;
  }
  return std::nullopt;
}

// Of the calls the patch path serves (the caller's check): float32, x and output both NCHW or both
// channels_last with dense rows, the input's size kept along both axes, and whole chunks of channels
// per group.
template <typename scalar_t>
bool plane_brgemm_serves(const Problem& p, const Axis& ax_h, const Axis& ax_w, const Layout& xl, const Layout& ol) {
  return std::is_same_v<scalar_t, float> && (p.Cin / p.groups) % kPatchChunk == 0 && keeps_size(ax_h, p.H, p.Ho) &&
         keeps_size(ax_w, p.W, p.Wo) && plane_layout(p, xl, ol).has_value();
}

// Per group, per tap in the sums' order, W_tap as brgemm's A, [Cout_g][Cin_g] (planes), or as its
// B, one [Cin_g][cols] matrix per block of kPlaneChannels output channels (pixels: rows of the
// brgemm's own width, not Cout_g apart: 512 channels' rows, 2 KiB apart, fall in 8 of L1's 64 sets,
// and B's 64 rows of 4 lines then miss L1 on every pass; channels_last 512 -> 512 3x3 on 14x14 at 1
// and 2 threads on a Zen 3, in the same processes: 1.68-1.71 -> 1.11-1.15 of torch's time), into
// memory left uninitialised (every element is written). 512 ->
// 512 at 1 thread on a Zen 3, fuel / torch, packed one tap matrix after another -> by tiles
// (pack_tap_matrices): 14x14 1.40 -> 1.24-1.30, 7x7 1.64 -> 1.22-1.29; channels_last (the packing 27%
// of the call before) 14x14 2.06 -> 1.51-1.61, 7x7 2.38-2.49 -> 1.79-1.96.
inline std::unique_ptr<float[]> pack_plane_weights(const Problem& p, const std::vector<Tap>& taps_h,
                                                   const std::vector<Tap>& taps_w, PlaneLayout layout, const float* w,
                                                   const int64_t* ws) {
  const int64_t G = p.groups, Cin_g = p.Cin / G, Cout_g = p.Cout / G, matrix = Cout_g * Cin_g;
  std::vector<int64_t> tap_offsets;
  for (const Tap& a : taps_h) {
    for (const Tap& b : taps_w) tap_offsets.push_back(a.k * ws[2] + b.k * ws[3]);
  }
  const int64_t taps = static_cast<int64_t>(tap_offsets.size());
  auto packed = scratch<float>(G * taps * matrix);
  const bool planes = layout == PlaneLayout::planes;
  const int64_t row_length = planes ? Cin_g : Cout_g;
  pack_tap_matrices<float>(p, tap_offsets, planes, 1, row_length, w, ws, [&](int64_t g, int64_t t, int64_t r, int64_t i) {
    float* const tap = packed.get() + (g * taps + t) * matrix;
    if (planes) return tap + r * row_length + i;
    const int64_t co0 = i / kPlaneChannels * kPlaneChannels;
    return tap + co0 * Cin_g + r * std::min(kPlaneChannels, Cout_g - co0) + (i - co0);
  });
  return packed;
}

// The positions of [q0, q1) whose column c + dw falls outside a row of `width` (dw: a tap's column
// offset), as runs [lo, hi), one per row.
template <typename Visit>
void outside_columns(int64_t q0, int64_t q1, int64_t width, int64_t dw, Visit&& visit) {
  if (dw == 0 || q0 >= q1) return;
  for (int64_t row = q0 / width; row * width < q1; ++row) {
    const int64_t lo = row * width + (dw < 0 ? 0 : std::max<int64_t>(0, width - dw));
    const int64_t hi = row * width + (dw < 0 ? std::min(-dw, width) : width);
    if (std::max(lo, q0) < std::min(hi, q1)) visit(std::max(lo, q0), std::min(hi, q1));
  }
}

inline void convolve_plane_brgemm(const Problem& p, const Axis& ax_h, const Axis& ax_w, const float* x,
                                  const Layout& xl, const ConvOperands& o, const float* bias, float* out,
                                  const Layout& ol) {
  namespace cpublas = at::native::cpublas;
  const PlaneLayout layout = *plane_layout(p, xl, ol);
  const bool planes = layout == PlaneLayout::planes;
  const std::vector<Tap> taps_h = by_offset(ax_h.phases[0].taps), taps_w = by_offset(ax_w.phases[0].taps);
  const std::unique_ptr<float[]> packed =
      pack_plane_weights(p, taps_h, taps_w, layout, static_cast<const float*>(o.weight), o.weight_strides);
  const int64_t G = p.groups, Cin_g = p.Cin / G, Cout_g = p.Cout / G, W = p.W, plane = p.H * p.W;
  const int64_t taps = static_cast<int64_t>(taps_h.size() * taps_w.size());
  // A task is a block of positions for a block of output channels: any split gives the same bits.
  // The channel blocks share the work among the threads where the images alone would not (one 14x14
  // image of 512 -> 512 channels made 7 blocks of 32 positions, 4 + 3 over 2 threads). The tasks go
  // channel block by channel block, each over every block of positions, so that a thread's run of
  // tasks holds the position blocks alike; blocks of equal size in whole vectors. A 14x14 image went
  // as 128 + 68 positions, each block's channel blocks in a run: one of 2 threads had twice the
  // other's work. NCHW 512 -> 512 on 14x14 at 2 threads on a Zen 3, 1.18-1.68 of torch's time with
  // equal blocks in position-first runs, 1.06-1.21 in channel-first runs.
  const int64_t co_blocks = (Cout_g + kPlaneChannels - 1) / kPlaneChannels;
  const int64_t most = rows_for_threads(kPlanePositions, plane, p.N * G * co_blocks, at::get_num_threads());
  const int64_t blocks = (plane + most - 1) / most;
  const int64_t block = std::min(most, equal_block(plane, blocks, Vectorized<float>::size()));
  int64_t widest_shift = 0;
  for (const Tap& b : taps_w) widest_shift = std::max(widest_shift, std::abs(b.offset));
  // The kept C values of one tap: the outside columns of a block's rows, for each channel of C.
  const int64_t kept_per_channel = (block / W + 2) * std::min(widest_shift, W);
  // NCHW planes whose rows crowd into few of L1's sets (float_brgemm.h): a task first copies the
  // positions its taps read from each of its group's planes, rows a pitch apart that spreads them
  // over the sets. float32 3x3 64 -> 64 at 1 thread on a Zen 3, fuel / torch: 4x64x32x32 1.54 read
  // in place, 1.19-1.27 with float_brgemm copying each B panel, 1.09-1.12 staged; 1x64x64x64 1.71 ->
  // 1.06. Planes that do not crowd (56x56: 4 rows to a set) gained nothing from staging.
  int64_t lowest_shift = 0, highest_shift = 0;
  for (const Tap& th : taps_h) {
    for (const Tap& tw : taps_w) {
      lowest_shift = std::min(lowest_shift, th.offset * W + tw.offset);
      highest_shift = std::max(highest_shift, th.offset * W + tw.offset);
    }
  }
  const bool stage_x = planes && rows_crowd_l1(xl.c, kPatchChunk);
  int64_t x_pitch = (std::min(plane, block + highest_shift - lowest_shift) + 15) / 16 * 16;
  while (stage_x && rows_crowd_l1(x_pitch, kPatchChunk)) x_pitch += 16;  // an odd number of lines spreads them
  path_counts().float_brgemm_images += p.N;
  path_counts().patch_brgemm_images += p.N;
  path_counts().plane_brgemm_images += p.N;
  if (stage_x) path_counts().plane_staged_images += p.N;
  at::parallel_for(0, p.N * G * blocks * co_blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> kept(kPlaneChannels * kept_per_channel);
    const auto staged = scratch<float>(stage_x ? Cin_g * x_pitch : 0);
    int64_t staged_block = -1;  // the block of positions (of an image and group) staged, if any
    for (int64_t task = first; task < last; ++task) {
      const int64_t positions = task % (p.N * G * blocks);  // the task's block of positions, of all the images and groups
      const int64_t q0 = positions % blocks * block, q1 = std::min(plane, q0 + block), g = positions / blocks % G;
      const int64_t n = positions / blocks / G;
      // Where x's channel ci, position q is read: x's plane in place, or the staged copy of the
      // positions [r0, r1) the task's taps reach (kept for a following task of the same block).
      const float* x_group = x + n * xl.n + g * Cin_g * xl.c;
      int64_t ld_x = xl.c, x_origin = 0;
      if (stage_x) {
        const int64_t r0 = std::max<int64_t>(0, q0 + lowest_shift), r1 = std::min(plane, q1 + highest_shift);
        if (staged_block != positions) {
          for (int64_t ci = 0; ci < Cin_g; ++ci) {
            std::copy(x_group + ci * xl.c + r0, x_group + ci * xl.c + r1, staged.get() + ci * x_pitch);
          }
          staged_block = positions;
        }
        x_group = staged.get(), ld_x = x_pitch, x_origin = r0;
      }
      const int64_t co0 = task / (p.N * G * blocks) * kPlaneChannels;
      const int64_t cols = std::min(kPlaneChannels, Cout_g - co0);
      // C's element (channel co, position q) at c + co * ol.c + q * ol.w, visited along its runs.
      float* c = out + n * ol.n + (g * Cout_g + co0) * ol.c;
      auto each_output = [&](int64_t s0, int64_t s1, auto&& visit) {
        if (planes) {
          for (int64_t co = 0; co < cols; ++co) {
            for (int64_t s = s0; s < s1; ++s) visit(c[co * ol.c + s], co);
          }
          return;
        }
        for (int64_t s = s0; s < s1; ++s) {
          for (int64_t co = 0; co < cols; ++co) visit(c[s * ol.w + co], co);
        }
      };
      each_output(q0, q1, [&](float& v, int64_t co) { v = bias ? bias[g * Cout_g + co0 + co] : 0.f; });
      const float* w_tap = packed.get() + g * taps * Cout_g * Cin_g;
      for (const Tap& th : taps_h) {
        // The output rows whose input row th reaches.
        const int64_t row_lo = std::clamp<int64_t>(-th.offset, 0, p.H), row_hi = std::clamp<int64_t>(p.H - th.offset, row_lo, p.H);
        for (const Tap& tw : taps_w) {
          const int64_t shift = th.offset * W + tw.offset;
          const int64_t lo = std::max(std::max(q0, row_lo * W), -shift);
          const int64_t hi = std::min(std::min(q1, row_hi * W), plane - shift);
          if (lo < hi) {
            float* saved = kept.data();
            outside_columns(lo, hi, W, tw.offset, [&](int64_t s0, int64_t s1) {
              each_output(s0, s1, [&](float& v, int64_t) { *saved++ = v; });
            });
            for (int64_t ci0 = 0; ci0 < Cin_g; ci0 += kPatchChunk) {
              if (planes) {
                const float* x_run = x_group + ci0 * ld_x + (lo + shift - x_origin);
                float_brgemm(cols, hi - lo, kPatchChunk, Cin_g, ld_x, ol.c, true, w_tap + co0 * Cin_g + ci0, x_run,
                             c + lo);
              } else {
                // oneDNN's kernel at every level: float_brgemm's tile took 10-20% longer on the
                // channels_last ResNet 3x3 (Zen 3, 1 thread), its B in panels or not, columns or
                // rows outermost (A's 128 pixels of 64 channels fill L1 by themselves).
                const float* x_run = x_group + ci0 * xl.c + (lo + shift) * xl.w;
                cpublas::brgemm(hi - lo, cols, kPatchChunk, xl.w, cols, ol.w, true, x_run,
                                w_tap + co0 * Cin_g + ci0 * cols, c + lo * ol.w, false);
              }
            }
            saved = kept.data();
            outside_columns(lo, hi, W, tw.offset, [&](int64_t s0, int64_t s1) {
              each_output(s0, s1, [&](float& v, int64_t) { v = *saved++; });
            });
          }
          w_tap += Cout_g * Cin_g;
        }
      }
    }
    cpublas::brgemm_release(false);
  });
}

#endif

}  // namespace CPU_CAPABILITY
}  // namespace fuel
