// The convolution family's kernel table: one kernel per dtype, defined once per instruction-set level
// by csrc/kernels/convolution_kernels.cpp (see ../dispatch.h).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "problem.h"

namespace fuel {

// Computes out from the operands of one validated call (shapes as p describes them).
using ConvolutionKernel = void (*)(const Problem& p, const ConvOperands& operands);

// Computes a wide-kernel problem on brgemm if that path serves it (wide_brgemm.h) and says whether it
// did. The weight gradient calls it with the real tensors in swapped layouts (weight_grad.cpp).
using WideBrgemmKernel = bool (*)(const Problem& p, const ConvOperands& operands);

// A depthwise conv2d's weight gradient (p: the forward call) from x and the output gradient read in
// place, into a contiguous [C][1][Kh][Kw], where that path serves p (depthwise_weight_grad.h); says
// whether it did.
using DepthwiseWeightGradKernel = bool (*)(const Problem& p, const void* x, const Layout& x_layout,
                                           const void* grad_out, const Layout& grad_layout, void* dw);

// The bias gradient's per-channel sums of a dense gradient (bias_grad_sums.h) into `sums`, in
// at::opmath_type of the dtype.
using BiasGradKernel = void (*)(const void* gradient, int64_t N, int64_t C, int64_t HW, bool channels_last,
                                void* sums);

struct ConvolutionKernels {
  std::array<ConvolutionKernel, 4> convolve;            // float, double, BFloat16, Half
  std::array<WideBrgemmKernel, 4> wide_brgemm_if_served;  // the same order
  std::array<DepthwiseWeightGradKernel, 4> depthwise_weight_grad;  // the same order
  std::array<BiasGradKernel, 4> bias_grad;  // the same order
};

// Where torch's brgemm runs bfloat16 for us (cpu_capability.cpp): the AMX tile unit, AVX512_BF16
// dot products (vdpbf16ps), or nowhere (FUEL_BF16_BRGEMM=0, kernels below AVX512, mkldnn off).
// Both units multiply bfloat16 pairs exactly, add in float32 to nearest even, and flush subnormal
// inputs and results alike, so one exponent rule (tap_brgemm.h) serves both.
enum class Bf16Unit { none, dot_products, tiles };
Bf16Unit bfloat16_brgemm_unit();

// What the brgemm paths (and the depthwise kernels' two ways) have served since import (fuel_torch._C.path_counts()): which path a call
// takes depends on the CPU, torch's switches and, for the tile unit, the operands' exponents, and
// the tests check that the path they mean to test is the one that ran.
struct PathCounts {
  std::atomic<int64_t> bfloat16_brgemm_images{0};  // bfloat16 images on brgemm (tap and patch paths)
  std::atomic<int64_t> float_brgemm_images{0};     // float32 images convolved by tap (tap_brgemm.h)
  std::atomic<int64_t> patch_brgemm_images{0};     // images convolved by patch (patch_brgemm.h), either dtype
  std::atomic<int64_t> patch_x_in_place_images{0};  // of those, images whose patches were read from x itself
  std::atomic<int64_t> plane_brgemm_images{0};  // of those, float32 images computed on x and out in place (plane_brgemm.h)
  std::atomic<int64_t> plane_staged_images{0};  // of those, NCHW images whose planes crowd L1's sets, x staged per task
  std::atomic<int64_t> wide_brgemm_calls{0};       // wide-kernel calls on brgemm (wide_brgemm.h)
  std::atomic<int64_t> pointwise_brgemm_images{0};  // float32 1x1 channels_last images (pointwise_brgemm.h), also in float_brgemm_images
  std::atomic<int64_t> depthwise_channels_last_calls{0};  // depthwise calls along the channels (depthwise.h)
  std::atomic<int64_t> depthwise_in_place_calls{0};  // NCHW depthwise calls reading x without lines (depthwise.h)
  std::atomic<int64_t> depthwise_weight_grad_calls{0};  // depthwise weight gradients read in place (depthwise_weight_grad.h)
};
PathCounts& path_counts();

}  // namespace fuel
