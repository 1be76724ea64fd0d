// One brgemm per spatial tap, on the planar path's geometry, through torch's brgemm (oneDNN's
// ukernel, ATen/native/CPUBlas.h): bfloat16 convolutions on Intel's AMX tile unit or on AVX512_BF16
// dot products (vdpbf16ps: AMD Zen 4 and 5), and float32 ones on oneDNN's AVX2 or AVX-512 kernel.
//
// The input is copied once into the planar path's zero-padded planes (split by stride residue, so
// every tap steps by 1); for bfloat16 as channel pairs side by side, the VNNI layout in which the
// tile unit takes its B matrix, k = input channel. A task is a block of kPositions grid positions
// q = jh * Wp + jw of one phase, for a block of output channels; for each spatial tap in the
// chassis's order it runs one brgemm, C[co][q] += sum over ci of W_tap[co][ci] * plane[ci][q + shift],
// where shift is the tap's place in its plane: B is the planes read in place. C starts at the
// bias; the Wp - count columns past each grid row are computed and dropped, as in planar.h.
//
// float32: oneDNN's kernel sums each tap's channels with fused multiply-adds in its own fixed
// order (for a given CPU), into C, in chunks of kTapChunk channels where there are more (each chunk
// from zero, then added to C); no operand needs a rule.
//
// bfloat16 arithmetic. The tile unit and vdpbf16ps alike multiply bfloat16 pairs exactly and add
// them in float32, to nearest even, but treat subnormal inputs as zero and flush subnormal results
// (their DAZ and FTZ cannot be turned off). Where neither can happen their sums are the float32
// sums the contract bounds: every operand normal or zero, and every partial sum zero or normal,
// which holds when the smallest product and the bias are multiples of 2^-126 (a nonzero bf16 is a
// multiple of 2^(e - 7), a product of 2^(ex + ew - 14); every partial sum, exact or rounded to
// float32, stays a multiple of the smallest such quantum). So the path runs only where, for every nonzero x, weight and bias,
// no operand is subnormal, ex_min + ew_min >= -112 and eb_min >= -119 (biased: Ex + Ew >= 142,
// Eb >= 8), checked per image while the planes are filled; an image that fails is computed by the
// chassis alone, which gives it the bits it would get convolved on its own. The order of each sum
// is fixed by the geometry: bias, then the taps in order, each tap's channels as the unit adds its
// 32-channel chunks (in oneDNN's fixed order for the CPU); no thread count or task split changes it.
#pragma once

#include <ATen/native/CPUBlas.h>

#include <atomic>

#include "axes.h"
#include "float_brgemm.h"
#include "kernel_table.h"
#include "kernel_common.h"
#include "packing.h"
#include "planar.h"

namespace fuel {

// Whether float32 brgemm reaches oneDNN's kernels (cpu_capability.cpp): mkldnn enabled in torch,
// FUEL_BRGEMM not "0", a level with AVX2.
bool float_brgemm_enabled();

namespace CPU_CAPABILITY {

// The planes' memory, kept by the calling thread from one call to the next up to 64 MiB: a
// fresh allocation of a few MB is a fresh mapping, and its first touch a page fault per 4 KiB page
// (5% of a ResNet 3x3's time). Larger planes are allocated per call and freed on the next.
template <typename T>
inline T* reused_planes(int64_t count) {
  constexpr int64_t kKept = (int64_t(64) << 20) / sizeof(T);
  thread_local std::unique_ptr<T[]> kept;
  thread_local int64_t capacity = 0;
  if (count > capacity || (capacity > kKept && count <= kKept)) {
    kept.reset();
    kept = scratch<T>(count);
    capacity = count;
  }
  return kept.get();
}

// The dtypes the brgemm paths take at this level: float32 (oneDNN's kernel) at AVX2 and AVX512,
// bfloat16 (AMX or AVX512_BF16) at AVX512. The exponent scans below have AVX-512 bodies and portable ones, so
// that AVX2 builds them too.
template <typename scalar_t>
constexpr bool kBrgemmDtype = std::is_same_v<scalar_t, float>
#if defined(CPU_CAPABILITY_AVX512)
                              || std::is_same_v<scalar_t, at::BFloat16>
#endif
    ;

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)

constexpr int64_t kPositions = 128;         // grid positions per task: one brgemm's N
constexpr int64_t kAmxChannelChunk = 64;   // output channels per task: one brgemm's M
constexpr int64_t kSmallestEx = 255;        // no nonzero element seen yet

// The smallest biased exponent of the nonzero bfloat16 values in [src, src + n) with `stride`, into
// emin, and whether any is subnormal, into subnormal.
inline void scan_exponents(const at::BFloat16* src, int64_t n, int64_t stride, int& emin, bool& subnormal) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  int low = emin;
  bool sub = false;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = bits[i * stride];
    const int e = (b >> 7) & 0xff;
    const bool nonzero = (b & 0x7fff) != 0;
    sub |= nonzero && e == 0;
    low = std::min(low, nonzero ? e : 255);
  }
  emin = low;
  subnormal = subnormal || sub;
}

