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
// at lines + taps[t] + v * chain_step, weighted by w[t] (a broadcast weight along an NCHW row; a
// vector of channels' weights channels_last). kTaps > 0 fixes the tap count at compile time (the
// common 3x3 and 5x5 kernels): the loops unroll, the same operations in the same order.
template <typename acc_t, int NV, int kTaps>
inline void chain_sums(const acc_t* lines, const int64_t* taps, const Vectorized<acc_t>* w, int64_t runtime_taps,
                       const Vectorized<acc_t>& bias, int64_t chain_step, Vectorized<acc_t> (&total)[NV]) {
  using Vec = Vectorized<acc_t>;
  if constexpr (kTaps > 0 && kTaps <= kBlock) {
    // One block of one chunk: the chain from the bias, then the chunk's sum from zero (0 + chain,
    // which turns a -0 into +0 exactly as the general order does).
    for (int v = 0; v < NV; ++v) total[v] = bias;
#pragma GCC unroll 16
    for (int t = 0; t < kTaps; ++t) {
      const acc_t* run = lines + taps[t];
      for (int v = 0; v < NV; ++v) total[v] = at::vec::fmadd(w[t], Vec::loadu(run + v * chain_step), total[v]);
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
        const acc_t* run = lines + taps[t];
        for (int v = 0; v < NV; ++v) acc[v] = at::vec::fmadd(w[t], Vec::loadu(run + v * chain_step), acc[v]);
      }
      for (int v = 0; v < NV; ++v) chunk[v] = chunk[v] + acc[v];
    }
    for (int v = 0; v < NV; ++v) total[v] = c0 == 0 ? chunk[v] : total[v] + chunk[v];
  }
}

// NV output vectors of one output row, starting at column ow0, of which the first `valid` columns
// are stored; taps[t] is the offset of tap t's run inside the task's lines, w[t] its weight
// (broadcast).
template <typename acc_t, int NV, int kTaps>
inline void row_vectors(const acc_t* lines, const int64_t* taps, const Vectorized<acc_t>* w, int64_t runtime_taps,
                        acc_t bias, int64_t ow0, acc_t* result, int64_t valid) {
  Vectorized<acc_t> total[NV];
  chain_sums<acc_t, NV, kTaps>(lines + ow0, taps, w, runtime_taps, Vectorized<acc_t>(bias),
                               Vectorized<acc_t>::size(), total);
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
#endif

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
  // Where each tap's run starts in the lines of a task's first output row; output row oh of the
  // task reads the same offsets sh input rows (sh * sw lines) further on per row. Computed once:
  // per row, its divisions cost more than the row's multiply-adds.
  std::vector<int64_t> taps;
};

