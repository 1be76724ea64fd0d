// float32 C = (add_c ? C : 0) + A B, the one product every float32 brgemm path asks for: A [M][K]
// (rows lda apart), B [K][N] (rows ldb apart), C [M][N] (rows ldc apart). Each C element is one fused
// multiply-add chain over k in order from zero, then added to C: the sums oneDNN's brgemm kernel
// computes (torch's at::native::cpublas::brgemm), so either gives the same bits.
//
// At AVX2 the register tile below runs instead of oneDNN's (torch's brgemm still gates these paths:
// float_brgemm_enabled()). fuel / torch on a Zen 3 at 1 thread, oneDNN's kernel against this tile in
// the same processes, two runs: the channels_last 1x1 4x256x28x28 -> 64 0.83-1.20 -> 0.77-0.88 (its
// B packed in panels, below), the channels_last grouped 3x3 0.74-1.02 -> 0.66-1.00, the NCHW grouped
// 0.75-0.82 -> 0.70-0.73, the NCHW ResNet 3x3 1.14-1.18 -> 1.05-1.15; the other rows within the
// noise (the NCHW upsampling 0.74-0.83 -> 0.80-0.84). The channels_last plane path keeps oneDNN's
// kernel (plane_brgemm.h). AVX-512 keeps oneDNN's kernel (unmeasured here).
#pragma once

#include <ATen/native/CPUBlas.h>

#include "kernel_common.h"

