// The bias gradient's sums (fuel_backward::conv_bias_grad, bias_grad.cpp, which states their order),
// compiled once per instruction-set level like the other kernels: at the base level alone, the
// channels_last loop went four floats at a time (float32 4x128x56x56 at 1 thread on a Zen 3: 0.37 ms,
// torch's sum over the same tensor 0.21-0.38). Each (channel, lane) adds its terms in the same
// order at every level, so every level gives the same bits.
#pragma once

#include <ATen/OpMathType.h>

#include "kernel_common.h"

namespace fuel {
namespace CPU_CAPABILITY {
namespace bias_grad_detail {

constexpr int64_t kLanes = 16;

// A channels_last gradient holds each position's channels side by side: a thread keeps its
// channels' lanes as [lane][channel] and adds each position's channels into lane (position mod 16),
// so each (channel, lane) takes the terms the NCHW loop gives it, in the same order.
template <typename T, typename Acc>
void sum_channels_last(const T* src, int64_t N, int64_t C, int64_t HW, int64_t first, int64_t last, Acc* dst) {
  const int64_t width = last - first;
  const auto lanes = scratch<Acc>(kLanes * width);
  zero(lanes.get(), kLanes * width);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t p = 0; p < HW; ++p) {
      const T* channels = src + (n * HW + p) * C + first;
      Acc* lane = lanes.get() + p % kLanes * width;
      for (int64_t c = 0; c < width; ++c) lane[c] += static_cast<Acc>(channels[c]);
    }
  }
  for (int64_t c = 0; c < width; ++c) {
    Acc sum(0);
    for (int64_t l = 0; l < kLanes; ++l) sum += lanes[l * width + c];
    dst[first + c] = sum;
  }
}

template <typename T, typename Acc>
void sum_channels_first(const T* src, int64_t N, int64_t C, int64_t HW, int64_t first, int64_t last, Acc* dst) {
  for (int64_t c = first; c < last; ++c) {
    Acc lanes[kLanes] = {};
    for (int64_t n = 0; n < N; ++n) {
      const T* run = src + (n * C + c) * HW;
      int64_t j = 0;
      for (; j + kLanes <= HW; j += kLanes) {
        for (int64_t l = 0; l < kLanes; ++l) lanes[l] += static_cast<Acc>(run[j + l]);
      }
      for (int64_t l = 0; j + l < HW; ++l) lanes[l] += static_cast<Acc>(run[j + l]);
    }
    Acc sum(0);
    for (Acc lane : lanes) sum += lane;
    dst[c] = sum;
  }
}

}  // namespace bias_grad_detail

// Per channel of a dense [N, C, H, W] gradient (channels_last or NCHW, HW = H * W), its sum in
// at::opmath_type<T> into dst[C]. Threads split the channels only.
template <typename T>
void bias_grad_sums(const void* gradient, int64_t N, int64_t C, int64_t HW, bool channels_last, void* sums) {
  using Acc = at::opmath_type<T>;
  const T* src = static_cast<const T*>(gradient);
  Acc* dst = static_cast<Acc*>(sums);
  // A channels_last thread wants a run of channels wide enough to fill its vector adds.
  at::parallel_for(0, C, channels_last ? 16 : 1, [&](int64_t first, int64_t last) {
    if (channels_last) return bias_grad_detail::sum_channels_last(src, N, C, HW, first, last, dst);
    bias_grad_detail::sum_channels_first(src, N, C, HW, first, last, dst);
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace fuel
