// The Judge's compute roof probe: fused multiply-adds at the full rate of the level's vectors, one
// chain set per thread, compiled once per instruction-set level (see ../dispatch.h).
#pragma once

#include <cstdint>

namespace fuel {

// Runs `iterations` rounds of independent vector fused multiply-adds on each of the pool's threads
// and returns the floating-point operations done (2 per lane and multiply-add).
using PeakProbe = double (*)(int64_t iterations);

struct PeakProbes {
  PeakProbe float32, float64;
};

}  // namespace fuel
