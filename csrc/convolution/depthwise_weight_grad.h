// The weight gradient of a depthwise conv2d (each channel its own group, one output channel per
// channel), read from x and the output gradient where they lie.
//
// autograd.cpp's general route computes a weight gradient as a conv2d over transposed copies of both
// (the images become input channels, the gradient the kernel: the wide-kernel problem, wide_kernel.h).
// For a channels_last depthwise call those copies turn NHWC into [channel][image] planes one strided
// element at a time: a float32 4x128x56x56 3x3 took 10.8 ms at 1 thread on a Zen 4, two thirds of it
// copying, where torch took 0.8.
//
// Every output keeps the bits that conv2d gives it there (the wide-kernel path's order): lane l of
// kWideLanes sums the products g * x of the output columns ow = l (mod kWideLanes), one fused chain
// from +0 over (image, output row, column) ascending, a tap in the padding multiplying +0; then the
// lanes are added in order to +0 and the sum is rounded once. (That path also pads each gradient row
// to whole lane groups, adding 0 * +0 to some lanes: nothing changes, as a chain that starts at +0
// never holds -0.) The calls served are the ones that conv2d sends down that path: at least two
// images, column stride 1, gradient rows of at least kWideLanes columns, at most 16 kernel columns.
//
// channels_last x and gradient: the vectors run along the channels, each vector lane one channel's
// chain. A task owns a block of channels (64 bytes of them: whole cache lines of each pixel) and all
// its sums; it walks the images a block of output rows at a time, and for each kernel row and group
// of lanes holds the sums of every kernel column in registers over the block's rows. Other layouts:
// the wide-kernel path itself, channel by channel, reading x's planes through their strides.
#pragma once

#include "depthwise.h"
#include "wide_kernel.h"

