// The convolution family's entry points: fuel::conv2d and fuel::conv_transpose2d and their .out
// overloads, registered for CPU. Each call: the contract's input clauses (contract_rules), the
// geometry (geometry.cpp), the result in the layout torch would return, then the kernel of its
// dtype (kernels.cpp).
#include <ATen/ATen.h>
#include <ATen/TensorSubclassLikeUtils.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "../contract_rules.h"
#include "../dispatch.h"
#include "geometry.h"
#include "kernel_table.h"
#include "weight_grad.h"

namespace fuel {

// One table per instruction-set level, from csrc/kernels/convolution_kernels.cpp.
FUEL_DECLARE_KERNELS(ConvolutionKernels, convolution_kernels)

namespace {


// Real CPU tensors only (fake ones, under torch.compile, have no data), each one dense block (the
// bfloat16 brgemm's exponent scan reads the whole block).
bool plain_operand(const at::Tensor& t) {
  return !at::isTensorSubclassLike(t) && t.is_cpu() && t.layout() == at::kStrided && t.dim() == 4 &&
         t.is_non_overlapping_and_dense();
}

Layout layout_of(const at::Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// torch's CPU convolutions return channels_last when the input or the weight suggests it (their
// strides order); fuel_torch/convolution.py's output_memory_format is the fake kernels' twin.
at::MemoryFormat output_format(const at::Tensor& x, const at::Tensor& weight) {
  const bool channels_last = x.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
                             weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
  return channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

ConvOperands operands_of(const at::Tensor& x, const at::Tensor& weight, const at::Tensor* bias, at::Tensor& out) {
  ConvOperands o;
  o.x = x.const_data_ptr();
  o.x_layout = layout_of(x);
  o.weight = weight.const_data_ptr();
  for (int i = 0; i < 4; ++i) o.weight_strides[i] = weight.stride(i);
  o.weight_contiguous = weight.is_contiguous();
  o.bias = bias ? bias->const_data_ptr() : nullptr;
  o.out = out.mutable_data_ptr();
  o.out_layout = layout_of(out);
  return o;
}

at::Tensor& run(const std::string& op, const at::Tensor& x, const at::Tensor& weight,
                const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                at::IntArrayRef dilation, std::optional<at::IntArrayRef> output_padding, int64_t groups,
                at::Tensor* out_arg, at::Tensor& result) {
  const at::Tensor* b = bias.has_value() && bias->defined() ? &*bias : nullptr;
  const KernelRule& rule = check_inputs(op, {&x, &weight, b});
  const Checker checker{op, rule};
  // Without out=, the geometry includes the allocation rule, so nothing is allocated before it passes.
  const Problem p = validate(checker, x, weight, b, stride, padding, dilation, output_padding, groups, !out_arg);
  const std::vector<int64_t> shape = {p.N, p.Cout, p.Ho, p.Wo};
  if (out_arg) {
    check_out(rule, *out_arg, x.scalar_type(), shape, {&x, &weight, b});
    result = *out_arg;
  } else {
    result = at::empty(shape, x.options().memory_format(output_format(x, weight)));
  }
  if (result.numel() == 0) return result;
  FUEL_KERNELS_FOR_CPU(convolution_kernels).convolve[kernel_dtype_slot(x.scalar_type())](
      p, operands_of(x, weight, b, result));
  return result;
}

at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  at::Tensor result;
  return run("conv2d", x, weight, bias, stride, padding, dilation, std::nullopt, groups, nullptr, result);
}

at::Tensor& conv2d_out(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                       at::Tensor& out) {
  at::Tensor result;
  run("conv2d", x, weight, bias, stride, padding, dilation, std::nullopt, groups, &out, result);
  return out;
}

at::Tensor conv_transpose2d(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef output_padding,
                            int64_t groups, at::IntArrayRef dilation) {
  at::Tensor result;
  return run("conv_transpose2d", x, weight, bias, stride, padding, dilation, output_padding, groups, nullptr, result);
}

at::Tensor& conv_transpose2d_out(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                 at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef output_padding,
                                 int64_t groups, at::IntArrayRef dilation, at::Tensor& out) {
  at::Tensor result;
  run("conv_transpose2d", x, weight, bias, stride, padding, dilation, output_padding, groups, &out, result);
  return out;
}

}  // namespace

std::optional<at::Tensor> weight_grad_on_brgemm(const at::Tensor& x, const at::Tensor& grad_out, int64_t kh, int64_t kw,
                                                at::IntArrayRef stride, at::IntArrayRef padding,
                                                at::IntArrayRef dilation) {
  const at::ScalarType dtype = x.scalar_type();
  if (!plain_operand(x) || !plain_operand(grad_out) || (dtype != at::kFloat && dtype != at::kBFloat16) || grad_out.scalar_type() != dtype ||
      stride.size() != 2 || padding.size() != 2 || dilation.size() != 2) {
    return std::nullopt;
  }
  // The weight gradient as conv2d's wide-kernel problem (autograd.cpp, conv2d_weight_grad): images are the
  // input channels, channels the images, the kernel the output gradient; stride and dilation trade places.
  // Only the kh x kw outputs the weight has are computed.
  Problem p;
  p.N = x.size(1), p.Cin = x.size(0), p.H = x.size(2), p.W = x.size(3);
  p.Cout = grad_out.size(1), p.Kh = grad_out.size(2), p.Kw = grad_out.size(3), p.Ho = kh, p.Wo = kw;
  for (int i = 0; i < 2; ++i) p.stride[i] = dilation[i], p.padding[i] = padding[i], p.dilation[i] = stride[i];
  if (grad_out.size(0) != x.size(0) || p.N == 0 || p.Cin == 0 || p.Cout == 0 || kh <= 0 || kw <= 0) return std::nullopt;
  // The outputs' reads stay inside the padded input: the last one starts at (kh - 1) * stride' and spans the
  // gradient's (Kh - 1) * dilation' + 1 rows (likewise columns).
  for (int i = 0; i < 2; ++i) {
    const int64_t in = (i == 0 ? p.H : p.W) + 2 * p.padding[i], k = i == 0 ? p.Kh : p.Kw, out = i == 0 ? kh : kw;
    if ((out - 1) * p.stride[i] + (k - 1) * p.dilation[i] + 1 > in) return std::nullopt;
  }
  at::Tensor dw = at::empty({p.Cout, p.N, kh, kw}, x.options());
  ConvOperands o;
  o.x = x.const_data_ptr();
  o.x_layout = {x.stride(1), x.stride(0), x.stride(2), x.stride(3)};
  o.weight = grad_out.const_data_ptr();
  o.weight_strides[0] = grad_out.stride(1), o.weight_strides[1] = grad_out.stride(0);
  o.weight_strides[2] = grad_out.stride(2), o.weight_strides[3] = grad_out.stride(3);
  o.weight_contiguous = false;
  o.out = dw.mutable_data_ptr();
  o.out_layout = {dw.stride(1), dw.stride(0), dw.stride(2), dw.stride(3)};
  if (!FUEL_KERNELS_FOR_CPU(convolution_kernels).wide_brgemm_if_served[kernel_dtype_slot(dtype)](p, o)) {
    return std::nullopt;
  }
  return dw;
}

std::optional<at::Tensor> weight_grad_depthwise(const at::Tensor& x, const at::Tensor& grad_out, int64_t kh, int64_t kw,
                                                at::IntArrayRef stride, at::IntArrayRef padding,
                                                at::IntArrayRef dilation) {
  const at::ScalarType dtype = x.scalar_type();
  const bool kernel_dtype = dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 || dtype == at::kHalf;
  if (!plain_operand(x) || !plain_operand(grad_out) || !kernel_dtype || grad_out.scalar_type() != dtype ||
      stride.size() != 2 || padding.size() != 2 || dilation.size() != 2) {
    return std::nullopt;
  }
  Problem p;
  p.N = x.size(0), p.Cin = p.Cout = p.groups = x.size(1), p.H = x.size(2), p.W = x.size(3);
  p.Kh = kh, p.Kw = kw, p.Ho = grad_out.size(2), p.Wo = grad_out.size(3);
  for (int i = 0; i < 2; ++i) p.stride[i] = stride[i], p.padding[i] = padding[i], p.dilation[i] = dilation[i];
  // The gradient must be that of this geometry's output (autograd passes one), with sane parameters.
  for (int i = 0; i < 2; ++i) {
    const int64_t in = i == 0 ? p.H : p.W, k = i == 0 ? kh : kw, out = i == 0 ? p.Ho : p.Wo;
    if (stride[i] < 1 || dilation[i] < 1 || padding[i] < 0 || k < 1 ||
        in + 2 * padding[i] - dilation[i] * (k - 1) - 1 < 0 ||
        (in + 2 * padding[i] - dilation[i] * (k - 1) - 1) / stride[i] + 1 != out) {
      return std::nullopt;
    }
  }
  if (grad_out.size(0) != p.N || grad_out.size(1) != p.Cin) return std::nullopt;
  at::Tensor dw = at::empty({p.Cin, 1, kh, kw}, x.options());
  if (!FUEL_KERNELS_FOR_CPU(convolution_kernels).depthwise_weight_grad[kernel_dtype_slot(dtype)](
          p, x.const_data_ptr(), layout_of(x), grad_out.const_data_ptr(), layout_of(grad_out), dw.mutable_data_ptr())) {
    return std::nullopt;
  }
  return dw;
}

TORCH_LIBRARY_IMPL(fuel, CPU, m) {
  m.impl("conv2d", TORCH_FN(conv2d));
  m.impl("conv2d.out", TORCH_FN(conv2d_out));
  m.impl("conv_transpose2d", TORCH_FN(conv_transpose2d));
  m.impl("conv_transpose2d.out", TORCH_FN(conv_transpose2d_out));
}

}  // namespace fuel
