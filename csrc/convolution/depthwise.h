// The depthwise kernel: conv2d where every output channel reads one input channel (x.dim[1] ==
// groups; weight.dim[1] == 1), any stride, padding, dilation and depth multiplier.
//
// The general chassis would gather Kh * Kw copies of the input for only Kh * Kw multiply-adds per
// output. Here each task widens the input rows it needs once into zero-padded lines (split into
// stride phases, so that every tap reads a contiguous run), and every output vector is a chain over
// the taps read straight from those lines. The sum runs in exactly the chassis order (blocks of
// kBlock taps as fused chains, the first from the bias; blocks added in turn; chunks of kTapChunk),
// so results are the bits the chassis gives. channels_last operands with one output channel per
// input channel run along the channels instead (convolve_depthwise_nhwc), in the same order.
#pragma once

#include <cstdint>
#include <utility>

#include "kernel_common.h"
#include "kernel_table.h"

namespace fuel {
namespace CPU_CAPABILITY {
namespace depthwise_detail {

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// Lanes [a, b) of a vector, a and b clamped to its lanes.
template <int V>
inline uint32_t lanes_between(int64_t a, int64_t b) {
  const int lo = static_cast<int>(std::clamp<int64_t>(a, 0, V)), hi = static_cast<int>(std::clamp<int64_t>(b, lo, V));
  return static_cast<uint32_t>((uint64_t(1) << hi) - (uint64_t(1) << lo));
}
#endif

#if defined(CPU_CAPABILITY_AVX2)
// AVX2's masked loads take 32- and 64-bit lanes: float and double only (the caller's check).
template <typename scalar_t>
inline constexpr bool kMaskedLoads = !is_half<scalar_t>;

// As the AVX-512 load below: the lanes outside `lanes` zero and not read (vmaskmov does not fault
// on them).
template <typename scalar_t>
inline Vectorized<scalar_t> load_widened_lanes(const scalar_t* src, uint32_t lanes) {
  static_assert(kMaskedLoads<scalar_t>);
  constexpr uint32_t all = (1u << Vectorized<scalar_t>::size()) - 1;
  if ((lanes & all) == all) return Vectorized<scalar_t>::loadu(src);
  if constexpr (std::is_same_v<scalar_t, float>) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(lanes)), bit), bit);
    return _mm256_maskload_ps(src, set);
  } else {
    const __m256i bit = _mm256_setr_epi64x(1, 2, 4, 8);
    const __m256i set = _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_set1_epi64x(lanes), bit), bit);
    return _mm256_maskload_pd(src, set);
  }
}

// Lanes kFirst, kFirst + 2, ... of lo followed by those of hi (as the AVX-512 version below).
template <int kFirst>
inline Vectorized<float> every_other_lane(const Vectorized<float>& lo, const Vectorized<float>& hi) {
  // Within each 128-bit half: lo's two lanes then hi's; the 64-bit permute puts lo's pairs first.
  const __m256 pairs = kFirst == 0 ? _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))
                                   : _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(pairs), _MM_SHUFFLE(3, 1, 2, 0)));
}
template <int kFirst>
inline Vectorized<double> every_other_lane(const Vectorized<double>& lo, const Vectorized<double>& hi) {
  const __m256d pairs = kFirst == 0 ? _mm256_unpacklo_pd(lo, hi) : _mm256_unpackhi_pd(lo, hi);
  return _mm256_permute4x64_pd(pairs, _MM_SHUFFLE(3, 1, 2, 0));
}
#endif

#if defined(CPU_CAPABILITY_AVX512)
template <typename scalar_t>
inline constexpr bool kMaskedLoads = true;

// The V elements from src widened to acc_t, those outside `lanes` zero and not read (a masked
// load does not fault on them, so src may start before a row or end past the tensor).
template <typename scalar_t>
inline Vectorized<acc_type<scalar_t>> load_widened_lanes(const scalar_t* src, uint32_t lanes) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>(lanes), src);
  } else if constexpr (std::is_same_v<scalar_t, double>) {
    return _mm512_maskz_loadu_pd(static_cast<__mmask8>(lanes), src);
  } else {
    const __m256i bits = _mm256_maskz_loadu_epi16(static_cast<__mmask16>(lanes), src);
    if constexpr (std::is_same_v<scalar_t, at::Half>) return _mm512_cvtph_ps(bits);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));  // a bfloat16 is a float's top half
  }
}

// Lanes kFirst, kFirst + 2, ... of lo followed by those of hi.
template <int kFirst>
inline Vectorized<float> every_other_lane(const Vectorized<float>& lo, const Vectorized<float>& hi) {
  const __m512i lanes = _mm512_add_epi32(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
                                         _mm512_set1_epi32(kFirst));
  return _mm512_permutex2var_ps(lo, lanes, hi);
}
template <int kFirst>
inline Vectorized<double> every_other_lane(const Vectorized<double>& lo, const Vectorized<double>& hi) {
  const __m512i lanes = _mm512_add_epi64(_mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), _mm512_set1_epi64(kFirst));
  return _mm512_permutex2var_pd(lo, lanes, hi);
}
#endif

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// widen_lines for unit column steps of a contiguous row: every vector of a line is one store, of
// zeros or of one masked load (the padding's lanes masked off, their masks worked out once). Per
// row, zeroing the padding and copying the row in loops of a few vectors and a tail took 0.29 of
// 0.83 ms of a 4x128x56x56 float32 call on a Zen 4 (measured by leaving the lines unwritten), and
// as much with the input in L2; this takes 0.72-0.74 ms in all. At AVX2 the same call went 1.11 ->
// 0.95 ms at 1 thread on a Zen 3 (0.59-0.73 -> 0.49-0.51 at 2): the row copy's stores, a float
// after each line's vector boundary, split cache lines. The widening is exact either way.
template <typename scalar_t, typename acc_t>
void widen_unit_step_lines(const scalar_t* plane, const Layout& xl, const Problem& p, int64_t ih0, int64_t rows,
                           int64_t len, int64_t lo, int64_t hi, acc_t* lines) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  const int64_t pw = p.padding[1];
  // x's columns fill the vectors [full_begin, full_end) whole; the one before them and the one
  // after hold its first and last columns beside padding; the others hold padding only. The
  // masks are the same for every row.
  const int64_t full_begin = (lo + V - 1) / V * V, full_end = std::max(full_begin, hi / V * V);
  const uint32_t first_lanes = lanes_between<V>(lo - (full_begin - V), hi - (full_begin - V));
  const uint32_t last_lanes = lanes_between<V>(lo - full_end, hi - full_end);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t ih = ih0 + row;
    acc_t* line = lines + row * len;
    if (ih < 0 || ih >= p.H) {
      zero(line, len);
      continue;
    }
    // Column j of the line is x's column j - pw, worked out on addresses: the first vector's
    // may start before the row.
    const auto row_start = reinterpret_cast<uintptr_t>(plane + ih * xl.h);
    const auto at = [&](int64_t j) { return reinterpret_cast<const scalar_t*>(row_start + (j - pw) * int64_t(sizeof(scalar_t))); };
    int64_t j = 0;
    for (; j + V < full_begin; j += V) Vec(acc_t(0)).store(line + j);
    if (j < full_begin) load_widened_lanes<scalar_t>(at(j), first_lanes).store(line + j), j += V;
    for (; j < full_end; j += V) load_widened_lanes<scalar_t>(at(j), ~0u).store(line + j);
    if (j < len) load_widened_lanes<scalar_t>(at(j), last_lanes).store(line + j), j += V;
    for (; j < len; j += V) Vec(acc_t(0)).store(line + j);
  }
}

// widen_lines for column stride 2 of a contiguous row: a vector of each phase's line takes every
// other element of the same two masked loads (columns outside the row masked off, so read as
// zeros), by one permute. Element by element, a 4x128x56x56 float32 3x3 at stride 2 took 1.15 ms
// at 1 thread on a Zen 4 (0.62 now); at AVX2 (float and double) 1.3-1.5 -> 0.86 ms on a Zen 3. The
// widening is exact either way, so the bits are the same.
template <typename scalar_t, typename acc_t>
void widen_stride2_lines(const scalar_t* plane, const Layout& xl, const Problem& p, int64_t ih0, int64_t rows,
                         int64_t len, acc_t* lines) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  const int64_t W = p.W, pw = p.padding[1];
  const auto load = [&](uintptr_t row_start, int64_t column) {  // x's columns [column, column + V)
    const auto* src = reinterpret_cast<const scalar_t*>(row_start + column * int64_t(sizeof(scalar_t)));
    return load_widened_lanes<scalar_t>(src, column >= 0 && column + V <= W ? ~0u : lanes_between<V>(-column, W - column));
  };
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t ih = ih0 + row;
    acc_t* const line = lines + row * 2 * len;
    if (ih < 0 || ih >= p.H) {
      zero(line, 2 * len);
      continue;
    }
    const auto row_start = reinterpret_cast<uintptr_t>(plane + ih * xl.h);
    for (int64_t j = 0; j < len; j += V) {
      const Vec lo = load(row_start, 2 * j - pw), hi = load(row_start, 2 * j - pw + V);  // phase 0's lane 0 on
      every_other_lane<0>(lo, hi).store(line + j);
      every_other_lane<1>(lo, hi).store(line + len + j);
    }
  }
}
#endif

