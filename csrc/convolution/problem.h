// The geometry of one convolution call, as validation leaves it for the planners and kernels.
#pragma once

#include <cstdint>

namespace fuel {

struct Problem {
  bool transpose = false;
  int64_t N = 0, Cin = 0, H = 0, W = 0, Cout = 0, Kh = 0, Kw = 0, Ho = 0, Wo = 0, groups = 1;
  int64_t stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1}, output_padding[2] = {0, 0};
};

// Element strides of a 4-d activation (x or out) in (n, c, h, w) order: NCHW (contiguous) or NHWC
// (channels_last); the kernels read and write either through these.
struct Layout {
  int64_t n = 0, c = 0, h = 0, w = 0;
};

// The tensors of one validated call, as the kernels see them: data of the call's dtype, x and out
// through their layouts, the weight through its strides (bias is contiguous, or nullptr: none).
struct ConvOperands {
  const void* x = nullptr;
  Layout x_layout;
  const void* weight = nullptr;
  int64_t weight_strides[4] = {0, 0, 0, 0};
  bool weight_contiguous = true;
  const void* bias = nullptr;
  void* out = nullptr;
  Layout out_layout;
};

}  // namespace fuel
