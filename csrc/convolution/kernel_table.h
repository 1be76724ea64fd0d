// The convolution family's kernel table: one kernel per dtype, from the kernel source compiled for
// the ISA level of this build (kernels.cpp).
#pragma once

#include <array>

#include "problem.h"

namespace fuel {

// Computes out from the operands of one validated call (shapes as p describes them).
using ConvolutionKernel = void (*)(const Problem& p, const ConvOperands& operands);

struct ConvolutionKernels {
  std::array<ConvolutionKernel, 4> convolve;  // float, double, BFloat16, Half
};

const ConvolutionKernels& convolution_kernels();

}  // namespace fuel