// Input lines for one task: for each input row ih in [ih0, ih0 + rows) and each stride phase r,
// line[(row * sw + r) * len + j] = x[ih][sw * j + r - pw] (zero outside the input).
template <typename scalar_t, typename acc_t>
void widen_lines(const scalar_t* plane, const Layout& xl, const Problem& p, int64_t ih0, int64_t rows, int64_t len,
                 acc_t* lines) {
  const int64_t sw = p.stride[1], pw = p.padding[1];
  // Phase by phase, so that each phase's column range is worked out once per task (its divisions
  // cost about what copying a row does).
  for (int64_t r = 0; r < sw; ++r) {
    // j reads column sw * j + r - pw, inside [0, W) for j in [lo, hi). The last such column's
    // numerator is negative where W = 0 or r > W - 1 + pw: then there is none (a truncating
    // division would have let j = 0 read column r - pw of an empty row).
    const int64_t lo = std::clamp<int64_t>((pw - r + sw - 1) / sw, 0, len);
    const int64_t last = p.W - 1 + pw - r;
    const int64_t hi = last < 0 ? lo : std::clamp<int64_t>(last / sw + 1, lo, len);
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    if constexpr (kMaskedLoads<scalar_t>) {
      if (sw == 1 && xl.w == 1) return widen_unit_step_lines<scalar_t, acc_t>(plane, xl, p, ih0, rows, len, lo, hi, lines);
      if (sw == 2 && xl.w == 1) return widen_stride2_lines<scalar_t, acc_t>(plane, xl, p, ih0, rows, len, lines);
    }
#endif
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t ih = ih0 + row;
      acc_t* line = lines + (row * sw + r) * len;
      if (ih < 0 || ih >= p.H) {
        zero(line, len);
        continue;
      }
      const scalar_t* src = plane + ih * xl.h;
      zero(line, lo);
      if (sw == 1 && xl.w == 1) {
        widen<scalar_t>(src + lo - pw, line + lo, hi - lo);
      } else {
        for (int64_t j = lo; j < hi; ++j) line[j] = static_cast<acc_t>(src[(sw * j + r - pw) * xl.w]);
      }
      zero(line + hi, len - hi);
    }
  }
}

// Stores the first `valid` columns of a row's NV vectors at dst (all of them where valid covers
// them): a row written in place ends inside its last vector (56 columns are three vectors and a
// half). A half output is rounded by the vector code narrow() uses, lane by lane, so the bits are
// narrow()'s; two vectors at a time, as narrow() does (one at a time, with a vector of zeros
// rounded beside each, the rounding took about as long as a bfloat16 3x3's multiply-adds).
template <typename out_t, typename acc_t, int NV>
inline void store_valid(const Vectorized<acc_t> (&v)[NV], out_t* dst, int64_t valid) {
  constexpr int64_t V = Vectorized<acc_t>::size();
  if constexpr (std::is_same_v<out_t, acc_t>) {
    for (int i = 0; i < NV; ++i) {
      const int64_t n = valid - i * V;  // columns from this vector on to store
      if (n >= V) v[i].store(dst + i * V);
      else if (n > 0) v[i].store(dst + i * V, static_cast<int>(n));
    }
  } else {
    for (int i = 0; i < NV && valid > i * V; i += 2) {
      const bool pair = i + 1 < NV;
      at::vec::convert_from_float<out_t>(v[i], pair ? v[i + 1] : Vectorized<float>(0.f))
          .store(dst + i * V, std::min(valid - i * V, pair ? 2 * V : V));
    }
  }
}

// NV independent sums in the chassis order (see the file comment), chain v reading tap t's input
// at tap_run(t, v), weighted by w[t] (a broadcast weight along an NCHW row; a vector of channels'
// weights channels_last). kTaps > 0 fixes the tap count at compile time (the common 3x3 and 5x5
// kernels): the loops unroll, the same operations in the same order. `load` reads a tap's vector.
struct WholeVectorLoad {
  template <typename T>
  Vectorized<T> operator()(const T* src) const {
    return Vectorized<T>::loadu(src);
  }
};

template <typename acc_t, int NV, int kTaps, typename TapRun, typename Load = WholeVectorLoad>
inline void chain_sums(const TapRun& tap_run, const Vectorized<acc_t>* w, int64_t runtime_taps,
                       const Vectorized<acc_t>& bias, Vectorized<acc_t> (&total)[NV], const Load& load = Load{}) {
  using Vec = Vectorized<acc_t>;
  if constexpr (kTaps > 0 && kTaps <= kBlock) {
    // One block of one chunk: the chain from the bias, then the chunk's sum from zero (0 + chain,
    // which turns a -0 into +0 exactly as the general order does).
    for (int v = 0; v < NV; ++v) total[v] = bias;
#pragma GCC unroll 16
    for (int t = 0; t < kTaps; ++t) {
      for (int v = 0; v < NV; ++v) total[v] = at::vec::fmadd(w[t], load(tap_run(t, v)), total[v]);
    }
    for (int v = 0; v < NV; ++v) total[v] = Vec(acc_t(0)) + total[v];
    return;
  }
  const int64_t n_taps = kTaps > 0 ? kTaps : runtime_taps;
  Vec chunk[NV], acc[NV];
  for (int v = 0; v < NV; ++v) total[v] = bias;
  for (int64_t c0 = 0; c0 < n_taps; c0 += kTapChunk) {
    const int64_t c1 = std::min(n_taps, c0 + kTapChunk);
    for (int v = 0; v < NV; ++v) chunk[v] = Vec(acc_t(0));
    for (int64_t b0 = c0; b0 < c1; b0 += kBlock) {
      const int64_t b1 = std::min(c1, b0 + kBlock);
      for (int v = 0; v < NV; ++v) acc[v] = b0 == 0 ? total[v] : Vec(acc_t(0));
      for (int64_t t = b0; t < b1; ++t) {
        for (int v = 0; v < NV; ++v) acc[v] = at::vec::fmadd(w[t], load(tap_run(t, v)), acc[v]);
      }
      for (int v = 0; v < NV; ++v) chunk[v] = chunk[v] + acc[v];
    }
    for (int v = 0; v < NV; ++v) total[v] = c0 == 0 ? chunk[v] : total[v] + chunk[v];
  }
}

// v, in a register the compiler may not refill from memory: GCC folds a load into each
// multiply-add that reads it (a memory operand costs no instruction), and loads held once in
// registers went back to one load per multiply-add.
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
template <typename acc_t>
inline Vectorized<acc_t> held(Vectorized<acc_t> v) {
#if defined(CPU_CAPABILITY_AVX512)
  using Raw = std::conditional_t<std::is_same_v<acc_t, float>, __m512, __m512d>;
  Raw r = v;
  asm("" : "+v"(r));  // any of the 32 vector registers
#else
  using Raw = std::conditional_t<std::is_same_v<acc_t, float>, __m256, __m256d>;
  Raw r = v;
  asm("" : "+x"(r));
#endif
  return r;
}
#else
template <typename Vec>
inline Vec held(Vec v) {
  return v;
}
#endif

// NV output vectors of one output row, starting at column ow0, of which the first `valid` columns
// are stored; taps[t] is the offset of tap t's run inside the task's lines, w[t] its weight
// (broadcast).
template <typename acc_t, int NV, int kTaps>
inline void row_vectors(const acc_t* lines, const int64_t* taps, const Vectorized<acc_t>* w, int64_t runtime_taps,
                        acc_t bias, int64_t ow0, acc_t* result, int64_t valid) {
  Vectorized<acc_t> total[NV];
  constexpr int64_t V = Vectorized<acc_t>::size();
  const auto tap_run = [&](int64_t t, int v) { return lines + ow0 + taps[t] + v * V; };
  chain_sums<acc_t, NV, kTaps>(tap_run, w, runtime_taps, Vectorized<acc_t>(bias), total);
  store_valid(total, result, valid);
}

// Two output rows, NV vectors of each from column ow0, for a kKh x kKw kernel whose rows step one
// input row per output row (stride and dilation 1 down the columns): the lower row's tap (kh, kw)
// reads the upper row's tap (kh + 1, kw), so each input vector serves both rows' chains (a 3x3
// pair reads 12 input vectors per two output vectors, not 18; with per-phase column ranges in
// widen_lines, a 4x128x56x56 float32 depthwise went from 0.64-1.0 to 0.48-0.55 ms at 2 threads on a
// Zen 3). Each row's chain runs its taps in the order row_vectors does (one block: kKh * kKw <=
// kBlock), so the bits are the same.
template <typename acc_t, int NV, int kKh, int kKw>
inline void row_pair_vectors(const acc_t* lines, const int64_t* taps, int64_t row_step, const Vectorized<acc_t>* w,
                             acc_t bias, int64_t ow0, acc_t* upper, acc_t* lower, int64_t valid) {
  static_assert(kKh * kKw <= kBlock);
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  Vec top[NV], bottom[NV];
  for (int v = 0; v < NV; ++v) top[v] = bottom[v] = Vec(bias);
#pragma GCC unroll 8
  for (int r = 0; r <= kKh; ++r) {
#pragma GCC unroll 8
    for (int kw = 0; kw < kKw; ++kw) {
      const int64_t offset = r < kKh ? taps[r * kKw + kw] : taps[(kKh - 1) * kKw + kw] + row_step;
      const acc_t* run = lines + offset + ow0;
      for (int v = 0; v < NV; ++v) {
        const Vec in = Vec::loadu(run + v * V);
        if (r < kKh) top[v] = at::vec::fmadd(w[r * kKw + kw], in, top[v]);
        if (r > 0) bottom[v] = at::vec::fmadd(w[(r - 1) * kKw + kw], in, bottom[v]);
      }
    }
  }
  for (int v = 0; v < NV; ++v) top[v] = Vec(acc_t(0)) + top[v], bottom[v] = Vec(acc_t(0)) + bottom[v];
  store_valid(top, upper, valid);
  store_valid(bottom, lower, valid);
}

#if defined(CPU_CAPABILITY_AVX512)
// Lanes kShift.. of lo followed by the first kShift lanes of hi: the vector that starts kShift
// columns after lo, built from two aligned loads.
template <int kShift>
inline Vectorized<float> columns_from(const Vectorized<float>& lo, const Vectorized<float>& hi) {
  return _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(hi), _mm512_castps_si512(lo), kShift));
}
template <int kShift>
inline Vectorized<double> columns_from(const Vectorized<double>& lo, const Vectorized<double>& hi) {
  return _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(hi), _mm512_castpd_si512(lo), kShift));
}

// columns_from with the lanes outside `lanes` zero.
template <int kShift>
inline Vectorized<float> columns_from_masked(uint32_t lanes, const Vectorized<float>& lo, const Vectorized<float>& hi) {
  return _mm512_castsi512_ps(_mm512_maskz_alignr_epi32(static_cast<__mmask16>(lanes), _mm512_castps_si512(hi),
                                                       _mm512_castps_si512(lo), kShift));
}
template <int kShift>
inline Vectorized<double> columns_from_masked(uint32_t lanes, const Vectorized<double>& lo, const Vectorized<double>& hi) {
  return _mm512_castsi512_pd(_mm512_maskz_alignr_epi64(static_cast<__mmask8>(lanes), _mm512_castpd_si512(hi),
                                                       _mm512_castpd_si512(lo), kShift));
}

