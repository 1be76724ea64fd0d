// Register transposes of 16 x 16 tiles (32-bit lanes, and 16-bit ones for bfloat16 at AVX512),
// shared by the brgemm paths: their buffers change which axis is innermost (images for the wide
// path, channels for the patch path) and the store back to an NCHW output turns it round again.
#pragma once

#include "kernel_common.h"

namespace fuel {
namespace CPU_CAPABILITY {

#if defined(CPU_CAPABILITY_AVX512)
// A 16 x 16 transpose of 32-bit lanes in registers.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 8; ++i) {  // 128-bit blocks: rows i and i + 8 exchange blocks 1 and 2, ...
    const int a = (i & 3) | ((i & 4) << 1), b = a + 4;
    t[a] = _mm512_shuffle_i32x4(r[a], r[b], 0x88);
    t[b] = _mm512_shuffle_i32x4(r[a], r[b], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    const int a = i, b = i + 8;
    r[a] = _mm512_shuffle_i32x4(t[a], t[b], 0x88);
    r[b] = _mm512_shuffle_i32x4(t[a], t[b], 0xdd);
  }
}

// An 8 x 8 transpose of 16-bit lanes inside each 128-bit half of r[0..8): afterwards r[k] holds
// column k of the rows in its low half and column k + 8 in its high half.
inline void transpose8x8_halves(__m256i r[8]) {
  __m256i pairs[8], quads[8];
  for (int i = 0; i < 8; i += 2) {
    pairs[i] = _mm256_unpacklo_epi16(r[i], r[i + 1]);
    pairs[i + 1] = _mm256_unpackhi_epi16(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // quads[i + k]: columns 2k and 2k + 1 of rows i..i + 3
    quads[i] = _mm256_unpacklo_epi32(pairs[i], pairs[i + 2]);
    quads[i + 1] = _mm256_unpackhi_epi32(pairs[i], pairs[i + 2]);
    quads[i + 2] = _mm256_unpacklo_epi32(pairs[i + 1], pairs[i + 3]);
    quads[i + 3] = _mm256_unpackhi_epi32(pairs[i + 1], pairs[i + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    r[2 * k] = _mm256_unpacklo_epi64(quads[k], quads[k + 4]);
    r[2 * k + 1] = _mm256_unpackhi_epi64(quads[k], quads[k + 4]);
  }
}

// dst[j * ldd + i] = r[i] lane j for 16 rows of 16-bit lanes, transposed in 256-bit registers:
// about a third of the shuffles of widening each row to 32-bit lanes, transposing those and
// narrowing back (a bfloat16 tile took 88 cycles that way and takes 27 this way on a Zen 4, where
// a 512-bit shuffle costs two 256-bit ones). dst's rows are stored in order.
template <typename T>
inline void store_turned16(__m256i r[16], T* dst, int64_t ldd) {
  transpose8x8_halves(r);
  transpose8x8_halves(r + 8);
  __m256i columns[16];
  for (int k = 0; k < 8; ++k) {
    columns[k] = _mm256_permute2x128_si256(r[k], r[k + 8], 0x20);
    columns[k + 8] = _mm256_permute2x128_si256(r[k], r[k + 8], 0x31);
  }
  for (int k = 0; k < 16; ++k) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k * ldd), columns[k]);
}

// dst[j * ldd + i] = src[i * lds + j] for a 16 x 16 tile of float or bfloat16, or from float into
// bfloat16, each element rounded to nearest even by ATen's own rounding (what narrow() in
// kernel_common.h applies), so a tile stored either way has the same bits. Rows of src from
// src_rows on are read as zeros. dst's rows are stored whole, in order.
template <typename in_t, typename out_t>
inline void transpose_tile(const in_t* src, int64_t lds, out_t* dst, int64_t ldd, int64_t src_rows = 16) {
  static_assert(std::is_same_v<in_t, out_t> || (std::is_same_v<in_t, float> && std::is_same_v<out_t, at::BFloat16>));
  if constexpr (sizeof(out_t) == 2) {  // float rows are rounded before they are turned (elementwise: the same bits)
    __m256i rows[16];
    for (int i = 0; i < 16; ++i) {
      if (i >= src_rows) {
        rows[i] = _mm256_setzero_si256();
      } else if constexpr (sizeof(in_t) == 4) {
        rows[i] = at::vec::cvtfp32_bf16(_mm512_loadu_ps(src + i * lds));
      } else {
        rows[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * lds));
      }
    }
    store_turned16(rows, dst, ldd);
  } else {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) r[i] = i < src_rows ? _mm512_loadu_si512(src + i * lds) : _mm512_setzero_si512();
    transpose16(r);
    for (int j = 0; j < 16; ++j) _mm512_storeu_si512(dst + j * ldd, r[j]);
  }
}
#elif defined(CPU_CAPABILITY_AVX2)
// An 8 x 8 transpose of floats in registers.
inline void transpose8(__m256 r[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit halves: row i takes the low halves of s[i] and s[i + 4]
    r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}

// dst[j * ldd + i] = src[i * lds + j] for a 16 x 16 tile of float, as four 8 x 8 transposes (the
// float32 brgemm paths; bfloat16 takes them only at AVX512, where AMX can serve it).
template <typename in_t, typename out_t>
inline void transpose_tile(const in_t* src, int64_t lds, out_t* dst, int64_t ldd) {
  static_assert(std::is_same_v<in_t, float> && std::is_same_v<out_t, float>,
                "below AVX512 the brgemm paths take float32 only");
  for (int bi = 0; bi < 16; bi += 8) {
    for (int bj = 0; bj < 16; bj += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + (bi + i) * lds + bj);
      transpose8(r);
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + (bj + j) * ldd + bi, r[j]);
    }
  }
}
#endif

}  // namespace CPU_CAPABILITY
}  // namespace fuel
