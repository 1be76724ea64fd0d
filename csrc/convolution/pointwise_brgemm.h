// float32 1x1 conv2d of channels_last operands on float_brgemm: an output pixel's channels are one
// row of x's pixel times the weight, so A is x read in place (a pixel's channels, the pixels of a
// block sw * C apart), B the weight packed [Cin][Cout] once per call (in column panels where the
// level's kernel wants them: float_brgemm.h), and C the output itself,
// written in place over the bias.
//
// The per-tap path (tap_brgemm.h), which takes the same calls, multiplies NCHW planes, [channel]
// [position], and had to turn a channels_last input round into them first: a 4x256x28x28 -> 64
// call took 2.2 ms at 1 thread on a Zen 4 there, twice torch's. The sums are the per-tap path's: each
// output a fused multiply-add chain over the channels in order (oneDNN's kernel either way round),
// in chunks of kTapChunk from zero, the first added to the bias, the others then in turn; so both
// layouts keep the same bits.
#pragma once

#include <ATen/native/CPUBlas.h>

#include "float_brgemm.h"
#include "kernel_common.h"
#include "kernel_table.h"
#include "packing.h"

namespace fuel {
namespace CPU_CAPABILITY {

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)

constexpr int64_t kPointwisePositions = 64;  // pixels per brgemm: its M

// The float32 calls this path takes out of those the per-tap path serves: x and out with unit channel
// strides (channels_last, or an NCHW image of a single pixel, whose strides say the same). A 1x1
// conv_transpose2d at stride 1, uncropped, is the same product with the weight's two channel axes
// swapped (each output pixel its input pixel's channels times the weight): the input gradient of a
// pointwise conv. Through the per-tap path's NCHW planes a channels_last 4x128x56x56 128 -> 128 one
// took 11 ms at 1 thread on a Zen 3, twice the conv2d's 5.
inline bool pointwise_nhwc_serves(const Problem& p, const Layout& xl, const Layout& ol) {
  const bool uncropped_stride_1 = !p.transpose || (p.stride[0] == 1 && p.stride[1] == 1);
  return uncropped_stride_1 && p.Kh == 1 && p.Kw == 1 && p.padding[0] == 0 && p.padding[1] == 0 && xl.c == 1 &&
         ol.c == 1;
}

inline void convolve_pointwise_nhwc(const Problem& p, const float* x, const Layout& xl, const ConvOperands& o,
                                    const float* bias, float* out, const Layout& ol) {
  namespace cpublas = at::native::cpublas;
  const int64_t G = p.groups, Cin_g = p.Cin / G, Cout_g = p.Cout / G;
  // Group g's [ci][co] in panels of b_panel_cols outputs, each [ci][column].
  const int64_t panel_cols = b_panel_cols(Cout_g);
  const auto packed = scratch<float>(G * Cin_g * Cout_g);
  pack_tap_matrices<float>(p, {0}, false, 1, panel_cols, static_cast<const float*>(o.weight), o.weight_strides,
                           [&](int64_t g, int64_t, int64_t ci, int64_t co) {
                             const int64_t j0 = co / panel_cols * panel_cols, cols = std::min(panel_cols, Cout_g - j0);
                             return packed.get() + g * Cin_g * Cout_g + j0 * Cin_g + ci * cols + co - j0;
                           });
  path_counts().float_brgemm_images += p.N;
  path_counts().pointwise_brgemm_images += p.N;
  // Pixels in blocks along an output row, or along the whole image where its rows lie back to back
  // in x and out alike (stride 1: every input pixel is read).
  const bool flat = p.stride[0] == 1 && p.stride[1] == 1 && xl.h == p.W * xl.w && ol.h == p.Wo * ol.w;
  const int64_t rows = flat ? 1 : p.Ho, row_length = flat ? p.Ho * p.Wo : p.Wo;
  // Where the blocks make only a few tasks per thread: blocks of equal size, as many as make whole
  // rounds of the threads where that takes one more (one 14x14 image: 196 pixels as 64 + 64 + 64 +
  // 4 gave one of 2 threads twice the other's work; now 4 x 49). Many tasks keep 64 (4x784 pixels
  // as 61s ran 5% slower: 61 rows end in a one-row register tile).
  const int64_t threads = at::get_num_threads();
  int64_t blocks = (row_length + kPointwisePositions - 1) / kPointwisePositions, block = kPointwisePositions;
  if (p.N * G * rows * blocks < 4 * threads) {
    const int64_t others = p.N * G * rows;
    if (blocks < row_length && others * blocks % threads != 0 && others * (blocks + 1) % threads == 0) ++blocks;
    block = equal_block(row_length, blocks, 1);
  }
  const int64_t ld_a = p.stride[1] * xl.w;
  // Fewer blocks of pixels than threads (one 7x7 image: one block) split the output channels too,
  // in whole panels; any split gives the same bits.
  const int64_t pixel_tasks = p.N * G * rows * blocks, panels = (Cout_g + panel_cols - 1) / panel_cols;
  const int64_t co_blocks = pixel_tasks >= threads ? 1 : std::min(panels, (threads + pixel_tasks - 1) / pixel_tasks);
  const int64_t co_block = (panels + co_blocks - 1) / co_blocks * panel_cols;
  at::parallel_for(0, pixel_tasks * co_blocks, 1, [&](int64_t first, int64_t last) {
    const auto part = scratch<float>(Cin_g > kTapChunk ? kPointwisePositions * Cout_g : 0);
    for (int64_t task = first; task < last; ++task) {
      const int64_t co_first = task % co_blocks * co_block, co_last = std::min(Cout_g, co_first + co_block);
      const int64_t pixels = task / co_blocks;
      const int64_t row = pixels / blocks % rows, g = pixels / blocks / rows % G;
      const int64_t n = pixels / blocks / rows / G;
      const int64_t j0 = pixels % blocks * block, count = std::min(block, row_length - j0);
      if (count <= 0) continue;
      const float* a = x + n * xl.n + row * p.stride[0] * xl.h + j0 * ld_a + g * Cin_g;
      float* c = out + n * ol.n + row * ol.h + j0 * ol.w + g * Cout_g;
      for (int64_t i = 0; i < count; ++i) {
        for (int64_t co = co_first; co < co_last; ++co) c[i * ol.w + co] = bias ? bias[g * Cout_g + co] : 0.f;
      }
      for (int64_t c0 = co_first; c0 < co_last; c0 += panel_cols) {
        const int64_t cols = std::min(panel_cols, Cout_g - c0);
        const float* b = packed.get() + g * Cin_g * Cout_g + c0 * Cin_g;
        if (Cin_g <= kTapChunk) {
          float_brgemm(count, cols, Cin_g, ld_a, cols, ol.w, true, a, b, c + c0);
          continue;
        }
        // More than kTapChunk channels: each chunk summed from zero, then added to C.
        for (int64_t k0 = 0; k0 < Cin_g; k0 += kTapChunk) {
          const int64_t kc = std::min(kTapChunk, Cin_g - k0);
          float_brgemm(count, cols, kc, ld_a, cols, cols, false, a + k0, b + k0 * cols, part.get());
          for (int64_t i = 0; i < count; ++i) {
            for (int64_t co = 0; co < cols; ++co) c[i * ol.w + c0 + co] += part[i * cols + co];
          }
        }
      }
    }
    cpublas::brgemm_release(false);
  });
}

#endif

}  // namespace CPU_CAPABILITY
}  // namespace fuel