// row_pair_vectors where the taps of a kernel row are adjacent columns of one line (stride and
// dilation 1 along the row) and the lines are aligned to whole vectors: each input vector is loaded
// aligned once and the taps' shifted vectors are built in registers. Loaded at each tap's column,
// all but a sixteenth of the kw > 0 loads straddled two cache lines, and the loads, not the
// multiply-adds, set the pace (a 3x3 pair took 70 cycles, in L1, for 36 cycles of multiply-adds).
// The same products in the same order as row_pair_vectors, so the same bits.
template <typename acc_t, typename out_t, int NV, int kKh, int kKw>
inline void row_pair_aligned(const acc_t* lines, int64_t len, const Vectorized<acc_t>* w, acc_t bias, int64_t ow0,
                             out_t* upper, out_t* lower, int64_t valid) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  static_assert(kKh * kKw <= kBlock && kKw <= V);
  Vec top[NV], bottom[NV];
  for (int v = 0; v < NV; ++v) top[v] = bottom[v] = Vec(bias);
#pragma GCC unroll 8
  for (int r = 0; r <= kKh; ++r) {
    const acc_t* line = lines + r * len + ow0;
    Vec in[NV + 1];
    for (int v = 0; v <= NV; ++v) in[v] = Vec::loadu(line + v * V);  // aligned addresses
    [&]<int... kw>(std::integer_sequence<int, kw...>) {
      ([&] {
        for (int v = 0; v < NV; ++v) {
          const Vec column = kw == 0 ? in[v] : columns_from<kw>(in[v], in[v + 1]);
          if (r < kKh) top[v] = at::vec::fmadd(w[r * kKw + kw], column, top[v]);
          if (r > 0) bottom[v] = at::vec::fmadd(w[(r - 1) * kKw + kw], column, bottom[v]);
        }
      }(), ...);
    }(std::make_integer_sequence<int, kKw>{});
  }
  for (int v = 0; v < NV; ++v) top[v] = Vec(acc_t(0)) + top[v], bottom[v] = Vec(acc_t(0)) + bottom[v];
  store_valid(top, upper, valid);
  store_valid(bottom, lower, valid);
}

// The lanes of an output vector from column c0 of a row whose tap `shift` columns to the right
// (kw - pw) lies inside its row. W >= V, so the vector reaches into one more row at most.
template <int V>
inline uint32_t lanes_inside_row(int64_t c0, int64_t W, int64_t shift) {
  return lanes_between<V>(-shift - c0, std::min(W - c0, W - c0 - shift)) |
         lanes_between<V>(std::max(W - c0, W - c0 - shift), 2 * W - c0 - shift);
}

#endif

// f(std::integral_constant<int, 0>) ... f(std::integral_constant<int, N - 1>), in turn. Arrays of
// vectors indexed only by such constants stay in registers: indexed in `#pragma GCC unroll` loops, a
// channels_last depthwise block's eight sums went to memory after every kernel row, and reading x in
// place instead of a widened ring was no faster (a float32 4x128x56x56 3x3 at 1 thread on a Zen 4:
// 0.53-0.64 ms either way; 0.39-0.54 with the sums held).
template <int N, typename F>
__attribute__((always_inline)) inline void for_each_index(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) __attribute__((always_inline)) {
    (f(std::integral_constant<int, I>{}), ...);
  }(std::make_integer_sequence<int, N>{});
}

// f(std::integral_constant<int, count>) for a count in [1, N], chosen at run time.
template <int N, typename F>
inline void with_count(int64_t count, F&& f) {
  if constexpr (N > 0) {
    if (count == N) return f(std::integral_constant<int, N>{});
    with_count<N - 1>(count, f);
  }
}

// One output row of a task, up to kChains vectors at a time as independent chains: a chain waits
// out each multiply-add's latency (Kh * Kw of them in a row), so a row of a typical width (56 =
// seven vectors) goes as one group, not as four and three (with the unrolled 3x3 chain, the rows'
// share of a 4x128x56x56 call fell from 55% to 39%, perf).
constexpr int kChains = 8;
template <typename acc_t, int kTaps>
inline void output_row(const acc_t* row_lines, const int64_t* taps, const Vectorized<acc_t>* w, int64_t n_taps,
                       acc_t bias, int64_t Wv, int64_t valid, acc_t* row) {
  constexpr int64_t V = Vectorized<acc_t>::size();
  int64_t ow = 0;
  for (; ow + kChains * V <= Wv; ow += kChains * V) {
    row_vectors<acc_t, kChains, kTaps>(row_lines, taps, w, n_taps, bias, ow, row + ow, valid - ow);
  }
  with_count<kChains - 1>((Wv - ow) / V, [&](auto chains) {
    row_vectors<acc_t, decltype(chains)::value, kTaps>(row_lines, taps, w, n_taps, bias, ow, row + ow, valid - ow);
  });
}

// Two output rows of a task as pairs (row_pair_vectors), up to kPairChains vectors of each at a
// time: twice that many chains, what the single row keeps in flight, within the 16 vector registers.
constexpr int kPairChains = 4;

#if defined(CPU_CAPABILITY_AVX512)
// output_row_pair by row_pair_aligned, into rows of the output's type: a bfloat16 or half NCHW
// output is rounded in registers and written in place, not through a buffer.
template <typename acc_t, typename out_t, int kKh, int kKw>
inline void output_row_pair_aligned(const acc_t* row_lines, int64_t row_step, const Vectorized<acc_t>* w, acc_t bias,
                                    int64_t Wv, int64_t valid, out_t* upper, out_t* lower) {
  constexpr int64_t V = Vectorized<acc_t>::size();
  int64_t ow = 0;
  for (; ow + kPairChains * V <= Wv; ow += kPairChains * V) {
    row_pair_aligned<acc_t, out_t, kPairChains, kKh, kKw>(row_lines, row_step, w, bias, ow, upper + ow, lower + ow,
                                                          valid - ow);
  }
  with_count<kPairChains - 1>((Wv - ow) / V, [&](auto chains) {
    row_pair_aligned<acc_t, out_t, decltype(chains)::value, kKh, kKw>(row_lines, row_step, w, bias, ow, upper + ow,
                                                                      lower + ow, valid - ow);
  });
}
#endif

template <typename acc_t, int kKh, int kKw>
inline void output_row_pair(const acc_t* row_lines, const int64_t* taps, int64_t row_step,
                            const Vectorized<acc_t>* w, acc_t bias, int64_t Wv, int64_t valid, acc_t* upper,
                            acc_t* lower, bool aligned) {
  constexpr int64_t V = Vectorized<acc_t>::size();
  int64_t ow = 0;
#if defined(CPU_CAPABILITY_AVX512)
  if (aligned) return output_row_pair_aligned<acc_t, acc_t, kKh, kKw>(row_lines, row_step, w, bias, Wv, valid, upper, lower);
#endif
  for (; ow + kPairChains * V <= Wv; ow += kPairChains * V) {
    row_pair_vectors<acc_t, kPairChains, kKh, kKw>(row_lines, taps, row_step, w, bias, ow, upper + ow, lower + ow,
                                                   valid - ow);
  }
  with_count<kPairChains - 1>((Wv - ow) / V, [&](auto chains) {
    row_pair_vectors<acc_t, decltype(chains)::value, kKh, kKw>(row_lines, taps, row_step, w, bias, ow, upper + ow,
                                                               lower + ow, valid - ow);
  });
}

}  // namespace depthwise_detail

// A depthwise convolution does only Kh * Kw multiply-adds per input element, so a task would
// mostly wait on its input (read once from memory, as the whole of x is) and on its output's cache
// lines. The next task's input, and its output rows for writing, are therefore fetched while this
// one computes, a share of them per output row.
template <bool kForWrite>
struct NextRange {
  const char *cursor = nullptr, *end = nullptr;
  int64_t per_step = 0;
  void start(std::pair<const char*, const char*> range, int64_t steps) {
    cursor = range.first, end = range.second;
    per_step = cursor ? ((end - cursor) / std::max<int64_t>(1, steps) + 63) / 64 * 64 : 0;
  }
  void step() {
    const char* stop = cursor + std::min<int64_t>(per_step, end - cursor);
    for (; cursor < stop; cursor += 64) __builtin_prefetch(cursor, kForWrite ? 1 : 0);
  }
};

inline bool is_depthwise(const Problem& p) {
  return !p.transpose && p.groups == p.Cin && p.Cin > 0;
}