// scan_exponents for a dense run, by the smallest nonzero magnitude: each magnitude less one, so
// that zeros wrap round to 0xffff and drop out of the minimum. The smallest one's exponent is the
// smallest, and it is subnormal (exponent 0) where any is. Four independent minima of 32 values: a
// bfloat16 channels_last 1x1 call read in place spent a twentieth of its time here with one chain
// of masked minima on a Zen 4.
inline void fold_exponents(const uint16_t* bits, int64_t n, int& emin, bool& subnormal) {
#if !defined(CPU_CAPABILITY_AVX512)
  return scan_exponents(reinterpret_cast<const at::BFloat16*>(bits), n, 1, emin, subnormal);
#else
  const __m512i magnitude = _mm512_set1_epi16(0x7fff), one = _mm512_set1_epi16(1);
  auto less_one = [&](__m512i x) { return _mm512_sub_epi16(_mm512_and_si512(x, magnitude), one); };
  __m512i low[4] = {_mm512_set1_epi16(-1), _mm512_set1_epi16(-1), _mm512_set1_epi16(-1), _mm512_set1_epi16(-1)};
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    for (int k = 0; k < 4; ++k) low[k] = _mm512_min_epu16(low[k], less_one(_mm512_loadu_si512(bits + i + 32 * k)));
  }
  for (; i < n; i += 32) {
    const __mmask32 lanes = n - i >= 32 ? ~__mmask32(0) : __mmask32((1u << (n - i)) - 1);
    low[0] = _mm512_min_epu16(low[0], less_one(_mm512_maskz_loadu_epi16(lanes, bits + i)));  // masked off: zero
  }
  alignas(64) uint16_t lanes_low[32];
  _mm512_store_si512(lanes_low, _mm512_min_epu16(_mm512_min_epu16(low[0], low[1]), _mm512_min_epu16(low[2], low[3])));
  uint16_t smallest_less_one = 0xffff;
  for (uint16_t l : lanes_low) smallest_less_one = std::min(smallest_less_one, l);
  if (smallest_less_one == 0xffff) return;  // all zero
  const int smallest = smallest_less_one + 1;
  emin = std::min(emin, smallest >> 7);
  subnormal = subnormal || smallest < 0x80;
#endif
}

// Per image, the smallest biased exponent of its nonzero elements and whether any is subnormal,
// folded in by the threads that fill the image's buffers.
struct ImageExponents {
  std::vector<std::atomic<int>> low;
  std::vector<std::atomic<char>> sub;
  explicit ImageExponents(int64_t images) : low(images), sub(images) {
    for (int64_t n = 0; n < images; ++n) low[n] = kSmallestEx, sub[n] = 0;
  }
  void fold(int64_t n, int emin, bool subnormal) {
    int seen = low[n].load();
    while (emin < seen && !low[n].compare_exchange_weak(seen, emin)) {
    }
    if (subnormal) sub[n] = 1;
  }
};

// Whether a product of two nonzero normal bf16 values of biased exponents >= ex and >= ew, and a
// bias of biased exponent >= eb, keep every float32 partial sum zero or normal (see the top).
inline bool sums_stay_normal(int ex, int ew, int eb) { return ex + ew >= 142 && eb >= 8; }

