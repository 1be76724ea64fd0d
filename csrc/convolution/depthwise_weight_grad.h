// The weight gradient of a depthwise conv2d (each channel its own group, one output channel per
// channel), read from x and the output gradient where they lie.
//
// autograd.cpp's general route computes a weight gradient as a conv2d over transposed copies of both
// (the images become input channels, the gradient the kernel: the wide-kernel problem, wide_kernel.h).
// For a channels_last depthwise call those copies turn NHWC into [channel][image] planes one strided
// element at a time: a float32 4x128x56x56 3x3 took 10.8 ms at 1 thread on a Zen 4, two thirds of it
// copying, where torch took 0.8; at stride 2, on the chassis, 12.1 ms (torch 0.3).
//
// Every output keeps the bits that conv2d gives it (NaN payloads aside: which of two NaNs a fused
// multiply-add passes on depends on the instruction form the compiler picks), in one of its two orders:
//
// - The wide-kernel path's, for the calls conv2d sends down it (at least two images, column stride 1,
//   gradient rows of at least kWideLanes columns, at most 16 kernel columns): lane l of kWideLanes sums
//   the products g * x of the output columns ow = l (mod kWideLanes), one fused chain from +0 over
//   (image, output row, column) ascending, a tap in the padding multiplying +0; then the lanes are
//   added in order to +0 and the sum is rounded once. (That path also pads each gradient row to whole
//   lane groups, adding 0 * +0 to some lanes: nothing changes, as a chain that starts at +0 never holds
//   -0.) channels_last x and gradient: weight_grad_nhwc, vectors along the channels; other layouts:
//   weight_grad_planes, vectors along the rows.
// - The chassis's, for the others (weight_grad_nhwc_blocked): the products in (image, output row,
//   column) order, in blocks of kBlock and chunks of kTapChunk. Vectors along the channels, NCHW
//   operands turned channels_last a task and an image at a time.
//
// Along the channels each vector lane is one channel's chain, and each thread owns one run of
// channels (whole cache lines of a pixel) and all their sums.
#pragma once

#include <cstring>

#include "depthwise.h"
#include "tiles.h"
#include "wide_kernel.h"