namespace depthwise_detail {

// A call's geometry, worked out once.
struct DepthwisePlan {
  int64_t n_taps = 0, Wv = 0, len = 0, rows_per_task = 0, row_blocks = 0, tasks = 0, work = 0, row_step = 0;
  bool rows_in_place = false;
  bool aligned_pairs = false;  // row pairs from aligned loads (row_pair_aligned)
  bool half_pairs_in_place = false;  // and, for a half NCHW output, rounded in registers into it
  bool reads_x_in_place = false;  // depthwise_rows_in_place, without lines
  std::vector<uint32_t> column_lanes;  // its masks: [column of a vector's first lane][kw]
  // Where each tap's run starts in the lines of a task's first output row; output row oh of the
  // task reads the same offsets sh input rows (sh * sw lines) further on per row. Computed once:
  // per row, its divisions cost more than the row's multiply-adds.
  std::vector<int64_t> taps;
};

// The widest rows read in place: its masks, a row's columns times the kernel's, stay a small table
// (80 KB for a 5x5), where a row of 10^8 columns would have asked for gigabytes.
constexpr int64_t kInPlaceWidest = 4096;

template <typename scalar_t>
DepthwisePlan plan_depthwise(const Problem& p, const Layout& xl, const Layout& ol) {
  using acc_t = acc_type<scalar_t>;
  constexpr int64_t V = Vectorized<acc_t>::size();
  const int64_t sw = p.stride[1], sh = p.stride[0];
  DepthwisePlan plan;
  plan.n_taps = p.Kh * p.Kw;
  plan.Wv = (p.Wo + V - 1) / V * V;  // output columns rounded up to whole vectors
  // A line holds every column a vector of the last block reads: j up to Wv + (Kw - 1) * dw / sw.
  // Whole vectors, so that every line of a task starts on a vector boundary.
  plan.len = (plan.Wv + ((p.Kw - 1) * p.dilation[1]) / sw + 1 + V - 1) / V * V;
  // Output rows per task: enough to amortize the lines, few enough to keep them in L2.
  plan.rows_per_task = std::clamp<int64_t>(
      (kScratchBytes / static_cast<int64_t>(sizeof(acc_t)) / std::max<int64_t>(1, sw * plan.len)) / std::max<int64_t>(1, sh),
      1, p.Ho);
  plan.row_blocks = (p.Ho + plan.rows_per_task - 1) / plan.rows_per_task;
  plan.tasks = p.N * p.Cout * plan.row_blocks;
  plan.work = std::max<int64_t>(1, plan.rows_per_task * plan.Wv * plan.n_taps);
  plan.taps.resize(plan.n_taps);
  for (int64_t kh = 0; kh < p.Kh; ++kh) {
    for (int64_t kw = 0; kw < p.Kw; ++kw) {
      const int64_t off = kw * p.dilation[1];
      plan.taps[kh * p.Kw + kw] = (kh * p.dilation[0] * sw + off % sw) * plan.len + off / sw;
    }
  }
  plan.row_step = sh * sw * plan.len;
  // A float NCHW output row is written in place, its last vector under a mask where the row ends
  // inside it (through a buffer, a 56-column row's copy took a fifth of a 4x128x56x56 call on a
  // Zen 5); others go through a buffer.
  plan.rows_in_place = !is_half<scalar_t> && ol.w == 1;
#if defined(CPU_CAPABILITY_AVX512)
  plan.aligned_pairs = sw == 1 && p.dilation[1] == 1 && p.Kw <= V;
  plan.half_pairs_in_place = is_half<scalar_t> && plan.aligned_pairs && ol.w == 1;
  plan.reads_x_in_place = !is_half<scalar_t> && p.Kh == 3 && p.Kw == 3 && sw == 1 && sh == 1 && p.dilation[0] == 1 &&
                          p.dilation[1] == 1 && p.Wo == p.W && p.W >= V && p.W <= kInPlaceWidest && xl.w == 1 &&
                          xl.h == p.W && ol.w == 1 && ol.h == p.Wo;
  if (plan.reads_x_in_place) {
    plan.column_lanes.resize(p.W * p.Kw);
    for (int64_t c0 = 0; c0 < p.W; ++c0) {
      for (int64_t kw = 0; kw < p.Kw; ++kw) plan.column_lanes[c0 * p.Kw + kw] = lanes_inside_row<V>(c0, p.W, kw - p.padding[1]);
    }
  }
#endif
  return plan;
}

// A task: output channel co of image n, output rows [oh0, oh1).
struct DepthwiseTask {
  int64_t n, co, oh0, oh1;
};

inline DepthwiseTask depthwise_task(const Problem& p, const DepthwisePlan& plan, int64_t task) {
  const int64_t block = task % plan.row_blocks, oh0 = block * plan.rows_per_task;
  return {task / plan.row_blocks / p.Cout, task / plan.row_blocks % p.Cout, oh0, std::min(p.Ho, oh0 + plan.rows_per_task)};
}

// The input rows a task reads, as a byte range of x where they lie back to back (NCHW).
template <typename scalar_t>
std::pair<const char*, const char*> task_input(const Problem& p, const DepthwiseTask& t, const scalar_t* x,
                                               const Layout& xl) {
  if (xl.w != 1 || xl.h != p.W) return {nullptr, nullptr};
  const int64_t ih0 = std::max<int64_t>(0, t.oh0 * p.stride[0] - p.padding[0]);
  const int64_t ih1 = std::min(p.H, (t.oh1 - 1) * p.stride[0] - p.padding[0] + (p.Kh - 1) * p.dilation[0] + 1);
  if (ih1 <= ih0) return {nullptr, nullptr};
  const scalar_t* plane = x + t.n * xl.n + t.co / (p.Cout / p.groups) * xl.c;
  return {reinterpret_cast<const char*>(plane + ih0 * xl.h), reinterpret_cast<const char*>(plane + ih1 * xl.h)};
}

// The output rows a task writes, as a byte range where they lie back to back (NCHW).
template <typename scalar_t>
std::pair<const char*, const char*> task_output(const Problem& p, const DepthwiseTask& t,
                                                const scalar_t* out, const Layout& ol) {
  if (ol.w != 1 || ol.h != p.Wo) return {nullptr, nullptr};
  const scalar_t* plane = out + t.n * ol.n + t.co * ol.c;
  return {reinterpret_cast<const char*>(plane + t.oh0 * ol.h), reinterpret_cast<const char*>(plane + t.oh1 * ol.h)};
}

// A thread's buffers, reused from one task to the next.
template <typename acc_t>
struct DepthwiseBuffers {
  std::vector<acc_t> result;  // two output rows not written in place
  std::vector<Vectorized<acc_t>> weights;
  NextRange<false> prefetch;
  NextRange<true> prefetch_output;
  explicit DepthwiseBuffers(const DepthwisePlan& plan) : result(2 * plan.Wv), weights(plan.n_taps) {}
  // The task's input lines, `count` elements from a 64-byte boundary.
  acc_t* lines(int64_t count) {
    constexpr int64_t slack = 64 / sizeof(acc_t);
    if (static_cast<int64_t>(storage_.size()) < count + slack) storage_.resize(count + slack);
    const auto address = reinterpret_cast<uintptr_t>(storage_.data());
    return storage_.data() + ((64 - address % 64) % 64) / sizeof(acc_t);
  }