// Pair planes: for image n, group g, channel pair cp and residue (rh, rw), pl.size positions of two
// bfloat16 each, channel 2 cp then 2 cp + 1 (zero past the group's channels). Layout
// [n][g][cp][rh][rw][position][2], so B's pair stride (ld_b) is step_h * step_w * pl.size.
struct PairPlanes {
  int64_t pairs = 0, ld_b = 0, image = 0;  // pairs per group; elements: per pair (/2), per image
};

inline PairPlanes pair_planes(const Problem& p, const PaddedPlanes& pl) {
  PairPlanes pp;
  pp.pairs = (p.Cin / p.groups + 1) / 2;
  pp.ld_b = pl.step_h * pl.step_w * pl.size;
  pp.image = p.groups * pp.pairs * pp.ld_b * 2;
  return pp;
}

// Pairs (s0[j * step], s1[j * step]) into dst[0, n) (s1 null: zeros), folding their exponents into
// emin and subnormal as scan_exponents does. The common row (stride 1 along it, NCHW) goes 16
// pairs to an instruction group, its tail under a mask; the rest one by one.
inline void interleave_row(const uint16_t* s0, const uint16_t* s1, int64_t step, int64_t n, uint32_t* dst, int& emin,
                           bool& subnormal) {
#if defined(CPU_CAPABILITY_AVX512)
  if (step != 1) {
#endif
    for (int64_t j = 0; j < n; ++j) {
      const uint16_t a = s0[j * step], b = s1 ? s1[j * step] : 0;
      dst[j] = uint32_t(a) | (uint32_t(b) << 16);
      scan_exponents(reinterpret_cast<const at::BFloat16*>(dst + j), 2, 1, emin, subnormal);
    }
#if defined(CPU_CAPABILITY_AVX512)
    return;
  }
  const __m512i mantissa = _mm512_set1_epi32(0x7fff), exponent = _mm512_set1_epi32(0xff);
  __m512i low = _mm512_set1_epi32(emin);
  __mmask16 sub = 0;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 lanes = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
    const __m512i a = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, s0 + j));
    const __m512i b = s1 ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, s1 + j)) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(dst + j, lanes, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
    for (const __m512i& v : {a, b}) {
      const __mmask16 nonzero = _mm512_test_epi32_mask(v, mantissa);  // masked-off lanes load as zero
      const __m512i e = _mm512_and_si512(_mm512_srli_epi32(v, 7), exponent);
      low = _mm512_mask_min_epi32(low, nonzero, low, e);
      sub |= _mm512_mask_cmpeq_epi32_mask(nonzero, e, _mm512_setzero_si512());
    }
  }
  emin = _mm512_reduce_min_epi32(low);
  subnormal = subnormal || sub != 0;
#endif
}

