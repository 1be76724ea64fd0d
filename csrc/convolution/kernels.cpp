// The convolution family's kernels, instantiated for the ISA level this source is compiled for
// (CPU_CAPABILITY): the paths and their summation order are described in kernels.h and
// contracts/convolution.fkc.md.
#include "kernels.h"

#include "kernel_table.h"

namespace fuel {

const ConvolutionKernels& convolution_kernels() {
  static const ConvolutionKernels table = {{&CPU_CAPABILITY::convolve<float>, &CPU_CAPABILITY::convolve<double>,
                                            &CPU_CAPABILITY::convolve<at::BFloat16>, &CPU_CAPABILITY::convolve<at::Half>}};
  return table;
}

}  // namespace fuel