 private:
  std::vector<acc_t> storage_;
};

#if defined(CPU_CAPABILITY_AVX512)
// A task's output rows of a stride-1 3x3 kernel whose padding keeps the row width (Wo == W,
// W >= V), read straight from an NCHW x, without lines: the plane's positions P = row * W + column
// go V at a time across row ends, and tap (kh, kw) of each reads x's element P + (kh - ph) * W +
// (kw - pw). Lanes whose tap falls outside its row (the columns' padding) or outside the plane (the
// rows') read +0, masked, as a line's padding is read, and each chain runs the taps in
// row_pair_vectors' order, so the bits are the lines'. Per kernel row, NV + 2 loads serve the
// taps of NV vectors: the centre tap's as loaded, the others shifted in registers. float and
// double only: a half input would be widened at each of its kKh reads, where lines widen it once.
// On a Zen 4, 4x128x56x56 at 1 thread: float32 0.69-0.71 -> 0.57 ms (no widening, and no padding
// columns computed: 56 columns are 3.5 vectors); float64 2.1-2.2 -> 1.4-1.5; bfloat16 took 0.67
// against 0.62 on lines. With every tap shifted from loads at the first tap, float32 took 0.69-0.72.
// A 5x5 (four chains, its 25 weights in registers) took 1.27 ms against 1.15 on lines, float64 2.5
// against 2.2: its row pairs share four of six input rows, so 5x5s keep the lines.
template <typename scalar_t>
void depthwise_rows_in_place(const Problem& p, const DepthwisePlan& plan, const DepthwiseTask& t, const scalar_t* x_plane,
                             const Vectorized<acc_type<scalar_t>>* w, acc_type<scalar_t> bias, scalar_t* out_plane,
                             std::pair<const char*, const char*> next, std::pair<const char*, const char*> next_out,
                             DepthwiseBuffers<acc_type<scalar_t>>& buf) {
  using acc_t = acc_type<scalar_t>;
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  constexpr int kKh = 3, kKw = 3;
  constexpr int NV = 8;  // chains within the 32 vector registers, with the 9 weights
  const int64_t W = p.W, HW = p.H * p.W, ph = p.padding[0], pw = p.padding[1];
  const int64_t begin = t.oh0 * W, end = t.oh1 * W;
  const auto x_address = reinterpret_cast<uintptr_t>(x_plane);
  const auto x_at = [&](int64_t i) { return reinterpret_cast<const scalar_t*>(x_address + i * int64_t(sizeof(scalar_t))); };
  const int64_t groups = (end - begin + NV * V - 1) / (NV * V);
  buf.prefetch.start(next, groups);
  buf.prefetch_output.start(next_out, groups);
  int64_t column = 0;  // of the next vector's first position (a task starts on a row)
  for (int64_t p0 = begin; p0 < end; p0 += NV * V) {
    buf.prefetch.step(), buf.prefetch_output.step();
    uint32_t lanes[NV][kKw];
    for (int v = 0; v < NV; ++v) {
      for (int kw = 0; kw < kKw; ++kw) lanes[v][kw] = plan.column_lanes[column * kKw + kw];
      column += V;
      if (column >= W) column -= W;
    }
    Vec acc[NV];
    for (int v = 0; v < NV; ++v) acc[v] = Vec(bias);
#pragma GCC unroll 8
    for (int kh = 0; kh < kKh; ++kh) {
      // in[v + 1] is x under the centre tap of vector v's lanes; in[0] and in[NV + 1] border them.
      const int64_t q = p0 + (kh - ph) * W - V;
      Vec in[NV + 2];
      if (q >= 0 && q + (NV + 2) * V <= HW) {
        for (int v = 0; v < NV + 2; ++v) in[v] = load_widened_lanes<scalar_t>(x_at(q + v * V), ~0u);
      } else {
        for (int v = 0; v < NV + 2; ++v) {
          in[v] = load_widened_lanes<scalar_t>(x_at(q + v * V), lanes_between<V>(-(q + v * V), HW - (q + v * V)));
        }
      }
      [&]<int... kw>(std::integer_sequence<int, kw...>) {
        ([&] {
          constexpr int shift = kw - kKw / 2;  // columns right of the centre
          for (int v = 0; v < NV; ++v) {
            Vec column;
            if constexpr (shift == 0) {
              column = in[v + 1];
            } else if constexpr (shift > 0) {
              column = columns_from_masked<(shift > 0 ? shift : 1)>(lanes[v][kw], in[v + 1], in[v + 2]);
            } else {
              column = columns_from_masked<(shift < 0 ? V + shift : 1)>(lanes[v][kw], in[v], in[v + 1]);
            }
            acc[v] = at::vec::fmadd(w[kh * kKw + kw], column, acc[v]);
          }
        }(), ...);
      }(std::make_integer_sequence<int, kKw>{});
    }
    for (int v = 0; v < NV; ++v) acc[v] = Vec(acc_t(0)) + acc[v];
    store_valid(acc, out_plane + p0, end - p0);
  }
}
#endif

// One task's output rows. kTaps > 0 unrolls the chains (see row_vectors); kKh > 0 (the kernel is
// kKh x kTaps / kKh) takes rows in pairs where each steps one input row. next, next_out: the
// following task's input and output rows, fetched while this one computes (fetching the output
// rows too took a 4x128x56x56 float32 call from 0.70 to 0.55 ms at 1 thread on a Zen 5).
template <typename scalar_t, int kTaps, int kKh>
void run_depthwise_task(const Problem& p, const DepthwisePlan& plan, const DepthwiseTask& t,
                        std::pair<const char*, const char*> next, std::pair<const char*, const char*> next_out,
                        const scalar_t* x, const Layout& xl,
                        const scalar_t* weight, const int64_t* ws, const scalar_t* bias, scalar_t* out,
                        const Layout& ol, DepthwiseBuffers<acc_type<scalar_t>>& buf) {
  using acc_t = acc_type<scalar_t>;
  using Vec = Vectorized<acc_t>;
  constexpr int kKw = kKh > 0 ? kTaps / kKh : 0;
  const int64_t sh = p.stride[0], Wv = plan.Wv;
  for (int64_t tap = 0; tap < plan.n_taps; ++tap) {
    buf.weights[tap] = Vec(static_cast<acc_t>(weight[t.co * ws[0] + (tap / p.Kw) * ws[2] + (tap % p.Kw) * ws[3]]));
  }
  const acc_t b = bias ? static_cast<acc_t>(bias[t.co]) : acc_t(0);
  const scalar_t* x_plane = x + t.n * xl.n + t.co / (p.Cout / p.groups) * xl.c;
  scalar_t* plane = out + t.n * ol.n + t.co * ol.c;
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (kKh == 3 && kKw == 3 && !is_half<scalar_t>) {
    if (plan.reads_x_in_place) {
      return depthwise_rows_in_place<scalar_t>(p, plan, t, x_plane, buf.weights.data(), b, plane, next, next_out, buf);
    }
  }
#endif
  const int64_t in_rows = (t.oh1 - 1 - t.oh0) * sh + (p.Kh - 1) * p.dilation[0] + 1;
  acc_t* const lines = buf.lines(in_rows * p.stride[1] * plan.len);
  widen_lines<scalar_t, acc_t>(x_plane, xl, p, t.oh0 * sh - p.padding[0], in_rows, plan.len, lines);
  buf.prefetch.start(next, t.oh1 - t.oh0);
  buf.prefetch_output.start(next_out, t.oh1 - t.oh0);
  // Output row oh's accumulators: the row itself where it is written in place (only taken where
  // scalar_t is acc_t; the cast keeps the other instantiations compiling), else the `slot`-th row
  // of buf.result, stored by finish().
  const auto row_at = [&](int64_t oh, int64_t slot) {
    return plan.rows_in_place ? reinterpret_cast<acc_t*>(plane + oh * ol.h) : buf.result.data() + slot * Wv;
  };
  const auto finish = [&](int64_t oh, int64_t slot) {
    if (!plan.rows_in_place) store_row<scalar_t>(buf.result.data() + slot * Wv, plane + oh * ol.h, ol.w, p.Wo);
  };
  const int64_t valid = plan.rows_in_place ? p.Wo : Wv;  // columns of a row stored by the chains
  int64_t oh = t.oh0;
  if constexpr (kKh > 0) {
    for (; sh == 1 && p.dilation[0] == 1 && oh + 1 < t.oh1; oh += 2) {
      for (int row = 0; row < 2; ++row) buf.prefetch.step(), buf.prefetch_output.step();
#if defined(CPU_CAPABILITY_AVX512)
      if (plan.half_pairs_in_place) {
        output_row_pair_aligned<acc_t, scalar_t, kKh, kKw>(lines + (oh - t.oh0) * plan.row_step, plan.row_step,
                                                           buf.weights.data(), b, Wv, p.Wo, plane + oh * ol.h,
                                                           plane + (oh + 1) * ol.h);
        continue;
      }
#endif
      output_row_pair<acc_t, kKh, kKw>(lines + (oh - t.oh0) * plan.row_step, plan.taps.data(), plan.row_step,
                                       buf.weights.data(), b, Wv, valid, row_at(oh, 0), row_at(oh + 1, 1),
                                       plan.aligned_pairs);
      finish(oh, 0);
      finish(oh + 1, 1);
    }
  }
  for (; oh < t.oh1; ++oh) {
    buf.prefetch.step(), buf.prefetch_output.step();
    output_row<acc_t, kTaps>(lines + (oh - t.oh0) * plan.row_step, plan.taps.data(), buf.weights.data(), plan.n_taps,
                             b, Wv, valid, row_at(oh, 0));
    finish(oh, 0);
  }
}

// channels_last (x and out with their channels side by side) and one output channel per input
// channel: the vectors run along the channels, and every output vector of a pixel is a chain over
// the taps, each lane the sum the NCHW kernel forms for its channel, in the same order (a padding
// tap reads +0 there and here), so both layouts give the same bits. Through the NCHW kernel's
// strided gathers and scatters, a 4x128x56x56 float32 call took 5.4 ms at 1 thread on a Zen 4,
// four times torch's.
//
// A task: image n, a block of channels, a run of output rows. Each output row goes one channel
// vector at a time, a group of pixels (pixel_group) as independent chains, reading x where it lies
// (widened on the load for a half x): a tap outside the input loads a vector of +0 instead. With a
// kernel's geometry fixed at compile time (3x3 and 5x5 at column stride 1 or 2, column dilation 1),
// a tap's load is a kernel row's base and a constant displacement, and each kernel row's columns are
// loaded once for all the pixels (sliding_sums). Widening every input row once into a ring of
// zero-padded lines [vector][column][lane] first took a 4x128x56x56 float32 call 0.55-1.2 ms at 1
// thread on a Zen 4, half of it in the widening's loads of x, which wait on the cache one strided
// line at a time, where the multiply-adds' loads wait among the multiply-adds.
// Blocks of 128 floats took a bfloat16 call 0.77-0.96 ms, 64 0.97-1.18 and 32 0.98-2.05, in the
// same runs (with the ring): fewer rounding calls per pixel. float64 blocks are 64 channels, the
// same 512 bytes a pixel.
constexpr int64_t kNhwcBlock = 128;
#if defined(CPU_CAPABILITY_AVX2)
constexpr bool kPairRowsLevel = true;
#else
constexpr bool kPairRowsLevel = false;
#endif
constexpr int kPixelChains = Vectorized<float>::size() == 16 ? 8 : 4;  // within 32 (16) vector registers
// Channel vectors in a block: kNhwcBlock floats' bytes over the narrowest vector a level has.
constexpr int64_t kMaxNhwcVectors = kNhwcBlock * 4 / 32;

// Pixels per block of a kernel kKw wide at column stride kStride: kPixelChains, but 4 for a 5x5 at
// stride 2, whose 19 columns for 8 pixels would not stay in 32 registers (its 11 for 4 do: float32
// 4x240x28x28 at 1 thread on a Zen 4, 0.35 -> 0.17 ms, against the chains of one load per tap).
template <int kKw, int kStride>
constexpr int pixel_group() {
  return kStride == 2 && kKw == 5 && kPixelChains == 8 ? 4 : kPixelChains;
}

// Channels per task: whole vectors, at most kNhwcBlock floats' bytes.
template <typename acc_t>
int64_t nhwc_channel_block(int64_t channels) {
  constexpr int64_t V = Vectorized<acc_t>::size();
  return std::min(kNhwcBlock * 4 / int64_t(sizeof(acc_t)), (channels + V - 1) / V * V);
}

inline bool depthwise_channels_last(const Problem& p, const Layout& xl, const Layout& ol) {
  return xl.c == 1 && ol.c == 1 && p.Cout == p.Cin && p.Cin >= 2;
}

struct NhwcPlan {
  int64_t CB = 0, vectors = 0, blocks = 0, rows_per_task = 0, row_blocks = 0, tasks = 0;
};

// Tasks split the images' channel blocks first, then their rows, into a multiple of the thread
// count (at::parallel_for hands each thread an equal run of tasks). Which task computes an output
// does not change its sum.
template <typename acc_t>
NhwcPlan plan_depthwise_nhwc(const Problem& p) {
  NhwcPlan plan;
  plan.CB = nhwc_channel_block<acc_t>(p.Cin);
  plan.vectors = plan.CB / Vectorized<acc_t>::size();
  plan.blocks = (p.Cin + plan.CB - 1) / plan.CB;
  const int64_t images = p.N * plan.blocks, threads = at::get_num_threads();
  int64_t common = threads;  // gcd(images, threads)
  for (int64_t rest = images % common; rest != 0;) std::swap(common, rest), rest %= common;
  const int64_t wanted = threads / common;
  plan.rows_per_task = (p.Ho + wanted - 1) / wanted;
  plan.row_blocks = (p.Ho + plan.rows_per_task - 1) / plan.rows_per_task;
  plan.tasks = images * plan.row_blocks;
  return plan;
}

// The weights as [tap][channel] and the biases, in the accumulator type, zero past the channels.
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
std::pair<std::unique_ptr<acc_t[]>, std::unique_ptr<acc_t[]>> nhwc_weights(const Problem& p, const NhwcPlan& plan,
                                                                           const scalar_t* weight, const int64_t* ws,
                                                                           const scalar_t* bias) {
  const int64_t Cpad = plan.blocks * plan.CB, n_taps = p.Kh * p.Kw;
  auto weights = scratch<acc_t>(n_taps * Cpad), biases = scratch<acc_t>(Cpad);
  zero(weights.get(), n_taps * Cpad), zero(biases.get(), Cpad);
  for (int64_t c = 0; c < p.Cin; ++c) {
    for (int64_t t = 0; t < n_taps; ++t) {
      weights[t * Cpad + c] = static_cast<acc_t>(weight[c * ws[0] + (t / p.Kw) * ws[2] + (t % p.Kw) * ws[3]]);
    }
    if (bias) biases[c] = static_cast<acc_t>(bias[c]);
  }
  return {std::move(weights), std::move(biases)};
}

// One channel vector of a pixel: its loads, widened to acc_t (the vector's first `lanes` channels,
// +0 in the others, which are not read: the block's last vector may end past the tensor), and its
// stores (the first `lanes`).
template <typename scalar_t>
struct ChannelVector {
  using Vec = Vectorized<acc_type<scalar_t>>;
  static constexpr int64_t V = Vec::size();
  int64_t lanes = 0;
#if defined(CPU_CAPABILITY_AVX512)
  uint32_t mask = lanes_between<Vec::size()>(0, lanes);  // a masked load costs what a whole one does
  Vec operator()(const scalar_t* src) const { return load_widened_lanes(src, mask); }
#else
  Vec operator()(const scalar_t* src) const {
    if (lanes == Vec::size()) {
      if constexpr (!is_half<scalar_t>) {
        return Vec::loadu(src);
      } else {
        Vec whole;
        at::vec::load_to_float(src, whole);
        return whole;
      }
    }
    acc_type<scalar_t> part[Vec::size()] = {};
    widen(src, part, lanes);
    return Vec::loadu(part);
  }
#endif

