// The wide-kernel problem (a weight gradient's shape, see wide_kernel.h) as one GEMM per output
// position, on torch's brgemm (oneDNN's ukernel, ATen/native/CPUBlas.h): float32 on AVX2 and
// AVX-512, bfloat16 on the AMX tile unit or AVX512_BF16 dot products.
//
// In a weight gradient, conv2d's "images" are the real input channels b, its "channels" the real
// images c, its "kernel" the output gradient and its few outputs the real kernel taps. Every output
// (b, co, oh, ow) then reads, for each c, the same window of x's plane shifted by (oh, ow):
//
//   out[b][co][oh][ow] = bias[co] + sum over c, q of A_c[co][q] * X_c[q + shift(oh, ow)][b]
//
// with q = kh * Wp + kw running over the kernel laid on the padded input's rows (Wp wide, zero
// where kw >= Kw), A_c the weight of channel c so laid out, and X_c channel c's zero-padded plane
// with the images b innermost. One brgemm per (output position, c, chunk of q): M = output
// channels, N = images, K = a chunk of q, B read in place at the tap's shift.
//
// Summation order, fixed by the geometry alone: the accumulator starts at the bias; for c in order,
// for chunks of kChunk positions (64 float32, 128 bfloat16) in order, the chunk's sum is added:
// brgemm with add_C sums the chunk from zero and then adds it to C (as the patch path relies on; bit
// for bit what summing into a fresh buffer and adding it did, on a Zen 5, where the separate add
// took a third of this file's time).
// Chunking keeps long reductions accurate (a chunk's sum and then a few hundred chunk sums, where
// one running sum over N * Kh * Wp terms would drift as torch's blocked sums do not). Threads split
// the outputs only.
//
// bfloat16: B is taken in pairs of positions (the VNNI layout), so X_c is kept twice, paired from
// position 0 and from position 1, and each tap reads the copy its shift's parity needs. The tile
// unit's flushing is ruled out as in tap_brgemm.h: the path runs only where no operand is subnormal and
// every product and the bias are multiples of 2^-126, which the whole call's exponents decide.
#pragma once

#include <ATen/native/CPUBlas.h>

#include <cmath>

#include "float_brgemm.h"
#include "tap_brgemm.h"
#include "tiles.h"
#include "kernel_table.h"
#include "kernel_common.h"

