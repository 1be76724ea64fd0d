// Python bindings of the instruction-set level (dispatch.h): module.cpp adds them to fuel_torch._C.
#pragma once

#include <pybind11/pybind11.h>

namespace fuel {

// init_cpu_capability(), cpu_capability(), built_capabilities(), cpu_capabilities().
void bind_cpu_capability(pybind11::module_& m);

}  // namespace fuel