  // Half `part` (0: lanes [0, V); 1: [V, 2V)) of two channel vectors rounded together.
  void store_part(const Vectorized<scalar_t>& both, int part, scalar_t* dst) const {
#if defined(CPU_CAPABILITY_AVX512)
    const __m512i bits = both;
    const __m256i half = part ? _mm512_extracti64x4_epi64(bits, 1) : _mm512_castsi512_si256(bits);
    _mm256_mask_storeu_epi16(dst, static_cast<__mmask16>(mask), half);
#else
    scalar_t rounded[2 * V];
    both.store(rounded);
    std::copy_n(rounded + part * V, lanes, dst);
#endif
  }
};

// Which of a pixel block's loads lie inside the input: kernel rows whose bit is set in `rows`, and
// of those the columns [lo, hi) of the block's window. The others read +0 (the padding).
struct InsideWindow {
  uint32_t rows;
  int64_t lo, hi;
};

// chain_sums for NV adjacent output pixels of a kKh x kKw kernel at column stride kStride and column
// dilation 1, channels_last: pixel i's tap (kh, kw) reads column i * kStride + kw of kernel row kh's
// window, whose column c (read by `load`) lies at address(kh, c): in x, or where the window reaches
// into the padding, a vector of +0 (the addresses outside x are never read). Each row's columns are
// loaded once and held while every pixel takes them in chain_sums' order (one block: taps
// ascending from the bias, then 0 + chain), so the bits are chain_sums'. A Zen 4 loads one 512-bit
// vector per cycle: a load per multiply-add held a 3x3 at half its multiply-add rate. Choosing the
// address, not branching around the load, keeps the columns in registers (a branch stored them to
// memory: float32 4x672x14x14 5x5 at 1 thread on a Zen 4, 0.51 -> 0.37 ms).
// kRows adjacent output rows at row stride and dilation 1: output row o's kernel row kh reads
// window row o + kh, and each of the kKh + kRows - 1 rows' columns is loaded once for every output
// row that reads it. Rows are taken in order, so each sum still takes its taps in ascending order.
template <typename scalar_t, int NV, int kKh, int kKw, int kStride, int kRows = 1, typename Address>
__attribute__((always_inline)) inline void sliding_sums(const Address& address, const ChannelVector<scalar_t>& load,
                                                        const Vectorized<acc_type<scalar_t>>* w,
                                                        const Vectorized<acc_type<scalar_t>>& bias,
                                                        Vectorized<acc_type<scalar_t>> (&total)[kRows][NV]) {
  static_assert(kKh * kKw <= kBlock);
  using acc_t = acc_type<scalar_t>;
  using Vec = Vectorized<acc_t>;
  constexpr int kColumns = (NV - 1) * kStride + kKw;
  // Column by column, each held while every sum that reads it takes it: a pixel's taps of a row
  // come in ascending columns, and only one column needs a register.
  for_each_index<kKh + kRows - 1>([&](auto row) __attribute__((always_inline)) {
    for_each_index<kColumns>([&](auto c) __attribute__((always_inline)) {
      const Vec column = held(load(address(row, c)));
      for_each_index<kRows>([&](auto o) __attribute__((always_inline)) {
        constexpr int kh = decltype(row)::value - decltype(o)::value;
        for_each_index<NV>([&](auto i) __attribute__((always_inline)) {
          constexpr int kw = decltype(c)::value - decltype(i)::value * kStride;
          if constexpr (kh >= 0 && kh < kKh && kw >= 0 && kw < kKw) {
            // The first tap adds to the bias itself: copied into each sum first, the copies went to memory.
            total[o][i] = at::vec::fmadd(w[kh * kKw + kw], column, kh + kw == 0 ? bias : total[o][i]);
          }
        });
      });
    });
  });
  for_each_index<kRows>([&](auto o) __attribute__((always_inline)) {
    for_each_index<NV>([&](auto i) __attribute__((always_inline)) { total[o][i] = Vec(acc_t(0)) + total[o][i]; });
  });
}

// What the pixels of one output row read for one channel vector: kernel row kh's input row starts
// at rows[kh] (at the block's first channel, column 0; null in the padding), the vector's channels
// `plane` elements on; the vector's weights (one per tap), bias, loads and stores.
template <typename scalar_t>
struct NhwcRowVector {
  using Vec = Vectorized<acc_type<scalar_t>>;
  const scalar_t* const* rows;
  uint32_t rows_inside;  // bit kh: rows[kh] is not null (for sliding_sums' kernels, <= 32 rows)
  int64_t plane;
  const Vec* w;
  Vec bias;
  ChannelVector<scalar_t> channels;
  const scalar_t* zeros;  // +0, as wide as the block, for a tap in the padding
  int64_t pitch, W, pw, Kh, Kw, n_taps, S, D;
};

// The sums of kPixels adjacent output pixels from column ow (see convolve_depthwise_nhwc). Always
// inlined: called out of line, the sums went through memory.
template <typename scalar_t, int kPixels, int kKh, int kKw, int kStride, bool kSliding>
__attribute__((always_inline)) inline void nhwc_pixel_sums(const NhwcRowVector<scalar_t>& r, int64_t ow,
                                                           Vectorized<acc_type<scalar_t>> (&sums)[1][kPixels]) {
  using acc_t = acc_type<scalar_t>;
  const int64_t first_column = ow * r.S - r.pw;  // of the block's window
  if constexpr (kSliding) {
    const scalar_t* base[kKh];
    static_assert(kKh <= 32);
    for (int kh = 0; kh < kKh; ++kh) base[kh] = r.rows[kh] ? r.rows[kh] + r.plane + first_column * r.pitch : nullptr;
    const InsideWindow inside{r.rows_inside, -first_column, r.W - first_column};
    const auto address = [&](auto row, auto c) __attribute__((always_inline)) {
      const bool read = (inside.rows >> row & 1) && c >= inside.lo && c < inside.hi;
      return read ? base[row] + c * r.pitch : r.zeros;
    };
    sliding_sums<scalar_t, kPixels, kKh, kKw, kStride>(address, r.channels, r.w, r.bias, sums);
  } else {
    // Tap t of pixel i: kernel row t / Kw, input column first_column + i * S + (t % Kw) * D.
    const auto tap_run = [&](int64_t t, int i) {
      const int64_t kh = t / r.Kw, column = first_column + i * r.S + (t - kh * r.Kw) * r.D;
      return r.rows[kh] && column >= 0 && column < r.W ? r.rows[kh] + r.plane + column * r.pitch : r.zeros;
    };
    chain_sums<acc_t, kPixels, kKh * kKw>(tap_run, r.w, r.n_taps, r.bias, sums[0], r.channels);
  }
}


// kPixels output pixels' sums of one channel vector, stored from `first`, the pixels `pitch` apart.
template <typename scalar_t, int kPixels>
__attribute__((always_inline)) inline void store_pixels(const Vectorized<acc_type<scalar_t>> (&sums)[kPixels],
                                                        const ChannelVector<scalar_t>& channels, scalar_t* first,
                                                        int64_t pitch) {
  constexpr int64_t V = Vectorized<acc_type<scalar_t>>::size();
  if constexpr (is_half<scalar_t>) {
    // Pixel pairs rounded together by the vector code narrow() uses, lane by lane (the bits
    // narrow() gives), into the output: through a row of sums, rounded as a run after it, a
    // bfloat16 call spent a fifth of its time in the rounding.
    for_each_index<(kPixels + 1) / 2>([&](auto pair) __attribute__((always_inline)) {
      constexpr int i = 2 * pair;
      const auto both = at::vec::convert_from_float<scalar_t>(sums[i], sums[std::min(i + 1, kPixels - 1)]);
      channels.store_part(both, 0, first + i * pitch);
      if constexpr (i + 1 < kPixels) channels.store_part(both, 1, first + (i + 1) * pitch);
    });
  } else {
    for_each_index<kPixels>([&](auto i) __attribute__((always_inline)) {
      if (channels.lanes == V) {
        sums[i].store(first + i * pitch);
      } else {
        sums[i].store(first + i * pitch, static_cast<int>(channels.lanes));
      }
    });
  }
}

// The groups of kGroup pixels, from column 0 on and below whole_groups, whose windows (kKw columns at
// stride kStride) lie inside x's columns: [begin, end), empty where none does.
template <int kKw, int kStride, int kGroup>
std::pair<int64_t, int64_t> interior_columns(const Problem& p, int64_t whole_groups) {
  constexpr int64_t kSpan = (kGroup - 1) * kStride + kKw, kStep = kGroup * kStride;
  const int64_t pw = p.padding[1], first = (pw + kStep - 1) / kStep;
  if (p.W + pw < kSpan) return {0, 0};
  const int64_t last = (p.W + pw - kSpan) / kStep;  // the last group whose window ends inside
  return {std::min(first * kGroup, whole_groups), std::min((last + 1) * kGroup, whole_groups)};
}

// Interior groups of kRows adjacent output rows (every kernel row inside x, every window inside its
// columns but for the padding columns below; kRows > 1: row stride and dilation 1, see
// sliding_sums), each group every channel vector of the block: the windows advanced in one loop,
// where a call per group and vector spent more on working out its window than on its multiply-adds
// (AVX2: four pixels of eight lanes a group).
// input_rows: the kKh + kRows - 1 input rows, at the block's first channel and column 0.
// The rows the previous rows did not read arrive from L2 or further, and the hardware's prefetchers
// do not follow a group's order (vector by vector, columns a pixel apart): the next group's lines of
// them are requested a group ahead (float32 4x128x56x56 at 1 thread on a Zen 3: 1.46 -> 1.11-1.16 of
// torch's time, the same process), and the output lines it writes, for writing (then 0.85-1.01 ->
// 0.84-0.98 at 1 thread, 0.68-0.98 -> 0.65-0.76 at 2, alternating processes).
// kLeftPad (kRightPad) > 0: the groups' windows begin (end) with that many columns of padding, which
// read +0 from the block-wide `zeros`, chosen at compile time (edge_groups works each address out).
template <typename scalar_t, int kKh, int kKw, int kStride, int kRows, int kLeftPad = 0, int kRightPad = 0>
__attribute__((noinline)) void interior_groups(const NhwcRowVector<scalar_t>* row_vectors, int64_t vectors,
                                               const scalar_t* const* input_rows, int64_t ow_begin,
                                               int64_t ow_end, scalar_t* out_row, int64_t out_pitch,
                                               int64_t out_row_pitch) {
  using Vec = Vectorized<acc_type<scalar_t>>;
  constexpr int kGroup = pixel_group<kKw, kStride>(), kInputRows = kKh + kRows - 1;
  constexpr int64_t kLine = 64 / sizeof(scalar_t), kStored = Vec::size() * sizeof(scalar_t);  // bytes a vector
  const NhwcRowVector<scalar_t>& r0 = row_vectors[0];
  const int64_t pitch = r0.pitch, step = kGroup * kStride * pitch;
  const int64_t lines_per_vector = (step + kLine * vectors - 1) / (kLine * vectors);
  const scalar_t* window[kInputRows];
  for (int r = 0; r < kInputRows; ++r) window[r] = input_rows[r] + (ow_begin * kStride - r0.pw) * pitch;
  for (int64_t ow = ow_begin; ow < ow_end; ow += kGroup) {
    for (int64_t v = 0; v < vectors; ++v) {
      for_each_index<kRows>([&](auto o) __attribute__((always_inline)) {
        const scalar_t* next = window[kKh - 1 + o] + step + v * lines_per_vector * kLine;
        for (int64_t line = 0; line < lines_per_vector; ++line) __builtin_prefetch(next + line * kLine, 0, 3);
      });
      if (v * kStored % 64 < kStored) {  // the vector starts a line of each output pixel
        for_each_index<kRows>([&](auto o) __attribute__((always_inline)) {
          scalar_t* next = out_row + o * out_row_pitch + (ow + kGroup) * out_pitch + row_vectors[v].plane;
          for_each_index<kGroup>([&](auto i) __attribute__((always_inline)) { __builtin_prefetch(next + i * out_pitch, 1, 3); });
        });
      }
      const NhwcRowVector<scalar_t>& r = row_vectors[v];
      const scalar_t* rows[kInputRows];
      for_each_index<kInputRows>([&](auto i) __attribute__((always_inline)) { rows[i] = window[i] + r.plane; });
      Vec sums[kRows][kGroup];
      const auto address = [&](auto row, auto c) __attribute__((always_inline)) {
        constexpr int kColumn = decltype(c)::value, kColumns = (kGroup - 1) * kStride + kKw;
        if constexpr (kColumn < kLeftPad || kColumn >= kColumns - kRightPad) return r.zeros + r.plane;
        return rows[row] + kColumn * pitch;
      };
      sliding_sums<scalar_t, kGroup, kKh, kKw, kStride, kRows>(address, r.channels, r.w, r.bias, sums);
      for_each_index<kRows>([&](auto o) __attribute__((always_inline)) {
        store_pixels(sums[o], r.channels, out_row + o * out_row_pitch + ow * out_pitch + r.plane, out_pitch);
      });
    }
    for_each_index<kInputRows>([&](auto i) __attribute__((always_inline)) { window[i] += step; });
  }
}

// Groups of one output row whose windows reach into the padding, each group every channel vector
// of the block as in interior_groups: each column of each kernel row's window is worked out once a
// group, in x or in `zeros` (as wide as the block, so that every vector's channels lie inside it).
// One call a group and vector, these groups took twice an interior group's time (float32
// 4x128x56x56 at 1 thread on a Zen 3: a sixth of the groups, 30% of the time; 1x128x28x28 went
// 0.70-0.78 -> 0.47-0.55 of torch's time, 4x128x56x56 1.25-1.37 -> 0.90-1.05, with row pairs).
template <typename scalar_t, int kKh, int kKw, int kStride>
__attribute__((noinline)) void edge_groups(const NhwcRowVector<scalar_t>* row_vectors, int64_t vectors,
                                           int64_t ow_begin, int64_t ow_end, scalar_t* out_row, int64_t out_pitch) {
  using Vec = Vectorized<acc_type<scalar_t>>;
  constexpr int kGroup = pixel_group<kKw, kStride>(), kColumns = (kGroup - 1) * kStride + kKw;
  const NhwcRowVector<scalar_t>& r0 = row_vectors[0];
  for (int64_t ow = ow_begin; ow < ow_end; ow += kGroup) {
    const scalar_t* columns[kKh][kColumns];
    for (int kh = 0; kh < kKh; ++kh) {
      for (int c = 0; c < kColumns; ++c) {
        const int64_t column = ow * kStride - r0.pw + c;
        const bool inside = r0.rows[kh] && column >= 0 && column < r0.W;
        columns[kh][c] = inside ? r0.rows[kh] + column * r0.pitch : r0.zeros;
      }
    }
    for (int64_t v = 0; v < vectors; ++v) {
      const NhwcRowVector<scalar_t>& r = row_vectors[v];
      const auto address = [&](auto row, auto c) __attribute__((always_inline)) { return columns[row][c] + r.plane; };
      Vec sums[1][kGroup];
      sliding_sums<scalar_t, kGroup, kKh, kKw, kStride>(address, r.channels, r.w, r.bias, sums);
      store_pixels(sums[0], r.channels, out_row + ow * out_pitch + r.plane, out_pitch);
    }
  }
}

// kKh x kKw taps at column stride kStride and column dilation 1, fixed at compile time; kKh == 0: the
// geometry read from p.
template <typename scalar_t, int kKh, int kKw, int kStride>
void convolve_depthwise_nhwc(const Problem& p, const scalar_t* x, const Layout& xl, const scalar_t* weight,
                             const int64_t* ws, const scalar_t* bias, scalar_t* out, const Layout& ol) {
  using acc_t = acc_type<scalar_t>;
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  // Each kernel row's columns held in registers (sliding_sums) at column stride 1, and for a 3x3 at
  // stride 2 where 32 vector registers hold its 17 columns: 4x128x56x56 at stride 2 took 0.26-0.29
  // -> 0.26-0.27 ms in float32 at 1 thread on a Zen 4 (0.16 -> 0.15 at 2), float64 0.88-0.95 ->
  // 0.78-0.82. A 5x5 at stride 2 goes 4 pixels at a time (pixel_group): as 8, its 19 columns took
  // it 0.45 -> 0.66 ms.
  constexpr bool kSliding = kKh > 0 && (kStride == 1 || ((kKw == 3 || kKw == 5) && Vec::size() * sizeof(acc_t) == 64));
  // Two output rows at a time share their interior windows' loads (4 input rows for 2 output rows,
  // not 6), with 8 chains of multiply-adds a channel vector for 4, in 14 of AVX2's 16 registers:
  // float32 4x128x56x56 at 1 thread on a Zen 3, 1.14-1.36 -> 1.00-1.20 of torch's time in the same
  // processes (2 threads 0.78-1.05 -> 0.68-0.96), float16 1.20 -> 0.99 ms, float64 3.6 -> 3.2.
  // Not measured at AVX-512 (8 pixels a group: 16 sums), which keeps one row at a time.
  constexpr bool kRowPairs = kPairRowsLevel && kSliding && kKh == 3 && kKw == 3 && kStride == 1;
  const int64_t Kh = kKh ? kKh : p.Kh, Kw = kKw ? kKw : p.Kw, n_taps = Kh * Kw;
  const int64_t S = kStride ? kStride : p.stride[1], D = kKh ? 1 : p.dilation[1];
  static_assert(kNhwcBlock * 4 / int64_t(sizeof(Vec)) <= kMaxNhwcVectors);
  const NhwcPlan plan = plan_depthwise_nhwc<acc_t>(p);
  path_counts().depthwise_channels_last_calls += 1;
  const auto [weights, biases] = nhwc_weights<scalar_t>(p, plan, weight, ws, bias);
  const int64_t Cpad = plan.blocks * plan.CB, sh = p.stride[0], dh = p.dilation[0];
  alignas(64) const scalar_t zeros[kNhwcBlock * 4 / sizeof(acc_t)] = {};  // at least a block
  constexpr int kGroup = pixel_group<kKw, kStride>();
  const int64_t whole_groups = p.Wo / kGroup * kGroup;
  // The groups whose windows lie inside x's columns (interior_groups); those that reach into the
  // padding go to edge_groups, and a row's last pixels past its whole groups one call each.
  const auto [inner_begin, inner_end] = kSliding ? interior_columns<kKw, kStride, kGroup>(p, whole_groups)
                                                 : std::pair<int64_t, int64_t>{0, 0};
  const bool pairs = kRowPairs && sh == 1 && dh == 1 && inner_begin < inner_end;
  // Row pairs take the edge group at either end too where it is one group whose window has one
  // column of padding (a 3x3 with padding 1): one row at a time (edge_groups), the sixth of the
  // groups at the edges took 30% of a float32 4x128x56x56 call at 1 thread on a Zen 3; paired,
  // 0.78-0.90 -> 0.66-0.76 of torch's time in the same processes.
  const bool left_pair = pairs && p.padding[1] == 1 && inner_begin == kGroup;
  const bool right_pair = pairs && whole_groups - inner_end == kGroup &&
                          (inner_end + kGroup - 1) * kStride - p.padding[1] + kKw - p.W == 1;
  at::parallel_for(0, plan.tasks, 1, [&](int64_t first, int64_t last) {
    const auto rows = scratch<const scalar_t*>(Kh);  // each kernel row's input row
    const auto w = scratch<Vec>(plan.vectors * n_taps);
    NhwcRowVector<scalar_t> row_vectors[kMaxNhwcVectors];
    for (int64_t task = first; task < last; ++task) {
      const int64_t rb = task % plan.row_blocks, block = task / plan.row_blocks % plan.blocks;
      const int64_t n = task / plan.row_blocks / plan.blocks;
      const int64_t oh0 = rb * plan.rows_per_task, oh1 = std::min(p.Ho, oh0 + plan.rows_per_task);
      const int64_t c0 = block * plan.CB, count = std::min(plan.CB, p.Cin - c0);
      const int64_t vectors = std::min(plan.vectors, (count + V - 1) / V);
      for (int64_t v = 0; v < plan.vectors; ++v) {
        for (int64_t t = 0; t < n_taps; ++t) w[v * n_taps + t] = Vec::loadu(&weights[t * Cpad + c0 + v * V]);
      }
      // Output row oh; where `paired`, not the groups the row pair takes.
      const auto output_row = [&](int64_t oh, bool paired) {
        uint32_t rows_inside = 0;
        for (int64_t kh = 0; kh < Kh; ++kh) {
          const int64_t ih = oh * sh - p.padding[0] + kh * dh;
          rows[kh] = ih >= 0 && ih < p.H ? x + n * xl.n + ih * xl.h + c0 : nullptr;
          if (kh < 32 && rows[kh]) rows_inside |= uint32_t(1) << kh;
        }
        scalar_t* const out_row = out + n * ol.n + oh * ol.h + c0;
        for (int64_t v = 0; v < vectors; ++v) {
          row_vectors[v] = {rows.get(), rows_inside, v * V, &w[v * n_taps], Vec::loadu(&biases[c0 + v * V]),
                            {std::min(V, count - v * V)}, zeros, xl.w, p.W, p.padding[1], Kh, Kw, n_taps, S, D};
        }
        // kPixels pixels from ow of channel vector v, stored.
        const auto pixels = [&](auto fixed, int64_t v, int64_t ow) {
          constexpr int kPixels = decltype(fixed)::value;
          Vec sums[1][kPixels];
          nhwc_pixel_sums<scalar_t, kPixels, kKh, kKw, kStride, kSliding>(row_vectors[v], ow, sums);
          store_pixels(sums[0], row_vectors[v].channels, out_row + ow * ol.w + v * V, ol.w);
        };
        // A group of pixels takes every channel vector of the block before the next group: the
        // group's window (Kh rows of its columns, whole lines) is read while it is in L1.
        if constexpr (kSliding) {
          const bool inner = rows_inside == (uint32_t(1) << kKh) - 1 && inner_begin < inner_end;
          if (!(paired && left_pair)) {
            edge_groups<scalar_t, kKh, kKw, kStride>(row_vectors, vectors, 0, inner ? inner_begin : whole_groups,
                                                     out_row, ol.w);
          }
          if (inner && !paired) {
            interior_groups<scalar_t, kKh, kKw, kStride, 1>(row_vectors, vectors, rows.get(), inner_begin, inner_end,
                                                             out_row, ol.w, ol.h);
          }
          if (inner && !(paired && right_pair)) {
            edge_groups<scalar_t, kKh, kKw, kStride>(row_vectors, vectors, inner_end, whole_groups, out_row, ol.w);
          }
        } else {
          for (int64_t ow = 0; ow < whole_groups; ow += kGroup) {
            for (int64_t v = 0; v < vectors; ++v) pixels(std::integral_constant<int, kGroup>{}, v, ow);
          }
        }
        const int64_t ow = whole_groups;
        with_count<kGroup - 1>(p.Wo - ow, [&](auto fixed) {
          for (int64_t v = 0; v < vectors; ++v) pixels(fixed, v, ow);
        });
      };
      for (int64_t oh = oh0; oh < oh1;) {
        if constexpr (kRowPairs) {
          const int64_t ih = oh - p.padding[0];  // at row stride and dilation 1
          if (pairs && oh + 1 < oh1 && ih >= 0 && ih + kKh < p.H) {
            output_row(oh, true), output_row(oh + 1, true);
            const scalar_t* pair_rows[kKh + 1];
            for (int64_t r = 0; r <= kKh; ++r) pair_rows[r] = x + n * xl.n + (ih + r) * xl.h + c0;
            scalar_t* const out_rows = out + n * ol.n + oh * ol.h + c0;
            if (left_pair) {
              interior_groups<scalar_t, kKh, kKw, kStride, 2, 1, 0>(row_vectors, vectors, pair_rows, 0, kGroup,
                                                                     out_rows, ol.w, ol.h);
            }
            interior_groups<scalar_t, kKh, kKw, kStride, 2>(row_vectors, vectors, pair_rows, inner_begin, inner_end,
                                                             out_rows, ol.w, ol.h);
            if (right_pair) {
              interior_groups<scalar_t, kKh, kKw, kStride, 2, 0, 1>(row_vectors, vectors, pair_rows, inner_end,
                                                                     whole_groups, out_rows, ol.w, ol.h);
            }
            oh += 2;
            continue;
          }
        }
        output_row(oh, false);
        oh += 1;
      }
    }
  });
}

}  // namespace depthwise_detail

