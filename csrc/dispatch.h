// Run-time choice of the instruction-set level the kernels run at, the way ATen's DispatchStub does.
//
// setup.py compiles every source in csrc/kernels/ once per level (DEFAULT: baseline x86-64; AVX2;
// AVX512), each copy with that level's -m flags and CPU_CAPABILITY=<level>, so that its code lives
// in namespace fuel::<level> and ATen's Vectorized<T> (inline namespace at::vec::<level>) is the
// level's own. Each kernel source defines one table of function pointers per family in its level's
// namespace; the family picks the table of the level in use through FUEL_KERNELS_FOR_CPU.
//
// The level in use is chosen once, at import: the best level this build has and this CPU supports,
// or the one FUEL_CPU_CAPABILITY names (refused if the CPU or the build lacks it).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace fuel {

enum class Capability : int { DEFAULT = 0, AVX2 = 1, AVX512 = 2 };

// The level in use. The first call chooses it (see choose_capability); later calls only read it.
Capability capability();

// Chooses the level from the CPU and FUEL_CPU_CAPABILITY, throwing c10::Error with the reason when
// that variable names a level that is unknown, not built, or beyond this CPU.
Capability choose_capability();

const char* capability_name(Capability level);
std::vector<std::string> built_capabilities();  // levels compiled into this build
std::vector<std::string> cpu_capabilities();    // levels both built and supported by this CPU

// A kernel table's dtype slot: float, double, BFloat16, Half.
inline int kernel_dtype_slot(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: return 0;
    case c10::kDouble: return 1;
    case c10::kBFloat16: return 2;
    case c10::kHalf: return 3;
    default: TORCH_CHECK(false, "fuel: no kernel for dtype ", dtype);
  }
}

}  // namespace fuel

// setup.py defines FUEL_HAVE_<LEVEL> for the common sources when it built that level's kernels.
#ifdef FUEL_HAVE_AVX2
#define FUEL_IF_AVX2(...) __VA_ARGS__
#define FUEL_AVX2_TABLE(name) (&::fuel::AVX2::name)
#else
#define FUEL_IF_AVX2(...)
#define FUEL_AVX2_TABLE(name) static_cast<decltype(&::fuel::DEFAULT::name)>(nullptr)
#endif
#ifdef FUEL_HAVE_AVX512
#define FUEL_IF_AVX512(...) __VA_ARGS__
#define FUEL_AVX512_TABLE(name) (&::fuel::AVX512::name)
#else
#define FUEL_IF_AVX512(...)
#define FUEL_AVX512_TABLE(name) static_cast<decltype(&::fuel::DEFAULT::name)>(nullptr)
#endif

// Declares `extern const Type name;` in fuel::<level> for every level built (use inside namespace
// fuel). Each kernel source defines it in its own level's namespace, constant-initialized, so no
// code of any level runs when the library is loaded.
#define FUEL_DECLARE_KERNELS(Type, name)                    \
  namespace DEFAULT { extern const Type name; }             \
  FUEL_IF_AVX2(namespace AVX2 { extern const Type name; })  \
  FUEL_IF_AVX512(namespace AVX512 { extern const Type name; })

// The table `name` of the level in use.
#define FUEL_KERNELS_FOR_CPU(name) \
  (::fuel::kernels_for_level(::fuel::DEFAULT::name, FUEL_AVX2_TABLE(name), FUEL_AVX512_TABLE(name)))

namespace fuel {

template <typename Table>
const Table& kernels_for_level(const Table& baseline, const Table* avx2, const Table* avx512) {
  switch (capability()) {
    case Capability::AVX512:
      if (avx512) return *avx512;
      [[fallthrough]];
    case Capability::AVX2:
      if (avx2) return *avx2;
      [[fallthrough]];
    default:
      return baseline;
  }
}

}  // namespace fuel
