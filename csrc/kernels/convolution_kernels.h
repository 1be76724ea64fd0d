// The convolution family's kernel table and problem description, shared by the kernel source
// (compiled once per instruction-set level, see ../dispatch.h) and csrc/convolution.cpp.
#pragma once

#include <array>
#include <cstdint>

namespace fuel {

// One validated call: sizes, and the parameters as torch defines them. transpose selects
// conv_transpose2d (its weight is [Cin, Cout / groups, Kh, Kw]).
struct ConvProblem {
  bool transpose = false;
  int64_t N = 0, Cin = 0, H = 0, W = 0, Cout = 0, Kh = 0, Kw = 0, Ho = 0, Wo = 0, groups = 1;
  int64_t stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1}, output_padding[2] = {0, 0};
};

// Computes out (N, Cout, Ho, Wo) from x, weight and bias (nullptr: none), contiguous buffers of
// the slot's dtype with the shapes p describes.
using ConvolutionKernel = void (*)(const ConvProblem& p, const void* x, const void* weight, const void* bias,
                                   void* out);

struct ConvolutionKernels {
  std::array<ConvolutionKernel, 4> convolve;  // float, double, BFloat16, Half
};

}  // namespace fuel