template <typename scalar_t>
DepthwisePlan plan_depthwise(const Problem& p, const Layout& ol) {
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
  const int64_t in_rows = (t.oh1 - 1 - t.oh0) * sh + (p.Kh - 1) * p.dilation[0] + 1;
  acc_t* const lines = buf.lines(in_rows * p.stride[1] * plan.len);
  widen_lines<scalar_t, acc_t>(x + t.n * xl.n + t.co / (p.Cout / p.groups) * xl.c, xl, p, t.oh0 * sh - p.padding[0],
                               in_rows, plan.len, lines);
  buf.prefetch.start(next, t.oh1 - t.oh0);
  buf.prefetch_output.start(next_out, t.oh1 - t.oh0);
  for (int64_t tap = 0; tap < plan.n_taps; ++tap) {
    buf.weights[tap] = Vec(static_cast<acc_t>(weight[t.co * ws[0] + (tap / p.Kw) * ws[2] + (tap % p.Kw) * ws[3]]));
  }
  const acc_t b = bias ? static_cast<acc_t>(bias[t.co]) : acc_t(0);
  scalar_t* plane = out + t.n * ol.n + t.co * ol.c;
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
// A task: image n, a block of kNhwcBlock channels, a run of output rows. It widens the input rows
// those read into zero-padded lines, [column][channel of the block]; output pixel (oh, ow)'s tap
// (kh, kw) is then at a fixed offset from its base, and kPixelChains pixels of a row go as
// independent chains, one channel vector at a time, that vector's tap weights held in registers.
// Blocks of 128 channels took a bfloat16 call 0.77-0.96 ms, 64 0.97-1.18 and 32 0.98-2.05, in the
// same runs: fewer widening and rounding calls per pixel.
constexpr int64_t kNhwcBlock = 128;
constexpr int kPixelChains = Vectorized<float>::size() == 16 ? 8 : 4;  // within 32 (16) vector registers

// A task's lines hold at least the input rows one output row reads. Where a tall dilated kernel
// makes those more than kNhwcLinesBytes, the NCHW kernel, whose lines hold one channel, takes the call
// (the same bits).
constexpr int64_t kNhwcLinesBytes = int64_t(4) << 20;

// Channels per task: whole vectors, at most kNhwcBlock.
template <typename acc_t>
int64_t nhwc_channel_block(int64_t channels) {
  constexpr int64_t V = Vectorized<acc_t>::size();
  return std::min(kNhwcBlock, (channels + V - 1) / V * V);
}

template <typename acc_t>
bool depthwise_channels_last(const Problem& p, const Layout& xl, const Layout& ol) {
  if (xl.c != 1 || ol.c != 1 || p.Cout != p.Cin || p.Cin < 2) return false;
  // In double: hostile geometry must fail the budget, not overflow.
  const double columns = double(p.Wo - 1) * double(p.stride[1]) + double(p.Kw - 1) * double(p.dilation[1]) + 1;
  const double rows = double(p.Kh - 1) * double(p.dilation[0]) + 1;
  const double block = double(nhwc_channel_block<acc_t>(p.Cin));
  return columns * rows * block * double(sizeof(acc_t)) <= double(kNhwcLinesBytes);
}

struct NhwcPlan {
  int64_t n_taps = 0, CB = 0, blocks = 0, columns = 0, len = 0, rows_per_task = 0, row_blocks = 0, tasks = 0;
  std::vector<int64_t> taps;  // tap t's offset from an output pixel's base in the lines
};

template <typename acc_t>
NhwcPlan plan_depthwise_nhwc(const Problem& p) {
  NhwcPlan plan;
  plan.n_taps = p.Kh * p.Kw;
  plan.CB = nhwc_channel_block<acc_t>(p.Cin);
  plan.blocks = (p.Cin + plan.CB - 1) / plan.CB;
  plan.columns = (p.Wo - 1) * p.stride[1] + (p.Kw - 1) * p.dilation[1] + 1;  // line column j: input column j - pw
  plan.len = plan.columns * plan.CB;
  const int64_t line_rows = std::max<int64_t>(1, 2 * kScratchBytes / static_cast<int64_t>(sizeof(acc_t)) / plan.len);
  const int64_t reach = (p.Kh - 1) * p.dilation[0];  // input rows an output row reads past its first
  plan.rows_per_task = std::clamp<int64_t>((line_rows - 1 - reach) / p.stride[0] + 1, 1, p.Ho);
  plan.row_blocks = (p.Ho + plan.rows_per_task - 1) / plan.rows_per_task;
  plan.tasks = p.N * plan.blocks * plan.row_blocks;
  plan.taps.resize(plan.n_taps);
  for (int64_t t = 0; t < plan.n_taps; ++t) {
    plan.taps[t] = (t / p.Kw) * p.dilation[0] * plan.len + (t % p.Kw) * p.dilation[1] * plan.CB;
  }
  return plan;
}

// The task's lines: input rows ih0 .. ih0 + rows - 1, channels c0 .. c0 + count - 1 of each column,
// zeros for the padding columns and rows and the lanes past count.
template <typename scalar_t, typename acc_t>
void widen_nhwc_lines(const scalar_t* image, const Layout& xl, const Problem& p, const NhwcPlan& plan, int64_t ih0,
                      int64_t rows, int64_t c0, int64_t count, acc_t* lines) {
  const int64_t pw = p.padding[1];
  const int64_t lo = std::clamp<int64_t>(pw, 0, plan.columns), hi = std::clamp<int64_t>(p.W + pw, lo, plan.columns);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t ih = ih0 + row;
    acc_t* line = lines + row * plan.len;
    if (ih < 0 || ih >= p.H) {
      zero(line, plan.len);
      continue;
    }
    zero(line, lo * plan.CB);
    zero(line + hi * plan.CB, (plan.columns - hi) * plan.CB);
    const scalar_t* src = image + ih * xl.h + (lo - pw) * xl.w + c0;
    if (count == plan.CB && xl.w == plan.CB) {  // the columns' channels back to back: one run
      widen<scalar_t>(src, line + lo * plan.CB, (hi - lo) * plan.CB);
      continue;
    }
    for (int64_t j = lo; j < hi; ++j) {
      widen<scalar_t>(src + (j - lo) * xl.w, line + j * plan.CB, count);
      zero(line + j * plan.CB + count, plan.CB - count);
    }
  }
}

