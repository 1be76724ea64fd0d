// What every convolution kernel shares: the accumulator type, the fixed summation constants, and
// the widening loads and narrowing stores between a tensor's dtype and the accumulator.
//
// Included by the kernel sources only, which are compiled once per ISA level inside
// namespace fuel::CPU_CAPABILITY (Vectorized<T> is that level's vector).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "problem.h"

#ifndef CPU_CAPABILITY
#define CPU_CAPABILITY DEFAULT
#endif

namespace fuel {

// Whether scratch buffers start poisoned (FUEL_POISON_SCRATCH=1, read once per process; scratch.cpp).
bool scratch_poisoned();

namespace CPU_CAPABILITY {

using at::vec::Vectorized;

// Where weight element (input channel ci, output channel co of group g) of kernel row 0, column 0
// lies, for weight strides ws: conv2d's weight is [Cout][Cin/groups][kh][kw], conv_transpose2d's
// [Cin][Cout/groups][kh][kw].
inline int64_t weight_offset(const Problem& p, const int64_t* ws, int64_t g, int64_t ci, int64_t co) {
  const int64_t Cin_g = p.Cin / p.groups, Cout_g = p.Cout / p.groups;
  return p.transpose ? (g * Cin_g + ci) * ws[0] + co * ws[1] : (g * Cout_g + co) * ws[0] + ci * ws[1];
}

// The size of each of `blocks` equal blocks that cover `total` items, in whole `unit`s: the tasks of
// a split then carry the same work (any split gives the same bits).
inline int64_t equal_block(int64_t total, int64_t blocks, int64_t unit) {
  return ((total + blocks - 1) / blocks + unit - 1) / unit * unit;
}

// The summation order every kernel keeps (see contracts/convolution.fkc.md, Arithmetic).
constexpr int64_t kBlock = 32;             // taps per fused multiply-add chain
constexpr int64_t kTapChunk = 256;         // taps per chunk (a multiple of kBlock)
constexpr int64_t kScratchBytes = 131072;  // per thread and buffer: what a task keeps in L2
static_assert(kTapChunk % kBlock == 0, "a tap chunk must hold whole blocks, or chunking would change the sums");

template <typename T>
using acc_type = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
constexpr bool is_half = std::is_same_v<T, at::BFloat16> || std::is_same_v<T, at::Half>;

// Fetches the cache lines of [begin, begin + bytes) for writing, ahead of the stores that will
// fill them. PREFETCHW brings a line in owned, so that a store to it does not wait at retirement
// for the line to come and be claimed; __builtin_prefetch(p, 1) emits it only under -mprfchw, which
// no level's flags name, and a read prefetch instead was no faster than none. (Every x86-64 CPU
// without the instruction runs its opcode as a hint that does nothing.)
inline void prefetch_for_write(const void* begin, int64_t bytes) {
  const char* line = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(begin) / 64 * 64);
  for (const char* end = static_cast<const char*>(begin) + bytes; line < end; line += 64) {
#if defined(__x86_64__)
    asm volatile("prefetchw %0" : : "m"(*line));
#else
    __builtin_prefetch(line, 1);
#endif
  }
}

// Scratch that the kernel writes in full before it reads it: left unfilled (a std::vector fills
// its elements, which took 6% of a 1x1 convolution's time for the padded input planes alone).
// Under FUEL_POISON_SCRATCH=1 every byte starts at 0xFF, a NaN in every floating dtype, so that an
// element read before it is written reaches the output (tests/test_scratch_poisoned.py).
template <typename T>
inline std::unique_ptr<T[]> scratch(int64_t n) {
  auto buffer = std::make_unique_for_overwrite<T[]>(static_cast<size_t>(n));
  if (scratch_poisoned()) std::memset(static_cast<void*>(buffer.get()), 0xFF, static_cast<size_t>(n) * sizeof(T));
  return buffer;
}

template <typename T>
inline void zero(T* dst, int64_t n) {
  using Vec = Vectorized<T>;
  const Vec z(T(0));
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) z.store(dst + i);
  for (; i < n; ++i) dst[i] = T(0);
}

