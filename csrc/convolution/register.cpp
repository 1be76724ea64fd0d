// The convolution family's entry points: fuel::conv2d and fuel::conv_transpose2d and their .out
// overloads, registered for CPU. Each call: the contract's input clauses (contract_rules), the
// geometry (geometry.cpp), the result in the layout torch would return, then the kernel of its
// dtype (kernels.cpp).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "../contract_rules.h"
#include "../dispatch.h"
#include "geometry.h"
#include "kernel_table.h"

namespace fuel {

// One table per instruction-set level, from csrc/kernels/convolution_kernels.cpp.
FUEL_DECLARE_KERNELS(ConvolutionKernels, convolution_kernels)

namespace {


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

TORCH_LIBRARY_IMPL(fuel, CPU, m) {
  m.impl("conv2d", TORCH_FN(conv2d));
  m.impl("conv2d.out", TORCH_FN(conv2d_out));
  m.impl("conv_transpose2d", TORCH_FN(conv_transpose2d));
  m.impl("conv_transpose2d.out", TORCH_FN(conv_transpose2d_out));
}

}  // namespace fuel
