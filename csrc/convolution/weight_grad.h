// Conv2d weight gradients read straight from x and the output gradient (register.cpp).
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace fuel {

// dw[o, i, kh, kw] = sum over images n and output positions p of grad_out[n, o, p] * x[n, i, p * stride + k *
// dilation - padding] for an ungrouped conv2d, computed by the wide brgemm path (wide_brgemm.h) with the images
// and channels swapped through the strides, where that path serves it: no transposed copies of x and grad_out.
// nullopt where it does not (other dtypes and shapes, tensor subclasses and fake tensors, operands that fail
// the bfloat16 exponent rule), and the caller computes it as a conv2d.
std::optional<at::Tensor> weight_grad_on_brgemm(const at::Tensor& x, const at::Tensor& grad_out, int64_t kh, int64_t kw,
                                                at::IntArrayRef stride, at::IntArrayRef padding,
                                                at::IntArrayRef dilation);

// dw for a depthwise conv2d (groups = input channels = output channels), computed by the depthwise weight-gradient
// path (depthwise_weight_grad.h) from x and grad_out in place, with the bits the conv2d route gives; nullopt where
// that path does not serve the call, and the caller computes it as a conv2d.
std::optional<at::Tensor> weight_grad_depthwise(const at::Tensor& x, const at::Tensor& grad_out, int64_t kh, int64_t kw,
                                                at::IntArrayRef stride, at::IntArrayRef padding,
                                                at::IntArrayRef dilation);

}  // namespace fuel