// A contiguous run of floats copied with inline vector moves: runs are short (an input or output
// row), and a memmove call per row took 5% of a 7x7 stem convolution. (The build also keeps GCC
// from turning this loop back into that call: setup.py, KERNEL_ARGS.)
// A run of at least a vector ends with one whole vector ending at n, over elements already
// copied (src and dst are separate buffers); a shorter one goes masked (AVX-512) or element by
// element (AVX2's masked stores are slow on AMD cores).
template <typename T>
inline void copy_run(const T* src, T* dst, int64_t n) {
  using Vec = Vectorized<T>;
  constexpr int64_t V = Vec::size();
  if (n >= V) {
    int64_t i = 0;
    for (; i + V <= n; i += V) Vec::loadu(src + i).store(dst + i);
    if (i < n) Vec::loadu(src + n - V).store(dst + n - V);
    return;
  }
#if defined(CPU_CAPABILITY_AVX512)
  Vec::loadu(src, n).store(dst, n);
#else
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
#endif
}

// Exact widening of a contiguous run into the accumulator type.
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
inline void widen(const scalar_t* src, acc_t* dst, int64_t n) {
  if constexpr (!is_half<scalar_t>) {
    copy_run(src, dst, n);
  } else {
    constexpr int64_t step = Vectorized<scalar_t>::size(), half = Vectorized<float>::size();
    for (int64_t i = 0; i < n; i += step) {
      const int64_t count = std::min(step, n - i);
      auto [lo, hi] = at::vec::convert_to_float<scalar_t>(Vectorized<scalar_t>::loadu(src + i, count));
      lo.store(dst + i, std::min(half, count));
      if (count > half) hi.store(dst + i + half, count - half);
    }
  }
}

// Narrowing (round to nearest even) of a contiguous run: every element through the same vector code.
// kWholeLoads: src may be read a whole step past n (a row of a turned tile, with the buffer's slack
// after it), so only the stores are masked. A masked load of values just stored waits for the stores
// to complete (no store-to-load forwarding on a Zen 5): storing a bfloat16 k4/s2 upsampling through
// masked loads took a fifth of its time, through whole loads an eighth. The lanes past n are
// converted and dropped, so the bits are the same.
template <typename scalar_t, bool kWholeLoads = false, typename acc_t = acc_type<scalar_t>>
inline void narrow(const acc_t* src, scalar_t* dst, int64_t n) {
  if constexpr (!is_half<scalar_t> && !kWholeLoads) {
    copy_run(src, dst, n);
  } else {
    constexpr int64_t half = Vectorized<float>::size();
    constexpr int64_t step = is_half<scalar_t> ? Vectorized<scalar_t>::size() : Vectorized<acc_t>::size();
    auto load = [](const acc_t* from, int64_t count) {
      return kWholeLoads ? Vectorized<acc_t>::loadu(from) : Vectorized<acc_t>::loadu(from, count);
    };
    for (int64_t i = 0; i < n; i += step) {
      const int64_t count = std::min(step, n - i);
      if constexpr (is_half<scalar_t>) {
        const auto lo = load(src + i, std::min(half, count));
        const auto hi = count > half ? load(src + i + half, count - half) : Vectorized<float>(0.f);
        at::vec::convert_from_float<scalar_t>(lo, hi).store(dst + i, count);
      } else {
        load(src + i, count).store(dst + i, count);
      }
    }
  }
}

// n accumulated values into an output row whose elements are `stride` apart (1: NCHW; the channel
// count: NHWC). Strided elements are narrowed by the same vector code, a piece at a time, then
// scattered: c10's scalar conversion rounds alike but makes a bfloat16 NaN 0x7fc0 where ATen's
// vectors make it 0xffff, and an output's bits must not depend on its layout.
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
inline void store_row(const acc_t* src, scalar_t* dst, int64_t stride, int64_t n) {
  if (stride == 1) return narrow<scalar_t>(src, dst, n);
  if constexpr (!is_half<scalar_t>) {
    for (int64_t i = 0; i < n; ++i) dst[i * stride] = src[i];
    return;
  }
  constexpr int64_t kPiece = 64;
  scalar_t piece[kPiece];
  for (int64_t i0 = 0; i0 < n; i0 += kPiece) {
    const int64_t count = std::min(kPiece, n - i0);
    narrow<scalar_t>(src + i0, piece, count);
    for (int64_t i = 0; i < count; ++i) dst[(i0 + i) * stride] = piece[i];
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace fuel