namespace fuel {

namespace CPU_CAPABILITY {

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)

namespace wide_brgemm_detail {

constexpr int64_t kGemmBlock = 64;    // output channels (M) and images (N) per brgemm, at most
// Positions q per brgemm, a multiple of the tile unit's 32: a chunk's A and B windows
// (kGemmBlock channels or images each) then fit L1 together, 16 KiB each: 64 float32 positions,
// 128 bfloat16 ones. 256-position float32 chunks streamed B from L2 (a ResNet 3x3 weight gradient
// 13% slower on a Zen 3); 64-position bfloat16 chunks, half the bytes, spent a tenth of a ResNet 3x3
// weight gradient on brgemm calls and C's loads and stores (6.4 ms against 5.5-5.8 in 128s on a
// Zen 4, 1 thread; float32 ran as fast in 128s as in 64s).
template <typename scalar_t>
constexpr int64_t kChunk = (int64_t(16) << 10) / (kGemmBlock * int64_t(sizeof(scalar_t)));
constexpr int64_t kBudgetBytes = int64_t(256) << 20;  // per-channel buffers (A_c, X_c) at most

struct Grid {
  int64_t Hp = 0, Wp = 0, plane = 0;  // padded plane; positions per plane incl. slack
  int64_t K = 0;                      // positions q per channel: (Kh - 1) * Wp + Kw, even
};

inline Grid make_grid(const Problem& p) {
  Grid g;
  g.Hp = p.H + 2 * p.padding[0];
  g.Wp = p.W + 2 * p.padding[1];
  g.K = ((p.Kh - 1) * g.Wp + p.Kw + 1) / 2 * 2;
  // The pair read one past the last position and the odd copy's shift, rounded to whole pairs.
  g.plane = (g.Hp * g.Wp + 3) / 2 * 2;
  return g;
}

template <typename scalar_t>
constexpr bool kPaired = std::is_same_v<scalar_t, at::BFloat16>;

// One channel c's A_c = [Cout][K] and X_c = [plane][N]; bfloat16 also X_c's two pairings
// [plane / 2][N][2], from position 0 (even) and from position 1 (odd).
template <typename scalar_t>
struct ChannelBuffers {
  scalar_t *a = nullptr, *x = nullptr, *x_even = nullptr, *x_odd = nullptr;
};

#if defined(CPU_CAPABILITY_AVX512)
// dst[j][b][0, 1] = (rows[2j + first][b], rows[2j + first + 1][b]) for j < pairs; rows are n long.
// tap_brgemm.h's row interleaving; its exponent scan is not needed here (the call's operands were
// scanned whole).
inline void pair_rows(const at::BFloat16* rows, int64_t n, int64_t first, int64_t pairs, at::BFloat16* dst) {
  at::parallel_for(0, pairs, std::max<int64_t>(1, 4096 / n), [&](int64_t begin, int64_t end) {
    int emin = kSmallestEx;
    bool subnormal = false;
    for (int64_t j = begin; j < end; ++j) {
      const uint16_t* r0 = reinterpret_cast<const uint16_t*>(rows + (2 * j + first) * n);
      interleave_row(r0, r0 + n, 1, n, reinterpret_cast<uint32_t*>(dst + j * 2 * n), emin, subnormal);
    }
  });
}
#endif


// Whether this level turns 16 x 16 tiles of scalar_t (tiles.h: float32 at AVX2 and AVX512,
// bfloat16 at AVX512).
template <typename scalar_t>
constexpr bool turns_tiles() {
#if defined(CPU_CAPABILITY_AVX512)
  return true;
#else
  return std::is_same_v<scalar_t, float>;
#endif
}

// Rows [r0, r1) of X_c (see fill_channel), 16 images at a time over all the rows: the tiles then
// read 16 of x's planes at a time, not all N (as in stage_rows, patch_brgemm.h).
template <typename scalar_t>
void fill_image_rows(const Problem& p, const Grid& g, int64_t c, const scalar_t* x, const Layout& xl, int64_t r0,
                     int64_t r1, scalar_t* xs) {
  const int64_t N = p.N;
  auto row_begin = [&](int64_t r) { return r * g.Wp; };
  auto row_end = [&](int64_t r) { return r + 1 == g.Hp ? g.plane + 1 : (r + 1) * g.Wp; };
  auto holds_x = [&](int64_t r) { return r - p.padding[0] >= 0 && r - p.padding[0] < p.H; };
  auto source = [&](int64_t r, int64_t b, int64_t iw) {
    return x + b * xl.n + c * xl.c + (r - p.padding[0]) * xl.h + iw * xl.w;
  };
  auto dest = [&](int64_t r, int64_t iw) { return xs + (row_begin(r) + p.padding[1] + iw) * N; };
  for (int64_t r = r0; r < r1; ++r) {
    if (!holds_x(r)) {
      zero(xs + row_begin(r) * N, (row_end(r) - row_begin(r)) * N);
      continue;
    }
    const int64_t s_lo = row_begin(r) + p.padding[1], s_hi = s_lo + p.W;
    zero(xs + row_begin(r) * N, (s_lo - row_begin(r)) * N);
    zero(xs + s_hi * N, (row_end(r) - s_hi) * N);
  }
  int64_t tiled = 0;  // images staged by tiles
  if (xl.n == 1 && xl.w == N) {
    // x channels_last: its "images" (the real channels) lie innermost already and a row of x is a
    // row of X_c, copied as it lies. Element by element, this and fill_channel's gather of a
    // channels_last gradient took a fifth of a ResNet 3x3's channels_last bfloat16 weight gradient.
    for (int64_t r = r0; r < r1; ++r) {
      if (holds_x(r)) copy_run(source(r, 0, 0), dest(r, 0), p.W * N);
    }
    return;
  }
  // NCHW x by 16 x 16 tiles wherever the level turns them (float32 at AVX2 too: element by element,
  // a float32 4x128x56x56 1x1 weight gradient spent a fifth of its time here on a Zen 3).
  if constexpr (turns_tiles<scalar_t>()) {
    if (xl.w == 1 && p.W >= 16) {
      tiled = N / 16 * 16;
      // A row's last columns by one more tile ending at its end, overlapping the one before it.
      for (int64_t b = 0; b < tiled; b += 16) {
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t iw0 = 0; holds_x(r) && iw0 < p.W; iw0 += 16) {
            const int64_t at = std::min(iw0, p.W - 16);
            transpose_tile(source(r, b, at), xl.n, dest(r, at) + b, N);
          }
        }
      }
    }
  }
  for (int64_t r = r0; r < r1 && tiled < N; ++r) {
    for (int64_t b = tiled; holds_x(r) && b < N; ++b) {
      for (int64_t iw = 0; iw < p.W; ++iw) dest(r, iw)[b] = source(r, b, iw)[0];
    }
  }
}