// Fills the pair planes of every image and records, per image, the smallest biased exponent of its
// nonzero elements and whether any is subnormal.
inline void fill_pair_planes(const Problem& p, const PaddedPlanes& pl, const PairPlanes& pp, const at::BFloat16* x,
                             const Layout& xl, uint32_t* planes, std::vector<int>& emin, std::vector<char>& subnormal) {
  const int64_t Cin_g = p.Cin / p.groups, residues = pl.step_h * pl.step_w;
  const int64_t items_per_image = p.groups * pp.pairs * residues;
  ImageExponents seen(p.N);
  const uint16_t* xb = reinterpret_cast<const uint16_t*>(x);
  at::parallel_for(0, p.N * items_per_image, std::max<int64_t>(1, (1 << 13) / pl.size), [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t n = item / items_per_image, rest = item % items_per_image;
      const int64_t residue = rest % residues, cp = rest / residues % pp.pairs, g = rest / residues / pp.pairs;
      const int64_t rh = residue / pl.step_w, rw = residue % pl.step_w;
      const uint16_t* src0 = xb + n * xl.n + (g * Cin_g + 2 * cp) * xl.c;
      const uint16_t* src1 = 2 * cp + 1 < Cin_g ? src0 + xl.c : nullptr;
      uint32_t* dst = planes + (n * pp.image) / 2 + ((g * pp.pairs + cp) * residues + residue) * pl.size;
      // Plane column j reads input column step_w * (j + min_w) + rw, inside [0, W) for j in [lo, hi).
      const int64_t lo = std::clamp<int64_t>(-floor_div(rw + pl.step_w * pl.min_w, pl.step_w), 0, pl.Wp);
      const int64_t hi = std::clamp<int64_t>(floor_div(p.W - 1 - rw, pl.step_w) - pl.min_w + 1, lo, pl.Wp);
      const int64_t step = pl.step_w * xl.w;
      int e_low = kSmallestEx;
      bool any_sub = false;
      for (int64_t i = 0; i < pl.Hp; ++i) {
        uint32_t* row = dst + i * pl.Wp;
        const int64_t ih = pl.step_h * (i + pl.min_h) + rh;
        if (ih < 0 || ih >= p.H) {
          std::fill_n(row, pl.Wp, 0u);
          continue;
        }
        std::fill_n(row, lo, 0u);
        const int64_t begin = ih * xl.h + (pl.step_w * (lo + pl.min_w) + rw) * xl.w;
        interleave_row(src0 + begin, src1 ? src1 + begin : nullptr, step, hi - lo, row + lo, e_low, any_sub);
        std::fill_n(row + hi, pl.Wp - hi, 0u);
      }
      std::fill_n(dst + pl.Hp * pl.Wp, pl.size - pl.Hp * pl.Wp, 0u);
      seen.fold(n, e_low, any_sub);
    }
  });
  emin.assign(p.N, kSmallestEx);
  subnormal.assign(p.N, 0);
  for (int64_t n = 0; n < p.N; ++n) emin[n] = seen.low[n].load(), subnormal[n] = seen.sub[n].load();
}

// The weights as one [Cout_g][K] matrix (brgemm's A, row-major) per group, phase and spatial tap,
// in the chassis's tap order; zero past the group's input channels (K: the channels, for bfloat16
// rounded up to whole pairs).
template <typename T>
struct TapWeights {
  std::unique_ptr<T[]> data;
  std::vector<int64_t> phase_start;  // first tap matrix of phase (i, j), per group
  int64_t taps_per_group = 0, matrix = 0;
  int emin = kSmallestEx;
  bool subnormal = false;
};

template <typename T>
TapWeights<T> pack_tap_weights(const Problem& p, const Axis& ax_h, const Axis& ax_w, int64_t K, const T* w,
                               const int64_t* ws) {
  const int64_t G = p.groups, Cin_g = p.Cin / G, Cout_g = p.Cout / G;
  TapWeights<T> tw;
  tw.matrix = Cout_g * K;
  std::vector<int64_t> tap_offsets;
  for (const Phase& ph : ax_h.phases) {
    for (const Phase& pw : ax_w.phases) {
      tw.phase_start.push_back(static_cast<int64_t>(tap_offsets.size()));
      for (const Tap& a : ph.taps) {
        for (const Tap& b : pw.taps) tap_offsets.push_back(a.k * ws[2] + b.k * ws[3]);
      }
    }
  }
  tw.taps_per_group = static_cast<int64_t>(tap_offsets.size());
  const int64_t size = G * tw.taps_per_group * tw.matrix;
  tw.data = scratch<T>(size);
  if (K > Cin_g) std::fill_n(tw.data.get(), size, T(0.f));  // a bfloat16 pair's missing half
  pack_tap_matrices<T>(p, tap_offsets, true, 1, K, w, ws, [&](int64_t g, int64_t t, int64_t co, int64_t ci) {
    return tw.data.get() + (g * tw.taps_per_group + t) * tw.matrix + co * K + ci;
  });
  if constexpr (std::is_same_v<T, at::BFloat16>) scan_exponents(tw.data.get(), size, 1, tw.emin, tw.subnormal);
  return tw;
}