template <typename scalar_t, int kTaps>
void convolve_depthwise_nhwc(const Problem& p, const scalar_t* x, const Layout& xl, const scalar_t* weight,
                             const int64_t* ws, const scalar_t* bias, scalar_t* out, const Layout& ol) {
  using acc_t = acc_type<scalar_t>;
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  const NhwcPlan plan = plan_depthwise_nhwc<acc_t>(p);
  path_counts().depthwise_channels_last_calls += 1;
  // Weights as [tap][channel] and the bias, in the accumulator type, zero past the channels.
  const int64_t Cpad = plan.blocks * plan.CB;
  std::vector<acc_t> weights(plan.n_taps * Cpad, acc_t(0)), biases(Cpad, acc_t(0));
  for (int64_t c = 0; c < p.Cin; ++c) {
    for (int64_t t = 0; t < plan.n_taps; ++t) {
      weights[t * Cpad + c] = static_cast<acc_t>(weight[c * ws[0] + (t / p.Kw) * ws[2] + (t % p.Kw) * ws[3]]);
    }
    if (bias) biases[c] = static_cast<acc_t>(bias[c]);
  }
  const int64_t sh = p.stride[0], step = p.stride[1] * plan.CB, vectors = plan.CB / V;
  at::parallel_for(0, plan.tasks, 1, [&](int64_t first, int64_t last) {
    std::vector<acc_t> lines_storage, result(is_half<scalar_t> ? p.Wo * plan.CB : 0);
    std::vector<Vec> w(vectors * plan.n_taps);
    for (int64_t task = first; task < last; ++task) {
      const int64_t rb = task % plan.row_blocks, block = task / plan.row_blocks % plan.blocks;
      const int64_t n = task / plan.row_blocks / plan.blocks;
      const int64_t oh0 = rb * plan.rows_per_task, oh1 = std::min(p.Ho, oh0 + plan.rows_per_task);
      const int64_t c0 = block * plan.CB, count = std::min(plan.CB, p.Cin - c0);
      const int64_t in_rows = (oh1 - 1 - oh0) * sh + (p.Kh - 1) * p.dilation[0] + 1;
      lines_storage.resize(in_rows * plan.len);
      acc_t* const lines = lines_storage.data();
      widen_nhwc_lines<scalar_t, acc_t>(x + n * xl.n, xl, p, plan, oh0 * sh - p.padding[0], in_rows, c0, count, lines);
      for (int64_t v = 0; v < vectors; ++v) {
        for (int64_t t = 0; t < plan.n_taps; ++t) w[v * plan.n_taps + t] = Vec::loadu(&weights[t * Cpad + c0 + v * V]);
      }
      for (int64_t oh = oh0; oh < oh1; ++oh) {
        const acc_t* row_lines = lines + (oh - oh0) * sh * plan.len;
        scalar_t* const out_row = out + n * ol.n + oh * ol.h + c0;
        for (int64_t v = 0; v < vectors; ++v) {
          const int64_t lanes = std::min(V, count - v * V);
          if (lanes <= 0) break;
          const Vec b = Vec::loadu(&biases[c0 + v * V]);
          // kPixels pixels from ow: their sums, stored (a half row into `result`, rounded below).
          const auto pixels = [&](auto fixed, int64_t ow) {
            constexpr int kPixels = decltype(fixed)::value;
            Vec sums[kPixels];
            chain_sums<acc_t, kPixels, kTaps>(row_lines + ow * step + v * V, plan.taps.data(), &w[v * plan.n_taps],
                                              plan.n_taps, b, step, sums);
            for (int i = 0; i < kPixels; ++i) {
              if constexpr (is_half<scalar_t>) {
                sums[i].store(&result[(ow + i) * plan.CB + v * V]);
              } else {
                sums[i].store(out_row + (ow + i) * ol.w + v * V, static_cast<int>(lanes));
              }
            }
          };
          int64_t ow = 0;
          for (; ow + kPixelChains <= p.Wo; ow += kPixelChains) pixels(std::integral_constant<int, kPixelChains>{}, ow);
          with_count<kPixelChains - 1>(p.Wo - ow, [&](auto fixed) { pixels(fixed, ow); });
        }
        if constexpr (is_half<scalar_t>) {
          if (count == plan.CB && ol.w == plan.CB) {  // the block is all the channels: one run
            narrow<scalar_t>(result.data(), out_row, p.Wo * plan.CB);
          } else {
            for (int64_t ow = 0; ow < p.Wo; ++ow) narrow<scalar_t>(&result[ow * plan.CB], out_row + ow * ol.w, count);
          }
        }
      }
    }
  });
}

}  // namespace depthwise_detail

template <typename scalar_t>
void convolve_depthwise(const Problem& p, const scalar_t* x, const Layout& xl, const scalar_t* weight, const int64_t* ws,
                        const scalar_t* bias, scalar_t* out, const Layout& ol) {
  using namespace depthwise_detail;
  if (depthwise_channels_last<acc_type<scalar_t>>(p, xl, ol)) {
    switch (p.Kh * p.Kw) {
      case 9: return convolve_depthwise_nhwc<scalar_t, 9>(p, x, xl, weight, ws, bias, out, ol);
      case 25: return convolve_depthwise_nhwc<scalar_t, 25>(p, x, xl, weight, ws, bias, out, ol);
      default: return convolve_depthwise_nhwc<scalar_t, 0>(p, x, xl, weight, ws, bias, out, ol);
    }
  }
  const DepthwisePlan plan = plan_depthwise<scalar_t>(p, ol);
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

}  // namespace CPU_CAPABILITY
}  // namespace fuel