namespace fuel {
namespace CPU_CAPABILITY {

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)

// A tile: kGemmRows rows of A, each broadcast against two vectors of a B row (12 accumulators and
// the two B vectors in AVX2's 16 registers); a last panel of at most one vector's columns takes one.
constexpr int64_t kGemmRows = 6;
constexpr int64_t kGemmCols = 2 * Vectorized<float>::size();

// One tile of whole columns; C's columns [0, kVecs * V) of rows [0, kRows).
template <int64_t kRows, int64_t kVecs>
inline void gemm_tile(int64_t K, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                      bool add_c) {
  using Vec = Vectorized<float>;
  constexpr int64_t V = Vec::size();
  // The loops unrolled by force: the accumulators then live in registers (left to the optimizer,
  // they went through the stack every step in some callers, at a third of the speed).
  Vec acc[kRows][kVecs];
#pragma GCC unroll 16
  for (int64_t r = 0; r < kRows; ++r) {
#pragma GCC unroll 2
    for (int64_t v = 0; v < kVecs; ++v) acc[r][v] = Vec(0.f);
  }
  for (int64_t k = 0; k < K; ++k) {
    Vec bk[kVecs];
#pragma GCC unroll 2
    for (int64_t v = 0; v < kVecs; ++v) bk[v] = Vec::loadu(b + k * ldb + v * V);
#pragma GCC unroll 16
    for (int64_t r = 0; r < kRows; ++r) {
      const Vec ar(a[r * lda + k]);
#pragma GCC unroll 2
      for (int64_t v = 0; v < kVecs; ++v) acc[r][v] = at::vec::fmadd(ar, bk[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int64_t r = 0; r < kRows; ++r) {
#pragma GCC unroll 2
    for (int64_t v = 0; v < kVecs; ++v) {
      float* dst = c + r * ldc + v * V;
      (add_c ? Vec::loadu(dst) + acc[r][v] : acc[r][v]).store(dst);
    }
  }
}

template <int64_t kVecs = 2, int64_t kRows = kGemmRows>
inline void gemm_rows(int64_t rows, int64_t K, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                      int64_t ldc, bool add_c) {
  if constexpr (kRows > 0) {
    if (rows == kRows) return gemm_tile<kRows, kVecs>(K, a, lda, b, ldb, c, ldc, add_c);
    return gemm_rows<kVecs, kRows - 1>(rows, K, a, lda, b, ldb, c, ldc, add_c);
  }
}

// Whether `rows` rows `ld` floats apart crowd into few of L1's 64 sets: fewer than a quarter of the
// sets they would spread over. NCHW planes of 16x16, 32x32 or 64x64 pixels, 1, 4 and 16 KiB apart,
// put a 64-row panel in 4 sets or in one (16 or 64 rows to a set of 8 ways), and every pass over
// them then misses L1; 56x56 planes put it in 16 sets, 4 rows to each, which costs nothing measurable.
inline bool rows_crowd_l1(int64_t ld, int64_t rows) {
  constexpr int64_t kSets = 64, kLine = 64;
  bool used[kSets] = {};
  int64_t sets = 0;
  for (int64_t k = 0; k < rows; ++k) {
    bool& set = used[k * ld * int64_t(sizeof(float)) / kLine % kSets];
    sets += !set;
    set = true;
  }
  return sets < std::min(rows, kSets) / 4;
}

inline void own_float_brgemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add_c,
                             const float* a, const float* b, float* c) {
  using Vec = Vectorized<float>;
  // Column panels outermost: a panel of B stays in L1 while A's rows go by (rows outermost, which
  // keeps A's tile in L1 instead, was no faster on any benchmark row). Where B's rows crowd into a
  // few of L1's sets each panel is copied first, its rows then back to back: float32 NCHW 1x1
  // 4x256x32x32 -> 64 at 1 thread on a Zen 3, 1.18-1.22 -> 0.99-1.00 of torch's time. So is a panel
  // of more than 128 rows that straddle cache lines (two lines a row: all of L1 for 256 rows): NCHW
  // 1x1 2048 -> 512 on 7x7, 1.28 -> 1.14; 1024 -> 256 on 14x14, 1.14 -> 1.06 (the 3x3 calls of the
  // plane path, whose B is as ragged, within the noise).
  const int64_t j0 = N / kGemmCols * kGemmCols;
  const bool straddle = ldb % 16 != 0 || reinterpret_cast<uintptr_t>(b) % 64 != 0;
  const bool copy_panels = K <= kTapChunk && (rows_crowd_l1(ldb, K) || (straddle && K > 128));
  // A panel's copy: of a crowded B, or of the last columns padded with zeros (below). Every caller's
  // K is one chunk of at most kTapChunk terms, so it fits on the stack.
  alignas(64) float copied[kTapChunk * kGemmCols];
  for (int64_t j = 0; j < j0; j += kGemmCols) {
    const float* panel = b + j;
    int64_t ld_panel = ldb;
    if (copy_panels) {
      for (int64_t k = 0; k < K; ++k) {
        Vec::loadu(b + k * ldb + j).store(copied + k * kGemmCols);
        Vec::loadu(b + k * ldb + j + Vec::size()).store(copied + k * kGemmCols + Vec::size());
      }
      panel = copied, ld_panel = kGemmCols;
    }
    for (int64_t i0 = 0; i0 < M; i0 += kGemmRows) {
      gemm_rows(std::min(kGemmRows, M - i0), K, a + i0 * lda, lda, panel, ld_panel, c + i0 * ldc + j, ldc, add_c);
    }
  }
  if (j0 == N) return;
  // The last columns: B's copied into a panel padded with zeros, the tile computed aside, the
  // columns that exist added to (or written over) C.
  const int64_t cols = N - j0;
  TORCH_INTERNAL_ASSERT(K <= kTapChunk);  // no message arguments: their formatting would be compiled per level
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t j = 0; j < kGemmCols; ++j) copied[k * kGemmCols + j] = j < cols ? b[k * ldb + j0 + j] : 0.f;
  }
  // At most one vector's columns run one vector wide: a 7x7 image's 49 positions are 3 x 16 + 1.
  const bool narrow = cols <= Vec::size();
  float tile[kGemmRows * kGemmCols];
  for (int64_t i0 = 0; i0 < M; i0 += kGemmRows) {
    const int64_t rows = std::min(kGemmRows, M - i0);
    if (narrow) {
      gemm_rows<1>(rows, K, a + i0 * lda, lda, copied, kGemmCols, tile, kGemmCols, false);
    } else {
      gemm_rows<2>(rows, K, a + i0 * lda, lda, copied, kGemmCols, tile, kGemmCols, false);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = c + (i0 + r) * ldc + j0;
      for (int64_t j = 0; j < cols; ++j) dst[j] = add_c ? dst[j] + tile[r * kGemmCols + j] : tile[r * kGemmCols + j];
    }
  }
}

#if defined(CPU_CAPABILITY_AVX2)
constexpr bool kOwnFloatGemm = true;
#else
constexpr bool kOwnFloatGemm = false;
#endif

// How many of B's N columns one float_brgemm call should read: callers that pack B pack it in panels
// of this many columns, each [K][cols], and call once per panel. The register tile then reads a
// panel's rows back to back, which keeps the panel in L1 (rows of a 64-column B, 256 bytes apart,
// fall in a quarter of L1's sets: the 1x1 call above took 5-25% longer so); oneDNN's kernel takes
// all the columns in one call.
inline int64_t b_panel_cols(int64_t N) { return kOwnFloatGemm ? std::min(kGemmCols, N) : N; }

inline void float_brgemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add_c,
                         const float* a, const float* b, float* c) {
  if constexpr (kOwnFloatGemm) {
    own_float_brgemm(M, N, K, lda, ldb, ldc, add_c, a, b, c);
  } else {
    at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, add_c, a, b, c, false);
  }
}

// A path's brgemm for its dtype: float32 as above, bfloat16 on oneDNN's kernel with B in pairs.
template <typename scalar_t>
inline void dtype_brgemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add_c,
                         const scalar_t* a, const scalar_t* b, float* c) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    float_brgemm(M, N, K, lda, ldb, ldc, add_c, a, b, c);
  } else {
    static_assert(std::is_same_v<scalar_t, at::BFloat16>, "the brgemm paths take float32 and bfloat16 only");
    at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, add_c, a, b, c, true);
  }
}

#endif

}  // namespace CPU_CAPABILITY
}  // namespace fuel