// Whether the brgemm paths of this level (this file and patch_brgemm.h) may take a call of this
// dtype: bfloat16 where a bfloat16 unit is on, float32 where brgemm reaches oneDNN.
template <typename scalar_t>
bool brgemm_dtype_enabled() {
  if constexpr (!kBrgemmDtype<scalar_t>) {
    return false;
  } else if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    return bfloat16_brgemm_unit() != Bf16Unit::none;
  } else {
    return float_brgemm_enabled();
  }
}

// Whether this path serves the call: a dtype the brgemm paths take, enough channels to fill the
// tiles, and padded planes of modest size. (Depthwise calls never reach here.)
template <typename scalar_t>
bool tap_brgemm_serves(const Problem& p, const PaddedPlanes& pl) {
  const int64_t Cin_g = p.Cin / p.groups, Cout_g = p.Cout / p.groups;
  return Cin_g >= 16 && Cout_g >= 16 && planes_fit<float>(p, pl) && brgemm_dtype_enabled<scalar_t>();
}

// The planes brgemm reads as B: where image n's group g begins, the stride between B's K rows
// (channels, or channel pairs), the planes of one residue, and elements per grid position (2 for
// bfloat16's pairs), all in elements of T; and per image whether it takes this path.
template <typename T>
struct TapPlanes {
  const T* data = nullptr;
  int64_t image = 0, group = 0, ld_b = 0, residue = 0, per_position = 1;
  bool in_place = false;  // x itself, which has no slack past its last position
  std::vector<char> done;
};

inline TapPlanes<at::BFloat16> tap_planes(const Problem& p, const PaddedPlanes& pl, const at::BFloat16* x,
                                          const Layout& xl, const TapWeights<at::BFloat16>& tw, const at::BFloat16* bias) {
  TapPlanes<at::BFloat16> tp;
  tp.done.assign(p.N, 0);
  int eb = kSmallestEx;
  bool bias_subnormal = false;
  if (bias) scan_exponents(bias, p.Cout, 1, eb, bias_subnormal);
  if (tw.subnormal || bias_subnormal) return tp;
  const PairPlanes pp = pair_planes(p, pl);
  uint32_t* const planes = reused_planes<uint32_t>(p.N * pp.image / 2);
  std::vector<int> emin;
  std::vector<char> subnormal;
  fill_pair_planes(p, pl, pp, x, xl, planes, emin, subnormal);
  for (int64_t n = 0; n < p.N; ++n) tp.done[n] = !subnormal[n] && sums_stay_normal(emin[n], tw.emin, eb);
  path_counts().bfloat16_brgemm_images += std::count(tp.done.begin(), tp.done.end(), 1);
  tp.data = reinterpret_cast<const at::BFloat16*>(planes);
  tp.image = pp.image, tp.group = pp.pairs * pp.ld_b * 2, tp.ld_b = pp.ld_b, tp.residue = pl.size * 2;
  tp.per_position = 2;
  return tp;
}

inline TapPlanes<float> tap_planes(const Problem& p, const PaddedPlanes& pl, const float* x, const Layout& xl,
                                   const TapWeights<float>&, const float*) {
  TapPlanes<float> tp;
  const int64_t residues = pl.step_h * pl.step_w, Cin_g = p.Cin / p.groups;
  tp.done.assign(p.N, 1);
  path_counts().float_brgemm_images += p.N;
  // A 1x1, stride-1, unpadded conv2d of an NCHW input reads x's own planes: the copy would be the
  // input again (a tenth of such a call's time). So does such a conv_transpose2d, uncropped and
  // without output padding (the pointwise conv's input gradient): each output position is its input
  // position's channels times the weight. Float32 4x128x56x56 128 -> 128 at 1 thread on a Zen 3:
  // 8.6-9.9 ms through the copy, 7.0-7.8 in place.
  const bool extended = p.transpose && (p.output_padding[0] != 0 || p.output_padding[1] != 0);
  if (!extended && p.Kh == 1 && p.Kw == 1 && p.stride[0] == 1 && p.stride[1] == 1 && p.padding[0] == 0 &&
      p.padding[1] == 0 && xl.w == 1 && xl.h == p.W && xl.c == p.H * p.W && pl.Wp == p.W && pl.min_h == 0 &&
      pl.min_w == 0) {
    tp.data = x, tp.in_place = true;
    tp.ld_b = xl.c, tp.image = xl.n, tp.group = Cin_g * xl.c;
    return tp;
  }
  float* const planes = reused_planes<float>(p.N * p.Cin * residues * pl.size);
  fill_padded_planes<float>(p, pl, x, xl, planes);
  tp.data = planes;
  tp.ld_b = residues * pl.size, tp.image = p.Cin * tp.ld_b, tp.group = Cin_g * tp.ld_b, tp.residue = pl.size;
  return tp;
}

