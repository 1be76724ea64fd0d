// The convolution family's kernel table: one kernel per dtype, defined once per instruction-set level
// by csrc/kernels/convolution_kernels.cpp (see ../dispatch.h).
#pragma once

#include <array>

#include "problem.h"

namespace fuel {

// Computes out from the operands of one validated call (shapes as p describes them).
using ConvolutionKernel = void (*)(const Problem& p, const ConvOperands& operands);

struct ConvolutionKernels {
  std::array<ConvolutionKernel, 4> convolve;  // float, double, BFloat16, Half
};

}  // namespace fuel