namespace fuel {
namespace CPU_CAPABILITY {
namespace depthwise_grad_detail {

using depthwise_detail::ChannelVector;
using depthwise_detail::for_each_index;

constexpr int64_t kRowBlock = 8;  // output rows per visit of a register block's sums
constexpr int64_t kStagedRowBlock = 4;  // the same where rows are staged (weight_grad_nhwc): within L1

// The input row that kernel row kh of output row oh reads (outside [0, H): the padding).
inline int64_t input_row_index(const Problem& p, int64_t oh, int64_t kh) {
  return oh * p.stride[0] + kh * p.dilation[0] - p.padding[0];
}

// Lanes (output columns) per register block: kKw sums each, with the gradient's values and x's
// columns loaded as they are used, within the vector registers (32 at AVX-512, 16 below). A half
// type's loads widen: eight lanes of a 3x3 share each x column among more multiply-adds (bfloat16
// 4x128x56x56 at 1 thread on a Zen 4: 0.73 -> 0.63 ms; float32, whose 24 sums then spill, 0.69 ->
// 0.75).
template <typename scalar_t, int kKw>
constexpr int lane_group() {
  constexpr bool wide_file = Vectorized<float>::size() == 16;
  if constexpr (kKw <= 3 && wide_file && is_half<scalar_t>) return 8;
  return kKw <= 5 ? (wide_file ? 4 : 2) : (wide_file ? 2 : 1);
}

// The kJ lanes from output column ow0 (ow0 + j: the same lane modulo kWideLanes at every step) add
// their products for the kKw taps of one kernel row: tap kw of lane j reads column ow0 + j + kw - pw
// of x_row (an input row at the vector's first channel, pixels `pitch` apart; in the padding,
// `zeros` with pitch 0), the gradient's pixels lie g_pitch apart from g_row. kEdges: some of those
// columns lie in the padding (they read `zeros`), or some lanes past the row's last output column
// (they add nothing).
template <typename scalar_t, int kJ, int kKw, bool kEdges>
__attribute__((always_inline)) inline void lane_step(const scalar_t* x_row, int64_t pitch, const scalar_t* g_row,
                                                     int64_t g_pitch, int64_t ow0, int64_t pw, int64_t W, int64_t Wo,
                                                     const ChannelVector<scalar_t>& load, const scalar_t* zeros,
                                                     Vectorized<acc_type<scalar_t>> (&acc)[kJ][kKw]) {
  using Vec = Vectorized<acc_type<scalar_t>>;
  Vec g[kJ];
  for_each_index<kJ>([&](auto j) __attribute__((always_inline)) {
    if (!kEdges || ow0 + j < Wo) g[j] = load(g_row + (ow0 + j) * g_pitch);
  });
  for_each_index<kJ + kKw - 1>([&](auto c) __attribute__((always_inline)) {
    const int64_t column = ow0 + c - pw;
    const Vec xv = load(!kEdges || (column >= 0 && column < W) ? x_row + column * pitch : zeros);
    for_each_index<kKw>([&](auto kw) __attribute__((always_inline)) {
      constexpr int j = static_cast<int>(c) - static_cast<int>(kw);
      if constexpr (j >= 0 && j < kJ) {
        if (!kEdges || ow0 + j < Wo) acc[j][kw] = at::vec::fmadd(g[j], xv, acc[j][kw]);
      }
    });
  });
}

// The task's sums (see the file comment), [lane][kh][kw], for one channel vector, over output rows
// [oh0, oh1) of one image. kKw = 0: any kernel width and column dilation (read at run time), one lane
// at a time with its sums in memory. x_image holds input rows from ih_first on, g_image gradient rows
// from oh_first on (0 and 0 where they are the tensors themselves).
template <typename scalar_t, int kKw>
void add_row_block(const Problem& p, const scalar_t* x_image, const Layout& xl, int64_t ih_first,
                   const scalar_t* g_image, const Layout& gl, int64_t oh_first, int64_t oh0, int64_t oh1,
                   const ChannelVector<scalar_t>& load, const scalar_t* zeros, Vectorized<acc_type<scalar_t>>* sums) {
  using Vec = Vectorized<acc_type<scalar_t>>;
  constexpr int64_t L = kWideLanes<acc_type<scalar_t>>;
  const int64_t Kh = p.Kh, pw = p.padding[1], W = p.W, Wo = p.Wo;
  // Kernel row kh's input row for output row oh, and its pitch.
  const auto input_row = [&](int64_t oh, int64_t kh) -> std::pair<const scalar_t*, int64_t> {
    const int64_t ih = input_row_index(p, oh, kh);
    if (ih < 0 || ih >= p.H) return {zeros, 0};
    return {x_image + (ih - ih_first) * xl.h, xl.w};
  };
  for (int64_t kh = 0; kh < Kh; ++kh) {
    if constexpr (kKw > 0) {
      constexpr int kJ = lane_group<scalar_t, kKw>();
      static_assert(L % kJ == 0);
      for (int64_t l0 = 0; l0 < L; l0 += kJ) {
        Vec acc[kJ][kKw];
        Vec* const at = sums + (l0 * Kh + kh) * kKw;  // lane l0 + j, tap kw: at[j * Kh * kKw + kw]
        for_each_index<kJ>([&](auto j) { for_each_index<kKw>([&](auto kw) { acc[j][kw] = at[j * Kh * kKw + kw]; }); });
        for (int64_t oh = oh0; oh < oh1; ++oh) {
          const auto [x_row, pitch] = input_row(oh, kh);
          const scalar_t* const g_row = g_image + (oh - oh_first) * gl.h;
          for (int64_t ow0 = l0; ow0 < Wo; ow0 += L) {
            if (ow0 - pw >= 0 && ow0 + kJ + kKw - 2 - pw < W && ow0 + kJ <= Wo) {
              lane_step<scalar_t, kJ, kKw, false>(x_row, pitch, g_row, gl.w, ow0, pw, W, Wo, load, zeros, acc);
            } else {
              lane_step<scalar_t, kJ, kKw, true>(x_row, pitch, g_row, gl.w, ow0, pw, W, Wo, load, zeros, acc);
            }
          }
        }
        for_each_index<kJ>([&](auto j) { for_each_index<kKw>([&](auto kw) { at[j * Kh * kKw + kw] = acc[j][kw]; }); });
      }
    } else {
      const int64_t Kw = p.Kw;
      for (int64_t oh = oh0; oh < oh1; ++oh) {
        const auto [x_row, pitch] = input_row(oh, kh);
        const scalar_t* const g_row = g_image + (oh - oh_first) * gl.h;
        for (int64_t ow = 0; ow < Wo; ++ow) {
          const Vec g = load(g_row + ow * gl.w);
          Vec* const at = sums + ((ow % L) * Kh + kh) * Kw;
          for (int64_t kw = 0; kw < Kw; ++kw) {
            const int64_t column = ow + kw * p.dilation[1] - pw;
            at[kw] = at::vec::fmadd(g, load(column >= 0 && column < W ? x_row + column * pitch : zeros), at[kw]);
          }
        }
      }
    }
  }
}

// The channel runs of the kernels along the channels: one per thread, of whole cache lines of a pixel
// (which thread computes an output does not change its sum). With one line's channels per task, the
// tasks of a float32 4x128x56x56 3x3 at 1 thread on a Zen 4 each read x and the gradient 512 bytes
// apart, and took 0.94 ms, 0.67 as one task.
struct ChannelRuns {
  int64_t block, vectors, blocks;  // channels per run, vectors per run, runs
};

template <typename scalar_t>
ChannelRuns channel_runs(int64_t channels) {
  constexpr int64_t V = Vectorized<acc_type<scalar_t>>::size();
  const int64_t line = std::max<int64_t>(V, 64 / int64_t(sizeof(scalar_t)));
  const int64_t per_thread = (channels + at::get_num_threads() - 1) / at::get_num_threads();
  const int64_t block = (per_thread + line - 1) / line * line;
  return {block, block / V, (channels + block - 1) / block};
}

// `channels` channels of each pixel of rows [row0, row1) of a channels_last image (rows `row` apart,
// pixels `pixel` apart), one pixel after another: each vector of V channels in its own run of rows
// (`vector_stride` elements apart), V elements a pixel. A pixel's channels are read in one sweep.
template <typename scalar_t, int64_t V>
void stage_rows(const scalar_t* from, int64_t row, int64_t pixel, int64_t row0, int64_t row1, int64_t width,
                int64_t channels, int64_t vector_stride, scalar_t* to) {
  for (int64_t r = row0; r < row1; ++r) {
    for (int64_t i = 0; i < width; ++i) {
      const scalar_t* const src = from + r * row + i * pixel;
      scalar_t* const dst = to + ((r - row0) * width + i) * V;
      int64_t c = 0;
      for (; c + V <= channels; c += V) std::memcpy(dst + c / V * vector_stride, src + c, V * sizeof(scalar_t));
      if (c < channels) std::copy_n(src + c, channels - c, dst + c / V * vector_stride);
    }
  }
}

// The wide-kernel path's order along the channels: a task walks the images a block of output rows at a
// time, and for each kernel row and group of lanes holds the sums of every kernel column in registers
// over the block's rows.
//
// With vectors of 8 floats (AVX2) a channel vector is half of a pixel's cache line, and a pixel of 128
// float32 channels 512 bytes from the next: the pixels a block reads all fall in 8 of L1's 64 sets
// (64 lines), so each group of lanes read its rows from L2 again. There the block's rows of the
// vectors are staged side by side first, the pixels read whole, in one sweep over each row (a float32
// 4x128x56x56 3x3 at 1 thread on a Zen 3, this machine's noise included: 2.5-2.9 -> 2.2-2.4 ms, torch
// 2.1-2.7 in the same runs; staging one vector at a time, its half lines read twice, 2.3-2.4).
template <typename scalar_t, int kKw>
void weight_grad_nhwc(const Problem& p, const scalar_t* x, const Layout& xl, const scalar_t* g, const Layout& gl,
                      scalar_t* dw) {
  using acc_t = acc_type<scalar_t>;
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size(), L = kWideLanes<acc_t>;
  constexpr bool kStaged = Vectorized<float>::size() < 16;
  const int64_t row_block = kStaged ? kStagedRowBlock : kRowBlock;
  const auto [block, vectors, blocks] = channel_runs<scalar_t>(p.Cin);
  const int64_t taps = p.Kh * p.Kw;
  const int64_t x_rows = (row_block - 1) * p.stride[0] + (p.Kh - 1) * p.dilation[0] + 1;
  const Layout staged_xl{0, 1, p.W * V, V}, staged_gl{0, 1, p.Wo * V, V};
  // A staged vector: x's rows, then the gradient's; as many vectors staged at once as fit ~384 KB (L2).
  const int64_t per_vector = (x_rows * p.W + row_block * p.Wo) * V;
  const int64_t staged_vectors =
      kStaged ? std::clamp<int64_t>((int64_t(384) << 10) / (per_vector * int64_t(sizeof(scalar_t))), 1, vectors) : 0;
  const scalar_t zeros[V] = {};
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<Vec> sums(vectors * L * taps);
    const auto staged = scratch<scalar_t>(staged_vectors * per_vector);
    for (int64_t b = first; b < last; ++b) {
      const int64_t c0 = b * block;
      std::fill(sums.begin(), sums.end(), Vec(acc_t(0)));
      for (int64_t n = 0; n < p.N; ++n) {
        for (int64_t oh0 = 0; oh0 < p.Ho; oh0 += row_block) {
          const int64_t oh1 = std::min(p.Ho, oh0 + row_block);
          // The input rows the block reads, the rows staged.
          const int64_t ih0 = std::max<int64_t>(0, input_row_index(p, oh0, 0));
          const int64_t ih1 = std::min(p.H, input_row_index(p, oh1 - 1, p.Kh - 1) + 1);
          for (int64_t v = 0; v < vectors && c0 + v * V < p.Cin; ++v) {
            const int64_t lanes = std::min(V, p.Cin - c0 - v * V);
            const ChannelVector<scalar_t> load{lanes};
            const scalar_t *const x_vector = x + n * xl.n + c0 + v * V, *const g_vector = g + n * gl.n + c0 + v * V;
            if constexpr (kStaged) {
              const int64_t slot = v % staged_vectors;
              if (slot == 0) {
                const int64_t channels = std::min(std::min(staged_vectors, vectors - v) * V, p.Cin - c0 - v * V);
                stage_rows<scalar_t, V>(x_vector, xl.h, xl.w, ih0, ih1, p.W, channels, per_vector, staged.get());
                stage_rows<scalar_t, V>(g_vector, gl.h, gl.w, oh0, oh1, p.Wo, channels, per_vector,
                                        staged.get() + x_rows * p.W * V);
              }
              const scalar_t* const mine = staged.get() + slot * per_vector;
              add_row_block<scalar_t, kKw>(p, mine, staged_xl, ih0, mine + x_rows * p.W * V, staged_gl, oh0, oh0, oh1,
                                           load, zeros, &sums[v * L * taps]);
            } else {
              add_row_block<scalar_t, kKw>(p, x_vector, xl, 0, g_vector, gl, 0, oh0, oh1, load, zeros,
                                           &sums[v * L * taps]);
            }
          }
        }
      }
      for (int64_t v = 0; v < vectors && c0 + v * V < p.Cin; ++v) {
        const int64_t lanes = std::min(V, p.Cin - c0 - v * V);
        for (int64_t t = 0; t < taps; ++t) {
          Vec total(acc_t(0));
          for (int64_t l = 0; l < L; ++l) total = total + sums[(v * L + l) * taps + t];
          acc_t values[V];
          total.store(values);
          // Rounded one by one as the wide-kernel path rounds (c10's conversion), for the same bits.
          for (int64_t e = 0; e < lanes; ++e) dw[(c0 + v * V + e) * taps + t] = static_cast<scalar_t>(values[e]);
        }
      }
    }
  });
}

// Other layouts (NCHW, or mixed): one channel per task, its planes staged image by image, x's rows
// widened into zero-padded lines and the gradient's rows zero-padded to whole lane groups: there the
// vectors run along the rows, lane l of a group (kNV vectors) being output column l (mod kWideLanes),
// as in the wide-kernel path itself. A group's last columns past the row multiply +0 by +0 (x masked,
// as that path masks it: x is real data there, and may be inf). As that path, channel by channel,
// a float32 NCHW 4x128x56x56 3x3 took 2.7 ms at 1 thread on a Zen 4 (its staged lines and its sums
// in memory).
template <typename acc_t>
struct PlaneStaging {
  int64_t line_len = 0, x_rows = 0, g_len = 0;  // a staged x line, x's staged rows, a staged gradient row
  std::unique_ptr<acc_t[]> x, g;  // scratch(): written in full before they are read
};

template <typename scalar_t>
void stage_planes(const Problem& p, const scalar_t* x_plane, const Layout& xl, const scalar_t* g_plane,
                  const Layout& gl, PlaneStaging<acc_type<scalar_t>>& s) {
  using acc_t = acc_type<scalar_t>;
  for (int64_t i = 0; i < s.x_rows; ++i) {
    acc_t* const line = s.x.get() + i * s.line_len;
    const int64_t ih = i - p.padding[0];
    const int64_t lo = ih >= 0 && ih < p.H ? std::clamp<int64_t>(p.padding[1], 0, s.line_len) : s.line_len;
    const int64_t hi = std::clamp<int64_t>(p.padding[1] + p.W, lo, s.line_len);
    zero(line, lo);
    if (lo < hi) {
      const scalar_t* const first = x_plane + ih * xl.h + (lo - p.padding[1]) * xl.w;  // x's column lo - padding
      if (xl.w == 1) {
        widen<scalar_t>(first, line + lo, hi - lo);
      } else {
        for (int64_t j = lo; j < hi; ++j) line[j] = static_cast<acc_t>(first[(j - lo) * xl.w]);
      }
    }
    zero(line + hi, s.line_len - hi);
  }
  for (int64_t oh = 0; oh < p.Ho; ++oh) {
    acc_t* const dst = s.g.get() + oh * s.g_len;
    if (gl.w == 1) {
      widen<scalar_t>(g_plane + oh * gl.h, dst, p.Wo);
    } else {
      for (int64_t ow = 0; ow < p.Wo; ++ow) dst[ow] = static_cast<acc_t>(g_plane[oh * gl.h + ow * gl.w]);
    }
    zero(dst + p.Wo, s.g_len - p.Wo);
  }
}

// kRows kernel rows from kh0, kKw columns each (compile-time), added over one staged image.
template <typename acc_t, int kRows, int kKw>
void add_plane(const Problem& p, const PlaneStaging<acc_t>& s, int64_t kh0, Vectorized<acc_t>* sums) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size(), L = kWideLanes<acc_t>;
  constexpr int kNV = static_cast<int>(L / V);
  const int64_t tail = p.Wo - (s.g_len - L);  // real columns of a row's last lane group
  Vec mask[kNV];
  for (int v = 0; v < kNV; ++v) mask[v] = Vec::arange(acc_t(v * V), acc_t(1)) < Vec(static_cast<acc_t>(tail));
  Vec acc[kRows][kKw][kNV];
  Vec* const at = sums + kh0 * p.Kw * kNV;  // [kh][kw][vector]
  for_each_index<kRows>([&](auto r) {
    for_each_index<kKw>([&](auto kw) { for_each_index<kNV>([&](auto v) { acc[r][kw][v] = at[(r * p.Kw + kw) * kNV + v]; }); });
  });
  const auto group = [&](const acc_t* g_row, const acc_t* const* lines, int64_t k, bool masked) __attribute__((always_inline)) {
    for_each_index<kNV>([&](auto v) __attribute__((always_inline)) {
      const Vec gv = Vec::loadu(g_row + k + v * V);
      for_each_index<kRows>([&](auto r) __attribute__((always_inline)) {
        for_each_index<kKw>([&](auto kw) __attribute__((always_inline)) {
          Vec xv = Vec::loadu(lines[r] + k + kw * p.dilation[1] + v * V);
          if (masked) xv = Vec::blendv(Vec(acc_t(0)), xv, mask[v]);
          acc[r][kw][v] = at::vec::fmadd(gv, xv, acc[r][kw][v]);
        });
      });
    });
  };
  for (int64_t oh = 0; oh < p.Ho; ++oh) {
    const acc_t* const g_row = s.g.get() + oh * s.g_len;
    const acc_t* lines[kRows];
    for (int r = 0; r < kRows; ++r) lines[r] = s.x.get() + (oh * p.stride[0] + (kh0 + r) * p.dilation[0]) * s.line_len;
    int64_t k = 0;
    for (; k + L < s.g_len || (k + L == s.g_len && tail == L); k += L) group(g_row, lines, k, false);
    if (k < s.g_len) group(g_row, lines, k, true);
  }
  for_each_index<kRows>([&](auto r) {
    for_each_index<kKw>([&](auto kw) { for_each_index<kNV>([&](auto v) { at[(r * p.Kw + kw) * kNV + v] = acc[r][kw][v]; }); });
  });
}