template <typename scalar_t>
void convolve_depthwise(const Problem& p, const scalar_t* x, const Layout& xl, const scalar_t* weight, const int64_t* ws,
                        const scalar_t* bias, scalar_t* out, const Layout& ol) {
  using namespace depthwise_detail;
  if (depthwise_channels_last(p, xl, ol)) {
    const auto run = [&](auto kh, auto kw, auto stride) {
      convolve_depthwise_nhwc<scalar_t, decltype(kh)::value, decltype(kw)::value, decltype(stride)::value>(
          p, x, xl, weight, ws, bias, out, ol);
    };
    using std::integral_constant;
    // The common kernels (MobileNet's and EfficientNet's 3x3 and 5x5, stride 1 or 2) compiled each
    // for its geometry; any other runs with the geometry read at run time.
    const bool square = p.Kh == p.Kw && p.dilation[1] == 1 && (p.stride[1] == 1 || p.stride[1] == 2);
    const auto sized = [&](auto k) {
      if (p.stride[1] == 1) return run(k, k, integral_constant<int, 1>{});
      return run(k, k, integral_constant<int, 2>{});
    };
    if (square && p.Kh == 3) return sized(integral_constant<int, 3>{});
    if (square && p.Kh == 5) return sized(integral_constant<int, 5>{});
    return run(integral_constant<int, 0>{}, integral_constant<int, 0>{}, integral_constant<int, 0>{});
  }
  const DepthwisePlan plan = plan_depthwise<scalar_t>(p, xl, ol);
  if (plan.reads_x_in_place) path_counts().depthwise_in_place_calls += 1;
  const auto run_tasks = [&](auto fixed_taps, auto fixed_rows) {
    constexpr int kTaps = decltype(fixed_taps)::value, kKh = decltype(fixed_rows)::value;
    at::parallel_for(0, plan.tasks, std::max<int64_t>(1, (1 << 16) / plan.work), [&](int64_t first, int64_t last) {
      DepthwiseBuffers<acc_type<scalar_t>> buf(plan);
      for (int64_t task = first; task < last; ++task) {
        std::pair<const char*, const char*> next_in{}, next_out{};  // none after the thread's last task
        if (task + 1 < last) {
          const DepthwiseTask following = depthwise_task(p, plan, task + 1);
          next_in = task_input(p, following, x, xl), next_out = task_output(p, following, out, ol);
        }
        run_depthwise_task<scalar_t, kTaps, kKh>(p, plan, depthwise_task(p, plan, task), next_in, next_out, x, xl,
                                                 weight, ws, bias, out, ol, buf);
      }
    });
  };
  using std::integral_constant;
  switch (plan.n_taps) {
    case 9:
      return p.Kh == 3 ? run_tasks(integral_constant<int, 9>{}, integral_constant<int, 3>{})
                       : run_tasks(integral_constant<int, 9>{}, integral_constant<int, 0>{});
    case 25:
      return p.Kh == 5 ? run_tasks(integral_constant<int, 25>{}, integral_constant<int, 5>{})
                       : run_tasks(integral_constant<int, 25>{}, integral_constant<int, 0>{});
    default: return run_tasks(integral_constant<int, 0>{}, integral_constant<int, 0>{});
  }
}