// Rows [co0, co0 + 16) of A_c from a "weight" whose 16 rows lie side by side (ws[0] == 1), Kw >= 16:
// each kernel row's columns turned 16 at a time, the last 16 ending at the row's end (overlapping
// the tile before them), so nothing is written past a kernel row; then the zeros between them.
template <typename scalar_t>
void fill_tiled_rows(const Problem& p, const Grid& g, const scalar_t* w_c, const int64_t* ws, int64_t co0,
                     scalar_t* a) {
  if constexpr (turns_tiles<scalar_t>()) {
    for (int64_t kh = 0; kh < p.Kh; ++kh) {
      for (int64_t kw0 = 0; kw0 < p.Kw; kw0 += 16) {
        const int64_t at = std::min(kw0, p.Kw - 16);
        transpose_tile(w_c + co0 + kh * ws[2] + at * ws[3], ws[3], a + co0 * g.K + kh * g.Wp + at, g.K);
      }
    }
    for (int64_t co = co0; co < co0 + 16; ++co) {
      for (int64_t kh = 0; kh < p.Kh; ++kh) {
        const int64_t gap = kh * g.Wp + p.Kw, gap_end = kh + 1 == p.Kh ? g.K : (kh + 1) * g.Wp;
        zero(a + co * g.K + gap, gap_end - gap);
      }
    }
  }
}

template <typename scalar_t>
void fill_channel(const Problem& p, const Grid& g, int64_t c, const scalar_t* x, const Layout& xl, const scalar_t* w,
                  const int64_t* ws, ChannelBuffers<scalar_t>& buf) {
  const int64_t N = p.N;
  // A_c: kernel row kh at q = kh * Wp, zeros between rows and past the last one. A channels_last
  // "weight" (the output gradient, its channels innermost) is turned round 16 x 16 at a time, 16
  // rows of A per task, not gathered element by element (see fill_image_rows). Other layouts, and
  // the rows past the last 16, row by row.
  const int64_t tiled_rows = turns_tiles<scalar_t>() && ws[0] == 1 && p.Kw >= 16 ? p.Cout / 16 * 16 : 0;
  const int64_t units = tiled_rows / 16 + (p.Cout - tiled_rows);
  at::parallel_for(0, units, 1, [&](int64_t first, int64_t last) {
    for (int64_t unit = first; unit < last; ++unit) {
      if (unit < tiled_rows / 16) {
        fill_tiled_rows(p, g, w + c * ws[1], ws, unit * 16, buf.a);
        continue;
      }
      const int64_t co = tiled_rows + unit - tiled_rows / 16;
      scalar_t* row = buf.a + co * g.K;
      zero(row, g.K);
      for (int64_t kh = 0; kh < p.Kh; ++kh) {
        const scalar_t* src = w + co * ws[0] + c * ws[1] + kh * ws[2];
        if (ws[3] == 1) {
          copy_run(src, row + kh * g.Wp, p.Kw);
        } else {
          for (int64_t kw = 0; kw < p.Kw; ++kw) row[kh * g.Wp + kw] = src[kw * ws[3]];
        }
      }
    }
  });
  // X_c: position (ih + ph) * Wp + (iw + pw), the images innermost; one slack position past the
  // planes' end for the odd pairing's last pair. A task fills a part of the rows.
  scalar_t* const xs = buf.x;
  const int64_t parts = std::min(g.Hp, 2 * int64_t(at::get_num_threads())), part_rows = (g.Hp + parts - 1) / parts;
  at::parallel_for(0, parts, 1, [&](int64_t first, int64_t last) {
    for (int64_t part = first; part < last; ++part) {
      fill_image_rows(p, g, c, x, xl, part * part_rows, std::min(g.Hp, (part + 1) * part_rows), xs);
    }
  });
  if constexpr (kPaired<scalar_t>) {
    pair_rows(xs, N, 0, g.plane / 2, buf.x_even);
    pair_rows(xs, N, 1, g.plane / 2, buf.x_odd);
  }
}