namespace fuel {
namespace CPU_CAPABILITY {
namespace depthwise_grad_detail {

using depthwise_detail::ChannelVector;
using depthwise_detail::for_each_index;

constexpr int64_t kRowBlock = 8;  // output rows per visit of a register block's sums

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
// at a time with its sums in memory.
template <typename scalar_t, int kKw>
void add_row_block(const Problem& p, const scalar_t* x_image, const Layout& xl, const scalar_t* g_image,
                   const Layout& gl, int64_t oh0, int64_t oh1, const ChannelVector<scalar_t>& load,
                   const scalar_t* zeros, Vectorized<acc_type<scalar_t>>* sums) {
  using Vec = Vectorized<acc_type<scalar_t>>;
  constexpr int64_t L = kWideLanes<acc_type<scalar_t>>;
  const int64_t Kh = p.Kh, pw = p.padding[1], W = p.W, Wo = p.Wo;
  // Kernel row kh's input row for output row oh, and its pitch.
  const auto input_row = [&](int64_t oh, int64_t kh) -> std::pair<const scalar_t*, int64_t> {
    const int64_t ih = oh * p.stride[0] + kh * p.dilation[0] - p.padding[0];
    if (ih < 0 || ih >= p.H) return {zeros, 0};
    return {x_image + ih * xl.h, xl.w};
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
          const scalar_t* const g_row = g_image + oh * gl.h;
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
        const scalar_t* const g_row = g_image + oh * gl.h;
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

template <typename scalar_t, int kKw>
void weight_grad_nhwc(const Problem& p, const scalar_t* x, const Layout& xl, const scalar_t* g, const Layout& gl,
                      scalar_t* dw) {
  using acc_t = acc_type<scalar_t>;
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size(), L = kWideLanes<acc_t>;
  // Each thread one run of channels, whole cache lines of a pixel (which thread computes an output
  // does not change its sum): with one line's channels per task, the tasks of a 4x128x56x56 float32
  // 3x3 at 1 thread on a Zen 4 each read x and the gradient 512 bytes apart, and took 0.94 ms, 0.67
  // as one task.
  const int64_t line = std::max<int64_t>(V, 64 / int64_t(sizeof(scalar_t)));
  const int64_t per_thread = (p.Cin + at::get_num_threads() - 1) / at::get_num_threads();
  const int64_t block = (per_thread + line - 1) / line * line, vectors = block / V;
  const int64_t blocks = (p.Cin + block - 1) / block, taps = p.Kh * p.Kw;
  const scalar_t zeros[V] = {};
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<Vec> sums(vectors * L * taps);
    for (int64_t b = first; b < last; ++b) {
      const int64_t c0 = b * block;
      std::fill(sums.begin(), sums.end(), Vec(acc_t(0)));
      for (int64_t n = 0; n < p.N; ++n) {
        for (int64_t oh0 = 0; oh0 < p.Ho; oh0 += kRowBlock) {
          for (int64_t v = 0; v < vectors && c0 + v * V < p.Cin; ++v) {
            const ChannelVector<scalar_t> load{std::min(V, p.Cin - c0 - v * V)};
            add_row_block<scalar_t, kKw>(p, x + n * xl.n + c0 + v * V, xl, g + n * gl.n + c0 + v * V, gl, oh0,
                                         std::min(p.Ho, oh0 + kRowBlock), load, zeros, &sums[v * L * taps]);
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
  std::vector<acc_t> x, g;
};

template <typename scalar_t>
void stage_planes(const Problem& p, const scalar_t* x_plane, const Layout& xl, const scalar_t* g_plane,
                  const Layout& gl, PlaneStaging<acc_type<scalar_t>>& s) {
  using acc_t = acc_type<scalar_t>;
  for (int64_t i = 0; i < s.x_rows; ++i) {
    acc_t* const line = s.x.data() + i * s.line_len;
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
    acc_t* const dst = s.g.data() + oh * s.g_len;
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
    const acc_t* const g_row = s.g.data() + oh * s.g_len;
    const acc_t* lines[kRows];
    for (int r = 0; r < kRows; ++r) lines[r] = s.x.data() + (oh * p.stride[0] + (kh0 + r) * p.dilation[0]) * s.line_len;
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
      const acc_t* const g_row = s.g.data() + oh * s.g_len;
      for (int64_t k = 0; k < s.g_len; k += L) {
        for (int64_t v = 0; v < kNV; ++v) {
          const Vec gv = Vec::loadu(g_row + k + v * V);
          const Vec mask = Vec::arange(acc_t(v * V), acc_t(1)) < Vec(static_cast<acc_t>(k + L == s.g_len ? tail : L));
          for (int64_t kh = 0; kh < p.Kh; ++kh) {
            const acc_t* const line = s.x.data() + (oh * p.stride[0] + kh * p.dilation[0]) * s.line_len;
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
    s.x.resize(s.x_rows * s.line_len);
    s.g.resize(p.Ho * s.g_len);
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

}  // namespace depthwise_grad_detail

// Whether conv2d computes this depthwise call's weight gradient on the wide-kernel path (see the file
// comment), whose sums these kernels keep.
template <typename acc_t>
bool depthwise_weight_grad_serves(const Problem& p) {
  return !p.transpose && p.groups == p.Cin && p.Cout == p.Cin && p.Cin >= 2 && p.N >= 2 && p.stride[1] == 1 &&
         p.Wo >= kWideLanes<acc_t> && p.Kw <= 16 && p.Ho > 0 && p.Kh > 0 && p.Kw > 0;
}

// dw [C][1][Kh][Kw] (contiguous) of the depthwise conv2d p, from x and the output gradient g (through
// their layouts); false, with nothing written, where the path does not serve p.
template <typename scalar_t>
bool depthwise_weight_grad(const Problem& p, const void* x_data, const Layout& xl, const void* g_data,
                           const Layout& gl, void* dw_data) {
  using namespace depthwise_grad_detail;
  if (!depthwise_weight_grad_serves<acc_type<scalar_t>>(p)) return false;
  path_counts().depthwise_weight_grad_calls += 1;
  const auto* x = static_cast<const scalar_t*>(x_data);
  const auto* g = static_cast<const scalar_t*>(g_data);
  auto* dw = static_cast<scalar_t*>(dw_data);
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
