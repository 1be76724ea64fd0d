// The Judge's compute roof (fuel_torch/judge/timing.py, Roofs.peak): torch.mm is not one on every
// CPU. On an AMD Zen 5, torch.mm runs MKL's AVX2 code (float32 1024x1024 at 2 threads: 210 GFLOP/s,
// float64 115) while AVX-512 multiply-adds reach 264 and 132 per core, and our convolutions ran above
// that "roof" and were marked measurement errors. This probe measures what the level's vectors can
// do; the roof is the higher of the two.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <vector>

#include "peak_probe.h"

namespace fuel {
namespace CPU_CAPABILITY {
namespace {

// Enough independent chains to cover the multiply-add latency on both pipes (4-6 cycles x 2),
// within the level's registers (AVX-512: 32, below it 16).
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kChains = 16;
#else
constexpr int kChains = 12;
#endif

template <typename T>
double fused_multiply_adds(int64_t iterations) {
  using Vec = at::vec::Vectorized<T>;
  const int64_t threads = at::get_num_threads();
  std::vector<T> sinks(threads);
  at::parallel_for(0, threads, 1, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      // x -> 0.999 x + 1e-6 stays near 1e-3: no overflow and no subnormals, whatever the count.
      Vec chains[kChains];
      for (int c = 0; c < kChains; ++c) chains[c] = Vec(T(1e-3) * T(c + 1));
      const Vec factor(T(0.999)), term(T(1e-6));
      for (int64_t i = 0; i < iterations; ++i) {
        for (int c = 0; c < kChains; ++c) chains[c] = at::vec::fmadd(chains[c], factor, term);
      }
      Vec total = chains[0];
      for (int c = 1; c < kChains; ++c) total = total + chains[c];
      T lanes[Vec::size()];
      total.store(lanes);
      sinks[t] = lanes[0];  // the results are used, so the loop cannot be dropped
    }
  });
  volatile T sink = 0;
  for (T value : sinks) sink = sink + value;
  return 2.0 * static_cast<double>(Vec::size()) * kChains * static_cast<double>(iterations) * threads;
}

}  // namespace

extern const PeakProbes peak_probes;
const PeakProbes peak_probes = {&fused_multiply_adds<float>, &fused_multiply_adds<double>};

}  // namespace CPU_CAPABILITY
}  // namespace fuel