// Any kernel width (kKw = 0: read at run time, the sums in memory) or a fixed one.
template <typename acc_t, int kKw>
void add_planes(const Problem& p, const PlaneStaging<acc_t>& s, Vectorized<acc_t>* sums) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size(), L = kWideLanes<acc_t>;
  constexpr int kNV = static_cast<int>(L / V);
  if constexpr (kKw > 0) {
    // A kernel's rows at once where their sums fit the registers (a 3x3 at AVX-512), else row by row.
    if (p.Kh == 3 && 3 * kKw * kNV <= 12) return add_plane<acc_t, 3, kKw>(p, s, 0, sums);
    for (int64_t kh = 0; kh < p.Kh; ++kh) add_plane<acc_t, 1, kKw>(p, s, kh, sums);
  } else {
    const int64_t tail = p.Wo - (s.g_len - L);
    for (int64_t oh = 0; oh < p.Ho; ++oh) {
      const acc_t* const g_row = s.g.get() + oh * s.g_len;
      for (int64_t k = 0; k < s.g_len; k += L) {
        for (int64_t v = 0; v < kNV; ++v) {
          const Vec gv = Vec::loadu(g_row + k + v * V);
          const Vec mask = Vec::arange(acc_t(v * V), acc_t(1)) < Vec(static_cast<acc_t>(k + L == s.g_len ? tail : L));
          for (int64_t kh = 0; kh < p.Kh; ++kh) {
            const acc_t* const line = s.x.get() + (oh * p.stride[0] + kh * p.dilation[0]) * s.line_len;
            for (int64_t kw = 0; kw < p.Kw; ++kw) {
              const Vec xv = Vec::blendv(Vec(acc_t(0)), Vec::loadu(line + k + kw * p.dilation[1] + v * V), mask);
              Vec& sum = sums[(kh * p.Kw + kw) * kNV + v];
              sum = at::vec::fmadd(gv, xv, sum);
            }
          }
        }
      }
    }
  }
}

