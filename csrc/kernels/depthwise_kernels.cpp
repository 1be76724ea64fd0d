// The depthwise forward kernels for one instruction-set level (see depthwise.h), compiled once per
// level like convolution_kernels.cpp, which calls them.
#include "../convolution/depthwise.h"

namespace fuel {
namespace CPU_CAPABILITY {

FUEL_DEPTHWISE_INSTANCES()

}  // namespace CPU_CAPABILITY
}  // namespace fuel
