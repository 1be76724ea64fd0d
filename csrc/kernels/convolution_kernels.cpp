// The convolution family's kernels for one instruction-set level: setup.py compiles this source once
// per level, so CPU_CAPABILITY names the level and everything below lives in fuel::<level>. The
// paths and their summation order are described in ../convolution/kernels.h and
// contracts/convolution.fkc.md.
#include "../convolution/bias_grad_sums.h"
#include "../convolution/depthwise_weight_grad.h"
#include "../convolution/kernels.h"
#include "../convolution/kernel_table.h"

namespace fuel {
namespace CPU_CAPABILITY {

extern const ConvolutionKernels convolution_kernels;
const ConvolutionKernels convolution_kernels = {
    {&convolve<float>, &convolve<double>, &convolve<at::BFloat16>, &convolve<at::Half>},
    {&wide_brgemm_if_served<float>, &wide_brgemm_if_served<double>, &wide_brgemm_if_served<at::BFloat16>,
     &wide_brgemm_if_served<at::Half>},
    {&depthwise_weight_grad<float>, &depthwise_weight_grad<double>, &depthwise_weight_grad<at::BFloat16>,
     &depthwise_weight_grad<at::Half>},
    {&bias_grad_sums<float>, &bias_grad_sums<double>, &bias_grad_sums<at::BFloat16>, &bias_grad_sums<at::Half>}};

}  // namespace CPU_CAPABILITY
}  // namespace fuel