template <typename scalar_t, int kKw>
void weight_grad_planes(const Problem& p, const scalar_t* x, const Layout& xl, const scalar_t* g, const Layout& gl,
                        scalar_t* dw) {
  using acc_t = acc_type<scalar_t>;
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size(), L = kWideLanes<acc_t>;
  const int64_t taps = p.Kh * p.Kw;
  at::parallel_for(0, p.Cin, 1, [&](int64_t first, int64_t last) {
    PlaneStaging<acc_t> s;
    s.g_len = (p.Wo + L - 1) / L * L;
    s.line_len = s.g_len + (p.Kw - 1) * p.dilation[1];
    s.x_rows = (p.Ho - 1) * p.stride[0] + (p.Kh - 1) * p.dilation[0] + 1;
    s.x = scratch<acc_t>(s.x_rows * s.line_len);
    s.g = scratch<acc_t>(p.Ho * s.g_len);
    std::vector<Vec> sums(taps * (L / V));
    for (int64_t c = first; c < last; ++c) {
      std::fill(sums.begin(), sums.end(), Vec(acc_t(0)));
      for (int64_t n = 0; n < p.N; ++n) {
        stage_planes<scalar_t>(p, x + n * xl.n + c * xl.c, xl, g + n * gl.n + c * gl.c, gl, s);
        add_planes<acc_t, kKw>(p, s, sums.data());
      }
      for (int64_t t = 0; t < taps; ++t) {
        acc_t lanes[L];
        for (int64_t v = 0; v < L / V; ++v) sums[t * (L / V) + v].store(lanes + v * V);
        acc_t total = acc_t(0);
        for (int64_t l = 0; l < L; ++l) total += lanes[l];
        dw[c * taps + t] = static_cast<scalar_t>(total);
      }
    }
  });
}

