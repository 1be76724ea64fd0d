// The per-ISA convolution entry: picks the path for a validated problem and runs it.
//
// Paths (each documented in its header): depthwise (one input channel per output channel),
// wide kernel (long kernel rows, few outputs: weight gradients), and the chassis for the rest:
// planar where the padded input copy fits its budget, gathering per task where it does not.
// All read x and write out through their layouts (NCHW or NHWC) and the weight through its strides.
#pragma once

#include <optional>

#include "chassis.h"
#include "depthwise.h"
#include "packing.h"
#include "patch_brgemm.h"
#include "planar.h"
#include "plane_brgemm.h"
#include "pointwise_brgemm.h"
#include "tap_brgemm.h"
#include "wide_brgemm.h"
#include "wide_kernel.h"

namespace fuel {
namespace CPU_CAPABILITY {

template <typename scalar_t>
void convolve_wide(const Problem& p, const scalar_t* x, const Layout& xl, const ConvOperands& o,
                   const scalar_t* bias, scalar_t* out, const Layout& ol) {
  using acc_t = acc_type<scalar_t>;
  constexpr int64_t L = kWideLanes<acc_t>;
  const int64_t row_len = (p.Kw + L - 1) / L * L;
  if constexpr (kBrgemmDtype<scalar_t>) {
    if (wide_brgemm_serves<scalar_t>(p, o)) return convolve_wide_brgemm<scalar_t>(p, x, xl, o, bias, out, ol);
  }
  const scalar_t* w = static_cast<const scalar_t*>(o.weight);
  if constexpr (!is_half<scalar_t>) {
    // A contiguous float weight whose rows are whole lane groups already is the packed layout.
    if (o.weight_contiguous && row_len == p.Kw) return convolve_wide_kernel<scalar_t>(p, x, xl, w, bias, out, ol);
  }
  std::vector<acc_t> packed(p.Cout * (p.Cin / p.groups) * p.Kh * row_len);
  pack_wide_weights<scalar_t>(p, w, o.weight_strides, row_len, packed.data());
  convolve_wide_kernel<scalar_t>(p, x, xl, packed.data(), bias, out, ol);
}

template <typename scalar_t>
void convolve_on_chassis(const Problem& p, const scalar_t* x, const Layout& xl, const ConvOperands& o,
                         const scalar_t* bias, scalar_t* out, const Layout& ol) {
  using acc_t = acc_type<scalar_t>;
  Axis ax_h = make_axis(p, 0), ax_w = make_axis(p, 1);
  std::vector<int64_t> offsets = phase_offsets(p, ax_h, ax_w);
  const ChassisPlan plan = plan_chassis<acc_t>(p, std::move(ax_h), std::move(ax_w), std::move(offsets));
  std::vector<acc_t> bias_acc(p.Cout, acc_t(0));
  for (int64_t co = 0; bias && co < p.Cout; ++co) bias_acc[co] = static_cast<acc_t>(bias[co]);
  const int64_t packed_size = (p.transpose ? p.Cin * (p.Cout / p.groups) : p.Cout * (p.Cin / p.groups)) * p.Kh * p.Kw;
  // Left uninitialised: the packing writes every element the kernels read (the taps a transposed
  // conv's phases leave out, which reach no output, leave a tail of each group that nothing reads).
  // Zeroed first, the 19 MB of a float64 512 -> 512 3x3 took 3% of its call.
  const auto packed = scratch<acc_t>(packed_size);
  pack_chassis_weights<scalar_t>(p, plan.ax_h, plan.ax_w, plan.phase_offsets, static_cast<const scalar_t*>(o.weight),
                                 o.weight_strides, packed.get());
  const acc_t* w_rows = packed.get();
  const PaddedPlanes planes = padded_planes(plan.ax_h, plan.ax_w, kVectorBlock * Vectorized<acc_t>::size());
  if (planes_fit<acc_t>(p, planes)) {
    return convolve_planar<scalar_t>(p, plan, planes, x, xl, w_rows, bias_acc.data(), out, ol);
  }
  convolve_chassis<scalar_t>(p, plan, x, xl, w_rows, bias_acc.data(), out, ol);
}

// The brgemm paths where one serves (bfloat16 on AMX or AVX512_BF16, image by image where it
// computes the contract's sums; float32 on oneDNN's kernel): per block of positions over whole patches
// (patch_brgemm.h) where that serves (its float32 sums computed on x and the output in place where
// the output keeps x's size and layout, plane_brgemm.h), else one brgemm per tap (tap_brgemm.h; float32 1x1 channels_last
// calls read in place, pointwise_brgemm.h). The chassis for every
// other call and every image a brgemm path leaves.
template <typename scalar_t>
void convolve_general(const Problem& p, const scalar_t* x, const Layout& xl, const ConvOperands& o,
                      const scalar_t* bias, scalar_t* out, const Layout& ol) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  if constexpr (kBrgemmDtype<scalar_t>) {
    const Axis ax_h = make_axis(p, 0), ax_w = make_axis(p, 1);
    std::vector<char> done;
    if (std::optional<PatchPlan> plan = patch_plan<scalar_t>(p, ax_h, ax_w)) {
      if constexpr (std::is_same_v<scalar_t, float>) {
        if (plane_brgemm_serves<scalar_t>(p, ax_h, ax_w, xl, ol)) return convolve_plane_brgemm(p, ax_h, ax_w, x, xl, o, bias, out, ol);
      }
      done = convolve_patch_brgemm<scalar_t>(p, ax_h, ax_w, std::move(*plan), x, xl, o, bias, out, ol);
    } else if (const PaddedPlanes planes = padded_planes(ax_h, ax_w, kPositions); tap_brgemm_serves<scalar_t>(p, planes)) {
      if constexpr (std::is_same_v<scalar_t, float>) {
        if (pointwise_nhwc_serves(p, xl, ol)) return convolve_pointwise_nhwc(p, x, xl, o, bias, out, ol);
      }
      done = convolve_tap_brgemm<scalar_t>(p, ax_h, ax_w, planes, x, xl, o, bias, out, ol);
    }
    if (!done.empty()) {
      Problem one = p;
      one.N = 1;
      for (int64_t n = 0; n < p.N; ++n) {
        if (!done[n]) convolve_on_chassis<scalar_t>(one, x + n * xl.n, xl, o, bias, out + n * ol.n, ol);
      }
      return;
    }
  }
#endif
  convolve_on_chassis<scalar_t>(p, x, xl, o, bias, out, ol);
}

template <typename scalar_t>
bool wide_brgemm_if_served(const Problem& p, const ConvOperands& o) {
  if constexpr (kBrgemmDtype<scalar_t>) {
    if (p.N == 0 || p.Cout == 0 || p.Ho == 0 || p.Wo == 0 || is_depthwise(p) || !is_wide_kernel<float>(p) ||
        !wide_brgemm_serves<scalar_t>(p, o)) {
      return false;
    }
    convolve_wide_brgemm<scalar_t>(p, static_cast<const scalar_t*>(o.x), o.x_layout, o,
                                   static_cast<const scalar_t*>(o.bias), static_cast<scalar_t*>(o.out), o.out_layout);
    return true;
  } else {
    return false;
  }
}

// A depthwise conv_transpose2d at stride 1 (each channel its own group, one output channel each, no
// output padding) is the depthwise conv2d of the same input with the kernel turned by 180 degrees,
// padded by dilation * (K - 1) - padding: output (oh, ow) takes the same products. The depthwise
// kernel adds them by input offset, the reverse of the transposed conv's tap order, so these calls
// keep that order (contracts/convolution.fkc.md, Arithmetic). They are the input gradients of
// depthwise convolutions; on the chassis a channels_last 4x128x56x56 3x3 one took 5.0 ms at 1
// thread (float32, Zen 4), ten times the forward conv.
inline std::optional<Problem> transpose_as_depthwise(const Problem& p) {
  if (!p.transpose || p.groups != p.Cin || p.Cout != p.Cin || p.Cin == 0) return std::nullopt;
  Problem q = p;
  q.transpose = false;
  const int64_t kernel[2] = {p.Kh, p.Kw};
  for (int i = 0; i < 2; ++i) {
    q.padding[i] = p.dilation[i] * (kernel[i] - 1) - p.padding[i];
    if (p.stride[i] != 1 || p.output_padding[i] != 0 || q.padding[i] < 0) return std::nullopt;
  }
  return q;
}

template <typename scalar_t>
void convolve(const Problem& p, const ConvOperands& o) {
  if (p.N == 0 || p.Cout == 0 || p.Ho == 0 || p.Wo == 0) return;
  const scalar_t* x = static_cast<const scalar_t*>(o.x);
  const scalar_t* bias = static_cast<const scalar_t*>(o.bias);
  scalar_t* out = static_cast<scalar_t*>(o.out);
  if (is_depthwise(p)) {
    return convolve_depthwise<scalar_t>(p, x, o.x_layout, static_cast<const scalar_t*>(o.weight), o.weight_strides,
                                        bias, out, o.out_layout);
  }
  if (const std::optional<Problem> direct = transpose_as_depthwise(p)) {
    // The turned kernel read through the weight's own strides, negated along the taps.
    const int64_t* ws = o.weight_strides;
    const int64_t turned[4] = {ws[0], ws[1], -ws[2], -ws[3]};
    const scalar_t* last_tap = static_cast<const scalar_t*>(o.weight) + (p.Kh - 1) * ws[2] + (p.Kw - 1) * ws[3];
    return convolve_depthwise<scalar_t>(*direct, x, o.x_layout, last_tap, turned, bias, out, o.out_layout);
  }
  if (is_wide_kernel<acc_type<scalar_t>>(p)) return convolve_wide<scalar_t>(p, x, o.x_layout, o, bias, out, o.out_layout);
  convolve_general<scalar_t>(p, x, o.x_layout, o, bias, out, o.out_layout);
}

}  // namespace CPU_CAPABILITY
}  // namespace fuel