#if defined(CPU_CAPABILITY_AVX512)
// The smallest biased exponent of the nonzero bfloat16 values in a dense block, and whether any
// is subnormal: scan_exponents' answer, split over the threads.
inline void scan_dense(const at::BFloat16* data, int64_t n, int& emin, bool& subnormal) {
  std::vector<int> low(at::get_num_threads(), kSmallestEx);
  std::vector<char> sub(low.size(), 0);
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(data);
  at::parallel_for(0, (n + 31) / 32, 2048, [&](int64_t first, int64_t last) {
    int e = kSmallestEx;
    bool any_sub = false;
    fold_exponents(bits + first * 32, std::min(n, last * 32) - first * 32, e, any_sub);
    const int t = at::get_thread_num();
    low[t] = std::min(low[t], e);
    sub[t] = sub[t] || any_sub;
  });
  for (size_t t = 0; t < low.size(); ++t) emin = std::min(emin, low[t]), subnormal = subnormal || sub[t];
}
#endif

}  // namespace wide_brgemm_detail

// Whether this path serves a wide-kernel call: float32 where brgemm reaches oneDNN, bfloat16 where
// a bfloat16 unit is on and the operands keep its sums exact (checked here, over the whole call);
// ungrouped, dilation 1 (a weight gradient of a stride-1 conv), channels enough to fill a tile and
// buffers within the budget.
template <typename scalar_t>
bool wide_brgemm_serves(const Problem& p, const ConvOperands& o) {
  using namespace wide_brgemm_detail;
  constexpr bool is_float = std::is_same_v<scalar_t, float>;
  static_assert(kBrgemmDtype<scalar_t>);
  if (p.transpose || p.groups != 1 || p.dilation[0] != 1 || p.dilation[1] != 1 || p.N < 16 || p.Cout < 16) {
    return false;
  }
  // In double: the padded plane of a hostile padding may not fit int64 products (validation
  // bounds the tensors, not this path's buffers).
  const double tasks = std::ceil(double(p.Cout) / kGemmBlock) * std::ceil(double(p.N) / kGemmBlock) * p.Ho * p.Wo;
  const double padded = (double(p.H) + 2.0 * p.padding[0]) * (double(p.W) + 2.0 * p.padding[1]);
  const double bytes = (double(p.Cout) * (double(p.Kh) * (p.W + 2.0 * p.padding[1])) + 3.0 * (padded + 4) * p.N) *
                           sizeof(scalar_t) +
                       tasks * kGemmBlock * kGemmBlock * sizeof(float);
  if (bytes > double(kBudgetBytes)) return false;
  if constexpr (is_float) {
    return float_brgemm_enabled();
  } else {
#if defined(CPU_CAPABILITY_AVX512)
    if (bfloat16_brgemm_unit() == Bf16Unit::none) return false;
    int ex = kSmallestEx, ew = kSmallestEx, eb = kSmallestEx;
    bool subnormal = false;
    scan_dense(static_cast<const at::BFloat16*>(o.x), p.N * p.Cin * p.H * p.W, ex, subnormal);
    scan_dense(static_cast<const at::BFloat16*>(o.weight), p.Cout * p.Cin * p.Kh * p.Kw, ew, subnormal);
    if (o.bias) scan_exponents(static_cast<const at::BFloat16*>(o.bias), p.Cout, 1, eb, subnormal);
    return !subnormal && sums_stay_normal(ex, ew, eb);
#else
    return false;
#endif
  }
}