// The other depthwise weight gradients (column strides, rows narrower than a lane group, one image,
// kernels wider than 16): conv2d computes them on the chassis, or for one image on the depthwise
// kernel, in the chassis's order. Each output sums the products of (image, output row, output
// column) in order in three levels: blocks of kBlock products as fused chains from +0 (the conv2d's
// zero bias), each kTapChunk products' blocks added to +0 in turn, the chunks added in turn; the
// result rounded as the chassis stores it (narrow()'s vector code). channels_last operands, vectors
// along the channels as in weight_grad_nhwc, every kernel tap's chain of a channel vector side by side
// (kTaps > 0: fixed at compile time, the chains in registers).
template <typename acc_t>
struct BlockedSums {  // one channel vector's: [tap] each
  std::vector<Vectorized<acc_t>> chain, chunk, total;
};

// Where the chains stand: products in the current block and chunk, and whether a chunk has ended.
struct BlockedPosition {
  int64_t in_block = 0, in_chunk = 0;
  bool first_chunk = true;
};

template <typename acc_t>
inline void end_block(BlockedSums<acc_t>& s, BlockedPosition& at, int64_t taps) {
  using Vec = Vectorized<acc_t>;
  for (int64_t t = 0; t < taps; ++t) s.chunk[t] = s.chunk[t] + s.chain[t], s.chain[t] = Vec(acc_t(0));
  at.in_chunk += at.in_block, at.in_block = 0;
  if (at.in_chunk == kTapChunk) {
    for (int64_t t = 0; t < taps; ++t) {
      s.total[t] = at.first_chunk ? s.chunk[t] : s.total[t] + s.chunk[t];
      s.chunk[t] = Vec(acc_t(0));
    }
    at.in_chunk = 0, at.first_chunk = false;
  }
}

