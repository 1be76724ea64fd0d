// The elementwise family's kernel table: one function per (op, dtype), compiled once per
// instruction-set level (see ../dispatch.h). Shared by the kernel sources and csrc/elementwise.cpp.
#pragma once

#include <array>
#include <cstdint>

namespace fuel {

// Table order of the ops; the dtypes go float, double, BFloat16, Half (kernel_dtype_slot).
enum class BinaryOp : int { add, sub, mul, div, maximum, minimum, pow, rem };
constexpr int kBinaryOps = 8;
constexpr int kKernelDtypes = 4;

// out[i] = op(lhs[i], rhs[i]) for i in [0, n); the three buffers hold n elements of the slot's dtype.
using BinaryKernel = void (*)(const void* lhs, const void* rhs, void* out, int64_t n);

struct BinaryKernels {
  std::array<std::array<BinaryKernel, kKernelDtypes>, kBinaryOps> kernel;
  // out = lhs + rhs in float32 with non-temporal stores whatever the size (where the level has
  // them): the Judge's bandwidth roof for two reads and a write without the read for ownership.
  BinaryKernel streaming_triad;
};

// Whether the CPU is Intel's (cpu_capability.cpp): its mesh L3 serves a core no faster than memory.
bool cpu_is_intel();

// Whether float16 div at the AVX512 level takes a reciprocal estimate and one correction rather
// than the divider (same bits either way). Chosen once per process (cpu_capability.cpp).
bool float16_division_by_reciprocal();

}  // namespace fuel