template <typename scalar_t>
void convolve_wide_brgemm(const Problem& p, const scalar_t* x, const Layout& xl, const ConvOperands& o,
                          const scalar_t* bias, scalar_t* out, const Layout& ol) {
  using namespace wide_brgemm_detail;
  namespace cpublas = at::native::cpublas;
  constexpr bool paired = kPaired<scalar_t>;
  ++path_counts().wide_brgemm_calls;
  const Grid g = make_grid(p);
  const int64_t b_blocks = (p.N + kGemmBlock - 1) / kGemmBlock, taps = p.Ho * p.Wo;
  // Output channels per task: kGemmBlock, or half that where whole blocks would make fewer than 16
  // tasks that do not share evenly among the threads (a 3x3 weight gradient's 9 taps went 5 and 4 to
  // two threads). At one thread halves only cost more calls: a ResNet 3x3 weight gradient took
  // 11.2 ms in halves and 9.9 in whole blocks in float32, 5.5-6.0 and 5.1-5.5 in bfloat16 (Zen 4).
  // Which task computes an output changes none of its sums.
  const int64_t whole_tasks = (p.Cout + kGemmBlock - 1) / kGemmBlock * b_blocks * taps;
  const int64_t co_block = whole_tasks < 16 && whole_tasks % at::get_num_threads() != 0 ? kGemmBlock / 2 : kGemmBlock;
  const int64_t co_blocks = (p.Cout + co_block - 1) / co_block, tasks = co_blocks * b_blocks * taps;
  constexpr int64_t kTile = kGemmBlock * kGemmBlock;
  // Each task's accumulator, [rows][cols] at ldc = cols, starting at the bias.
  const auto acc = scratch<float>(tasks * kTile);
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t cb = t / taps / b_blocks, co0 = cb * co_block;
    const int64_t rows = std::min(co_block, p.Cout - co0), cols = std::min(kGemmBlock, p.N - t / taps % b_blocks * kGemmBlock);
    for (int64_t r = 0; r < rows; ++r) {
      std::fill_n(acc.get() + t * kTile + r * cols, cols, bias ? static_cast<float>(bias[co0 + r]) : 0.f);
    }
  }
  // One block for the four, kept by the calling thread between calls (a fresh one is a page fault
  // per 4 KiB on first touch, as tap_brgemm.h measured).
  const int64_t a_size = p.Cout * g.K, x_size = (g.plane + 1) * p.N, pair_size = paired ? g.plane * p.N : 0;
  ChannelBuffers<scalar_t> buf;
  buf.a = reused_planes<scalar_t>(a_size + x_size + 2 * pair_size);
  buf.x = buf.a + a_size;
  buf.x_even = buf.x + x_size;
  buf.x_odd = buf.x_even + pair_size;
  const scalar_t* w = static_cast<const scalar_t*>(o.weight);
  for (int64_t c = 0; c < p.Cin; ++c) {
    fill_channel<scalar_t>(p, g, c, x, xl, w, o.weight_strides, buf);
    at::parallel_for(0, tasks, 1, [&](int64_t first, int64_t last) {
      for (int64_t k0 = 0; k0 < g.K; k0 += kChunk<scalar_t>) {
        const int64_t kc = std::min(kChunk<scalar_t>, g.K - k0);
        for (int64_t t = first; t < last; ++t) {
          const int64_t tap = t % taps, bb = t / taps % b_blocks, cb = t / taps / b_blocks;
          const int64_t co0 = cb * co_block, b0 = bb * kGemmBlock;
          const int64_t rows = std::min(co_block, p.Cout - co0), cols = std::min(kGemmBlock, p.N - b0);
          const int64_t shift = tap / p.Wo * p.stride[0] * g.Wp + tap % p.Wo * p.stride[1] + k0;
          const scalar_t* a = buf.a + co0 * g.K + k0;
          const scalar_t* b = paired ? (shift % 2 ? buf.x_odd : buf.x_even) + (shift / 2) * 2 * p.N + 2 * b0
                                     : buf.x + shift * p.N + b0;
          dtype_brgemm(rows, cols, kc, g.K, p.N, cols, true, a, b, acc.get() + t * kTile);
        }
      }
      cpublas::brgemm_release(paired);
    });
  }
  at::parallel_for(0, tasks, 1, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const int64_t tap = t % taps, bb = t / taps % b_blocks, cb = t / taps / b_blocks;
      const int64_t co0 = cb * co_block, b0 = bb * kGemmBlock;
      const int64_t rows = std::min(co_block, p.Cout - co0), cols = std::min(kGemmBlock, p.N - b0);
      const float* sum = acc.get() + t * kTile;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
          out[(b0 + j) * ol.n + (co0 + r) * ol.c + tap / p.Wo * ol.h + tap % p.Wo * ol.w] =
              static_cast<scalar_t>(sum[r * cols + j]);
        }
      }
    }
  });
}

#else

template <typename scalar_t>
bool wide_brgemm_serves(const Problem&, const ConvOperands&) {
  return false;
}
template <typename scalar_t>
void convolve_wide_brgemm(const Problem&, const scalar_t*, const Layout&, const ConvOperands&, const scalar_t*,
                          scalar_t*, const Layout&) {}

#endif

}  // namespace CPU_CAPABILITY
}  // namespace fuel