// The products of one output row from column ow0 to ow1 (within one block) onto one channel vector's
// chains. rows[kh] / pitch[kh]: kernel row kh's input row at the block's first channel (`zeros`, with
// pitch 0, in the padding; as long as the block); the vector's channels lie `plane` elements on.
template <typename scalar_t, int kKh, int kKw>
__attribute__((always_inline)) inline void blocked_products(const Problem& p, const scalar_t* const* rows,
                                                            const int64_t* pitch, bool rows_inside,
                                                            const scalar_t* g_row, int64_t g_pitch, int64_t plane,
                                                            int64_t ow0, int64_t ow1,
                                                            const ChannelVector<scalar_t>& load,
                                                            const scalar_t* zeros,
                                                            Vectorized<acc_type<scalar_t>>* chain) {
  using Vec = Vectorized<acc_type<scalar_t>>;
  const int64_t sw = p.stride[1], dw = p.dilation[1], pw = p.padding[1], W = p.W;
  if constexpr (kKh > 0) {
    constexpr int kTaps = kKh * kKw;
    Vec acc[kTaps];
    for_each_index<kTaps>([&](auto t) { acc[t] = chain[t]; });
    for (int64_t ow = ow0; ow < ow1; ++ow) {
      const Vec g = load(g_row + ow * g_pitch + plane);
      const int64_t first = ow * sw - pw;
      const bool inside = rows_inside && first >= 0 && first + (kKw - 1) * dw < W;
      for_each_index<kTaps>([&](auto t) __attribute__((always_inline)) {
        constexpr int kh = t / kKw, kw = t % kKw;
        const int64_t column = first + kw * dw;
        const scalar_t* src = inside || (column >= 0 && column < W) ? rows[kh] + column * pitch[kh] : zeros;
        acc[t] = at::vec::fmadd(g, load(src + plane), acc[t]);
      });
    }
    for_each_index<kTaps>([&](auto t) { chain[t] = acc[t]; });
  } else {
    for (int64_t ow = ow0; ow < ow1; ++ow) {
      const Vec g = load(g_row + ow * g_pitch + plane);
      for (int64_t kh = 0, t = 0; kh < p.Kh; ++kh) {
        for (int64_t kw = 0; kw < p.Kw; ++kw, ++t) {
          const int64_t column = ow * sw - pw + kw * dw;
          const scalar_t* src = column >= 0 && column < W ? rows[kh] + column * pitch[kh] : zeros;
          chain[t] = at::vec::fmadd(g, load(src + plane), chain[t]);
        }
      }
    }
  }
}

