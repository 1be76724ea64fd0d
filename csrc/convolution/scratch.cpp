// The switch that makes the kernels' scratch buffers start poisoned (kernel_common.h, scratch).
//
// Kernels leave scratch unfilled because each writes every element before it reads it; nothing in
// an ordinary run checks that claim, since leftover heap contents are usually harmless zeros or
// stale sums. With FUEL_POISON_SCRATCH=1 every buffer starts as NaN, and a read of an element never
// written shows in the output. Read once: the tests set it in a child process.
#include <cstdlib>
#include <string_view>

namespace fuel {

bool scratch_poisoned() {
  static const bool poisoned = [] {
    const char* value = std::getenv("FUEL_POISON_SCRATCH");
    return value != nullptr && std::string_view(value) == "1";
  }();
  return poisoned;
}

}  // namespace fuel