// Instantiated once per level in csrc/kernels/depthwise_kernels.cpp, a translation unit of their own:
// in convolution_kernels.cpp's they took so much of GCC's inlining budget for the unit that other
// paths' std::vector constructors went out of line, compiled with that level's instructions.
#define FUEL_DEPTHWISE_INSTANCES(keyword)                                                                    \
  keyword template void convolve_depthwise<float>(const Problem&, const float*, const Layout&, const float*, \
                                                  const int64_t*, const float*, float*, const Layout&);      \
  keyword template void convolve_depthwise<double>(const Problem&, const double*, const Layout&,             \
                                                   const double*, const int64_t*, const double*, double*,    \
                                                   const Layout&);                                           \
  keyword template void convolve_depthwise<at::BFloat16>(const Problem&, const at::BFloat16*, const Layout&, \
                                                         const at::BFloat16*, const int64_t*,                \
                                                         const at::BFloat16*, at::BFloat16*, const Layout&); \
  keyword template void convolve_depthwise<at::Half>(const Problem&, const at::Half*, const Layout&,         \
                                                     const at::Half*, const int64_t*, const at::Half*,       \
                                                     at::Half*, const Layout&);
FUEL_DEPTHWISE_INSTANCES(extern)

}  // namespace CPU_CAPABILITY
}  // namespace fuel
