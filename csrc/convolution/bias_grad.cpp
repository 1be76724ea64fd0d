// fuel_backward::conv_bias_grad, the bias gradient of fuel::conv2d and fuel::conv_transpose2d: the
// incoming gradient summed over images and positions, per channel.
//
// An op of its own (not torch's sum inside the backward node) for two reasons:
// - Its order is ours and fixed: per channel, 16 lanes in the accumulator type (float32 for float32
//   and the halves, float64 for float64), lane = position mod 16 over each image's positions,
//   images in order, then the lanes added in order; halves round once at the end. The same terms
//   meet in the same order from an NCHW or a channels_last gradient and for every thread count
//   (threads split channels only). torch's sum follows the layout, so a channels_last gradient had
//   to be copied into NCHW first, and a half one was widened into a float32 copy.
// - torch.compile records the op itself in the backward graph (its fake kernel is in
//   fuel_torch/convolution.py), so a compiled backward runs this kernel and gets the eager bits.
//
// Not user API and outside the contracts: the backward node calls it on a gradient it made dense.
// It still checks what it reads (the dispatcher sends it CPU tensors only), so a direct call with
// anything else gets an error, not a crash.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "../contract_rules.h"
#include "../dispatch.h"
#include "kernel_table.h"

namespace fuel {

// One table per instruction-set level, from csrc/kernels/convolution_kernels.cpp; the sums'
// loops are in bias_grad_sums.h.
FUEL_DECLARE_KERNELS(ConvolutionKernels, convolution_kernels)

namespace {

using at::Tensor;

template <typename T>
Tensor sum_channels(const Tensor& g) {
  using Acc = at::opmath_type<T>;
  const int64_t N = g.size(0), C = g.size(1), HW = g.size(2) * g.size(3);
  Tensor total = at::empty({C}, g.options().dtype(c10::CppTypeToScalarType<Acc>::value));
  FUEL_KERNELS_FOR_CPU(convolution_kernels).bias_grad[kernel_dtype_slot(g.scalar_type())](
      g.const_data_ptr<T>(), N, C, HW, !g.is_contiguous(), total.mutable_data_ptr<Acc>());
  return total.scalar_type() == g.scalar_type() ? total : total.to(g.scalar_type());
}

Tensor conv_bias_grad(const Tensor& grad) {
  constexpr const char* op = "fuel_backward::conv_bias_grad";
  TORCH_CHECK(grad.dim() == 4, op, ": argument 'grad' must be 4-d [N, C, H, W] (a convolution's output gradient); "
              "got ", grad.dim(), "-d. Fix: pass the gradient of a conv2d or conv_transpose2d output.");
  const at::ScalarType dtype = grad.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 || dtype == at::kHalf, op,
              ": argument 'grad' must be float32, float64, bfloat16 or float16; got ", dtype_str(dtype),
              ". Fix: convert it to one of those.");
  // Dense rows in either layout are read in place; anything else (strided, expanded) is copied.
  const bool dense = grad.is_contiguous() || grad.is_contiguous(at::MemoryFormat::ChannelsLast);
  const Tensor g = dense ? grad : grad.contiguous();
  return AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "conv_bias_grad",
                                         [&] { return sum_channels<scalar_t>(g); });
}

}  // namespace

TORCH_LIBRARY_IMPL(fuel_backward, CPU, m) { m.impl("conv_bias_grad", TORCH_FN(conv_bias_grad)); }

}  // namespace fuel