// count channels of one image (src: at its first channel, through layout l) copied channels_last into
// dst [row][column][pitch]: 16 x 16 register transposes where the level has them for the type
// (tiles.h), element by element elsewhere. Turning NCHW operands so, a task at a time, took a float32
// 4x128x56x56 3x3 at stride 2 (1 thread, Zen 4) 0.67 ms, where turning the tensors first took 2.4
// (torch 0.54; through the conv2d route 7.5).
template <typename scalar_t>
void turn_image(const scalar_t* src, const Layout& l, int64_t count, int64_t H, int64_t W, scalar_t* dst,
                int64_t pitch) {
#if defined(CPU_CAPABILITY_AVX512)
  constexpr bool kTiles = !std::is_same_v<scalar_t, double>;
#elif defined(CPU_CAPABILITY_AVX2)
  constexpr bool kTiles = std::is_same_v<scalar_t, float>;
#else
  constexpr bool kTiles = false;
#endif
  for (int64_t h = 0; h < H; ++h) {
    int64_t c0 = 0;
    if constexpr (kTiles) {
      if (l.w == 1 && W >= 16) {
        for (; c0 + 16 <= count; c0 += 16) {
          // The last tile of a row overlaps the one before it: its columns are written twice, alike.
          for (int64_t w0 = 0; w0 < W; w0 += 16) {
            const int64_t w = std::min(w0, W - 16);
            transpose_tile<scalar_t, scalar_t>(src + c0 * l.c + h * l.h + w, l.c, dst + (h * W + w) * pitch + c0, pitch);
          }
        }
      }
    }
    for (int64_t c = c0; c < count; ++c) {
      for (int64_t w = 0; w < W; ++w) dst[(h * W + w) * pitch + c] = src[c * l.c + h * l.h + w * l.w];
    }
  }
}

template <typename scalar_t, int kKh, int kKw>
void weight_grad_nhwc_blocked(const Problem& p, const scalar_t* x, const Layout& xl, const scalar_t* g,
                              const Layout& gl, scalar_t* dw) {
  using acc_t = acc_type<scalar_t>;
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  const auto [block, vectors, blocks] = channel_runs<scalar_t>(p.Cin);
  const int64_t taps = p.Kh * p.Kw;
  // Buffers of types every level shares are scratch(), not std::vector: a std::vector<float>(n) the
  // compiler outlines here is AVX-512 code under a name outside the level (test_isa_levels' leak check).
  const auto zeros = scratch<scalar_t>(block);
  std::fill_n(zeros.get(), block, scalar_t(0));
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<BlockedSums<acc_t>> sums(vectors);
    const auto rows = scratch<const scalar_t*>(p.Kh);
    const auto pitch = scratch<int64_t>(p.Kh);
    acc_t values[V];
    scalar_t rounded[V];
    // For operands that are not channels_last: one image's channels of a block, turned.
    const auto x_turned = scratch<scalar_t>(xl.c != 1 ? p.H * p.W * block : 0);
    const auto g_turned = scratch<scalar_t>(gl.c != 1 ? p.Ho * p.Wo * block : 0);
    for (int64_t b = first; b < last; ++b) {
      const int64_t c0 = b * block, count = std::min(vectors, (p.Cin - c0 + V - 1) / V);
      for (auto& s : sums) {
        for (auto* chains : {&s.chain, &s.chunk, &s.total}) chains->assign(taps, Vec(acc_t(0)));
      }
      BlockedPosition at;
      for (int64_t n = 0; n < p.N; ++n) {
        // The image's channels of the block, where they lie or turned channels_last.
        const scalar_t *x_image = x + n * xl.n + c0 * xl.c, *g_image = g + n * gl.n + c0 * gl.c;
        Layout xi = xl, gi = gl;
        if (xl.c != 1) {
          turn_image(x_image, xl, std::min(block, p.Cin - c0), p.H, p.W, x_turned.get(), block);
          x_image = x_turned.get(), xi = Layout{0, 1, p.W * block, block};
        }
        if (gl.c != 1) {
          turn_image(g_image, gl, std::min(block, p.Cin - c0), p.Ho, p.Wo, g_turned.get(), block);
          g_image = g_turned.get(), gi = Layout{0, 1, p.Wo * block, block};
        }
        for (int64_t oh = 0; oh < p.Ho; ++oh) {
          bool rows_inside = true;
          for (int64_t kh = 0; kh < p.Kh; ++kh) {
            const int64_t ih = input_row_index(p, oh, kh);
            const bool inside = ih >= 0 && ih < p.H;
            rows[kh] = inside ? x_image + ih * xi.h : zeros.get();
            pitch[kh] = inside ? xi.w : 0;
            rows_inside = rows_inside && inside;
          }
          const scalar_t* const g_row = g_image + oh * gi.h;
          // The row in pieces that end where a block ends.
          for (int64_t ow0 = 0; ow0 < p.Wo;) {
            const int64_t ow1 = std::min(p.Wo, ow0 + kBlock - at.in_block);
            for (int64_t v = 0; v < count; ++v) {
              const ChannelVector<scalar_t> load{std::min(V, p.Cin - c0 - v * V)};
              blocked_products<scalar_t, kKh, kKw>(p, rows.get(), pitch.get(), rows_inside, g_row, gi.w, v * V, ow0,
                                                   ow1, load, zeros.get(), sums[v].chain.data());
            }
            at.in_block += ow1 - ow0;
            if (at.in_block == kBlock) {
              BlockedPosition next = at;
              for (int64_t v = 0; v < count; ++v) next = at, end_block(sums[v], next, taps);
              at = next;
            }
            ow0 = ow1;
          }
        }
      }
      for (int64_t v = 0; v < count; ++v) {
        BlockedSums<acc_t>& s = sums[v];
        if (at.in_block > 0 || at.in_chunk > 0) {  // the last chunk, whole or not
          for (int64_t t = 0; t < taps; ++t) {
            const Vec chunk = at.in_block > 0 ? s.chunk[t] + s.chain[t] : s.chunk[t];
            s.total[t] = at.first_chunk ? chunk : s.total[t] + chunk;
          }
        }
        const int64_t lanes = std::min(V, p.Cin - c0 - v * V);
        for (int64_t t = 0; t < taps; ++t) {
          s.total[t].store(values);
          narrow<scalar_t>(values, rounded, V);  // the chassis's rounding, for its bits
          for (int64_t e = 0; e < lanes; ++e) dw[(c0 + v * V + e) * taps + t] = rounded[e];
        }
      }
    }
  });
}

}  // namespace depthwise_grad_detail

