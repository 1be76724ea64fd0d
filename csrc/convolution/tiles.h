// Register transposes of 16 x 16 tiles of 32-bit lanes, shared by the brgemm paths: their
// buffers change which axis is innermost (images for the wide path, channels for the patch path)
// and the store back to an NCHW output turns it round again.
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

// dst[j * ldd + i] = src[i * lds + j] for a 16 x 16 tile of float or bfloat16.
template <typename scalar_t>
inline void transpose_tile(const scalar_t* src, int64_t lds, scalar_t* dst, int64_t ldd) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) {
    if constexpr (sizeof(scalar_t) == 4) {
      r[i] = _mm512_loadu_si512(src + i * lds);
    } else {
      r[i] = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * lds)));
    }
  }
  transpose16(r);
  for (int j = 0; j < 16; ++j) {
    if constexpr (sizeof(scalar_t) == 4) {
      _mm512_storeu_si512(dst + j * ldd, r[j]);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j * ldd), _mm512_cvtepi32_epi16(r[j]));
    }
  }
}
#endif

}  // namespace CPU_CAPABILITY
}  // namespace fuel