// Computes the images that take this path (every image for float32; for bfloat16 those whose
// operands pass the exponent rule); returns, per image, whether it did (the caller computes the
// others).
template <typename scalar_t>
std::vector<char> convolve_tap_brgemm(const Problem& p, const Axis& ax_h, const Axis& ax_w, const PaddedPlanes& pl,
                                      const scalar_t* x, const Layout& xl, const ConvOperands& o, const scalar_t* bias,
                                      scalar_t* out, const Layout& ol) {
  namespace cpublas = at::native::cpublas;
  constexpr bool paired = std::is_same_v<scalar_t, at::BFloat16>;
  const int64_t G = p.groups, Cin_g = p.Cin / G, Cout_g = p.Cout / G;
  const int64_t K = paired ? (Cin_g + 1) / 2 * 2 : Cin_g;
  const TapWeights<scalar_t> tw =
      pack_tap_weights<scalar_t>(p, ax_h, ax_w, K, static_cast<const scalar_t*>(o.weight), o.weight_strides);
  const TapPlanes<scalar_t> tp = tap_planes(p, pl, x, xl, tw, bias);
  const std::vector<char>& done = tp.done;
  if (std::find(done.begin(), done.end(), 1) == done.end()) return done;

  const int64_t n_ph = static_cast<int64_t>(ax_h.phases.size()), n_pw = static_cast<int64_t>(ax_w.phases.size());
  const int64_t co_chunks = (Cout_g + kAmxChannelChunk - 1) / kAmxChannelChunk;
  int64_t max_positions = 1;
  for (const Phase& ph : ax_h.phases) max_positions = std::max(max_positions, ph.count * pl.Wp);
  // Blocks of equal width in whole register tiles (float_brgemm.h), read in place: a 7x7 output
  // grid's 56 positions ran as 128, and 210 of a 14x14 one as 2 x 128. (Widths of whole vectors
  // instead, 56 as 3 x 16 + 8, left the last 8 to float_brgemm's copied tail: no faster.)
  static_assert(kPositions % kGemmCols == 0);
  const int64_t blocks = (max_positions + kPositions - 1) / kPositions;
  const int64_t width = equal_block(max_positions, blocks, kGemmCols);
  std::vector<float> bias_f(p.Cout, 0.f);
  for (int64_t c = 0; bias && c < p.Cout; ++c) bias_f[c] = static_cast<float>(bias[c]);

  // Where grid position q is output position q of each channel plane (float32 x read in place: one
  // phase, unit steps, no padding columns, output rows back to back), C is the output itself, not a
  // block copied there row by row after its brgemms: a float32 NCHW 1x1 4x256x28x28 -> 64 took 5-7%
  // less time on a Zen 3, 1 and 2 threads, in the same processes (the copy was a tenth of it).
  const bool into_output = std::is_same_v<scalar_t, float> && tp.in_place && n_ph == 1 && n_pw == 1 &&
                           ax_h.out_step == 1 && ax_w.out_step == 1 && ax_h.phases[0].r == 0 &&
                           ax_w.phases[0].r == 0 && ax_w.phases[0].count == pl.Wp && ol.w == 1 && ol.h == pl.Wp;
  at::parallel_for(0, p.N * G * n_ph * n_pw * blocks * co_chunks, 1, [&](int64_t first_task, int64_t last_task) {
    const auto acc = scratch<float>(kAmxChannelChunk * kPositions);
    const auto part = scratch<float>(paired || K <= kTapChunk ? 0 : kAmxChannelChunk * kPositions);
    for (int64_t task = first_task; task < last_task; ++task) {
      const auto [n, g, i, j, block, chunk] = phase_task(task, G, n_ph, n_pw, blocks, co_chunks);
      if (!done[n]) continue;
      const Phase &ph = ax_h.phases[i], &pw = ax_w.phases[j];
      const int64_t q0 = block * width, q1 = std::min(ph.count * pl.Wp, q0 + width);
      if (q0 >= q1) continue;  // a phase with fewer grid rows than the longest
      const int64_t co0 = chunk * kAmxChannelChunk, rows = std::min(kAmxChannelChunk, Cout_g - co0);
      float* c = acc.get();
      int64_t ldc = kPositions;
      // The columns every brgemm of the task computes: a short last block reads into the planes'
      // slack and its extra columns are dropped, so every task of a phase runs one kernel shape.
      const int64_t n_cols = tp.in_place ? q1 - q0 : width;
      if constexpr (std::is_same_v<scalar_t, float>) {
        if (into_output) c = out + n * ol.n + (g * Cout_g + co0) * ol.c + q0, ldc = ol.c;
      }
      for (int64_t r = 0; r < rows; ++r) std::fill_n(c + r * ldc, n_cols, bias_f[g * Cout_g + co0 + r]);
      const scalar_t* image = tp.data + n * tp.image + g * tp.group;
      const scalar_t* a_tap = tw.data.get() + (g * tw.taps_per_group + tw.phase_start[i * n_pw + j]) * tw.matrix +
                              co0 * K;
      for (const Tap& a : ph.taps) {
        const Split sa = split(a.offset, pl.step_h);
        for (const Tap& b : pw.taps) {
          const Split sb = split(b.offset, pl.step_w);
          const scalar_t* run = image + (sa.r * pl.step_w + sb.r) * tp.residue +
                                ((sa.q - pl.min_h) * pl.Wp + (sb.q - pl.min_w) + q0) * tp.per_position;
          if (paired || K <= kTapChunk) {
            dtype_brgemm(rows, n_cols, K, K, tp.ld_b, ldc, true, a_tap, run, c);
          } else {
            // float32 over more than kTapChunk channels: each chunk summed from zero and added to C, as
            // the chassis chunks its taps (one running sum over thousands of channels would drift
            // where the operands share a sign).
            for (int64_t k0 = 0; k0 < K; k0 += kTapChunk) {
              const int64_t kc = std::min(kTapChunk, K - k0);
              dtype_brgemm(rows, n_cols, kc, K, tp.ld_b, kPositions, false, a_tap + k0, run + k0 * tp.ld_b,
                           part.get());
              for (int64_t r = 0; r < rows; ++r) {
                for (int64_t i = 0; i < n_cols; ++i) c[r * ldc + i] += part[r * kPositions + i];
              }
            }
          }
          a_tap += tw.matrix;
        }
      }
      if (into_output) continue;
      // Grid position q = jh * Wp + jw is output (r_h + out_step_h * jh, r_w + out_step_w * jw).
      const int64_t step = ax_w.out_step * ol.w;
      for (int64_t q = q0; q < q1;) {
        const int64_t jh = q / pl.Wp, jw = q % pl.Wp, run_end = std::min(q1, (jh + 1) * pl.Wp);
        const int64_t count = std::max<int64_t>(0, std::min(run_end - q, pw.count - jw));
        for (int64_t r = 0; count > 0 && r < rows; ++r) {
          scalar_t* dst = out + n * ol.n + (g * Cout_g + co0 + r) * ol.c + (ph.r + ax_h.out_step * jh) * ol.h +
                          (pw.r + ax_w.out_step * jw) * ol.w;
          store_row<scalar_t>(c + r * kPositions + (q - q0), dst, step, count);
        }
        q = run_end;
      }
    }
    cpublas::brgemm_release(paired);
  });
  return done;
}

#else

template <typename scalar_t>
bool tap_brgemm_serves(const Problem&, const PaddedPlanes&) {
  return false;
}

#endif

}  // namespace CPU_CAPABILITY
}  // namespace fuel