// Whether conv2d computes this depthwise call's weight gradient on the wide-kernel path (see the file
// comment), whose sums weight_grad_nhwc and weight_grad_planes keep.
template <typename acc_t>
bool depthwise_weight_grad_is_wide(const Problem& p) {
  return p.N >= 2 && p.stride[1] == 1 && p.Wo >= kWideLanes<acc_t> && p.Kw <= 16;
}

// Whether a depthwise call's weight gradient outside that path is computed in the chassis's order
// (weight_grad_nhwc_blocked): not for bfloat16 on the AMX tile unit, where the conv2d's patch path
// takes calls of one output channel per group (in its own order).
template <typename scalar_t>
bool depthwise_weight_grad_is_blocked(const Problem& p) {
  return !(std::is_same_v<scalar_t, at::BFloat16> && p.N >= 2 && bfloat16_brgemm_unit() == Bf16Unit::tiles);
}

// dw [C][1][Kh][Kw] (contiguous) of the depthwise conv2d p, from x and the output gradient g (through
// their layouts); false, with nothing written, where neither way serves p.
template <typename scalar_t>
bool depthwise_weight_grad(const Problem& p, const void* x_data, const Layout& xl, const void* g_data,
                           const Layout& gl, void* dw_data) {
  using namespace depthwise_grad_detail;
  if (p.transpose || p.groups != p.Cin || p.Cout != p.Cin || p.Cin < 2 || p.N < 1 || p.Ho < 1 || p.Wo < 1 ||
      p.Kh < 1 || p.Kw < 1) {
    return false;
  }
  const auto* x = static_cast<const scalar_t*>(x_data);
  const auto* g = static_cast<const scalar_t*>(g_data);
  auto* dw = static_cast<scalar_t*>(dw_data);
  if (!depthwise_weight_grad_is_wide<acc_type<scalar_t>>(p)) {
    if (!depthwise_weight_grad_is_blocked<scalar_t>(p)) return false;
    path_counts().depthwise_weight_grad_calls += 1;
    if (p.Kh == 3 && p.Kw == 3) return weight_grad_nhwc_blocked<scalar_t, 3, 3>(p, x, xl, g, gl, dw), true;
    if (p.Kh == 5 && p.Kw == 5) return weight_grad_nhwc_blocked<scalar_t, 5, 5>(p, x, xl, g, gl, dw), true;
    return weight_grad_nhwc_blocked<scalar_t, 0, 0>(p, x, xl, g, gl, dw), true;
  }
  path_counts().depthwise_weight_grad_calls += 1;
  if (xl.c != 1 || gl.c != 1) {
    if (p.Kw == 3) return weight_grad_planes<scalar_t, 3>(p, x, xl, g, gl, dw), true;
    if (p.Kw == 5) return weight_grad_planes<scalar_t, 5>(p, x, xl, g, gl, dw), true;
    weight_grad_planes<scalar_t, 0>(p, x, xl, g, gl, dw);
  } else if (p.dilation[1] == 1 && p.Kw == 3) {
    weight_grad_nhwc<scalar_t, 3>(p, x, xl, g, gl, dw);
  } else if (p.dilation[1] == 1 && p.Kw == 5) {
    weight_grad_nhwc<scalar_t, 5>(p, x, xl, g, gl, dw);
  } else if (p.dilation[1] == 1 && p.Kw == 7) {
    weight_grad_nhwc<scalar_t, 7>(p, x, xl, g, gl, dw);
  } else {
    weight_grad_nhwc<scalar_t, 0>(p, x, xl, g, gl, dw);
  }
  return true;
}

}  // namespace CPU_CAPABILITY
}  // namespace fuel
